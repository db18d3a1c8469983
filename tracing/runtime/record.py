"""Self-contained runtime capture: one forward (and backward) that leaves no trace.

:func:`record_execution_order` runs the model once under a
:class:`~tracing.runtime.recorder.RuntimeRecorder` and puts back what running
changed (:class:`~tracing.model_state.SavedModelState`: gradients, buffers,
RNG states). When the model raises, the error names the module it came from:
on the meta device as a :class:`~tracing.errors.TracingError` that says why
meta execution failed, otherwise as a note added to the model's own error.
Timed on CPU, a WARNING says when the timed steps' gradients held denormal values,
which CPUs compute several times slower (``torch.set_flush_denormal(True)`` avoids them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.nn as nn

from tracing.errors import TracingError
from tracing.fqn import module_phrase
from tracing.model_state import SavedModelState
from tracing.nested import default_loss, tensors_in
from tracing.order import ExecutionOrder
from tracing.preconditions import check_no_lazy_modules, distributed_wrapper
from tracing.rates import ComputeRates
from tracing.runtime.hook_cost import without_hook_cost
from tracing.runtime.param_map import ParamMap
from tracing.runtime.precision import as_dtype
from tracing.runtime.recorder import RuntimeRecorder, timing_clock
from tracing.runtime.timing import CallTimer, Clock

__all__ = ["TIMED_STEPS", "record_execution_order"]

#: Steps timed by ``record_execution_order(..., timing=True)``; the median one is kept.
TIMED_STEPS = 3
#: Slowest / fastest timed step above which the timing gets a WARNING (a busy machine),
#: when they also differ by more than :data:`TIMING_SPREAD_MIN_S` (steps of a few
#: milliseconds vary by more than this ratio on any machine).
TIMING_SPREAD_WARN = 1.5
TIMING_SPREAD_MIN_S = 0.005

logger = logging.getLogger(__name__)


def record_execution_order(
    model: nn.Module,
    *args: Any,
    backward: bool = True,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    timing: bool | ComputeRates = False,
    param_dtype: torch.dtype | None = None,
    **kwargs: Any,
) -> ExecutionOrder:
    """Capture the execution order by running one forward (and backward).

    Runs ``model(*args, **kwargs)`` once under a :class:`RuntimeRecorder`,
    then, when ``backward``, ``loss_fn(output).backward()``. Afterwards the
    model is as before: hooks removed, ``.grad`` of every parameter exactly
    what it was (``None`` stays ``None``; existing gradients keep their tensor
    and values), buffers (e.g. BatchNorm statistics) restored, and the CPU and
    CUDA RNG states restored so the user's random stream does not shift (and,
    unless the model is wrapped by FSDP/DDP, the values of plain tensor
    attributes). The training flag, ``requires_grad`` and autograd's mode are never
    touched (under ``torch.no_grad()`` no backward runs; ``order.warnings`` says so).

    Runs on the meta device too (nothing allocated), if control flow depends on shapes only.

    ``timing=True`` times :data:`TIMED_STEPS` more steps under a
    :class:`~tracing.runtime.timing.CallTimer` alone (the recorded step is their warm-up)
    and keeps the median one's per-call times (on CPU less the timer's own cost per call:
    :mod:`tracing.runtime.hook_cost`) and saved bytes (``"measured"``), with the
    matmul/attention outputs and transient memory of the recorded step's ops
    (:mod:`tracing.runtime.op_record`); ``timing=rates`` (:class:`~tracing.rates.ComputeRates`,
    e.g. ``cost_model.compute``) estimates the recorded step op by op (``"estimated"``).

    Args:
        model: the model; may be wrapped by FSDP1/FSDP2 (see
            :class:`RuntimeRecorder`).
        *args: positional inputs of ``model``.
        backward: also run one backward pass and record gradient-ready order,
            module backward order and checkpoint recomputation.
        loss_fn: maps the output to a scalar loss; default: the sum of every
            floating-point tensor in the output (nested tuples, lists, dicts,
            dataclasses, ``ModelOutput``).
        timing: ``False``, ``True`` (measure) or the rates to estimate with.
        param_dtype: run on parameters and inputs cast to this dtype, as FSDP2's
            ``MixedPrecisionPolicy`` does (:mod:`tracing.runtime.precision`; free on meta).
        **kwargs: keyword inputs of ``model``.

    Returns:
        An :class:`ExecutionOrder` with ``method == "runtime"``.

    Raises:
        TracingError: on the meta device, an op needed tensor values (``.item()``,
            a tensor-valued ``if``), naming the module; or a lazy module is uninitialised.
        TypeError: ``loss_fn`` did not return a tensor, or a bad ``param_dtype``.
        ValueError: ``timing=True`` on the meta device or fake tensors.
        Exception: whatever the model raises otherwise, unchanged (with a
            note naming the innermost module).

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> order = record_execution_order(model, torch.randn(3, 4))
        >>> order.param_forward_order
        ['0.weight', '0.bias', '1.weight', '1.bias']
    """
    check_no_lazy_modules(model)
    clock = timing_clock(model, True) if timing is True else None
    saved = SavedModelState(model, tensor_attributes=distributed_wrapper(model) is None)
    input_grads = _InputGrads((args, kwargs))
    recorder: RuntimeRecorder | None = None
    try:
        if backward:
            saved.clear_grads()  # fresh grads; the originals are put back below
        recorder = RuntimeRecorder(model, timing)
        steps = (backward, loss_fn, param_dtype, clock, saved)
        order = _record_and_time(recorder, model, args, kwargs, *steps)
    except Exception as e:
        where = recorder.error_location(e) if recorder is not None else None
        _raise_located(e, where, meta=_is_meta(model, args, kwargs))
    finally:
        saved.restore()
        input_grads.restore()
    return order


def _record_and_time(
    recorder: RuntimeRecorder,
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    backward: bool,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    param_dtype: torch.dtype | None,
    clock: Clock | None,
    saved: SavedModelState,
) -> ExecutionOrder:
    """The recorded step in ``param_dtype`` (:func:`record_step`), then, with a
    ``clock``, the timed ones (:func:`_timed_step`)."""
    with as_dtype(model, (args, kwargs), param_dtype, "record_execution_order") as inputs:
        args, kwargs = inputs
        order = record_step(recorder, model, args, kwargs, backward, loss_fn, param_dtype)
        if clock is not None:
            order = _timed_step(model, args, kwargs, order, clock, saved, backward, loss_fn)
    return order


def record_step(
    recorder: RuntimeRecorder,
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    backward: bool,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    param_dtype: torch.dtype | None,
) -> ExecutionOrder:
    """The recorded step's order (``param_dtype``: the dtype the parameters were cast to)."""
    with recorder:  # in the caller's grad mode: under no_grad, no backward (the order says so)
        run_step(model, args, kwargs, backward=backward, loss_fn=loss_fn, timer=recorder.timer)
    order = recorder.order
    if param_dtype is not None:
        order.param_dtype = str(param_dtype).removeprefix("torch.")
    return order


