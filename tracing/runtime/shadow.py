"""Zero-cost runtime capture: the recording run on a fake shadow of the model.

:func:`record_zero_cost` records the same forward/backward as
:func:`~tracing.runtime.record.record_execution_order`, but on fake tensors
(``torch._subclasses.FakeTensorMode``): every parameter and buffer of the
model is swapped, for the run only, for a fake tensor of the same shape,
dtype, device and ``requires_grad`` (made by ``FakeTensorMode.from_tensor``:
metadata only, no copy of the values), and so is every example input. No
kernel computes anything and no activation is allocated, so a model too slow
or too large to run on CPU can still be recorded.

The shadow is the model itself, with stand-ins: the same module objects run
their own Python ``forward``, so FQNs, hooks, wrappers and tied weights (one
fake tensor per real tensor, memoised by the fake mode) are those of the
original; plain tensor attributes (``self.scale = torch.tensor(...)``, not a
buffer) are swapped too, since a fake mode runs ops on real tensors for real.
Inputs are deep-copied under ``FakeCopyMode`` (fake tensors, no data), so a
forward that mutates what it is given (a KV cache) leaves the user's objects
alone. :class:`~tracing.model_state.ModuleSnapshot` puts every real tensor
back afterwards (also when the run fails), together with anything else the
forward stored on a module; the parameters' ``.grad`` (the fake ones
accumulate their own), the inputs, buffers' values and the RNG are never
touched.

What a fake run cannot do: an op whose output depends on tensor *values*
(``.item()``, ``if x.sum() > 0:``, ``nonzero``, ``torch.unique``) raises in
the fake mode instead of guessing; :func:`record_zero_cost` turns that into a
:class:`~tracing.errors.TracingError` naming the module, the op and the model's
source line, and the capture ladder then runs the real model (see
:mod:`tracing.ladder`). It never returns an order that the real inputs would
not produce.

Shape rules: a few meta kernels of torch 2.13 are stricter than the CPU
kernels they describe; for those ops the fake output comes from the op's shape
rule instead (see :data:`SHAPE_RULES`).
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch._subclasses import FakeTensorMode
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeCopyMode,
    UnsupportedOperatorException,
)
from torch.fx.immutable_collections import immutable_dict

from tracing.errors import TracingError
from tracing.fqn import module_phrase
from tracing.model_state import MODULE_INTERNALS, ModuleSnapshot, RngState
from tracing.order import ExecutionOrder
from tracing.preconditions import check_no_lazy_modules, distributed_wrapper, wrapped_error
from tracing.rates import ComputeRates
from tracing.runtime.known_values import KnownValues
from tracing.runtime.precision import cast_inputs, cast_parameters, check_compute_dtype
from tracing.runtime.record import record_step
from tracing.runtime.recorder import RuntimeRecorder
from tracing.source_line import source_line

__all__ = ["SHAPE_RULES", "ShadowMode", "record_zero_cost"]

logger = logging.getLogger(__name__)

_aten = torch.ops.aten


def _grouped_mm_shape(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The output of ``aten._grouped_mm`` (2-D/3-D operands), as an empty tensor.

    Source: ``_create_grouped_mm_output_tensor`` in torch 2.13's
    ``torch/_meta_registrations.py``. Its meta kernel also requires bfloat16
    and 16-byte strides (GPU constraints), which the CPU kernel does not, so
    transformers 5's grouped-mm experts (Mixtral, Qwen3-MoE, DeepSeek-V3) on
    float32 would not run on fake tensors otherwise.
    """
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        assert offs is not None
        shape = [offs.size(0), mat_a.size(0), mat_b.size(1)]
    elif mat_a.dim() == 2:
        shape = [mat_a.size(0), mat_b.size(-1)]
    elif mat_b.dim() == 2:
        shape = [mat_a.size(1), mat_b.size(1)]
    else:
        shape = [mat_a.size(0), mat_a.size(1), mat_b.size(-1)]
    return torch.empty(shape, dtype=out_dtype or mat_a.dtype, device=mat_a.device)


