"""The auto-planner's mergeable units: which may form one FSDP2 group, and their bytes.

Helpers of :class:`execwrap.planning.auto.space.SearchSpace` over the units of an
atomic plan: how far a group starting at each unit may reach under FSDP2's
rules (:func:`execwrap.planning.bucketing.can_group` without a cap), the dtypes of
each unit's trainable parameters, and its parameters' bytes padded as FSDP2
pads them (counted as the simulator counts them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from execwrap.plan.unit import WrapUnit
from tracing.fqn import ancestors

if TYPE_CHECKING:
    from execwrap.plan.wrap_plan import WrapPlan
    from execwrap.simulate.facts import SimulationFacts

__all__ = [
    "group_reach",
    "padded_unit_bytes",
    "param_padded_bytes",
    "trainable_count",
    "trainable_dtypes",
]


def trainable_count(facts: SimulationFacts, unit: WrapUnit) -> int:
    """Trainable parameter tensors of ``unit`` (unknown ones count as trainable,
    as the simulator counts them)."""
    return sum(1 for p in unit.param_fqns if facts.requires_grad(p))


def param_padded_bytes(facts: SimulationFacts, unit: WrapUnit) -> list[int]:
    """Padded bytes of each parameter of ``unit`` the order knows (as FSDP2 pads dim 0)."""
    return [facts.padded[p] for p in unit.param_fqns if p in facts.padded]


def padded_unit_bytes(facts: SimulationFacts, unit: WrapUnit) -> tuple[int, int]:
    """Parameter and trainable bytes of ``unit``, padded as FSDP2 pads (dim 0 to a
    multiple of ``facts.world_size``; parameters the order does not know count 0)."""
    sizes = [(facts.param_padded(p), facts.requires_grad(p)) for p in unit.param_fqns]
    return sum(n for n, _ in sizes), sum(n for n, trainable in sizes if trainable)


def trainable_dtypes(plan: WrapPlan) -> dict[str, frozenset[str]]:
    """Each unit's first module FQN -> the dtypes of its trainable parameters."""
    params = plan.order.params
    return {
        u.module_fqns[0]: frozenset(
            params[p].dtype for p in u.param_fqns if p in params and params[p].requires_grad
        )
        for u in plan.units
    }


def group_reach(units: list[WrapUnit], dtypes: dict[str, frozenset[str]]) -> list[int]:
    """For each unit ``i``, the largest ``j`` such that ``units[i:j]`` may form one
    FSDP2 group (:func:`execwrap.planning.bucketing.can_group` without a cap), found
    with two pointers: ``O(units x group length)``."""
    m = len(units)
    lineage = [set().union(*(set(ancestors(f)) for f in u.module_fqns)) for u in units]
    own = [set(u.module_fqns) for u in units]
    reach = [0] * m
    j = 0
    for i in range(m):
        j = max(j, i + 1)
        while j < m and _joins(units, own, lineage, dtypes, i, j):
            j += 1
        reach[i] = j
    return reach


def _joins(
    units: list[WrapUnit],
    own: list[set[str]],
    lineage: list[set[str]],
    dtypes: dict[str, frozenset[str]],
    i: int,
    j: int,
) -> bool:
    """Whether ``units[j]`` may join the group ``units[i:j]``."""
    kinds: set[str] = set()
    for k in range(i, j + 1):
        for m in units[k].module_fqns:
            kinds |= dtypes.get(m, frozenset())
    if len(kinds) > 1:
        return False
    # nested: one unit's module is an ancestor (or equal) of another's
    return not any(own[k] & lineage[j] or own[j] & lineage[k] for k in range(i, j))