def _timed_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    order: ExecutionOrder,
    clock: Clock,
    saved: SavedModelState,
    backward: bool,
    loss_fn: Callable[[Any], torch.Tensor] | None,
) -> ExecutionOrder:
    """``order`` with the timing of the median of :data:`TIMED_STEPS` more steps (by
    their total time), each run under a :class:`CallTimer` alone."""
    params = ParamMap(model)
    timed: list[dict[str, Any]] = []
    try:
        for _ in range(TIMED_STEPS):
            if backward:
                saved.clear_grads()
            timer = CallTimer(params.modules, clock)
            try:
                run_step(model, args, kwargs, backward=backward, loss_fn=loss_fn, timer=timer)
            finally:
                timer.remove()
            if timer.num_calls != len(order.module_forward_order):
                logger.warning(
                    "record_execution_order: a timed step made %s module calls, the recorded one "
                    "%s; the order has no timing",
                    timer.num_calls,
                    len(order.module_forward_order),
                )
                return _without_timing(order)
            timed.append(timer.fields("measured"))
    finally:
        params.clear()
    if backward and clock.device_type == "cpu":
        _warn_denormal_grads(model)
    timed.sort(key=_step_seconds)
    fastest, slowest = _step_seconds(timed[0]), _step_seconds(timed[-1])
    if slowest - fastest > TIMING_SPREAD_MIN_S and slowest > TIMING_SPREAD_WARN * fastest:
        logger.warning(
            "record_execution_order: the %d timed steps took %.1f to %.1f ms (the slowest "
            "%.2fx the fastest); the machine may be busy. The median step is kept; time "
            "again on a quiet machine before planning from these times",
            len(timed),
            fastest * 1e3,
            slowest * 1e3,
            slowest / fastest,
        )
    # a measured order keeps its forward's transient bytes (a language model's logits until
    # the loss has used them: 6.6% of the peak of a 4-micro-batch step whose peak comes at
    # the end of forward, benchmarks/results/training_step-2026-12-05_111752.md) but not its
    # backward's: the recorded step holds each parameter's gradient until autograd has
    # accumulated it (a tied weight's until both uses' are summed), which the simulator
    # prices as FSDP's unsharded gradients already; counted again they over-predicted CPU
    # peaks against FSDP's memory tracker by 9-19% (tests/distributed/test_simulate_fsdp2.py)
    kept = timed[len(timed) // 2]
    if clock.device_type == "cpu":  # the timer's own cost off the forward times
        kept, per_call = without_hook_cost(kept)
        logger.debug("record_execution_order: the timer's cost, %.2f µs per call, taken off",
                     per_call * 1e6)  # fmt: skip
    empty = ExecutionOrder()
    return dataclasses.replace(
        order,
        **kept,
        backward_transient_bytes=empty.backward_transient_bytes,
    )


def _warn_denormal_grads(model: nn.Module) -> None:
    """WARNING when the timed steps' float32/float64 gradients hold denormal values
    (nonzero, below the dtype's smallest normal number, e.g. 1.18e-38 in float32): CPUs
    compute those through microcode assists, several times slower (a 192-wide GPT of
    ``benchmarks/training_step.py`` whose float32 gradients held 9,196 of them: forward and
    backward 4.4x slower on an Intel Xeon, varying from step to step), which the measured
    times would carry into every prediction made from them."""
    counts: dict[str, int] = {}
    for name, p in model.named_parameters():
        g = p.grad
        if g is None or g.dtype not in (torch.float32, torch.float64) or g.is_sparse:
            continue
        n = int(((g != 0) & (g.abs() < torch.finfo(g.dtype).tiny)).sum())
        if n:
            counts[name] = n
    if counts:
        worst = max(counts, key=lambda k: counts[k])
        logger.warning(
            "record_execution_order: %d gradient elements are denormal (nonzero, below their "
            "dtype's smallest normal number; most in %r: %d); a CPU computes such values "
            "several times slower, so the measured times may be too long. Call "
            "torch.set_flush_denormal(True) and record again (GPUs compute them at full speed)",
            sum(counts.values()),
            worst,
            counts[worst],
        )


def _without_timing(order: ExecutionOrder) -> ExecutionOrder:
    """``order`` without what the recorded step's own timer measured (its times carry
    the recorder's overhead): the fields of an order captured without timing."""
    empty = ExecutionOrder()
    names = (
        "forward_times_s",
        "forward_start_s",
        "backward_start_s",
        "backward_end_s",
        "backward_times_s",
        "saved_activation_bytes",
        "input_activation_bytes",
        "compute_ops",
        "forward_transient_bytes",
        "backward_transient_bytes",
        "forward_op_counts",
        "timing_device",
        "timing_method",
    )
    return dataclasses.replace(order, **{n: getattr(empty, n) for n in names})


def _step_seconds(fields: dict[str, Any]) -> float:
    """Total seconds of a timed step: to the end of backward, else of forward."""
    end = fields.get("backward_end_s")
    if end is not None:
        return float(end)
    return max(
        (s + d for s, d in zip(fields["forward_start_s"], fields["forward_times_s"], strict=True)),
        default=0.0,
    )


def run_step(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    backward: bool,
    loss_fn: Callable[[Any], torch.Tensor] | None,
    timer: CallTimer | None = None,
) -> None:
    """One forward, then (when ``backward``) one backward of its loss (whose saved
    tensors ``timer`` counts for the root call). The output is let go before the
    backward, as training loops do (torchtitan's ``del pred``), so that what the
    backward keeps alive is the loss's own."""
    output = model(*args, **kwargs)
    if not backward:
        return
    with timer.count_saved() if timer is not None else contextlib.nullcontext():
        loss = (loss_fn or default_loss)(output)
    del output
    if loss is not None and not isinstance(loss, torch.Tensor):
        raise TypeError(f"loss_fn must return a torch.Tensor, got {type(loss).__name__}")
    if loss is None or not loss.requires_grad:
        logger.debug("runtime capture: the loss needs no grad; skipping backward")
    else:
        (loss if loss.dim() == 0 else loss.sum()).backward()


class _InputGrads:
    """The ``.grad`` of every leaf input tensor that requires grad, put back by :meth:`restore`.

    The inputs' ``.grad`` is set to ``None`` for the run, so that backward
    accumulates into a fresh tensor and never into the user's gradient.
    """

    def __init__(self, inputs: Any) -> None:
        self._grads = [(t, t.grad) for t in tensors_in(inputs) if t.is_leaf and t.requires_grad]
        for t, _ in self._grads:
            t.grad = None

    def restore(self) -> None:
        for t, grad in self._grads:
            t.grad = grad


def _raise_located(error: Exception, where: tuple[str, str] | None, *, meta: bool) -> NoReturn:
    """Re-raise ``error`` naming the module it came from: on the meta device as a
    :class:`TracingError` that says why meta execution failed, else with a note."""
    if meta and not isinstance(error, TypeError):
        raise _meta_error(error, where) from error
    if where is not None and hasattr(error, "add_note"):
        error.add_note(f"While recording the execution order, in {_located(*where)}")
    raise error


def _is_meta(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if any(p.is_meta for p in model.parameters()):
        return True
    return any(t.is_meta for t in tensors_in((args, kwargs)))


def _located(fqn: str, cls: str) -> str:
    """``module 'a.b' (Linear)``; ``the root module <root> (Net)`` for the root."""
    return f"{module_phrase(fqn)} ({cls})"


def _meta_error(error: Exception, where: tuple[str, str] | None) -> TracingError:
    """The :class:`TracingError` for ``error`` raised while running on meta."""
    fqn, cls = where if where is not None else (None, None)
    loc = _located(*where) if where is not None else "the model"
    return TracingError(
        f"runtime capture on the meta device failed in {loc}: {error}. Meta execution "
        "needs shape-only control flow: a value-dependent op (e.g. .item(), "
        "`if tensor:`, nonzero) cannot run on meta tensors. Make that control "
        "flow depend on shapes only, or capture with small real inputs on CPU.",
        module_fqn=fqn,
        module_class=cls,
    )
