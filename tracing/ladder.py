"""The capture ladder: symbolic, then zero-cost runtime, then real runtime.

:func:`run_ladder` is what :func:`tracing.capture.capture_execution_order`
does, step by step:

1. **symbolic** (with a :class:`~tracing.config.TracingConfig`):
   :func:`~tracing.symbolic.trace_execution_order`, with the example inputs
   bound to ``forward``'s signature. When example inputs are given, a
   successful trace is **checked** against step 2 on the same inputs (against
   step 3 when step 2 cannot run them), unless ``check=False``; if the orders
   differ (a branch taken on a Proxy that the real call does not
   take), the runtime order is used, one WARNING is logged and
   ``fallback_reason`` says where they first differ
   (:func:`~tracing.order_diff.first_difference`).
2. **zero-cost runtime** (with example inputs):
   :func:`~tracing.runtime.shadow.record_zero_cost`, the recording run on
   fake tensors: no compute, no weight copy.
3. **real runtime**: :func:`~tracing.runtime.record_execution_order`, one
   real forward/backward, when step 2 cannot decide (a value-dependent op);
   never for a model built under fake tensors (its parameters are
   ``FakeTensor`` s: step 2's error is raised).

Every step that was tried and skipped adds one line to ``fallback_reason``
(module FQN and class, the cause, what would help); one INFO line is logged
when a later step is used. A model wrapped by FSDP1/FSDP2/DDP skips steps 1
and 2 (both would run the wrapper's forward on stand-ins) and is recorded for
real with its original FQNs, or refused without example inputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensor

from tracing.config import TracingConfig
from tracing.errors import TracingError
from tracing.fqn import module_phrase
from tracing.order import ExecutionOrder
from tracing.order_diff import first_difference
from tracing.preconditions import check_no_lazy_modules, distributed_wrapper, wrapped_error
from tracing.rates import ComputeRates
from tracing.runtime import record_execution_order
from tracing.runtime.shadow import record_zero_cost
from tracing.symbolic import trace_execution_order

__all__ = ["run_ladder"]

logger = logging.getLogger(__name__)


def _where(e: TracingError) -> str:
    """``module 'a' (Cls)``, ``the root module <root> (Cls)`` or ``an unknown module``."""
    where = "an unknown module" if e.module_fqn is None else module_phrase(e.module_fqn)
    return where + (f" ({e.module_class})" if e.module_class else "")


def _line(step: str, e: TracingError) -> str:
    """One ``fallback_reason`` line: the step, where, why and what would help."""
    what = e.reason or str(e).splitlines()[0]
    advice = f"; {e.advice}" if e.advice else ""
    return f"{step} failed in {_where(e)}: {what}{advice}"


def _no_inputs_error(e: TracingError) -> TracingError:
    """Symbolic capture failed and there is nothing to run: say to pass inputs."""
    return TracingError(
        f"cannot capture the execution order: symbolic tracing failed in {_where(e)} and no "
        f"example inputs were given for runtime capture ({e.reason or str(e).splitlines()[0]}). "
        "Pass example_inputs (and example_kwargs) to capture_execution_order to capture at "
        f"run time instead.\nTracing error: {e}",
        module_fqn=e.module_fqn,
        module_class=e.module_class,
        reason=e.reason,
        advice=e.advice,
    )


def run_ladder(
    model: nn.Module,
    config: TracingConfig | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    has_inputs: bool,
    backward: bool,
    check: bool,
    timing: ComputeRates | None = None,
) -> ExecutionOrder:
    """Capture ``model``'s order by the first step of the ladder that works.

    Args and raises: as :func:`tracing.capture.capture_execution_order`.
    """
    check_no_lazy_modules(model)
    if timing is not None and not has_inputs:
        raise ValueError(
            "capture_execution_order: timing needs example_inputs (the times are estimated "
            "op by op on a recorded run; a symbolic trace has none)"
        )
    if config is not None and not isinstance(config, TracingConfig):
        raise TypeError(
            f"capture_execution_order: tracing_config must be a TracingConfig or None, "
            f"got {type(config).__name__}"
        )
    wrapped = distributed_wrapper(model)
    if wrapped is not None:
        return _wrapped(model, wrapped, args, kwargs, has_inputs=has_inputs, backward=backward)
    step = _Steps(model, args, kwargs, backward, timing)
    reasons: list[str] = []
    if config is not None:
        symbolic, failed = _symbolic(model, config, args, kwargs, has_inputs=has_inputs)
        if symbolic is not None:
            if has_inputs and (check or timing is not None):
                return _checked(symbolic, step)
            return symbolic
        assert failed is not None
        if not has_inputs:
            raise _no_inputs_error(failed) from failed
        reasons.append(_line("symbolic tracing", failed))
    elif not has_inputs:
        raise TracingError(
            "cannot capture the execution order: no tracing_config (for symbolic capture) "
            "and no example_inputs (for runtime capture) were given. Pass example_inputs "
            "(and example_kwargs) to capture at run time, or a TracingConfig for a "
            "symbolically traceable model."
        )
    zero, zero_failed = step.zero_cost()
    if zero is not None:
        return _with_reasons(zero, reasons)
    assert zero_failed is not None
    if _fake_parameters(model):
        raise zero_failed
    reasons.append(_line("zero-cost runtime capture", zero_failed) + "; the real model was run")
    return _with_reasons(step.real(), reasons)


def _fake_parameters(model: nn.Module) -> bool:
    """Whether ``model`` was built under fake tensors: it has no real step to run (one
    would be a fake run without the shadow's known values and shape rules)."""
    return any(isinstance(p, FakeTensor) for p in model.parameters())


def _with_reasons(order: ExecutionOrder, reasons: list[str]) -> ExecutionOrder:
    if reasons:
        order.fallback_reason = "; ".join(reasons)
        logger.info("capture fell back to %s: %s", order.capture_step, order.fallback_reason)
    return order


def _symbolic(
    model: nn.Module,
    config: TracingConfig,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    has_inputs: bool,
) -> tuple[ExecutionOrder | None, TracingError | None]:
    inputs: dict[str, Any] = {"example_inputs": args, "example_kwargs": kwargs}
    try:
        return trace_execution_order(model, config, **(inputs if has_inputs else {})), None
    except TracingError as e:
        return None, e
    except TypeError as e:  # the example inputs do not fit forward's signature
        return None, TracingError(
            str(e),
            module_fqn="",
            module_class=type(model).__name__,
            reason=str(e),
            advice="runtime capture calls the model as given",
        )


@dataclass
class _Steps:
    """The runtime steps of the ladder for one call: zero-cost, then real."""

    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    backward: bool
    timing: ComputeRates | None

    def zero_cost(self) -> tuple[ExecutionOrder | None, TracingError | None]:
        try:
            order = record_zero_cost(
                self.model, *self.args, backward=self.backward, timing=self.timing, **self.kwargs
            )
        except TracingError as e:
            return None, e
        return order, None

    def real(self) -> ExecutionOrder:
        timing = self.timing if self.timing is not None else False
        return record_execution_order(
            self.model, *self.args, backward=self.backward, timing=timing, **self.kwargs
        )


def _checked(symbolic: ExecutionOrder, step: _Steps) -> ExecutionOrder:
    """The symbolic order if a runtime recording of the same call agrees, else the recording.

    The recording is zero-cost when the fake run works, else one real
    forward/backward (whose errors, e.g. inputs of the wrong shape, propagate).
    With ``timing``, the recording (which has the times) is returned when they agree.
    """
    runtime, failed = step.zero_cost()
    reasons = []
    if runtime is None:
        assert failed is not None
        reasons.append(_line("zero-cost runtime capture", failed) + "; the real model was run")
        logger.info("checking the symbolic order with a real run: %s", reasons[0])
        runtime = step.real()
    where = first_difference(symbolic, runtime, a_name="the trace", b_name="the run")
    if where is None:
        if step.timing is not None:
            runtime.fallback_reason = "; ".join(reasons) or None
            runtime.warnings.extend(symbolic.warnings)
            return runtime
        return symbolic
    reasons.insert(
        0,
        f"the symbolic trace differs from a {runtime.capture_step} run of the example inputs: "
        f"{where} (the trace took a branch the real call does not take, e.g. on an argument "
        "that was a Proxy); the runtime order is used",
    )
    runtime.fallback_reason = "; ".join(reasons)
    runtime.warnings.extend(symbolic.warnings)
    logger.warning("%s: %s", type(step.model).__name__, runtime.fallback_reason)
    return runtime


def _wrapped(
    model: nn.Module,
    wrapped: tuple[str, str, str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    has_inputs: bool,
    backward: bool,
) -> ExecutionOrder:
    """A model wrapped by FSDP/DDP: a real recorded step, or a refusal."""
    if not has_inputs:
        raise wrapped_error(
            wrapped,
            lambda where, label: (
                f"cannot capture the execution order: {where} is wrapped by {label}, and "
                "symbolic or zero-cost capture would run the wrapper's forward on stand-ins, "
                "leaving it unusable for training; nothing was changed. Capture before "
                "wrapping, or pass example_inputs to record one real forward/backward "
                "(original FQNs)."
            ),
        )
    fqn, cls, label = wrapped
    order = record_execution_order(model, *args, backward=backward, **kwargs)
    return _with_reasons(
        order,
        [
            f"symbolic and zero-cost runtime capture skipped: {module_phrase(fqn)} ({cls}) is wrapped by {label}, "
            "whose forward cannot run on Proxies or fake tensors; capture before wrapping "
            "to avoid a real step"
        ],
    )
