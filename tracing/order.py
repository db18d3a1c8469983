"""The execution-order record: plain, serialisable data keyed by FQN.

An :class:`ExecutionOrder` says in which order a model really calls its
modules and uses its parameters. It is keyed by fully qualified names (FQNs,
as ``named_modules()`` / ``named_parameters()`` give them), never by object
identity, so an order can be saved, compared across ranks and iterations, and
loaded without the model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn as nn

from tracing.atomic import atomic_write_text, refuse_folder
from tracing.compute_op import ComputeOp
from tracing.order_fields import (
    CAPTURE_METHODS,
    READABLE_SCHEMA_VERSIONS,
    SCHEMA_VERSION,
    TIMING_FIELDS,
    TIMING_METHODS,
    checked_fields,
    parse_json,
)

__all__ = [
    "READABLE_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "CaptureMethod",
    "ComputeOp",
    "TimingMethod",
    "ExecutionOrder",
    "ParamInfo",
    "ParamUse",
    "param_info",
    "param_infos",
    "shared_param_map",
]

#: How the order was captured.
CaptureMethod = Literal["symbolic", "runtime"]
#: How compute times were obtained: ``""`` (none recorded), measured, or estimated.
TimingMethod = Literal["", "measured", "estimated"]


@dataclass(frozen=True)
class ParamInfo:
    """Static facts about one parameter (by its canonical FQN).

    Attributes:
        numel: number of elements (not bytes).
        dtype: dtype name without the ``torch.`` prefix, e.g. ``"float32"``.
        requires_grad: whether the parameter is trainable.
        shape: the parameter's shape.
    """

    numel: int
    dtype: str
    requires_grad: bool
    shape: tuple[int, ...] = ()

    @property
    def bytes(self) -> int:
        """Size in bytes (``numel * element size``)."""
        return self.numel * _dtype_itemsize(self.dtype)


@dataclass(frozen=True)
class ParamUse:
    """One group of parameters used together during one module call.

    Attributes:
        module_fqn: FQN of the module whose forward was running (the innermost
            one); ``""`` is the root.
        call_index: index into :attr:`ExecutionOrder.module_forward_order` of
            that call.
        param_fqns: canonical FQNs used together: a leaf module's own
            parameters, or the parameter arguments of one functional op.
        op: ``"call_module"`` for a leaf module call, else the op's name
            (e.g. ``"linear"``, ``"cat"``, ``"t"``).
    """

    module_fqn: str
    call_index: int
    param_fqns: tuple[str, ...]
    op: str = "call_module"


@dataclass
class ExecutionOrder:
    """The order in which a model really uses its modules and parameters.

    All names are canonical FQNs of the *original* (unwrapped) model. A tied
    (shared) parameter appears under its canonical FQN, the first in
    ``named_parameters()`` order; its other names are in :attr:`shared_params`.

    Attributes:
        module_forward_order: every forward call of a module, in order, repeats
            kept (a module called twice appears twice); the root is ``""``.
            Recomputation under activation checkpointing is not included.
        param_forward_order: each parameter's first use in forward, in order.
        param_uses: groups of parameters used together, per module call, in
            execution order.
        param_backward_order: order in which gradients became ready (runtime
            capture only; empty for symbolic capture). Frozen parameters never
            appear here.
        module_backward_order: order in which modules finished their backward
            (runtime capture only).
        recompute_order: module calls re-run during backward by activation
            checkpointing (runtime capture only).
        shared_params: canonical FQN -> every other FQN of the same tensor.
        params: canonical FQN -> :class:`ParamInfo`, for every parameter of the
            model (used or not), in ``named_parameters()`` order.
        module_classes: module FQN -> class name, for every module of the model
            in ``named_modules()`` order.
        method: ``"symbolic"`` or ``"runtime"``.
        fallback_reason: why each skipped step of the capture ladder failed
            (one line each, ``"; "``-joined), or why the symbolic order was
            replaced by the runtime one; ``None`` when the first step tried was used.
        zero_cost: runtime capture ran on a fake shadow of the model (``FakeTensorMode``: no
            compute, no weight copy), not a real forward/backward. Always ``False`` for
            symbolic capture.
        warnings: things the capture could not rule out, one sentence each
            (e.g. optional ``forward`` arguments that fx turned into Proxies).
        module_call_depths: schema 2, one per :attr:`module_forward_order` call: how many
            recorded calls it runs inside (``0`` for the outermost). The calls are in
            pre-order, so a call's enclosing call is the nearest earlier call one level up
            (:meth:`enclosing_calls`). Empty in orders that did not record it (version 1,
            hand-built).
        torch_version: ``torch.__version__`` at capture time.
        schema_version: layout version, :data:`SCHEMA_VERSION`.
        forward_times_s: timing (schema 2; empty unless captured with ``timing=True``): one
            entry per :attr:`module_forward_order` call, its inclusive wall time in seconds
            (pre-forward hook to post-forward hook: nested calls included).
        forward_start_s: per call, when it started, in seconds from the start
            of the first call (same clock as the other timing fields).
        backward_start_s: per forward call, when its backward began (the first gradient with
            respect to one of its outputs was computed), same clock; ``None`` for a call
            autograd never ran backward through.
        backward_end_s: when the backward pass ended, same clock (``None``
            without timing or without backward).
        backward_times_s: module FQN -> inclusive backward time of its last call, seconds:
            from its backward start to the end of the last backward segment of it or of a
            call nested in it (see :mod:`tracing.runtime.timing`).
        saved_activation_bytes: per forward call, bytes of the tensors saved
            for backward while that call was the innermost running one
            (deduplicated by storage; parameters excluded).
        timing_device: device type the times are for (``"cpu"``, ``"cuda"``);
            ``""`` without timing.
        timing_method: ``"measured"`` (clocks), ``"estimated"`` (a roofline on
            the meta device or fake tensors), or ``""`` without timing.
        input_activation_bytes: per forward call, bytes of its floating-point
            tensor arguments that are not parameters (what full activation
            checkpointing of the call keeps).
        compute_ops: the forward matmuls and fused attention kernels, in order
            (:class:`ComputeOp`; with timing: measured or estimated seconds), for
            selective checkpointing.
        forward_transient_bytes: per call, the most bytes alive while its own
            forward ops ran, beyond the saved tensors (with timing;
            :mod:`tracing.runtime.op_record`); the root's includes the loss.
        backward_transient_bytes: the same for its backward ops.
        forward_op_counts: per call, the aten ops its own forward dispatched (views included;
            with timing, :mod:`tracing.runtime.op_record`): activation checkpointing's host
            work is per op (selective checkpointing's dispatch mode sees every op).
        param_dtype: the dtype the floating-point parameters were cast to for the
            capture (``""``: as the model holds them), so activations are sized in it.
        training: schema 3: the ``training`` flag of the module whose calls the
            order holds (the root's, for one step) when it was captured: ``False``
            for an order captured in eval mode; ``None``: not recorded (symbolic
            capture, older files, hand-built orders).
        grad_enabled: schema 3: whether autograd was on during the recorded forward
            (``torch.is_grad_enabled()``): ``False`` under ``torch.no_grad()`` or
            ``torch.inference_mode()``, where no backward runs and
            :attr:`param_backward_order` is empty (:attr:`warnings` says so); ``None`` for
            symbolic capture (nothing runs) and older files.

    Example:
        >>> order = ExecutionOrder(module_forward_order=["", "fc"], method="symbolic")
        >>> ExecutionOrder.from_dict(order.to_dict()) == order
        True
    """

    module_forward_order: list[str] = field(default_factory=list)
    param_forward_order: list[str] = field(default_factory=list)
    param_uses: list[ParamUse] = field(default_factory=list)
    param_backward_order: list[str] = field(default_factory=list)
    module_backward_order: list[str] = field(default_factory=list)
    recompute_order: list[str] = field(default_factory=list)
    shared_params: dict[str, list[str]] = field(default_factory=dict)
    params: dict[str, ParamInfo] = field(default_factory=dict)
    module_classes: dict[str, str] = field(default_factory=dict)
    method: CaptureMethod = "symbolic"
    fallback_reason: str | None = None
    torch_version: str = field(default_factory=lambda: str(torch.__version__))
    schema_version: int = SCHEMA_VERSION
    # ---- timing (schema version 2; empty when not recorded)
    forward_times_s: list[float] = field(default_factory=list)
    forward_start_s: list[float] = field(default_factory=list)
    backward_start_s: list[float | None] = field(default_factory=list)
    backward_end_s: float | None = None
    backward_times_s: dict[str, float] = field(default_factory=dict)
    saved_activation_bytes: list[int] = field(default_factory=list)
    timing_device: str = ""
    timing_method: TimingMethod = ""
    input_activation_bytes: list[int] = field(default_factory=list)
    compute_ops: list[ComputeOp] = field(default_factory=list)
    forward_transient_bytes: list[int] = field(default_factory=list)
    backward_transient_bytes: list[int] = field(default_factory=list)
    param_dtype: str = ""
    forward_op_counts: list[int] = field(default_factory=list)
    # ---- capture (schema version 2)
    zero_cost: bool = False
    warnings: list[str] = field(default_factory=list)
    module_call_depths: list[int] = field(default_factory=list)
    # ---- the mode of the capture (schema version 3; None: not recorded)
    training: bool | None = None
    grad_enabled: bool | None = None

    def __post_init__(self) -> None:
        if self.method not in CAPTURE_METHODS:
            raise ValueError(
                f"ExecutionOrder.method must be one of {CAPTURE_METHODS}, got {self.method!r}"
            )
        if self.timing_method not in TIMING_METHODS:
            raise ValueError(
                f"ExecutionOrder.timing_method must be one of {TIMING_METHODS}, got "
                f"{self.timing_method!r}"
            )

    def enclosing_calls(self) -> list[int]:
        """For each call of :attr:`module_forward_order`, the index of the call it
        runs inside (``-1`` for an outermost call), from :attr:`module_call_depths`.

        Returns ``[]`` when the depths were not recorded.

        Example:
            >>> ExecutionOrder(module_forward_order=["", "a", "a.x", "b"],
            ...                module_call_depths=[0, 1, 2, 1]).enclosing_calls()
            [-1, 0, 1, 0]
        """
        out: list[int] = []
        open_at: list[int] = []  # open_at[d]: the latest call at depth d
        for i, depth in enumerate(self.module_call_depths):
            del open_at[depth:]
            out.append(open_at[-1] if open_at else -1)
            open_at.append(i)
        return out

    @property
    def has_timing(self) -> bool:
        """Whether per-call forward times were recorded (``timing=True``)."""
        return bool(self.forward_times_s)

    # ------------------------------------------------------------------ helpers
    @property
    def capture_step(self) -> str:
        """The step of the capture ladder that produced this order:
        ``"symbolic"``, ``"zero-cost runtime"`` or ``"runtime"``."""
        if self.method == "symbolic":
            return "symbolic"
        return "zero-cost runtime" if self.zero_cost else "runtime"

    def alias_to_canonical(self) -> dict[str, str]:
        """Map every parameter FQN (canonical and alias) to its canonical FQN."""
        mapping = {fqn: fqn for fqn in self.params}
        for canonical, aliases in self.shared_params.items():
            mapping[canonical] = canonical
            for alias in aliases:
                mapping[alias] = canonical
        return mapping

    def first_call_index(self) -> dict[str, int]:
        """Module FQN -> index of its first call in :attr:`module_forward_order`."""
        first: dict[str, int] = {}
        for i, fqn in enumerate(self.module_forward_order):
            first.setdefault(fqn, i)
        return first

    def param_first_use_index(self) -> dict[str, int]:
        """Canonical parameter FQN -> ``call_index`` of its first use in forward."""
        first: dict[str, int] = {}
        for use in self.param_uses:
            for fqn in use.param_fqns:
                first.setdefault(fqn, use.call_index)
        return first

    def param_last_use_index(self) -> dict[str, int]:
        """Canonical parameter FQN -> ``call_index`` of its last use in forward."""
        last: dict[str, int] = {}
        for use in self.param_uses:
            for fqn in use.param_fqns:
                last[fqn] = use.call_index
        return last

    def total_numel(self) -> int:
        """Number of elements over all (canonical) parameters."""
        return sum(info.numel for info in self.params.values())

    # ------------------------------------------------------------ serialising
    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (see the README's JSON schema)."""
        return {
            "schema_version": self.schema_version,
            "method": self.method,
            "fallback_reason": self.fallback_reason,
            "torch_version": self.torch_version,
            "module_forward_order": list(self.module_forward_order),
            "param_forward_order": list(self.param_forward_order),
            "param_uses": [
                {
                    "module_fqn": u.module_fqn,
                    "call_index": u.call_index,
                    "param_fqns": list(u.param_fqns),
                    "op": u.op,
                }
                for u in self.param_uses
            ],
            "param_backward_order": list(self.param_backward_order),
            "module_backward_order": list(self.module_backward_order),
            "recompute_order": list(self.recompute_order),
            "shared_params": {k: list(v) for k, v in self.shared_params.items()},
            "params": {
                k: {
                    "numel": v.numel,
                    "dtype": v.dtype,
                    "requires_grad": v.requires_grad,
                    "shape": list(v.shape),
                }
                for k, v in self.params.items()
            },
            "module_classes": dict(self.module_classes),
            **_timing_dict(self),
            "zero_cost": self.zero_cost,
            "warnings": list(self.warnings),
            "module_call_depths": list(self.module_call_depths),
            "training": self.training,
            "grad_enabled": self.grad_enabled,
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>", prefix: str = "") -> ExecutionOrder:
        """Build an order from :meth:`to_dict` output, checked field by field.

        Every field is checked against :data:`tracing.order_fields.ORDER_FIELDS` in one pass
        (strict JSON types: counts are ints, never bools or floats; sizes and
        indices ``>= 0``; dtypes are torch dtype names; every ``call_index``
        is a call of ``module_forward_order``). Unknown keys are ignored.

        Args:
            data: the dict (parsed JSON).
            source: where the dict came from (a file name), used in error messages.
            prefix: where ``data`` sits in that file (``"order"`` inside a
                report), so the message names the field as the file has it.

        Raises:
            ValueError: ``data`` is of another schema version or malformed; the
                message (one line) names ``source``, the field and what is wrong
                (a :class:`tracing.schema.SchemaError` for a malformed field).
        """
        f = checked_fields(data, source=source, prefix=prefix)
        return cls(
            module_forward_order=f["module_forward_order"],
            param_forward_order=f["param_forward_order"],
            param_uses=[
                ParamUse(u["module_fqn"], u["call_index"], tuple(u["param_fqns"]), u["op"])
                for u in f["param_uses"]
            ],
            param_backward_order=f["param_backward_order"],
            module_backward_order=f["module_backward_order"],
            recompute_order=f["recompute_order"],
            shared_params=f["shared_params"],
            params={
                k: ParamInfo(v["numel"], v["dtype"], v["requires_grad"], tuple(v["shape"]))
                for k, v in f["params"].items()
            },
            module_classes=f["module_classes"],
            method=f["method"],
            fallback_reason=f["fallback_reason"],
            torch_version=f["torch_version"],
            zero_cost=f["zero_cost"],
            warnings=f["warnings"],
            module_call_depths=f["module_call_depths"],
            training=f["training"],
            grad_enabled=f["grad_enabled"],
            **{name: f[name] for name in TIMING_FIELDS if name != "compute_ops"},
            compute_ops=[ComputeOp.from_dict(op) for op in f["compute_ops"]],
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the order as JSON to ``path`` atomically (temp file + rename).

        Returns:
            The path written.

        Raises:
            IsADirectoryError: ``path`` is a folder (nothing is written); the
                message names it and a file path to pass instead.
            OSError: the folder cannot be created or the file written.
        """
        path = Path(path)
        refuse_folder(path, "ExecutionOrder.save", "order.json")
        text = json.dumps(self.to_dict(), indent=1)
        atomic_write_text(path, text)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ExecutionOrder:
        """Read an order written by :meth:`save` (or an execwrap JSON report).

        A JSON report (with ``"order"`` and ``"plan"`` keys) is accepted too:
        its ``"order"`` entry is read.

        Raises:
            ValueError: the file is not JSON, is of another schema version, or
                is malformed; the message names the file.
            FileNotFoundError: the file does not exist.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        data = parse_json(text, str(path))
        prefix = ""
        if isinstance(data, dict) and "order" in data and "module_forward_order" not in data:
            data, prefix = data["order"], "order"
        return cls.from_dict(data, source=str(path), prefix=prefix)


def _timing_dict(order: ExecutionOrder) -> dict[str, Any]:
    """The schema-2 timing fields of :meth:`ExecutionOrder.to_dict`."""
    return {
        "forward_times_s": list(order.forward_times_s),
        "forward_start_s": list(order.forward_start_s),
        "backward_start_s": list(order.backward_start_s),
        "backward_end_s": order.backward_end_s,
        "backward_times_s": dict(order.backward_times_s),
        "saved_activation_bytes": list(order.saved_activation_bytes),
        "timing_device": order.timing_device,
        "timing_method": order.timing_method,
        "input_activation_bytes": list(order.input_activation_bytes),
        "compute_ops": [op.to_dict() for op in order.compute_ops],
        "forward_transient_bytes": list(order.forward_transient_bytes),
        "backward_transient_bytes": list(order.backward_transient_bytes),
        "param_dtype": order.param_dtype,
        "forward_op_counts": list(order.forward_op_counts),
    }


def _dtype_itemsize(dtype: str) -> int:
    dt = getattr(torch, dtype, None)
    if isinstance(dt, torch.dtype):
        return dt.itemsize
    raise ValueError(f"unknown dtype {dtype!r}")


def shared_param_map(model: nn.Module) -> tuple[dict[int, str], dict[str, list[str]]]:
    """Find tied (shared) parameters by tensor identity.

    Returns:
        ``(id_to_canonical, shared)``: ``id(param)`` -> canonical FQN (the
        first name in ``named_parameters()`` order), and canonical FQN -> the
        other FQNs of the same tensor (only for tensors with several names).
    """
    id_to_canonical: dict[int, str] = {}
    shared: dict[str, list[str]] = {}
    for fqn, p in model.named_parameters(remove_duplicate=False):
        canonical = id_to_canonical.setdefault(id(p), fqn)
        if canonical != fqn:
            shared.setdefault(canonical, []).append(fqn)
    return id_to_canonical, shared


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def param_info(param: torch.Tensor) -> ParamInfo:
    """The :class:`ParamInfo` of one parameter (works on the meta device)."""
    dtype = param.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return ParamInfo(
        numel=param.numel(),
        dtype=name,
        requires_grad=param.requires_grad,
        shape=tuple(param.shape),
    )


def param_infos(model: nn.Module) -> dict[str, ParamInfo]:
    """Canonical FQN -> :class:`ParamInfo` for every parameter of ``model``."""
    return {fqn: param_info(p) for fqn, p in model.named_parameters()}
