"""The sentences in ``WrapPlan.notes``: why the plan departs from the policy.

Each function returns the notes of one kind of decision, written for the
person who chose the policy: which module was not wrapped and why, where its
parameters went, which tied or shared parameter moved to which unit, which
unit mixes frozen and trainable parameters, what is ignored, which FSDP2
group FSDP1 cannot realise. FQNs are quoted (``'blocks.0'``), the root is
written ``<root>``, counts say what they count.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from execwrap.plan.model_view import ModelView, OrderView
from execwrap.plan.unit import WrapUnit
from execwrap.util.text import fqn_and_list, fqn_list, listed, modules_named, param_count, plural
from tracing.fqn import innermost, is_within, owner_fqn, quoted

__all__ = [
    "bypassed_notes",
    "dead_module_notes",
    "dropped_notes",
    "fsdp1_split_note",
    "ignored_notes",
    "mixed_requires_grad_notes",
    "no_calls_note",
    "relocation_notes",
    "reordered_note",
    "scalar_param_notes",
]


def no_calls_note() -> str:
    """An order without module calls: units come from the policy alone."""
    return (
        "The order has no module calls (nothing captured yet), so units come from "
        "the init policy alone, in definition order; plan again once an order is "
        "captured."
    )


def reordered_note(method: str) -> str:
    """Units applied before any order existed, re-ordered by ``method``'s order."""
    return (
        f"Order recorded during the first step ({method}); units kept as applied "
        "and re-ordered by first use."
    )


def fsdp1_split_note(split: Sequence[WrapUnit], num_units: int) -> str:
    """FSDP2 groups ``split`` that FSDP1 cannot wrap as one module."""
    return (
        f"FSDP1 wraps single modules: {len(split)} of {num_units} FSDP2 groups have no "
        "module that holds exactly their units and runs its own forward, so "
        "fsdp1_modules() wraps their members separately: "
        + "; ".join("[" + ", ".join(quoted(m) for m in u.module_fqns) + "]" for u in split)
        + "."
    )


def dropped_notes(
    view: ModelView,
    uses: OrderView,
    dropped: Sequence[tuple[str, str]],
    units: Collection[str],
    holder: dict[str, str],
) -> list[str]:
    """Policy units that were not wrapped because their module never runs
    (or is registered under two parents).

    Modules that hold no parameters (an empty ``ParameterDict``, a
    ``ModuleDict`` of ``Dropout``) share one note at the end: there is nothing
    of theirs to shard, so each one's reason would add nothing.

    Args:
        view: the model's snapshot.
        uses: the order's view.
        dropped: ``(module FQN, kind)`` for each dropped unit, kind one of
            ``"shared"``, ``"container"``, ``"forwardless"``, ``"uncalled"``.
        units: the module FQNs that remain units.
        holder: canonical parameter -> the unit module holding it.
    """
    notes: list[str] = []
    empty = [f for f, _ in dropped if next(view.modules[f].parameters(), None) is None]
    for fqn, kind in dropped:
        if fqn in empty:
            continue
        if any(o != fqn and is_within(fqn, o) for o, k in dropped if k == "uncalled"):
            continue  # covered by the enclosing uncalled module's note
        if kind == "shared":
            notes.append(_shared_note(view, uses, fqn, units, holder))
        elif kind in ("container", "forwardless"):
            notes.append(_container_note(view, uses, fqn, kind, units, holder))
        else:
            nested = [o for o, _ in dropped if o != fqn and is_within(o, fqn)]
            notes.append(_uncalled_note(view, uses, fqn, nested, units))
    if empty:
        notes.append(_empty_modules_note(view, empty))
    return notes


def bypassed_notes(
    view: ModelView,
    uses: OrderView,
    bypassed: Mapping[str, tuple[str, int]],
    holder: dict[str, str],
) -> list[str]:
    """Policy units not wrapped because a call outside the unit's own forward
    uses their parameters (:meth:`execwrap.planning.steps.Planner._drop_bypassed`).

    Args:
        view: the model's snapshot.
        uses: the order's view.
        bypassed: dropped unit -> (canonical parameter, call index) of the
            first use outside its calls.
        holder: canonical parameter -> the unit module holding it.
    """
    order = uses.order
    calls = order.module_forward_order
    parents = order.enclosing_calls()
    notes: list[str] = []
    for unit, (param, call) in bypassed.items():
        caller = parents[call] if parents else -1
        caller_text = f", called from {quoted(calls[caller])}" if caller >= 0 else ""
        moved = [p for p in view.params if is_within(owner_fqn(p), unit)]
        holders = list(dict.fromkeys(holder[p] for p in moved))
        notes.append(
            f"Module {quoted(calls[call])} (call {call}{caller_text}) uses parameter {param!r} "
            f"outside every call of {quoted(unit)} ({view.classes.get(unit, '?')}): FSDP gathers "
            "a unit's parameters when the unit's forward starts and frees them when it ends, so "
            f"{quoted(unit)} cannot be an FSDP unit. Not wrapped; its parameters "
            f"({param_count(moved, view.numel)}) go to unit{'s' if len(holders) > 1 else ''} "
            f"{fqn_list(holders)}."
        )
    return notes


