"""The runtime recorder: a model's execution order, recorded while it really runs.

:class:`RuntimeRecorder` installs its hooks (:mod:`tracing.runtime.hooks`)
when created and records, until it is removed, every module call (repeats
kept), every parameter use (:mod:`tracing.runtime.use_mode`), gradient-ready
order (:mod:`tracing.runtime.backward`) and activation-checkpointing
recomputation: a module call made while autograd runs a backward pass
(``torch._C._current_graph_task_id() != -1``) is a recompute, kept apart from
the forward order. Names come from :mod:`tracing.runtime.param_map`.
"""

from __future__ import annotations

import enum
import logging
import sys
from types import TracebackType
from typing import Any

import torch
import torch.nn as nn

from tracing.fqn import is_wrapper_module, original_class_name
from tracing.order import ExecutionOrder, ParamUse
from tracing.rates import ComputeRates
from tracing.runtime.backward import GradReadyOrder, module_backward_order
from tracing.runtime.call_stack import CallKind, CallStack
from tracing.runtime.estimate import FusedAttentionMode, RooflineMode
from tracing.runtime.hooks import HookSet
from tracing.runtime.op_record import OpRecordMode
from tracing.runtime.param_map import ParamMap
from tracing.runtime.step_calls import NO_AUTOGRAD_WARNING, StepCalls, keep_calls
from tracing.runtime.timing import CallTimer, Clock, CudaClock, PerfClock, VirtualClock
from tracing.runtime.use_mode import ParamUseMode

__all__ = ["RecorderState", "RuntimeRecorder", "timing_clock"]

logger = logging.getLogger(__name__)


class RecorderState(enum.Enum):
    """Life cycle of a :class:`RuntimeRecorder` (like FSDP2's ``TrainingState``)."""

    #: Hooks installed, recording every forward/backward that runs.
    RECORDING = "recording"
    #: Hooks removed; :attr:`RuntimeRecorder.order` is available.
    FINISHED = "finished"
    #: Hooks removed after the recorded block raised; no order.
    FAILED = "failed"


