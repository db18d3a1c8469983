"""Plans of given groups: the units exactly as FSDP2 builds them from ``fully_shard`` calls.

:func:`execwrap.plan_wrap` decides units (and may drop or move them so that every
parameter is unsharded wherever it is used). A plan that someone else decided
(transformers' ``fsdp_plan``, a saved rule file) must instead be described as it
is, so that it can be simulated and compared as it would run. :func:`plan_from_groups`
builds that :class:`~execwrap.plan.wrap_plan.WrapPlan`: one unit per group plus the
root's, each holding the parameters FSDP2 gives it.

FSDP2's assignment (``torch/distributed/fsdp/_fully_shard/_fsdp_init.py``,
``_get_managed_modules`` / ``_get_managed_states``): groups are sharded children
first and the root last; each call manages its modules' subtrees except the subtrees
of modules already sharded. So a parameter belongs to the innermost group module on
the path to the module holding it (the root's group when there is none). A tied or
shared parameter reached through modules of two groups is managed by both (each
all-gathers it); the plan puts it in the innermost of them (ties broken by
definition order) and a note names the others. Nothing is dropped or moved: a group
whose modules never run forward is kept (a note says so).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn as nn

from execwrap.plan.model_view import ModelView
from execwrap.plan.spans import UseSpans
from execwrap.plan.unit import WrapUnit
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.util.text import fqn_list
from tracing.fqn import is_within, owner_fqn, quoted
from tracing.order import ExecutionOrder, param_infos, shared_param_map

__all__ = ["plan_from_groups", "tables_order"]


def tables_order(model: nn.Module) -> ExecutionOrder:
    """An order of ``model`` without calls: its parameter, tied-name and module tables only.

    Enough to lay out, check, export and apply a plan of given groups (the plan then
    fits this model); not enough to simulate it or to set explicit prefetching, which
    need the calls (capture the order for those).
    """
    _, shared = shared_param_map(model)
    return ExecutionOrder(
        params=param_infos(model),
        shared_params=shared,
        module_classes={f: type(m).__name__ for f, m in model.named_modules()},
    )


def plan_from_groups(
    model: nn.Module,
    order: ExecutionOrder,
    groups: Sequence[Sequence[str]],
    *,
    reshard_after_forward: Sequence[bool] | None = None,
    prefetch: int | None = None,
    policy_name: str = "given groups",
    notes: Sequence[str] = (),
) -> WrapPlan:
    """A plan whose units are exactly ``groups`` (and the root's), as FSDP2 builds them.

    Args:
        model: the unwrapped model (the meta device is fine).
        order: its execution order (a hand-built one without calls is allowed:
            every unit is then "never called", in definition order).
        groups: module FQNs of each ``fully_shard`` call, the root left out.
        reshard_after_forward: one flag per group (in ``groups`` order); the
            root's unit gets ``False`` (FSDP2's default for the root). ``None``:
            the plan leaves it to FSDP2's defaults.
        prefetch: the explicit prefetch depth the plan is applied with
            (``0``: FSDP2's implicit prefetching only), or ``None``.
        policy_name: how the plan's source is named in reports.
        notes: sentences added before the plan's own notes.

    Returns:
        A :class:`~execwrap.plan.wrap_plan.WrapPlan` with units in execution order
        (by first call; never-called units last, in definition order).

    Raises:
        TypeError: ``groups`` is a string or holds one.
        ValueError: a group is empty, names a module the model does not have or
            the root, names a module twice, or holds a module inside another of
            its modules; a module is in two groups; ``reshard_after_forward`` has
            another length than ``groups``.
    """
    view = ModelView.build(model, ())
    name = type(model).__name__
    checked = _checked_groups(view, groups, name)
    if reshard_after_forward is not None and len(reshard_after_forward) != len(checked):
        raise ValueError(
            f"plan_from_groups: {len(reshard_after_forward)} reshard_after_forward flag(s) for "
            f"{len(checked)} group(s); give one per group"
        )
    holders, shared = _holders(view, checked)
    spans = UseSpans(order)
    position = _forward_positions(order, view)
    units: list[WrapUnit] = []
    flags: dict[tuple[str, ...], bool] = {("",): False}
    for i, fqns in enumerate([("",), *checked]):
        params = sorted(holders.get(i, []), key=position.__getitem__)
        first, last = spans.span(fqns, params)
        units.append(
            WrapUnit(
                module_fqns=fqns,
                param_fqns=tuple(params),
                numel=sum(view.numel[p] for p in params),
                bytes=sum(view.bytes[p] for p in params),
                first_use=first,
                last_use=last,
            )
        )
        if i and reshard_after_forward is not None:
            flags[fqns] = bool(reshard_after_forward[i - 1])
    units.sort(
        key=lambda u: (u.first_use is None, u.first_use or 0, view.def_index[u.module_fqns[0]])
    )
    plan_notes = [*notes, *_shared_notes(shared, checked, view), *_uncalled_notes(units, order)]
    return WrapPlan(
        units=units,
        order=order,
        atomic_units=list(units),
        notes=plan_notes,
        policy_name=policy_name,
        policy_fqns=("", *(m for fqns in checked for m in fqns)),
        prefetch=prefetch,
        reshard_after_forward=(
            None if reshard_after_forward is None else tuple(flags[u.module_fqns] for u in units)
        ),
    )


def _checked_groups(
    view: ModelView, groups: Sequence[Sequence[str]], model_name: str
) -> list[tuple[str, ...]]:
    if isinstance(groups, str) or any(isinstance(g, str) for g in groups):
        raise TypeError(
            "plan_from_groups: groups must be a list of lists of module FQNs, e.g. "
            f"[['model.norm', 'lm_head']]; got {groups!r}"
        )
    seen: dict[str, int] = {}
    out: list[tuple[str, ...]] = []
    for i, group in enumerate(groups):
        members = list(group)
        if not members:
            raise ValueError(f"plan_from_groups: groups[{i}] is empty; list its modules")
        canonical = []
        for m in members:
            if not isinstance(m, str) or m not in view.module_alias:
                raise ValueError(
                    f"plan_from_groups: groups[{i}] names module {m!r}, which {model_name} "
                    f"does not have (its modules include {fqn_list(list(view.modules)[1:6])})"
                )
            c = view.module_alias[m]
            if c == "":
                raise ValueError(
                    f"plan_from_groups: groups[{i}] names the root; the root is always a "
                    "group of its own (leave it out)"
                )
            if c in seen:
                raise ValueError(
                    f"plan_from_groups: module {quoted(c)} is in groups[{seen[c]}] and "
                    f"groups[{i}]; a module can be in one FSDP group only"
                )
            seen[c] = i
            canonical.append(c)
        for a in canonical:
            for b in canonical:
                if a != b and is_within(b, a):
                    raise ValueError(
                        f"plan_from_groups: groups[{i}] lists {quoted(a)} and {quoted(b)}, "
                        f"which is inside it; list {quoted(a)} alone, or its parts"
                    )
        out.append(tuple(canonical))
    return out


def _holders(
    view: ModelView, groups: Sequence[tuple[str, ...]]
) -> tuple[dict[int, list[str]], dict[str, list[int]]]:
    """Unit index (0: the root, ``i + 1``: ``groups[i]``) -> its canonical parameters;
    and each parameter managed by several groups -> those groups (holder first)."""
    group_of = {m: i + 1 for i, fqns in enumerate(groups) for m in fqns}
    first_def = [0, *(min(view.def_index[m] for m in fqns) for fqns in groups)]
    holders: dict[int, list[str]] = {}
    shared: dict[str, list[int]] = {}
    for p in view.params:
        reached: dict[int, int] = {}  # group -> depth of its innermost module on a path
        for name in view.fqns_of[p]:
            chain = view.chain(owner_fqn(name))
            depth, unit = max(
                ((d, group_of[m]) for d, m in enumerate(chain) if m in group_of),
                default=(-1, 0),
            )
            reached[unit] = max(reached.get(unit, -1), depth)
        ordered = sorted(reached, key=lambda u: (-reached[u], first_def[u]))
        holders.setdefault(ordered[0], []).append(p)
        if len(ordered) > 1:
            shared[p] = ordered
    return holders, shared


def _forward_positions(order: ExecutionOrder, view: ModelView) -> dict[str, int]:
    """Canonical parameter -> its position in forward use order (unused ones after, in
    definition order)."""
    canonical = view.alias_to_canonical
    pos: dict[str, int] = {}
    for p in order.param_forward_order:
        if p in canonical:
            pos.setdefault(canonical[p], len(pos))
    for use in order.param_uses:
        for p in use.param_fqns:
            if p in canonical:
                pos.setdefault(canonical[p], len(pos))
    for p in view.params:
        pos.setdefault(p, len(pos))
    return pos


def _shared_notes(
    shared: dict[str, list[int]], groups: Sequence[tuple[str, ...]], view: ModelView
) -> list[str]:
    def label(unit: int) -> str:
        return "the root's group" if unit == 0 else f"group {list(groups[unit - 1])}"

    notes = []
    for p, units in shared.items():
        others = ", ".join(label(u) for u in units[1:])
        names = ", ".join(quoted(n) for n in view.fqns_of[p])
        notes.append(
            f"parameter {quoted(p)} (names {names}) is reached from {label(units[0])} and "
            f"from {others}: FSDP2 manages it in each (each all-gathers it and reduce-scatters "
            f"its gradient); this plan counts it once, in {label(units[0])}"
        )
    return notes


def _uncalled_notes(units: Sequence[WrapUnit], order: ExecutionOrder) -> list[str]:
    if not order.module_forward_order:
        return []
    return [
        f"group {list(u.module_fqns)} never runs forward in the order: FSDP2's hooks on it "
        "never fire, so its parameters stay sharded where they are used"
        for u in units
        if u.first_use is None and u.param_fqns and not u.is_root
    ]