def _empty_modules_note(view: ModelView, fqns: Sequence[str]) -> str:
    """One line for every dropped policy unit without parameters."""
    classes: dict[str, int] = {}
    for fqn in fqns:
        classes[view.classes.get(fqn, "?")] = classes.get(view.classes.get(fqn, "?"), 0) + 1
    kinds = ", ".join(f"{n} {c}" for c, n in classes.items())
    return (
        f"{plural(len(fqns), 'policy unit')} {'holds' if len(fqns) == 1 else 'hold'} no "
        f"parameters and {'is' if len(fqns) == 1 else 'are'} not wrapped (nothing to shard; "
        f"the forward of each never runs, or it is registered under two parents): {kinds}: "
        f"{listed([quoted(f) for f in fqns], 4)}."
    )


def _shared_note(
    view: ModelView,
    uses: OrderView,
    fqn: str,
    units: Collection[str],
    holder: dict[str, str],
) -> str:
    """A module registered under two or more parents."""
    names = view.registrations[fqn]
    params = _direct_params_of(view, fqn)
    holders = list(dict.fromkeys(holder[p] for p in params))
    where = (
        f"; its own parameters ({param_count(params, view.numel)}) go to unit"
        f"{'s' if len(holders) > 1 else ''} {fqn_list(holders)}, which encloses every name of it"
        if params
        else ""
    )
    inside = sorted(
        (u for u in units if u != fqn and is_within(u, fqn)),
        key=lambda u: uses.first_call.get(u, math.inf),
    )
    stay = f"; the units inside it stay ({fqn_list(inside)})" if inside else ""
    return (
        f"Module {quoted(fqn)} ({view.classes.get(fqn, '?')}) is registered under "
        f"{len(names)} names ({fqn_and_list(names)}), so it cannot be an FSDP unit: FSDP1 "
        "puts a unit's wrapper under the module's first name only, and a call through "
        f"another name would run it with its parameters still sharded. Not wrapped{where}"
        f"{stay}."
    )


def scalar_param_notes(view: ModelView) -> list[str]:
    """0-dim parameters, which FSDP1 and FSDP2 refuse to shard (no note when none)."""
    scalars = [p for p in view.params if view.shape[p] == ()]
    if not scalars:
        return []
    these = (
        f"Parameter {scalars[0]!r} is"
        if len(scalars) == 1
        else (f"Parameters {listed([repr(p) for p in scalars], 5)} are")
    )
    return [
        f"{these} 0-dim (a scalar): FSDP1 and FSDP2 refuse to shard scalar parameters "
        f'(torch: "Change {scalars[0]} to a 1D tensor with numel equal to 1."), so '
        "apply_fully_shard and ParamExecOrderWrapPolicy refuse this model before wrapping "
        "anything. Make each a 1-D parameter of one element, or keep it unsharded on every "
        "rank: FSDP2 fully_shard(..., ignored_params={...}), FSDP1 FSDP(..., ignored_states=[...])."
    ]


def _container_note(
    view: ModelView,
    uses: OrderView,
    fqn: str,
    kind: str,
    units: Collection[str],
    holder: dict[str, str],
) -> str:
    """A container (only its children run) or a class without ``forward``."""
    params = _direct_params_of(view, fqn)
    holders = list(dict.fromkeys(holder[p] for p in params))
    where = (
        f", and its own parameters ({param_count(params, view.numel)}) go to unit"
        f"{'s' if len(holders) > 1 else ''} {fqn_list(holders)}"
        if params
        else ""
    )
    children = sorted(
        (u for u in units if u != fqn and is_within(u, fqn)),
        key=lambda u: uses.first_call.get(u, math.inf),
    )
    why = (
        "does not implement forward"
        if kind == "forwardless"
        else "never runs its own forward (only modules inside it are called)"
    )
    return (
        f"Module {quoted(fqn)} ({view.classes.get(fqn, '?')}) {why}, so it cannot be an FSDP "
        "unit: its hooks would never fire. "
        f"Not wrapped; the units inside it stay ({fqn_list(children) or 'none'}){where}."
    )