#: aten overload -> function computing its fake output from the fake inputs.
SHAPE_RULES: dict[Any, Callable[..., torch.Tensor]] = {
    _aten._grouped_mm.default: _grouped_mm_shape,
}


class ShadowMode(FakeTensorMode):
    """``FakeTensorMode`` that accepts real tensors, applies :data:`SHAPE_RULES` and
    keeps the values fixed by the config and the inputs' shapes.

    Real tensors met during the run (a tensor held in a plain attribute, an
    input inside a container the shadow did not convert) are converted on the
    fly (``allow_non_fake_inputs=True``), again without copying values.
    Values that depend on no weight and no activation (masks, position ids, a
    seeded random draw) are computed on CPU beside the fake run
    (:class:`~tracing.runtime.known_values.KnownValues`, :attr:`known`), so that
    ``.item()``, ``nonzero`` and boolean-mask indexing on them run.

    Attributes:
        known: the run's :class:`~tracing.runtime.known_values.KnownValues`.
    """

    def __init__(self) -> None:
        super().__init__(allow_non_fake_inputs=True)
        self.known = KnownValues()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Sequence[type],
        args: Sequence[object] = (),
        kwargs: Mapping[str, object] = immutable_dict(),
    ) -> Any:
        rule = SHAPE_RULES.get(func)
        if rule is not None:
            with self:
                return rule(*args, **kwargs)
        fake_call = functools.partial(super().__torch_dispatch__, func, types, args, kwargs)
        return self.known.dispatch(self, func, args, dict(kwargs), fake_call)


@contextmanager
def _fake_stand_ins(model: nn.Module, mode: ShadowMode) -> Iterator[None]:
    """Swap every parameter and buffer of ``model`` for its fake tensor, for the block.

    ``from_tensor`` is memoised per real tensor, so tied weights stay tied. The
    values of real buffers and plain tensor attributes are known to the run
    (:attr:`ShadowMode.known`); parameters' never are. Each module gets an
    ``_apply`` stand-in (:func:`_fake_apply`) for ``.to()`` called inside ``forward``.
    """
    snapshot = ModuleSnapshot(model)
    try:
        for module in model.modules():
            for slot in (module._parameters, module._buffers):
                for name, t in slot.items():
                    if t is not None:
                        slot[name] = mode.from_tensor(t)  # type: ignore[assignment]
                        if slot is module._buffers:
                            mode.known.add(slot[name], t)  # type: ignore[arg-type]
            attrs = vars(module)
            for name in attrs.keys() - MODULE_INTERNALS:  # the module's own attributes only
                value = attrs[name]
                if _holds_tensors(value):  # a plain tensor attribute (or a list/dict of them)
                    attrs[name] = pytree.tree_map_only(torch.Tensor, mode.from_tensor, value)
                    for real in pytree.tree_leaves(value):
                        if isinstance(real, torch.Tensor):
                            mode.known.add(mode.from_tensor(real), real)
            attrs["_apply"] = functools.partial(_fake_apply, module)
        yield
    finally:
        snapshot.restore()


def _fake_apply(module: nn.Module, fn: Callable[[torch.Tensor], Any], recurse: bool = True) -> Any:
    """``module._apply`` during a fake run: a conversion that changes nothing is a no-op.

    ``self.classifier = self.classifier.to(self.dtype)`` inside ``forward``
    (SwitchTransformers' router) converts nothing when the dtype is already
    the parameter's, and then keeps the same parameters, as it does for real
    tensors. torch's ``Module._apply`` instead always swaps a fake parameter
    for a new one (``torch.utils.swap_tensors``), which fails for a tensor the
    fake mode keeps a weak reference to. A conversion that does change a
    tensor runs torch's ``_apply``.
    """
    modules = module.modules() if recurse else (module,)
    with torch.no_grad():
        unchanged = all(
            fn(t) is t
            for m in modules
            for slot in (m._parameters, m._buffers)
            for t in slot.values()
            if t is not None
        )
    return module if unchanged else type(module)._apply(module, fn, recurse)


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple, dict)):
        return any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(value))
    return False