class RuntimeRecorder:
    """Record a model's execution order while it really runs.

    Creating the recorder installs forward pre-/post-hooks on every module and
    gradient-ready hooks on every trainable parameter; every forward and
    backward that runs until :meth:`remove` (or the end of the ``with`` block)
    is recorded. While a module's forward runs, a
    :class:`torch.overrides.TorchFunctionMode` reports every torch call that
    takes a parameter (at any nesting depth, by keyword, inside lists or
    tuples). The mode is pushed when the outermost recorded module starts and
    popped when it ends, so backward and code outside the model run without it.

    Names are those of the original model: on a model wrapped by FSDP1
    (``FullyShardedDataParallel``), ``CheckpointWrapper`` or ``torch.compile``
    the wrappers are skipped and their prefixes (``_fsdp_wrapped_module.``,
    ``_checkpoint_wrapped_module.``, ``_orig_mod.``) removed; FSDP2
    (``fully_shard``) keeps names, and its ``FSDP<Name>`` classes are reported
    as ``<Name>``. Parameters that a wrapper swaps in during forward (FSDP2's
    unsharded parameters, FSDP1's unsharded views with ``use_orig_params=True``)
    are recognised by module and attribute name when the module is called.
    A wrapper's own tensor calls (FSDP1's unshard/reshard around the wrapped
    module) are not recorded as uses. With FSDP1 ``use_orig_params=True`` the
    gradient-ready order comes from tensor hooks on the unsharded views, which
    autograd runs in the views' creation order: it is exact per FSDP unit, but
    inside a unit it can differ from the unwrapped model's order.
    With FSDP1 ``use_orig_params=False`` the original parameters no longer
    exist as tensors of their own: ``params`` and the backward order name the
    ``FlatParameter`` of each unit (``<unit>._flat_param``), and forward uses
    of the original parameters are not seen.

    The recorder never changes the model and does not touch ``.grad`` or the
    RNG (use :func:`record_execution_order` for a self-contained capture that
    restores them).

    The order holds the calls of one step: when some top-level calls run in
    training mode with autograd and others do not (a ``generate`` loop under
    ``torch.no_grad()``, an evaluation pass), the others are left out, with a
    note in ``order.warnings`` (:mod:`tracing.runtime.step_calls`). The order
    records the mode of its calls (``training``, ``grad_enabled``); one
    recorded without autograd has no backward order, and says so.

    With ``timing``, the order also gets per-call compute times and saved
    activation bytes (:mod:`tracing.runtime.timing`): ``True`` measures them
    (``time.perf_counter_ns`` on CPU, CUDA events on GPU; the times include
    the recorder's own hooks, a few percent, and whatever the first step
    costs extra: :func:`record_execution_order` times a second, clean step);
    a :class:`~tracing.rates.ComputeRates` estimates them with a roofline per
    op (:mod:`tracing.runtime.estimate`), the way to time a model on the meta
    device or under fake tensors. Either way the recorder also records, per call,
    the matmul and attention outputs (with their measured or estimated seconds) and
    the transient memory (:mod:`tracing.runtime.op_record`).

    Args:
        model: the model (wrapped or not); any ``nn.Module``.
        timing: ``False``, ``True`` (measure) or the rates to estimate with.

    Attributes:
        state: the recorder's :class:`RecorderState`.
        timer: the :class:`~tracing.runtime.timing.CallTimer` (``None``
            without ``timing``).

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> with RuntimeRecorder(model) as rec:
        ...     model(torch.randn(3, 4)).sum().backward()
        >>> rec.order.module_forward_order
        ['', '0', '1', '2']
        >>> rec.order.param_backward_order
        ['2.bias', '2.weight', '0.bias', '0.weight']
    """

    def __init__(self, model: nn.Module, timing: bool | ComputeRates = False) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"RuntimeRecorder needs an nn.Module, got {type(model).__name__}")
        clock = timing_clock(model, timing) if timing is not False else None
        self.state = RecorderState.RECORDING
        self._order: ExecutionOrder | None = None

        self._params = ParamMap(model)
        self._module_forward_order: list[str] = []
        self._module_call_depths: list[int] = []
        self._param_forward_order: list[str] = []
        self._seen_params: set[str] = set()
        self._param_uses: list[ParamUse] = []
        self._recompute_order: list[str] = []
        self._steps = StepCalls()
        self._backward = GradReadyOrder()
        self._calls = CallStack(ParamUseMode(self._params.fqn_of, self._on_use))
        #: innermost module an exception unwound through: (fqn, class, exc).
        self._error: tuple[str, str, BaseException] | None = None

        self._hooks = HookSet()
        self.timer: CallTimer | None = None
        self._roofline: RooflineMode | None = None
        self._fused_attention: FusedAttentionMode | None = None
        self._op_record: OpRecordMode | None = None
        try:
            for fqn, t in self._params.tensors.items():
                self._hooks.add_grad_ready_hook(t, fqn, self._on_grad_ready)
            self._hooks.add_forward_hooks(
                self._params.modules,
                pre_forward=self._pre_forward,
                pre_wrapper=self._pre_wrapper,
                post_forward=self._post_forward,
            )
            if clock is not None:
                self.timer = CallTimer(self._params.modules, clock, hooks=self._hooks)
                if isinstance(clock, VirtualClock):
                    self._fused_attention = FusedAttentionMode()
                    self._fused_attention.__enter__()
                if isinstance(clock, VirtualClock) and isinstance(timing, ComputeRates):
                    self._roofline = RooflineMode(timing, clock)
                    self._roofline.__enter__()
                # above the roofline (whose clock it reads), or timing real ops
                self._op_record = OpRecordMode(self.timer, clock)
                self._op_record.__enter__()
        except BaseException:
            if self._roofline is not None:
                self._roofline.__exit__(None, None, None)
            if self._fused_attention is not None:
                self._fused_attention.__exit__(None, None, None)
            self._hooks.remove()
            raise

    def _on_grad_ready(self, fqn: str, t: torch.Tensor) -> None:
        self._backward.on_ready(fqn, t)
        if self._op_record is not None:
            self._op_record.gradient_ready(t)

    # ----------------------------------------------------------------- hooks
    def _pre_wrapper(self, fqn: str, module: nn.Module, args: Any) -> None:
        self._calls.push(module, CallKind.WRAPPER, None)

    def _pre_forward(self, fqn: str, module: nn.Module, args: Any) -> None:
        calls = self._calls
        calls.suspend()  # the recorder's own tensor calls below are no uses
        for t, pfqn in self._params.swapped_in(module):
            self._hooks.add_grad_ready_hook(t, pfqn, self._on_grad_ready)
        if torch._C._current_graph_task_id() != -1:
            self._recompute_order.append(fqn)
            calls.push(module, CallKind.RECOMPUTE, None)
            return
        target = (fqn, len(self._module_forward_order))
        if calls.forward_depth() == 0:
            self._steps.top_level(target[1], fqn, module)
        self._module_forward_order.append(fqn)
        self._module_call_depths.append(calls.forward_depth())
        calls.push(module, CallKind.FORWARD, target)

    def _post_forward(self, fqn: str, module: nn.Module, args: Any, output: Any) -> None:
        # An exception is this call's own when it is being handled now but was
        # not when the call started (a call made inside an ``except`` block
        # sees the handled exception without raising it). The innermost call
        # sees a new exception first.
        handling = self._calls.pop(module)
        exc = sys.exc_info()[1]
        if exc is not None and exc is not handling and not is_wrapper_module(module):
            if self._error is None or self._error[2] is not exc:
                self._error = (fqn, original_class_name(module), exc)

    def _on_use(self, target: tuple[str, int], op: str, fqns: list[str]) -> None:
        if len(fqns) > 1:
            fqns = list(dict.fromkeys(fqns))
        for fqn in fqns:
            if fqn not in self._seen_params:
                self._seen_params.add(fqn)
                self._param_forward_order.append(fqn)
        self._param_uses.append(ParamUse(target[0], target[1], tuple(fqns), op))

    # ------------------------------------------------------------ life cycle
    def __enter__(self) -> RuntimeRecorder:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove(failed=exc is not None)

    def remove(self, *, failed: bool = False) -> None:
        """Remove every hook and mode; build :attr:`order` unless ``failed``.

        Safe to call more than once.

        Args:
            failed: the recorded code raised; no order is built.
        """
        if self.state is not RecorderState.RECORDING:
            return
        try:
            self._calls.clear()
            if self._op_record is not None:
                self._op_record.__exit__(None, None, None)
                self._op_record.close()
            if self._roofline is not None:
                self._roofline.__exit__(None, None, None)
            if self._fused_attention is not None:
                self._fused_attention.__exit__(None, None, None)
            if self.timer is not None:
                self.timer.remove()
        finally:
            self._hooks.remove()
            self._params.clear()
        if failed:
            self.state = RecorderState.FAILED
            return
        self._order = self._build_order()
        self.state = RecorderState.FINISHED

    @property
    def order(self) -> ExecutionOrder:
        """The recorded order (available after :meth:`remove` / the ``with`` block).

        Raises:
            RuntimeError: still recording, or the recorded block raised.
        """
        if self._order is None:
            if self.state is RecorderState.FAILED:
                raise RuntimeError(
                    "RuntimeRecorder has no order: the recorded forward/backward raised"
                )
            raise RuntimeError(
                "RuntimeRecorder.order is available after the `with` block ends or "
                "remove() is called"
            )
        return self._order

    def error_location(self, exc: BaseException) -> tuple[str, str] | None:
        """``(module FQN, class name)`` of the innermost module ``exc`` unwound through.

        Returns ``None`` if ``exc`` (or an exception it chains to) was not
        raised inside a recorded module's forward.
        """
        if self._error is None:
            return None
        fqn, cls, err = self._error
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen:
            if e is err:
                return fqn, cls
            seen.add(id(e))
            e = e.__cause__ or e.__context__
        return None

    def _timing_fields(self) -> dict[str, Any]:
        timer = self.timer
        if timer is None or timer.num_calls == 0:
            return {}
        if timer.num_calls != len(self._module_forward_order):
            logger.warning(
                "RuntimeRecorder: timed %s calls but recorded %s; the order has no timing",
                timer.num_calls,
                len(self._module_forward_order),
            )
            return {}
        fields = timer.fields("estimated" if self._roofline is not None else "measured")
        if self._op_record is not None:
            fields.update(self._op_record.fields(timer.num_calls))
        return fields

    def _build_order(self) -> ExecutionOrder:
        params = self._params
        fields: dict[str, Any] = dict(
            module_forward_order=list(self._module_forward_order),
            module_call_depths=list(self._module_call_depths),
            param_forward_order=list(self._param_forward_order),
            param_uses=list(self._param_uses),
            **self._timing_fields(),
        )
        calls = len(self._module_forward_order)
        keep = self._steps.kept(calls)
        if keep is not None:  # calls outside the training step (see step_calls)
            fields = keep_calls(fields, keep)
        mode = self._steps.mode()
        return ExecutionOrder(
            **fields,
            param_backward_order=list(self._backward.order),
            module_backward_order=module_backward_order(
                self._backward.order,
                fields["module_forward_order"],
                params.names,
                params.module_classes,
            ),
            recompute_order=list(self._recompute_order),
            shared_params={k: list(v) for k, v in params.shared.items()},
            params=params.param_infos(),
            module_classes=dict(params.module_classes),
            method="runtime",
            training=None if mode is None else mode.training,
            grad_enabled=None if mode is None else mode.grad_enabled,
            warnings=self._warnings(calls),
        )

    def _warnings(self, calls: int) -> list[str]:
        """Calls left out of the step, and a recording without autograd (each logged)."""
        out = []
        note = self._steps.left_out_note(calls)
        if note is not None:
            out.append(note)
        mode = self._steps.mode()
        if mode is not None and not mode.grad_enabled:
            out.append(NO_AUTOGRAD_WARNING)
        for line in out:
            logger.info("RuntimeRecorder: %s", line)
        return out


def timing_clock(model: nn.Module, timing: bool | ComputeRates) -> Clock:
    """The clock for ``timing`` on ``model``: virtual for rates, CUDA events for a CUDA
    model, ``perf_counter_ns`` otherwise.

    Raises:
        ValueError: ``timing=True`` on the meta device or under fake tensors,
            where nothing can be measured.
        TypeError: ``timing`` is neither a bool nor :class:`ComputeRates`.
    """
    if isinstance(timing, ComputeRates):
        return VirtualClock(timing.device_type)
    if timing is not True:
        raise TypeError(
            f"timing must be True, False or a tracing.rates.ComputeRates, got {type(timing).__name__}"
        )
    params = list(model.parameters())
    if any(p.is_meta or _is_fake(p) for p in params):
        raise ValueError(
            "timing=True needs real tensors: the model is on the meta device or under fake "
            "tensors, where nothing runs. Estimate instead: timing=cost_model.compute (a "
            "tracing.rates.ComputeRates with the target device's rates)"
        )
    if any(p.is_cuda for p in params):
        return CudaClock()
    return PerfClock()


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return bool(is_fake(t))