def _uncalled_note(
    view: ModelView, uses: OrderView, fqn: str, nested: list[str], units: Collection[str]
) -> str:
    """A module whose forward never runs (its parameters may be used elsewhere)."""
    moved = [p for p in view.params if is_within(owner_fqn(p), fqn)]
    users = sorted(
        {m for p in moved for m in uses.users[p] if not is_within(m, fqn)},
        key=lambda m: uses.first_call.get(m, math.inf),
    )
    if users:
        why = f"never runs its own forward (its parameters are used by {fqn_list(users)})"
        verdict = "so it cannot be an FSDP unit"
        extra = f" (nor can the units inside it: {fqn_list(nested)})" if nested else ""
        tail = f"{extra}: its hooks would never fire."
    else:
        # another input may call it: say what the plan does, not that it cannot work
        why = f"{_never_called(uses)} and its parameters are never used"
        verdict = "so the plan does not make it an FSDP unit"
        extra = f" (nor the units inside it: {fqn_list(nested)})" if nested else ""
        tail = f"{extra}."
    return (
        f"Module {quoted(fqn)} ({view.classes.get(fqn, '?')}) {why}, {verdict}{tail} Its "
        f"parameters ({param_count(moved, view.numel)}) stay in unit "
        f"{quoted(innermost(fqn, units))}."
    )


def dead_module_notes(
    view: ModelView, uses: OrderView, units: Collection[str], policy_fqns: Sequence[str]
) -> list[str]:
    """Modules with parameters that are neither called nor used, and were not
    policy units (those are noted by :func:`dropped_notes`); outermost only."""
    noted: list[str] = []
    notes: list[str] = []
    for fqn in view.modules:
        if fqn == "" or any(is_within(fqn, n) for n in noted):
            continue
        if any(is_within(fqn, i) for i in view.ignored_modules):
            continue
        if fqn in uses.called_at_or_below:
            continue
        params = [p for p in view.params if is_within(owner_fqn(p), fqn)]
        if not params or any(uses.users[p] for p in params):
            continue
        if any(is_within(u, fqn) for u in policy_fqns if u not in units):
            continue
        noted.append(fqn)
        notes.append(
            f"Module {quoted(fqn)} ({view.classes.get(fqn, '?')}) {_never_called(uses)} "
            f"and its parameters ({param_count(params, view.numel)}) are never used; "
            f"they stay in unit {quoted(innermost(fqn, units))}."
        )
    return notes


