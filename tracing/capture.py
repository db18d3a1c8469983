"""One entry point for order capture: the capture ladder.

:func:`capture_execution_order` gets an order by the cheapest step that is
right for the model (:mod:`tracing.ladder`): ``torch.fx`` symbolic capture
when a :class:`~tracing.config.TracingConfig` is given (no inputs needed, meta
device fine), else, or when tracing fails, a recording on a fake shadow of the
model (zero-cost: no compute, no weight copy), else one real forward and
backward. With example inputs, a symbolic order is checked against the
zero-cost recording of the same call and replaced by it when they differ.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from tracing.config import TracingConfig
from tracing.ladder import run_ladder
from tracing.order import ExecutionOrder
from tracing.rates import ComputeRates
from tracing.symbolic.signature import as_args

__all__ = ["capture_execution_order"]


def capture_execution_order(
    model: nn.Module,
    tracing_config: TracingConfig | None = None,
    example_inputs: tuple[Any, ...] | torch.Tensor | None = None,
    example_kwargs: dict[str, Any] | None = None,
    backward: bool = True,
    *,
    check: bool = True,
    timing: ComputeRates | None = None,
) -> ExecutionOrder:
    """Capture ``model``'s execution order: symbolic, zero-cost runtime, or real runtime.

    The ladder (:mod:`tracing.ladder`):

    1. With ``tracing_config``: symbolic capture (:func:`~tracing.symbolic.trace_execution_order`;
       example inputs, when given, are bound to ``forward``'s signature, every argument not
       passed keeps its default). With example inputs and ``check``, the trace is compared
       with step 2 (step 3 if step 2 cannot run them); when they differ, the runtime order
       is returned, one WARNING is logged on ``tracing.ladder`` and ``fallback_reason``
       says where they first differ (call index, the module each has there).
    2. With example inputs: zero-cost runtime capture
       (:func:`~tracing.runtime.shadow.record_zero_cost`, fake tensors; ``order.zero_cost``).
    3. Otherwise real runtime capture (:func:`~tracing.runtime.record_execution_order`);
       not for a model built under fake tensors.

    ``fallback_reason`` has one line (``"; "``-joined) per step tried and skipped: where it
    failed (module FQN and class), why, and what would help; one INFO line is logged when a
    later step is used. ``order.capture_step`` names the step used. The model and the inputs
    are never changed (state_dict, buffers, hooks, ``requires_grad``, training flags,
    ``.grad`` of parameters and inputs), also when capture fails.

    Args:
        model: the model (may be on the meta device: the real runtime step then needs
            meta inputs and shape-only control flow). Wrapped by FSDP1/FSDP2/DDP: recorded
            by one real step (original FQNs), never traced.
        tracing_config: how to trace symbolically, or ``None`` to start at
            step 2.
        example_inputs: positional inputs for one forward: a tuple of arguments, or a
            single tensor (any other non-tuple value is one positional argument).
        example_kwargs: keyword inputs for that forward.
        backward: runtime capture also runs one backward (gradient-ready order).
        check: check a symbolic order against a runtime recording of the example inputs:
            one fake forward/backward (measured in ``benchmarks/zero_cost.py``), or one
            real one when the fake run cannot decide.
        timing: compute rates (``CostModel.preset(...).compute``) to estimate each call's
            time with on the runtime step (for :func:`execwrap.simulate_step`); needs
            example inputs. A symbolic order has no times: with ``timing``, the runtime
            recording that checks it is returned when the two agree.

    Returns:
        The :class:`ExecutionOrder`.

    Raises:
        TracingError: symbolic capture failed without example inputs (the message names
            the failing module and says to pass ``example_inputs``); neither a config nor
            inputs; an uninitialised lazy module; a wrapped model without inputs; real
            runtime capture on the meta device hit a value-dependent op; zero-cost capture
            failed on a model built under fake tensors (no real step to run).
        ValueError: a ``concrete_args`` name that ``forward`` does not take;
            ``timing`` without example inputs.
        TypeError: ``tracing_config`` is not a ``TracingConfig``.
        Exception: what the model raises during real runtime capture.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> capture_execution_order(model, example_inputs=torch.randn(3, 4)).capture_step
        'zero-cost runtime'
    """
    has_inputs = example_inputs is not None or example_kwargs is not None
    args, kwargs = as_args(example_inputs), dict(example_kwargs or {})
    return run_ladder(
        model,
        tracing_config,
        args,
        kwargs,
        has_inputs=has_inputs,
        backward=backward,
        check=check,
        timing=timing,
    )
