"""What capture checks before it touches a model: lazy modules, distributed wrappers.

* An uninitialised lazy module (``nn.LazyLinear``, ``nn.LazyConv2d``, ...) has
  no parameter shapes yet: its first forward creates them and changes its
  class. Symbolic capture would hand it a Proxy, a fake shadow a fake tensor,
  and a real run would initialise it, changing the model. Every capture
  refuses it first, naming the module (:func:`check_no_lazy_modules`).
* A model wrapped by FSDP1 (``FullyShardedDataParallel``), FSDP2
  (``fully_shard``) or DDP runs collectives and lazy initialisation in its
  forward. Tracing it with fx, or running it on fake tensors, would leave that
  state half-built (FSDP1: ``'Sequential' object has no attribute
  '_unshard_stream'``; FSDP2: ``FSDP state has already been lazily
  initialized``). :func:`distributed_wrapper` finds such a wrapper so that
  capture can refuse before anything changes, or record a real step at run
  time with the original FQNs. The wrapper classes are looked up in
  ``sys.modules`` only: a process that never imported FSDP has no FSDP module.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch.nn as nn
from torch.nn.modules.lazy import LazyModuleMixin

from tracing.classes import instance_classes
from tracing.errors import TracingError
from tracing.fqn import clean_fqn, module_phrase, original_class_name

__all__ = ["check_no_lazy_modules", "distributed_wrapper", "wrapped_error"]

#: (module, class name, what to call it in messages)
_WRAPPER_CLASSES = (
    ("torch.distributed.fsdp", "FullyShardedDataParallel", "FSDP1 (FullyShardedDataParallel)"),
    ("torch.distributed.fsdp", "FSDPModule", "FSDP2 (fully_shard)"),
    ("torch.nn.parallel", "DistributedDataParallel", "DDP (DistributedDataParallel)"),
)


def check_no_lazy_modules(
    model: nn.Module,
    *,
    what: str = "capture the execution order",
    modules: Iterable[nn.Module] | None = None,
) -> None:
    """Refuse a model with an uninitialised lazy module.

    The modules' classes (:func:`~tracing.classes.instance_classes`, one
    ``type()`` per module, in C) are looked at first; only when one is a lazy
    module class are the modules walked again by name to find it.

    Args:
        model: the model.
        what: the action refused, for the message.
        modules: ``model.modules()`` already listed (a capture's one walk,
            :func:`tracing.walk.walk_modules`), or ``None`` to list them here.

    Raises:
        TracingError: the first such module in ``named_modules()`` order; the
            message names its FQN and class and says how to initialise it;
            ``module_fqn`` and ``module_class`` are set.

    Example:
        >>> check_no_lazy_modules(nn.Sequential(nn.LazyLinear(2)))
        Traceback (most recent call last):
        ...
        tracing.errors.TracingError: cannot capture the execution order: module '0' (LazyLinear) ...
    """
    listed = model.modules() if modules is None else modules
    if not any(issubclass(cls, LazyModuleMixin) for cls in instance_classes(listed)):
        return
    for fqn, module in model.named_modules():
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():  # type: ignore[misc]
            cls = type(module).__name__
            raise TracingError(
                f"cannot {what}: {module_phrase(fqn)} ({cls}) has uninitialized parameters "
                "(a lazy module gets its parameter shapes from its first forward, which also "
                "changes its class). Run one forward pass with real inputs first "
                "(model(*example_inputs)) to initialise it, then capture.",
                module_fqn=fqn,
                module_class=cls,
                reason=f"{cls} {fqn!r} has uninitialized parameters",
            )


def distributed_wrapper(
    model: nn.Module, *, modules: Iterable[nn.Module] | None = None
) -> tuple[str, str, str] | None:
    """The first module wrapped by FSDP1, FSDP2 or DDP, if any.

    The modules' classes (:func:`~tracing.classes.instance_classes`, one
    ``type()`` per module, in C) are looked at first; only when one is a
    loaded wrapper class are the modules walked again by name to find it.

    Args:
        model: the model.
        modules: ``model.modules()`` already listed (a capture's one walk,
            :func:`tracing.walk.walk_modules`), or ``None`` to list them here.

    Returns:
        ``(FQN in the original model, original class name, wrapper)``, e.g.
        ``("", "Sequential", "FSDP2 (fully_shard)")``, or ``None``.
    """
    classes = []
    for module_name, class_name, label in _WRAPPER_CLASSES:
        loaded = sys.modules.get(module_name)
        cls = getattr(loaded, class_name, None) if loaded is not None else None
        if isinstance(cls, type):
            classes.append((cls, label))
    if not classes:
        return None
    if "torch.distributed.fsdp" not in sys.modules:  # DDP only: it must be the root
        named: Any = [("", model)]
    else:
        listed = model.modules() if modules is None else modules
        wrappers = tuple(cls for cls, _ in classes)
        if not any(issubclass(cls, wrappers) for cls in instance_classes(listed)):
            return None
        named = model.named_modules()
    for fqn, module in named:
        for cls, label in classes:
            if isinstance(module, cls):
                inner = getattr(module, "module", module) if label.startswith("DDP") else module
                wrapped = getattr(module, "_fsdp_wrapped_module", inner)
                return clean_fqn(fqn), original_class_name(wrapped), label
    return None


def wrapped_error(wrapped: tuple[str, str, str], text: Callable[[str, str], str]) -> TracingError:
    """The :class:`TracingError` for a model that :func:`distributed_wrapper` found
    wrapped: ``text(where, label)`` is the message (``where``: ``"module 'fc'
    (Linear)"``, ``label``: the wrapper), and ``module_fqn``, ``module_class`` and
    ``reason`` are set alike for every capture step that refuses one."""
    fqn, cls, label = wrapped
    return TracingError(
        text(f"{module_phrase(fqn)} ({cls})", label),
        module_fqn=fqn,
        module_class=cls,
        reason=f"{cls} is wrapped by {label}",
    )
