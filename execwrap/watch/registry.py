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
naming it, where it was created and what would have applied it. A plan applied
to a model other than the one it was planned for (its order does not fit the
model: other parameters, sizes or modules) is logged the same way, once, when
it is applied.

Nothing is stored on the watched objects or on the user's modules: the
registry holds them weakly (an object garbage-collected before the first step
is not reported), and the global optimizer step pre-hook
(``torch.optim.optimizer.register_optimizer_step_pre_hook``) is installed with
the first watched object and removed at the first step, so later steps cost
nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from execwrap.plan.model_view import ModelView, check_order_fits
from execwrap.watch.hints import ignored_by

__all__ = ["mark_applied", "warn_if_other_model", "watch"]

logger = logging.getLogger(__name__)

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


def warn_if_other_model(plan: Any, model: nn.Module, where: str) -> bool:
    """Log one WARNING when ``plan`` was planned for a model other than ``model``.

    The plan's order must fit ``model`` (:func:`execwrap.plan.model_view.check_order_fits`:
    the same parameters with the same numel and shape, every module it calls);
    a plan whose order has no parameter table (a hand-built one) is not checked.

    Args:
        plan: the :class:`~execwrap.WrapPlan` about to be applied.
        model: the model it is applied to.
        where: the caller, for the message (e.g. ``"apply_fully_shard"``).

    Returns:
        Whether a warning was logged.
    """
    order = plan.order
    mesh = getattr(plan, "mesh", None)
    if mesh is not None and mesh.tp > 1:  # its sizes are tensor-parallel local shards
        order = dataclasses.replace(order, params={})
    try:
        check_order_fits(ModelView.build(model, plan.ignored_modules), order, type(model).__name__)
    except (ValueError, KeyError) as e:
        detail = str(e).removeprefix("plan_wrap: ")
        logger.warning(
            "%s: the plan (policy %s, %d groups) was planned for another model than the %s "
            "it is applied to: %s. Expected a plan made from this model's own order; "
            "modules or parameters the plan does not know stay in their enclosing group. "
            "Plan this model: plan_wrap(model, capture_execution_order(model, ...), ...)",
            where,
            plan.policy_name,
            len(plan.units),
            type(model).__name__,
            detail,
        )
        return True
    return False


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