def fake_inputs(mode: FakeTensorMode, inputs: Any) -> Any:
    """``inputs`` with every tensor replaced by a fake one, the user's objects untouched.

    A deep copy under torch's ``FakeCopyMode`` reaches tensors inside any
    object (a KV cache, a dataclass) and copies no tensor data, so the forward
    can mutate what it is given without touching the user's inputs. Objects
    that cannot be deep-copied fall back to converting the tensors of lists,
    tuples and dicts only.
    """
    try:
        with FakeCopyMode(mode):
            return copy.deepcopy(inputs)
    except Exception:  # noqa: BLE001 - an object that refuses deepcopy
        logger.debug("zero-cost capture: inputs cannot be deep-copied; converting containers only")
        return pytree.tree_map_only(torch.Tensor, mode.from_tensor, inputs)


def record_zero_cost(
    model: nn.Module,
    *args: Any,
    backward: bool = True,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    param_dtype: torch.dtype | None = None,
    timing: ComputeRates | None = None,
    **kwargs: Any,
) -> ExecutionOrder:
    """Record the execution order on a fake shadow of ``model``: no compute, no weight copy.

    The same recording as :func:`~tracing.runtime.record.record_execution_order`
    (module calls, parameter uses, gradient-ready order, recomputation), run
    with every parameter, buffer and example input replaced by a fake tensor
    for the duration of the run. Peak memory grows by the fake mode's
    bookkeeping only (a few hundred bytes per tensor), not by weights or
    activations (measured in ``benchmarks/zero_cost.py``).

    Args:
        model: the model, materialised or on the meta device; not wrapped by
            FSDP/DDP.
        *args: positional example inputs (real or meta tensors; their shapes,
            dtypes and devices are used, and the values of small real ones
            where a value decides what runs, see :class:`ShadowMode`).
        backward: also run one backward of the (fake) loss.
        loss_fn: maps the output to a scalar loss; default: the sum of every
            floating-point output tensor.
        param_dtype: run on parameters and inputs cast to it (:mod:`tracing.runtime.precision`).
        timing: compute rates (``CostModel.preset(...).compute``) to estimate
            each call's time and saved bytes with, op by op
            (:class:`~tracing.runtime.estimate.RooflineMode`), as
            ``record_execution_order(..., timing=rates)`` does; ``None``: no timing.
        **kwargs: keyword example inputs.

    Returns:
        An :class:`ExecutionOrder` with ``method == "runtime"`` and
        ``zero_cost == True``; ``warnings`` says where a seeded random draw
        decided control flow (a layer drop), if one did.

    Raises:
        TracingError: the fake run failed (a data-dependent op such as
            ``.item()`` or ``nonzero``, an op without a fake kernel, or any
            other error); the message names the innermost module (FQN and
            class), the op and the model's source line; ``module_fqn``,
            ``module_class`` and ``reason`` are set; the original error is
            chained. Also for an uninitialised lazy module and for a model
            wrapped by FSDP1/FSDP2/DDP (nothing is run then).

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> order = record_zero_cost(model, torch.randn(3, 4))
        >>> order.module_forward_order, order.zero_cost
        (['', '0', '1'], True)
    """
    param_dtype = _check_runnable(model, param_dtype, timing)
    mode = ShadowMode()
    rng = RngState()
    recorder: RuntimeRecorder | None = None
    try:
        with _quiet_fake_kernel_errors(), _fake_stand_ins(model, mode):
            fake_args, fake_kwargs = fake_inputs(mode, (args, kwargs))
            _know_inputs(mode, (args, kwargs))
            recorder = RuntimeRecorder(model, timing if timing is not None else False)
            with mode, cast_parameters(model, param_dtype):
                fake_args, fake_kwargs = cast_inputs((fake_args, fake_kwargs), param_dtype)
                record_step(recorder, model, fake_args, fake_kwargs, backward, loss_fn, param_dtype)
    except Exception as e:
        where = recorder.error_location(e) if recorder is not None else None
        raise fake_run_error(e, where) from e
    finally:
        rng.restore()
    order = recorder.order
    order.zero_cost = True
    order.warnings.extend(mode.known.notes)
    return order


