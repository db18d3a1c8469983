"""Symbolic execution-order capture with ``torch.fx``.

:func:`trace_execution_order` runs one ``torch.fx`` symbolic trace of a model
(no inputs, no real compute, so a model on the meta device works) and records,
while the tracer builds its graph, which modules are called and which
parameters each operation uses.

How it works (:mod:`tracing.symbolic.recorder`): for exactly one
``tracer.trace()`` call the tracer instance's ``call_module`` and
``create_proxy`` are wrapped; the first records every submodule call and keeps
the stack of modules being traced, the second notes every graph node that
takes a parameter (a ``get_attr`` input node), at any nesting depth. The
parameter groups are built after the trace, which therefore stays within a few
percent of a bare ``tracer.trace()``.

Source: the approach follows torch's 2022 ``ParamExecOrderWrapPolicy`` tracer
(``torch/distributed/fsdp/_trace_utils.py``, ``_ExecOrderTracer``), which
patched the same two methods; this version keys everything by FQN, finds
parameters inside containers and keyword arguments, restores the tracer
exactly, and names the failing module when tracing fails.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch.nn as nn

from tracing.config import TracingConfig
from tracing.errors import TracingError
from tracing.fqn import display, module_phrase, quoted
from tracing.order import ExecutionOrder
from tracing.symbolic.recorder import SymbolicRecorder

__all__ = ["trace_execution_order"]

logger = logging.getLogger(__name__)


def trace_execution_order(model: nn.Module, config: TracingConfig | None = None) -> ExecutionOrder:
    """Capture a model's execution order by symbolic tracing (no inputs needed).

    Traces ``model.forward`` once with ``config.tracer`` and records every
    module call (repeats kept) and every group of parameters used together:
    a leaf module's parameters (leaf as the tracer's ``is_leaf_module``
    decides; a custom tracer that makes a whole block a leaf gives all of that
    block's parameters at that point), and the parameter arguments of each
    functional op or tensor method at any depth, positional, by keyword or
    inside lists/tuples/dicts (``F.linear(x, self.w)``,
    ``F.linear(x, weight=self.w)``, ``torch.cat([self.a, self.b])``,
    ``self.w.t()``, ``self.w * 2``). Reading only a parameter's metadata
    (``w.shape``, ``w.size(0)``, ``w.dtype``) is not a use. Buffers are not
    parameters.

    The model is never changed: no hooks, attributes, dtype, device,
    ``requires_grad`` or training-mode changes; a model on the meta device
    works (no memory for weights is needed). The tracer's ``call_module`` and
    ``create_proxy`` are wrapped for this one trace only and restored
    afterwards, also when tracing fails. The cost is one ``tracer.trace()``
    plus O(1) work per graph node.

    Args:
        model: the root module. Its ``forward`` must be symbolically
            traceable by ``config.tracer`` given ``config.concrete_args``.
        config: the tracer and concrete arguments; ``TracingConfig()`` (a
            fresh plain ``torch.fx.Tracer``, no concrete arguments) if
            ``None``.

    Returns:
        An :class:`~tracing.order.ExecutionOrder` with ``method="symbolic"``:
        ``module_forward_order`` starts with the root ``""``;
        ``param_uses[i].call_index`` indexes ``module_forward_order`` (the
        innermost module being traced when the op ran); parameter names are
        canonical FQNs (a tied tensor's first name in ``named_parameters()``
        order, other names in ``shared_params``); ``param_backward_order`` is
        empty (symbolic capture cannot see backward).

    Raises:
        TracingError: the tracer raised (e.g. a data-dependent ``if``, or
            a tensor factory given a traced size such as
            ``torch.zeros(x.size(0), 4)``). The message names the innermost
            module being traced (FQN, ``<root>`` for the root, and class), the
            original error's type and text, and what to do; ``module_fqn`` and
            ``module_class`` are set; the original error is chained as
            ``__cause__``.
        TypeError: ``config`` is not a :class:`~tracing.config.TracingConfig`.

    Example:
        >>> import torch.nn as nn
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> order = trace_execution_order(model)
        >>> order.module_forward_order
        ['', '0', '1', '2']
        >>> order.param_forward_order
        ['0.weight', '0.bias', '2.weight', '2.bias']
    """
    config = _checked_config(config)
    recorder = SymbolicRecorder(model)
    with _model_attributes_kept(model), recorder.patched(config.tracer):
        try:
            config.tracer.trace(model, concrete_args=config.concrete_args)
        except Exception as e:
            raise _tracing_error(e, *recorder.failed_module(e)) from e
    order = recorder.result()
    logger.debug(
        "traced %s: %d module calls, %d parameter uses, %d of %d parameters used",
        type(model).__name__,
        len(order.module_forward_order),
        len(order.param_uses),
        len(order.param_forward_order),
        len(order.params),
    )
    return order


def _checked_config(config: TracingConfig | None) -> TracingConfig:
    """``config``, or a fresh ``TracingConfig()`` for ``None``."""
    if config is None:
        return TracingConfig()
    if not isinstance(config, TracingConfig):
        raise TypeError(
            f"trace_execution_order: config must be a TracingConfig or None, "
            f"got {type(config).__name__}"
        )
    return config


@contextlib.contextmanager
def _model_attributes_kept(model: nn.Module) -> Iterator[None]:
    """Remove every attribute the trace adds to ``model``.

    fx's ``Tracer.create_arg`` stores tensors made in forward (constants) on
    the root as ``_tensor_constantN`` / ``_param_constantN``; capture must
    leave the model as it was, so anything new in its ``__dict__`` is removed.
    """
    model_attrs = set(vars(model))
    try:
        yield
    finally:
        for name in set(vars(model)) - model_attrs:
            delattr(model, name)


def _tracing_error(error: Exception, fqn: str, cls: str) -> TracingError:
    """A :class:`TracingError` for ``error``, raised while tracing module ``fqn``."""
    leaf_hint = (
        ""
        if fqn == ""
        else f"use a tracer whose is_leaf_module() returns True for {quoted(fqn)} (or a "
        "module above it) so that fx does not trace inside it; "
    )
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
    reason = f"{type(error).__name__}: {first_line}".rstrip(": ")
    message = (
        f"symbolic tracing failed in {module_phrase(fqn)} ({cls}): "
        f"{type(error).__name__}: {error}\n"
        "To fix it, do one of: pass concrete_args in TracingConfig for the "
        "forward arguments that the failing code depends on (e.g. flags that "
        f"select a branch); {leaf_hint}or capture the order at run time with "
        "example inputs: capture_execution_order(model, example_inputs=...)."
    )
    logger.debug("symbolic tracing failed in %s (%s): %r", display(fqn), cls, error)
    return TracingError(message, module_fqn=fqn, module_class=cls, reason=reason)
