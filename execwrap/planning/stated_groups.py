"""Stated groups: "these modules form one FSDP group", for any model.

``plan_wrap(..., groups=[["norm", "lm_head"]])`` makes each listed module a
unit (whether or not the init policy chose it) and merges the modules of each
list into one FSDP2 group (``fully_shard([norm, lm_head])``: one all-gather and
one reduce-scatter), as torchtitan groups a decoder's final norm with its
output projection, so that the step that runs last in forward and first in
backward gathers once. A list of one module makes that module a unit of its
own. Stated groups are kept as stated: bucketing never adds to them or merges
across them (it fills the runs of units between them).

The three steps, used by :func:`execwrap.plan_wrap`:

1. :func:`check_stated_groups`: every member is a module of the model, not
   the root, not ignored, in one group only, and no member encloses another
   member of its group (``fully_shard`` groups must not overlap).
2. After the planner's own steps, :func:`stated_group_units` merges each
   group's units, or raises naming the member the plan could not keep as a
   unit (a module that never runs its own forward, or one holding a tied or
   shared parameter used outside it) and what to change.
3. :func:`bucket_between_groups` buckets the units between stated groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from execwrap.plan.model_view import ModelView, OrderView
from execwrap.plan.unit import WrapUnit
from execwrap.planning.bucketing import merge_units
from execwrap.util.text import fqn_and_list, fqn_list
from tracing.fqn import is_within, quoted

__all__ = [
    "bucket_between_groups",
    "check_stated_groups",
    "stated_group_note",
    "stated_group_units",
]

StatedGroups = tuple[tuple[str, ...], ...]


def check_stated_groups(view: ModelView, groups: Iterable[Iterable[str]] | None) -> StatedGroups:
    """Validate ``groups`` against the model; return them as canonical FQN tuples.

    Args:
        view: the model's snapshot.
        groups: lists of module FQNs, each list one FSDP group; ``None`` for none.

    Returns:
        The groups, each member written with its canonical module FQN.

    Raises:
        TypeError: ``groups`` is a string or not a list of lists of strings.
        ValueError: a member is not a module of the model, is the root, is
            inside an ignored module, is in two groups, or encloses another
            member of its group; or a group is empty.
    """
    if groups is None:
        return ()
    if isinstance(groups, str) or any(isinstance(g, str) for g in groups):
        raise TypeError(
            "plan_wrap: groups must be a list of lists of module FQNs, e.g. "
            f"[['norm', 'lm_head']]; got {groups!r}"
        )
    checked: list[tuple[str, ...]] = []
    seen: dict[str, int] = {}
    for i, group in enumerate(groups):
        members = list(group)
        if not members:
            raise ValueError(f"plan_wrap: groups[{i}] is empty; list the modules of the group")
        canonical = [_member(view, m, i) for m in members]
        for j, m in enumerate(canonical):
            if m in seen:
                raise ValueError(
                    f"plan_wrap: module {quoted(m)} is in groups[{seen[m]}] and groups[{i}]; "
                    "a module can be in one FSDP group only"
                )
            seen[m] = i
            for other in canonical[j + 1 :]:
                if is_within(m, other) or is_within(other, m):
                    outer, inner = (other, m) if is_within(m, other) else (m, other)
                    raise ValueError(
                        f"plan_wrap: groups[{i}] lists {quoted(outer)} and {quoted(inner)}, "
                        f"which is inside it; FSDP groups must not overlap: list {quoted(outer)} "
                        "alone, or its parts"
                    )
        checked.append(tuple(dict.fromkeys(canonical)))
    return tuple(checked)


def _member(view: ModelView, fqn: object, i: int) -> str:
    if not isinstance(fqn, str):
        raise TypeError(
            f"plan_wrap: groups[{i}] must list module FQN strings; got {type(fqn).__name__}"
        )
    if fqn not in view.module_alias:
        raise ValueError(
            f"plan_wrap: groups[{i}] names module {fqn!r}, which the model does not have "
            f"(its modules include {fqn_list(list(view.modules)[1:6])})"
        )
    canonical = view.module_alias[fqn]
    if canonical == "":
        raise ValueError(
            f"plan_wrap: groups[{i}] names the root module; the root is always a group of its own"
        )
    for ignored in view.ignored_modules:
        if is_within(canonical, ignored):
            raise ValueError(
                f"plan_wrap: groups[{i}] names {quoted(canonical)}, which is inside ignored "
                f"module {quoted(ignored)}"
            )
    return canonical


def stated_group_units(
    groups: StatedGroups,
    atomic: Sequence[WrapUnit],
    view: ModelView,
    uses: OrderView,
    trainable_dtypes: Mapping[str, frozenset[str]],
) -> tuple[list[WrapUnit], set[int]]:
    """Merge each stated group's atomic units into one unit.

    Args:
        groups: the checked groups (:func:`check_stated_groups`).
        atomic: the planner's single-module units, in execution order.
        view: the model's snapshot.
        uses: the order's view.
        trainable_dtypes: unit module FQN -> dtypes of its trainable parameters.

    Returns:
        ``(units, fixed)``: the units in execution order with each group merged,
        and the indices in ``units`` of the stated groups.

    Raises:
        ValueError: a member did not stay a unit (it never runs its own
            forward, or holds a tied/shared parameter used outside it), or
            the group's trainable parameters have several dtypes (FSDP2
            reduce-scatters a group in one dtype).
    """
    by_module = {u.module_fqns[0]: u for u in atomic}
    merged: dict[str, WrapUnit] = {}
    for i, group in enumerate(groups):
        missing = [m for m in group if m not in by_module]
        if missing:
            raise ValueError(_not_a_unit(i, missing[0], view, uses, by_module))
        dtypes = set().union(*(trainable_dtypes.get(m, frozenset()) for m in group))
        if len(dtypes) > 1:
            raise ValueError(
                f"plan_wrap: groups[{i}] ({fqn_and_list(group)}) has trainable parameters of "
                f"dtypes {sorted(dtypes)}; FSDP2 reduce-scatters a group in one dtype: cast "
                "them to one dtype or split the group"
            )
        members = sorted((by_module[m] for m in group), key=_first_use_key)
        unit = merge_units(members)
        for m in group:
            merged[m] = unit
    units: list[WrapUnit] = []
    fixed: set[int] = set()
    emitted: set[int] = set()
    for unit in atomic:
        group_unit = merged.get(unit.module_fqns[0])
        if group_unit is None:
            units.append(unit)
        elif id(group_unit) not in emitted:
            emitted.add(id(group_unit))
            fixed.add(len(units))
            units.append(group_unit)
    return units, fixed


def bucket_between_groups(
    atomic: Sequence[WrapUnit],
    group_units: Sequence[WrapUnit],
    bucket: Callable[[Sequence[WrapUnit]], list[WrapUnit]],
) -> list[WrapUnit]:
    """Bucket each run of units between stated groups; keep the groups as they are.

    A run is a stretch of atomic units consecutive in execution order with no
    stated member among them: every member ends a run, also a later member of
    a group that was already placed (with ``groups=[["blocks.0", "blocks.2"]]``,
    ``blocks.1`` and ``blocks.3`` are in different runs, since ``blocks.2``
    runs between them).

    Args:
        atomic: the planner's single-module units, in execution order.
        group_units: the stated groups, merged (:func:`stated_group_units`).
        bucket: the bucketing of one run (:func:`execwrap.planning.bucketing.bucket_units`
            with its cap and dtypes).

    Returns:
        All units, ordered by first use.
    """
    member_of = {m: g for g in group_units for m in g.module_fqns}
    out: list[WrapUnit] = []
    run: list[WrapUnit] = []
    placed: set[int] = set()
    for unit in atomic:
        group = member_of.get(unit.module_fqns[0])
        if group is None:
            run.append(unit)
            continue
        out += bucket(run) if run else []
        run = []
        if id(group) not in placed:
            placed.add(id(group))
            out.append(group)
    out += bucket(run) if run else []
    out.sort(key=_first_use_key)
    return out


def stated_group_note(unit: WrapUnit) -> str:
    """The note on one stated group of several modules (or one module)."""
    if len(unit.module_fqns) == 1:
        return (
            f"Module {quoted(unit.module_fqns[0])} is a unit of its own, as stated in groups "
            f"({unit.numel} elements)."
        )
    return (
        f"Modules {fqn_and_list(unit.module_fqns)} form one FSDP group, as stated in groups: "
        f"one all-gather and one reduce-scatter for {len(unit.module_fqns)} modules "
        f"({unit.numel} elements)."
    )


def _not_a_unit(
    i: int, member: str, view: ModelView, uses: OrderView, units: Mapping[str, WrapUnit]
) -> str:
    """Why stated member ``member`` did not stay a unit, and what to do."""
    head = f"plan_wrap: groups[{i}] lists {quoted(member)} ({view.classes.get(member, '?')}), "
    if uses.order.module_forward_order and uses.calls[member] == 0:
        return (
            head + "which never runs its own forward in the order, so FSDP hooks on it would "
            "never fire; list the modules inside it that run instead"
        )
    inside = [
        p for p in view.params if any(is_within(view.owner(n), member) for n in view.fqns_of[p])
    ]
    outside = sorted({m for p in inside for m in uses.users[p] if not is_within(m, member)})
    tied = [p for p in inside if len(view.fqns_of[p]) > 1]
    what = (
        f"tied parameter {tied[0]!r} (also {fqn_list(view.fqns_of[tied[0]][1:])})"
        if tied
        else "a parameter"
    )
    users = f", used outside it by {fqn_list(outside)}" if outside else ", used outside it"
    return (
        head + f"which holds {what}{users}: FSDP must keep such a parameter in one unit "
        "enclosing every name and use of it, so the plan could not keep the module as a "
        "unit. List the modules sharing it in the same group, or leave it out"
    )


def _first_use_key(unit: WrapUnit) -> tuple[bool, int]:
    return (unit.first_use is None, unit.first_use or 0)
