"""A plan's self-check against the model, like ``torch.fx.Graph.lint()``.

:func:`check_plan` is the body of :meth:`WrapPlan.check`, and
:func:`~execwrap.planning.planner.plan_wrap` runs it on every plan it builds. It
checks that:

* every module and parameter FQN of the plan exists in the model;
* no module is in two units, and no group nests one of its modules in another
  (``fully_shard`` groups must not overlap); the root is a unit;
* every canonical parameter (ignored ones excepted) is in exactly one unit,
  and no ignored parameter is in any;
* each unit's numel and bytes add up over its parameters;
* each parameter's unit is the innermost unit enclosing every name of it, on
  every path to it (a module registered under two parents has two), so FSDP,
  which gives a parameter to the innermost wrapped module on the path it
  meets it by, builds exactly these units, and tied parameters are never split;
* no unit is a module registered under two parents (FSDP1 would wrap it
  under its first name only).
"""

from __future__ import annotations

from collections.abc import Sequence

from execwrap.errors import PlanError
from execwrap.plan.model_view import ModelView
from execwrap.plan.unit import WrapUnit
from tracing.fqn import is_within, owner_fqn, quoted

__all__ = ["check_plan"]


def check_plan(units: Sequence[WrapUnit], view: ModelView, model_name: str) -> None:
    """Check a plan's units against a snapshot of the model.

    Args:
        units: the plan's units (``WrapPlan.units``).
        view: the model's snapshot (:meth:`ModelView.build`, with the plan's
            ignored modules).
        model_name: the model's class name, for messages.

    Raises:
        PlanError: naming the FQN, what was expected and what was found.
    """
    by_module = _check_modules(units, view, model_name)
    holder = _check_params(units, view, model_name)
    _check_innermost(units, view, by_module, holder)


def _check_modules(units: Sequence[WrapUnit], view: ModelView, model_name: str) -> dict[str, int]:
    """Module FQN -> index of its unit, checking modules exist, are in one unit
    each and do not nest inside their group, and that the root is a unit."""
    by_module: dict[str, int] = {}
    for i, unit in enumerate(units):
        for m in unit.module_fqns:
            if m not in view.modules:
                raise PlanError(
                    f"plan unit {unit.label}: module {quoted(m)} does not exist in the "
                    f"model ({model_name}); was the plan built for another model?"
                )
            if m and m in view.registrations:
                raise PlanError(
                    f"plan unit {unit.label}: module {quoted(m)} is registered under "
                    f"{len(view.registrations[m])} names ({', '.join(view.registrations[m])}); "
                    "FSDP1 would wrap it under its first name only"
                )
            if m in by_module:
                raise PlanError(
                    f"module {quoted(m)} is in two units ({units[by_module[m]].label} "
                    f"and {unit.label})"
                )
            by_module[m] = i
        for a in unit.module_fqns:
            for b in unit.module_fqns:
                if a != b and is_within(b, a):
                    raise PlanError(
                        f"group {unit.label} nests {quoted(b)} inside {quoted(a)}; "
                        "fully_shard groups must not overlap"
                    )
    if "" not in by_module:
        raise PlanError("the plan has no root unit (module '') ")
    return by_module


def _check_params(units: Sequence[WrapUnit], view: ModelView, model_name: str) -> dict[str, int]:
    """Canonical parameter -> index of its unit, checking each is a canonical,
    unignored parameter in one unit, and that numel and bytes add up."""
    holder: dict[str, int] = {}
    for i, unit in enumerate(units):
        for p in unit.param_fqns:
            if p not in view.fqns_of:
                raise PlanError(
                    f"plan unit {unit.label}: parameter {p!r} is not a canonical parameter "
                    f"of the model ({model_name})"
                )
            if p in holder:
                raise PlanError(
                    f"parameter {p!r} is in two units: {units[holder[p]].label} and {unit.label}"
                )
            if p in view.ignored_params:
                raise PlanError(f"parameter {p!r} is ignored but in unit {unit.label}")
            holder[p] = i
        numel = sum(view.numel[p] for p in unit.param_fqns)
        nbytes = sum(view.bytes[p] for p in unit.param_fqns)
        if (numel, nbytes) != (unit.numel, unit.bytes):
            raise PlanError(
                f"plan unit {unit.label}: numel/bytes {unit.numel}/{unit.bytes} do not match "
                f"its parameters ({numel}/{nbytes})"
            )
    return holder


def _check_innermost(
    units: Sequence[WrapUnit], view: ModelView, by_module: dict[str, int], holder: dict[str, int]
) -> None:
    """Every unignored parameter is in a unit, the innermost one enclosing
    every name of it."""
    for p, names in view.fqns_of.items():
        if p in view.ignored_params:
            continue
        if p not in holder:
            raise PlanError(f"parameter {p!r} is in no unit of the plan")
        for name in names:
            chain = view.chain(owner_fqn(name))
            want = by_module[next((m for m in reversed(chain) if m in by_module), "")]
            if want != holder[p]:
                tied = (
                    f" (tied with {', '.join(repr(n) for n in names if n != p)})"
                    if len(names) > 1
                    else ""
                )
                raise PlanError(
                    f"parameter {p!r}{tied} is in unit {units[holder[p]].label}, but "
                    f"FSDP would give its name {name!r} to unit {units[want].label}, "
                    "the innermost unit enclosing it"
                )
