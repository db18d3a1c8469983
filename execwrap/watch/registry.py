"""Never silent: policies and plans that the first optimizer step finds unapplied.

The most common failure with wrap policies is silence: a
:class:`~execwrap.ParamExecOrderWrapPolicy` or a :class:`~execwrap.WrapPlan`
is built and handed to something that ignores it (accelerate's FSDP2 plugin
as ``auto_wrap_policy``, a policy assigned to the HF Trainer's plugin after
construction), and training runs with another sharding, or none. So every
policy, and every plan returned by :func:`execwrap.plan_wrap`, is *watched*
from its creation: FSDP1 (the policy's ``_run_policy``) and
:func:`execwrap.apply_fully_shard` mark what they apply, and the first
``optimizer.step()`` of the process after a watched object was created logs
one WARNING for each watched object that is still alive and was never applied,
naming it, where it was created and what would have applied it. An object that
execwrap refused to apply (an exception from FSDP1's policy call or
``apply_fully_shard``) is no longer watched: the caller has that error. A plan
applied to a model other than the one it was planned for (its order does not
fit the model: other parameters, sizes or modules) is refused when applied.

Nothing is stored on the watched objects or on the user's modules: the
registry holds them weakly (an object garbage-collected before the first step
is not reported), and the global optimizer step pre-hook
(``torch.optim.optimizer.register_optimizer_step_pre_hook``) is installed with
the first watched object and removed at the first step, so later steps cost
nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import sys
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from execwrap.plan.model_view import ModelView, check_order_fits
from execwrap.watch.hints import ignored_by
from tracing.fqn import clean_fqn

__all__ = ["check_same_model", "mark_applied", "unwatched_if_refused", "watch"]

logger = logging.getLogger(__name__)

_F = TypeVar("_F", bound=Callable[..., Any])

#: Source folders of execwrap and tracing (frames there are not "where it was created").
_OWN_DIRS = tuple(
    str(Path(__file__).resolve().parents[2] / name) + "/" for name in ("execwrap", "tracing")
)


@dataclass
class _Entry:
    """One watched object: what it is, where it was made, whether applied."""

    ref: weakref.ReferenceType[Any]
    label: str
    created_at: str
    applied: bool = False


#: id(object) -> its entry (entries drop out with their objects).
_WATCHED: dict[int, _Entry] = {}
_HOOK: list[RemovableHandle] = []


def watch(obj: Any, label: str) -> None:
    """Watch ``obj`` (a policy or plan) until the next first optimizer step.

    Args:
        obj: the policy or plan (held weakly).
        label: how the warning names it, e.g. ``"ParamExecOrderWrapPolicy(...)"``.
    """
    key = id(obj)

    def drop(_: weakref.ReferenceType[Any]) -> None:
        entry = _WATCHED.get(key)
        if entry is not None and entry.ref() is None:
            del _WATCHED[key]

    _WATCHED[key] = _Entry(weakref.ref(obj, drop), label, _caller_site())
    if not _HOOK:
        _HOOK.append(register_optimizer_step_pre_hook(_first_step))


def mark_applied(obj: Any) -> None:
    """Record that ``obj`` was applied (FSDP1 wrap or ``apply_fully_shard``)."""
    entry = _WATCHED.get(id(obj))
    if entry is not None and entry.ref() is obj:
        entry.applied = True


def unwatched_if_refused(argument: str) -> Callable[[_F], _F]:
    """Decorator: when the function raises, stop watching its argument ``argument``
    (a policy or plan): execwrap refused it (or applying it failed), the caller has
    that error, and a later "never applied" WARNING would only repeat it.

    >>> @unwatched_if_refused("plan")
    ... def apply(model, plan): ...
    """

    def decorate(fn: _F) -> _F:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception:
                obj = signature.bind_partial(*args, **kwargs).arguments.get(argument)
                entry = _WATCHED.get(id(obj))
                if entry is not None and entry.ref() is obj:
                    del _WATCHED[id(obj)]
                raise

        return cast(_F, wrapper)

    return decorate


def check_same_model(plan: Any, model: nn.Module, where: str) -> None:
    """Refuse ``plan`` when it was planned for a model other than ``model``.

    The plan's order must fit ``model`` (:func:`execwrap.plan.model_view.check_order_fits`:
    the same parameters with the same numel and shape, every module it calls);
    a plan whose order has no parameter table (a hand-built one) is not checked.
    A model that shares some module names with the planned one is another model:
    its other parameters would be sharded where the plan never looked.

    Args:
        plan: the :class:`~execwrap.WrapPlan` about to be applied.
        model: the model it is applied to.
        where: the caller, for the message (e.g. ``"apply_fully_shard"``).

    Raises:
        ValueError: naming what differs, before anything is wrapped.
    """
    order = plan.order
    mesh = getattr(plan, "mesh", None)
    if mesh is not None and mesh.tp > 1:  # its sizes are tensor-parallel local shards
        order = dataclasses.replace(order, params={})
    try:
        check_order_fits(ModelView.build(model, plan.ignored_modules), order, type(model).__name__)
    except (ValueError, KeyError) as e:
        if _fits_without_wrappers(model, plan.order):
            return  # the same model, torch's wrappers (checkpoint_wrapper, compile) inside it
        detail = str(e).removeprefix("plan_wrap: ")
        raise ValueError(
            f"{where}: the plan (policy {plan.policy_name}, {len(plan.units)} groups) was "
            f"planned for another model than the {type(model).__name__} it is applied to, so "
            f"nothing was wrapped: {detail}, then plan_wrap(model, order, ...)"
        ) from None


def _fits_without_wrappers(model: nn.Module, order: Any) -> bool:
    """Whether ``model`` is the order's model once the names torch's wrappers insert
    (``_checkpoint_wrapped_module``, ``_fsdp_wrapped_module``, ``_orig_mod``) are
    removed: the same parameters and shapes, every module the order calls."""
    names = [fqn for fqn, _ in model.named_modules()] + [n for n, _ in model.named_parameters()]
    if all(clean_fqn(n) == n for n in names) or not order.params:
        return False
    params = {clean_fqn(n): tuple(p.shape) for n, p in model.named_parameters()}
    modules = {clean_fqn(fqn) for fqn, _ in model.named_modules()}
    return (
        params == {f: tuple(i.shape) for f, i in order.params.items()}
        and set(order.module_forward_order) <= modules
    )


def _first_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """The global step pre-hook: report unapplied objects once, then remove itself."""
    for handle in _HOOK:
        handle.remove()
    _HOOK.clear()
    entries = list(_WATCHED.values())
    _WATCHED.clear()
    for entry in entries:
        obj = entry.ref()
        if obj is None or entry.applied:
            continue
        held = ignored_by(obj)
        if held is not None:
            logger.warning(
                "%s (created at %s) was never applied by the first optimizer step (%s.step()): %s",
                entry.label,
                entry.created_at,
                type(optimizer).__name__,
                held,
            )
            continue
        logger.warning(
            "%s (created at %s) was never applied by the first optimizer step "
            "(%s.step()): expected FSDP(model, auto_wrap_policy=policy), "
            "apply_fully_shard(model, policy_or_plan), or an execwrap.integrations helper "
            "to use it before training. Frameworks that take a policy object and "
            "ignore it: accelerate's FSDP2 plugin (auto_wrap_policy=policy; use "
            "execwrap.integrations.accelerate.prepare_fully_shard) and a policy set on "
            "the HF Trainer's plugin after construction (use "
            "execwrap.integrations.hf_trainer.ExecwrapTrainer).",
            entry.label,
            entry.created_at,
            type(optimizer).__name__,
        )


def _caller_site() -> str:
    """``file:line`` of the first frame outside execwrap and tracing."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<") and not filename.startswith(_OWN_DIRS):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"
