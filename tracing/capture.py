"""One entry point for order capture: symbolic when possible, else at run time.

:func:`capture_execution_order` tries ``torch.fx`` symbolic capture when a
:class:`~tracing.config.TracingConfig` is given (no inputs needed, meta device
fine) and falls back to runtime capture (one real forward and backward) when
tracing fails and example inputs are given. Most real models need the
fallback: data-dependent branches, tensor factories with traced sizes,
iteration over proxies.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn as nn

from tracing.config import TracingConfig
from tracing.errors import TracingError
from tracing.fqn import module_phrase
from tracing.order import ExecutionOrder
from tracing.runtime import record_execution_order
from tracing.symbolic import trace_execution_order

__all__ = ["capture_execution_order"]

logger = logging.getLogger(__name__)


def _as_args(example_inputs: Any) -> tuple[Any, ...]:
    if example_inputs is None:
        return ()
    if isinstance(example_inputs, tuple):
        return example_inputs
    return (example_inputs,)


def capture_execution_order(
    model: nn.Module,
    tracing_config: TracingConfig | None = None,
    example_inputs: tuple[Any, ...] | torch.Tensor | None = None,
    example_kwargs: dict[str, Any] | None = None,
    backward: bool = True,
) -> ExecutionOrder:
    """Capture ``model``'s execution order, symbolically or at run time.

    * With ``tracing_config``: symbolic capture
      (:func:`~tracing.symbolic.trace_execution_order`). If it raises
      :class:`TracingError` and example inputs are given, runtime capture
      (:func:`~tracing.runtime.record_execution_order`) is used instead; the
      returned order has ``method == "runtime"`` and ``fallback_reason``
      naming the module where tracing failed and the error, and one INFO line
      is logged on the ``tracing.capture`` logger.
    * Without ``tracing_config``: runtime capture with the example inputs.

    Args:
        model: the model (may be on the meta device; runtime capture then
            needs meta inputs and shape-only control flow).
        tracing_config: how to trace symbolically, or ``None`` to capture at
            run time.
        example_inputs: positional inputs for one forward: a tuple of
            arguments, or a single tensor (any other non-tuple value is one
            positional argument).
        example_kwargs: keyword inputs for that forward.
        backward: with runtime capture, also run one backward pass to record
            gradient-ready order (ignored by symbolic capture).

    Returns:
        The :class:`ExecutionOrder`.

    Raises:
        TracingError: symbolic capture failed and no example inputs were
            given (the message names the failing module and says to pass
            ``example_inputs``), or neither a config nor inputs were given,
            or runtime capture on the meta device hit a value-dependent op.
        Exception: what the model raises during runtime capture.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> capture_execution_order(model, TracingConfig()).method
        'symbolic'
        >>> capture_execution_order(model, example_inputs=torch.randn(3, 4)).method
        'runtime'
    """
    has_inputs = example_inputs is not None or example_kwargs is not None
    args = _as_args(example_inputs)
    kwargs = dict(example_kwargs or {})
    if tracing_config is not None:
        try:
            return trace_execution_order(model, tracing_config)
        except TracingError as e:
            if not has_inputs:
                raise _no_inputs_error(e) from e
            return _fall_back(e, model, args, kwargs, backward=backward)
    if not has_inputs:
        raise TracingError(
            "cannot capture the execution order: no tracing_config (for symbolic capture) "
            "and no example_inputs (for runtime capture) were given. Pass example_inputs "
            "(and example_kwargs) to capture at run time, or a TracingConfig for a "
            "symbolically traceable model."
        )
    return record_execution_order(model, *args, backward=backward, **kwargs)


def _failed_where(e: TracingError) -> str:
    """``module 'a' (Cls)``, ``the root module <root> (Cls)`` or ``an unknown module``."""
    where = "an unknown module" if e.module_fqn is None else module_phrase(e.module_fqn)
    return where + (f" ({e.module_class})" if e.module_class else "")


def _failed_what(e: TracingError) -> str:
    """What failed, in one line."""
    return e.reason or str(e).splitlines()[0]


def _no_inputs_error(e: TracingError) -> TracingError:
    """Symbolic capture failed and there is nothing to run: say to pass inputs."""
    return TracingError(
        f"cannot capture the execution order: symbolic tracing failed in "
        f"{_failed_where(e)} and no example inputs were given for runtime capture "
        f"({_failed_what(e)}). Pass example_inputs (and example_kwargs) to "
        "capture_execution_order to capture at run time instead.\n"
        f"Tracing error: {e}",
        module_fqn=e.module_fqn,
        module_class=e.module_class,
        reason=e.reason,
    )


def _fall_back(
    e: TracingError,
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    backward: bool,
) -> ExecutionOrder:
    """Runtime capture after symbolic capture failed with ``e``; one INFO line."""
    where = _failed_where(e)
    logger.info(
        "symbolic capture failed in %s; falling back to runtime capture with the example inputs",
        where,
    )
    order = record_execution_order(model, *args, backward=backward, **kwargs)
    order.fallback_reason = f"symbolic tracing failed in {where}: {_failed_what(e)}"
    return order
