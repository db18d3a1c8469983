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

The root (:mod:`tracing.symbolic.signature`): with example inputs, they are
bound to ``forward``'s signature and fx traces a generated function whose
parameters are exactly the input tensors; every other bound value stays
concrete and every argument not passed keeps its default, so
``if attn_mask is not None:`` takes the branch the real call takes, and
decorated forwards (``functools.wraps``, transformers 5) or ``**kwargs`` do
not stop fx at the root. Without example inputs, plain fx makes *every*
argument a Proxy, optional ones included: ``attn_mask is None`` is then
``False`` during the trace (a Proxy is not ``None``) and the trace follows the
passed-mask branch; the order's ``warnings`` name such arguments.

Source: the approach follows torch's 2022 ``ParamExecOrderWrapPolicy`` tracer
(``torch/distributed/fsdp/_trace_utils.py``, ``_ExecOrderTracer``), which
patched the same two methods; this version keys everything by FQN, finds
parameters inside containers and keyword arguments, restores the tracer
exactly, and names the failing module when tracing fails.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.nn as nn

from tracing.config import TracingConfig
from tracing.errors import TracingError
from tracing.fqn import display, module_phrase, quoted
from tracing.model_state import ModuleSnapshot, RngState
from tracing.order import ExecutionOrder
from tracing.preconditions import check_no_lazy_modules, distributed_wrapper, wrapped_error
from tracing.source_line import source_line
from tracing.symbolic.diagnosis import ConcreteValueWatch, Diagnosis, diagnose
from tracing.symbolic.recorder import SymbolicRecorder
from tracing.symbolic.signature import as_args, bind_root, root_patched
from tracing.walk import walk_modules

__all__ = ["trace_execution_order"]

logger = logging.getLogger(__name__)


def trace_execution_order(
    model: nn.Module,
    config: TracingConfig | None = None,
    *,
    example_inputs: tuple[Any, ...] | torch.Tensor | None = None,
    example_kwargs: dict[str, Any] | None = None,
) -> ExecutionOrder:
    """Capture a model's execution order by symbolic tracing (no compute).

    Traces ``model.forward`` once with ``config.tracer`` and records every
    module call (repeats kept) and every group of parameters used together: a
    leaf module's parameters, and the parameter arguments of each functional
    op or tensor method at any depth, by keyword or inside containers.
    Metadata reads (``w.shape``) are not uses; buffers are not parameters.

    Root arguments (see the module docstring): with example inputs, they are
    bound to ``forward``'s signature, their tensors are traced and every
    argument *not passed keeps its default*. Without them every argument is a
    Proxy, as in plain fx, so an unpassed optional one makes ``x is None``
    false: ``order.warnings`` then names those arguments (also logged at
    WARNING). The model is never changed (buffers a forward updates get their
    values back, attributes it stores are removed); the tracer is restored.

    Args:
        model: the root module; not wrapped by FSDP1/FSDP2/DDP (refused).
        config: the tracer and concrete arguments; ``TracingConfig()`` if ``None``.
        example_inputs: positional inputs of one real call (a tuple, or one
            tensor); they decide which arguments are passed.
        example_kwargs: keyword inputs of that call.

    Returns:
        An :class:`~tracing.order.ExecutionOrder` with ``method="symbolic"``;
        the root is ``""``, ``param_uses[i].call_index`` indexes
        ``module_forward_order``, names are canonical FQNs (tied aliases in
        ``shared_params``), ``param_backward_order`` is empty.

    Raises:
        TracingError: the tracer raised; the message names the innermost
            module (FQN and class), the error, the model's source line, the
            cause (a branch on a value, shape or argument) and true advice;
            ``module_fqn``/``module_class``/``reason``/``advice`` are set, the
            error is chained. Also, before anything runs, for a model wrapped
            by FSDP1/FSDP2/DDP and for an uninitialised lazy module.
        ValueError: a ``concrete_args`` name that ``forward`` does not take.
        TypeError: ``config`` is not a :class:`~tracing.config.TracingConfig`,
            or the example inputs do not fit ``forward``'s signature.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
        >>> trace_execution_order(model).module_forward_order
        ['', '0', '1', '2']
    """
    config = _checked_config(config)
    walk = walk_modules(model)
    _check_traceable(model, walk.modules)
    has_inputs = example_inputs is not None or example_kwargs is not None
    args = as_args(example_inputs) if has_inputs else None
    root = bind_root(model, args=args, kwargs=example_kwargs, concrete_args=config.concrete_args)
    recorder, watch, tracer = (
        SymbolicRecorder(model, walk),
        ConcreteValueWatch(),
        config.tracer,
    )
    rng, snapshot = RngState(), ModuleSnapshot(model, values=True, modules=walk.modules)
    try:
        with recorder.patched(tracer), root_patched(tracer, root), watch.patched(tracer):
            tracer.trace(model, concrete_args=root.fx_concrete_args)
    except Exception as e:
        fqn, cls = recorder.failed_module(e)
        raise _tracing_error(e, fqn, cls, bound=root.bound, diagnosis=diagnose(watch)) from e
    finally:
        snapshot.restore()
        rng.restore()
    return _finished(recorder.result(), model, root.proxied_optional)