def relocation_notes(
    view: ModelView,
    uses: OrderView,
    events: dict[str, tuple[str, list[str]]],
    holder: dict[str, str],
    stated: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """Tied parameters (where they stay) and parameters that moved up to an
    enclosing unit because they are used outside their own.

    Args:
        view: the model's snapshot.
        uses: the order's view.
        events: canonical parameter -> (holding unit, policy units dropped
            for it), from the planner's relocation step.
        holder: canonical parameter -> the unit module holding it.
        stated: stated-group member -> its group (``plan_wrap(groups=...)``).
    """
    notes: list[str] = []
    stated = stated or {}
    for p in view.params:
        names = view.fqns_of[p]
        users = list(uses.users[p])
        tied = len(names) > 1
        subject = (
            f"Tied parameter {p!r} (also {fqn_list(names[1:])})" if tied else f"Parameter {p!r}"
        )
        used = f"is used by {modules_named(users)}" if users else "is not used in forward"
        owners = {view.owner(n) for n in names}
        if users and owners <= set(users):
            encloses = {1: "it", 2: "both"}.get(len(users), "all of them")
        else:
            encloses = "every name and use of it" if tied else "every use of it"
        if p in events:
            moved = _moved_note(view, p, events[p][1], holder, users, tied, encloses)
            notes.append(f"{subject} {used}; {moved}")
        elif tied and holder[p] in stated:
            notes.append(
                f"{subject} {used}; it stays in the stated group "
                f"{fqn_and_list(stated[holder[p]])}, which holds every name and use of it."
            )
        elif tied:
            notes.append(
                f"{subject} {used}; it stays in unit {quoted(holder[p])}, which encloses "
                f"{encloses}."
            )
    return notes


def _moved_note(
    view: ModelView,
    p: str,
    dropped: list[str],
    holder: dict[str, str],
    users: list[str],
    tied: bool,
    encloses: str,
) -> str:
    """Why parameter ``p`` left the ``dropped`` policy units, and where it went."""
    unit = holder[p]
    verb = "is" if len(dropped) == 1 else "are"
    others = [
        q
        for q in view.params
        if q != p and holder[q] == unit and any(is_within(owner_fqn(q), d) for d in dropped)
    ]
    rest = (
        f"; {'its' if len(dropped) == 1 else 'their'} other parameters "
        f"({param_count(others, view.numel)}) go to {quoted(unit)} too"
        if others
        else ""
    )
    policy_units = f"the policy's unit{'s' if len(dropped) > 1 else ''} {fqn_and_list(dropped)}"
    if tied:
        return (
            "FSDP must never split a tied tensor and needs it unsharded at every use, so it "
            f"goes to unit {quoted(unit)}, which encloses {encloses}: {policy_units} {verb} "
            f"not wrapped because of the tie{rest}."
        )
    outside = [m for m in users if not any(is_within(m, d) for d in dropped)]
    return (
        f"{fqn_and_list(outside)} run{'s' if len(outside) == 1 else ''} "
        f"outside unit{'s' if len(dropped) > 1 else ''} {fqn_and_list(dropped)}, where FSDP "
        f"has resharded it, so it goes to unit {quoted(unit)}, which encloses "
        f"{encloses}: {policy_units} {verb} not wrapped{rest}."
    )


def mixed_requires_grad_notes(
    view: ModelView, units: Sequence[WrapUnit], target: str | None = None
) -> list[str]:
    """Units holding both frozen and trainable parameters (PEFT adapters in a
    frozen block), in the words of ``target`` (``"fsdp1"``, ``"fsdp2"``, or
    ``None`` for both)."""
    notes: list[str] = []
    for unit in units:
        frozen = [p for p in unit.param_fqns if not view.requires_grad[p]]
        trainable = [p for p in unit.param_fqns if view.requires_grad[p]]
        if frozen and trainable:
            notes.append(
                f"Unit {fqn_list(unit.module_fqns)} mixes requires_grad=True "
                f"({plural(len(trainable))}) and requires_grad=False "
                f"({plural(len(frozen))}: {', '.join(repr(p) for p in frozen[:5])}"
                f"{', ...' if len(frozen) > 5 else ''}): {_MIXED_ADVICE[target]}"
            )
    return notes


#: What a unit mixing frozen and trainable parameters means for each target.
_MIXED_ADVICE: dict[str | None, str] = {
    None: (
        "FSDP1 needs use_orig_params=True for it (FSDP2 accepts it); wrap the frozen "
        "parameters' modules separately to avoid it."
    ),
    "fsdp1": (
        "FSDP1 needs use_orig_params=True for it (a flat parameter has one requires_grad; "
        "with use_orig_params=False wrapping is refused); wrap the frozen parameters' "
        "modules separately to avoid it."
    ),
    "fsdp2": (
        "FSDP2 shards and all-gathers them together, and reduce-scatters the gradients of "
        "the trainable ones only."
    ),
}


def ignored_notes(view: ModelView) -> list[str]:
    """The ignored modules and their parameters (no note when none)."""
    if not view.ignored_modules:
        return []
    params = sorted(view.ignored_params)
    return [
        f"Ignored modules {fqn_list(view.ignored_modules)}: their parameters "
        f"({param_count(params, view.numel)}) are in no unit; FSDP leaves them unsharded "
        "on every rank."
    ]


def _direct_params_of(view: ModelView, fqn: str) -> list[str]:
    """Canonical params that module ``fqn`` holds directly (one of their
    names is ``fqn.<name>``), not through a submodule."""
    return [p for p in view.params if any(view.owner(n) == fqn for n in view.fqns_of[p])]


def _never_called(uses: OrderView) -> str:
    """How a module that the order never calls is described. Neither capture
    proves a module dead: a runtime capture sees one forward, and a symbolic
    trace one path too (fx fixes every argument not given as a traced input
    at its default, so a branch on it is decided by the default)."""
    if uses.order.method == "runtime":
        return (
            "is never called with the example inputs (runtime capture sees one forward: "
            "another input may take another branch; execwrap.OrderMonitor warns if it does)"
        )
    return (
        "is never called in the traced forward (fx traces one path: an argument not given "
        "as an input is fixed at its default, so another input may take another branch; "
        "execwrap.OrderMonitor warns if it does)"
    )