def _check_runnable(
    model: nn.Module, param_dtype: torch.dtype | None, timing: ComputeRates | None
) -> torch.dtype | None:
    """``record_zero_cost``'s checks of its arguments; the checked ``param_dtype``."""
    check_no_lazy_modules(model)
    param_dtype = check_compute_dtype(param_dtype, "record_zero_cost")
    if timing is not None and not isinstance(timing, ComputeRates):
        raise TypeError(
            "record_zero_cost: timing must be a tracing.rates.ComputeRates (e.g. "
            f"CostModel.preset(...).compute) or None, got {type(timing).__name__}"
        )
    wrapped = distributed_wrapper(model)
    if wrapped is not None:
        raise wrapped_error(
            wrapped,
            lambda where, label: (
                f"zero-cost runtime capture cannot run {where}: it is wrapped by {label}, "
                "whose forward runs collectives on real shards. Capture before wrapping, or "
                "record a real step with RuntimeRecorder(model)."
            ),
        )
    return param_dtype


def _know_inputs(mode: ShadowMode, inputs: Any) -> None:
    """The values of the example inputs (real tensors in lists, tuples and dicts) are known."""
    for real in pytree.tree_leaves(inputs):
        if isinstance(real, torch.Tensor):
            mode.known.add(mode.from_tensor(real), real)


class _DropFakeKernelErrors(logging.Filter):
    """Drops FakeTensorMode's own "failed while attempting to run meta for OP" log
    (logged at ERROR with a traceback before it raises): the error reaches the
    caller as one :class:`TracingError` instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("failed while attempting to run meta")


@contextmanager
def _quiet_fake_kernel_errors() -> Iterator[None]:
    """:class:`_DropFakeKernelErrors` on torch's fake-tensor logger for one run."""
    fake_logger = logging.getLogger("torch._subclasses.fake_tensor")
    drop = _DropFakeKernelErrors()
    fake_logger.addFilter(drop)
    try:
        yield
    finally:
        fake_logger.removeFilter(drop)


def fake_run_error(error: BaseException, where: tuple[str, str] | None) -> TracingError:
    """The :class:`TracingError` for ``error``, raised during a fake run in module ``where``."""
    fqn, cls = where if where is not None else (None, None)
    loc = f"{module_phrase(fqn)} ({cls})" if fqn is not None else "the model"
    line = source_line(error)
    at = f" at {line}" if line else ""
    cause = fake_failure_cause(error)
    reason = f"{type(error).__name__}: {_first_line(error)}{at}: {cause}"
    logger.debug("zero-cost runtime capture failed in %s: %r", loc, error)
    return TracingError(
        f"zero-cost runtime capture (fake tensors) failed in {loc}: {reason}.",
        module_fqn=fqn,
        module_class=cls,
        reason=reason,
    )


def fake_failure_cause(error: BaseException) -> str:
    """Why a fake run raised ``error``, in words (no advice)."""
    if isinstance(error, (DataDependentOutputException, DynamicOutputShapeException)):
        return "the op's result depends on tensor values, which fake tensors do not have"
    if "DataDependent" in type(error).__name__:  # GuardOnDataDependentSymNode and kin
        return "Python code branched on a tensor value, which fake tensors do not have"
    if isinstance(error, UnsupportedOperatorException):
        return "the op has no fake (meta) kernel"
    return "the model raised on fake tensors"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""