def _finished(order: ExecutionOrder, model: nn.Module, proxied: tuple[str, ...]) -> ExecutionOrder:
    """``order`` with the warning about optional arguments made Proxies, logged."""
    if proxied:
        order.warnings.append(_proxied_optional_warning(model, proxied))
        logger.warning("%s", order.warnings[-1])
    logger.debug(
        "traced %s: %d module calls, %d parameter uses, %d of %d parameters used",
        type(model).__name__,
        len(order.module_forward_order),
        len(order.param_uses),
        len(order.param_forward_order),
        len(order.params),
    )
    return order


def _check_traceable(model: nn.Module, modules: list[nn.Module]) -> None:
    """Refuse, before anything runs, what a trace would break or cannot trace.

    ``modules`` is ``model.modules()``, listed once for the whole capture.
    """
    check_no_lazy_modules(model, modules=modules)
    wrapped = distributed_wrapper(model, modules=modules)
    if wrapped is not None:
        raise wrapped_error(
            wrapped,
            lambda where, label: (
                f"symbolic tracing refused: {where} is wrapped by {label}. Tracing runs the "
                "wrapper's forward with Proxies, which half-builds its lazy state and leaves "
                "the model unusable for training. Capture before wrapping, or record a real "
                "step at run time: capture_execution_order(model, example_inputs=...) or "
                "RuntimeRecorder(model) (original FQNs)."
            ),
        )


def _proxied_optional_warning(model: nn.Module, names: tuple[str, ...]) -> str:
    listed = ", ".join(repr(n) for n in names)
    return (
        f"{type(model).__name__}.forward was traced without example inputs, so fx made its "
        f"optional argument{'s' if len(names) > 1 else ''} {listed} "
        f"{'Proxies' if len(names) > 1 else 'a Proxy'}: a test such as "
        f"`{names[0]} is None` is False during the trace, and a branch on it follows the "
        "passed-argument side even when the argument is never passed. Pass example inputs "
        "(arguments not passed then keep their defaults) or concrete_args="
        f"{{{names[0]!r}: None}} if the trace must match calls without it."
    )


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


def _tracing_error(
    error: Exception, fqn: str, cls: str, *, bound: bool, diagnosis: Diagnosis | None
) -> TracingError:
    """A :class:`TracingError` for ``error``, raised while tracing module ``fqn``.

    ``reason`` (one line, no advice) gives the error, the model's source line
    and the cause (:mod:`tracing.symbolic.diagnosis`); the message adds the
    advice that is true for that cause.
    """
    text = str(error).strip()
    first_line = text.splitlines()[0] if text else ""
    line = source_line(error)
    reason = f"{type(error).__name__}: {first_line}".rstrip(": ")
    if line:
        reason += f" at {line}"
    if diagnosis is not None:
        reason += f": {diagnosis.cause}"
    elif isinstance(error, TypeError):
        reason += ": a Python or torch call got a Proxy where it needs a concrete value (a size, index or dtype)"
    message = (
        f"symbolic tracing failed in {module_phrase(fqn)} ({cls}): {reason}\n"
        f"To fix it: {_advice(fqn, bound=bound, diagnosis=diagnosis)}"
    )
    logger.debug("symbolic tracing failed in %s (%s): %r", display(fqn), cls, error)
    return TracingError(
        message,
        module_fqn=fqn,
        module_class=cls,
        reason=reason,
        advice=_short_advice(fqn, bound=bound, diagnosis=diagnosis),
    )


def _short_advice(fqn: str, *, bound: bool, diagnosis: Diagnosis | None) -> str:
    """The advice of :func:`_advice` in one clause, for the capture ladder's reasons."""
    if diagnosis is not None and diagnosis.value_args and not bound:
        names = ", ".join(f"{n!r}: ..." for n in diagnosis.value_args[:3])
        return f"pass concrete_args={{{names}}} or example inputs to trace it"
    if diagnosis is not None and (diagnosis.value_args or diagnosis.value_attrs):
        return "it depends on tensor values, which only a run decides"
    if fqn:
        return f"a tracer whose is_leaf_module() is True for {quoted(fqn)} traces around it"
    return "runtime capture records it without tracing"


_RUNTIME = (
    "capture the order at run time with example inputs: capture_execution_order(model, "
    "example_inputs=...) records it on fake tensors first (no compute, no weight copy)"
)


def _advice(fqn: str, *, bound: bool, diagnosis: Diagnosis | None) -> str:
    """What to do, true for the cause found."""
    leaf = (
        ""
        if fqn == ""
        else f"use a tracer whose is_leaf_module() returns True for {quoted(fqn)} (fx then "
        "records it as one call and does not look inside); or "
    )
    if diagnosis is not None and diagnosis.value_args and not bound:
        names = ", ".join(f"{n!r}: ..." for n in diagnosis.value_args[:3])
        return (
            f"pass those forward arguments as concrete values, TracingConfig(concrete_args="
            f"{{{names}}}), or pass example inputs (arguments not passed then keep their "
            f"defaults); or {leaf}{_RUNTIME}."
        )
    if diagnosis is not None and (diagnosis.value_args or diagnosis.value_attrs):
        return (
            f"the branch depends on tensor values, which no trace can decide: {leaf}"
            f"{_RUNTIME} (a value-dependent op then falls back to one real forward/backward)."
        )
    if diagnosis is not None and diagnosis.shape_sources:
        return f"{leaf}{_RUNTIME}: fake tensors have shapes and dtypes."
    flags = (
        ""
        if bound
        else (
            "pass concrete_args in TracingConfig for the forward arguments the failing code "
            "depends on (e.g. flags that select a branch), or example inputs; "
        )
    )
    return f"{flags}{leaf}{_RUNTIME}."
