"""Bucketing: merge consecutive units into size-capped FSDP2 groups.

With ``plan_wrap(..., bucket_numel=cap)``, the plan's atomic units (one module
each, in execution order) are merged greedily into ``fully_shard`` groups of
at most ``cap`` elements: extend the group being filled while the next unit
may join it (:func:`_can_group`), else start a new one. Every sub-run of a
run that may form a group may form one too, so the greedy scan is optimal
for a contiguous grouping under a cap: after ``k`` groups it has covered at
least as many units as any valid grouping into ``k`` groups.
:func:`min_contiguous_groups` is the same scan over bare sizes: the least
number of all-gathers per forward that any contiguous bucketing can reach.

This is the bucketing that the original ``ParamExecOrderWrapPolicy`` left as
future work.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from execwrap.plan.unit import WrapUnit
from tracing.checks import check_int
from tracing.fqn import is_within

__all__ = [
    "bucket_units",
    "can_group",
    "merge_units",
    "min_contiguous_groups",
    "min_groups_lower_bound",
]

logger = logging.getLogger(__name__)


def bucket_units(
    atomic: Sequence[WrapUnit], cap: int, trainable_dtypes: dict[str, frozenset[str]]
) -> list[WrapUnit]:
    """Greedy contiguous grouping of ``atomic`` (in execution order) under ``cap``.

    Units that hold no parameters (e.g. a block whose children are all units
    under ``always_wrap_policy``) all-gather nothing: they stay alone and do
    not interrupt the group being filled, so the groups of parameter-holding
    units are the greedy (optimal) grouping of that sequence.

    Args:
        atomic: single-module units in execution order.
        cap: group size cap (elements, ``> 0``).
        trainable_dtypes: module FQN -> dtypes of its unit's trainable
            parameters (FSDP2 reduce-scatters a group in one dtype).

    Returns:
        The merged units, ordered by first use.
    """
    groups: list[list[WrapUnit]] = []
    filling: list[WrapUnit] | None = None
    for unit in atomic:
        if unit.numel == 0 and not unit.is_root:
            groups.append([unit])
            continue
        if filling is not None and _can_group([*filling, unit], cap, trainable_dtypes):
            filling.append(unit)
        else:
            filling = [unit]
            groups.append(filling)
    logger.debug(
        "bucketing %d unit(s) under %d elements: %d group(s)", len(atomic), cap, len(groups)
    )
    merged = [merge_units(g) for g in groups]
    # Keep execution order by first use (paramless units may have been emitted
    # while an earlier group was still filling).
    merged.sort(key=lambda u: (u.first_use is None, u.first_use or 0))
    return merged


def _can_group(
    members: Sequence[WrapUnit], cap: int, trainable_dtypes: dict[str, frozenset[str]]
) -> bool:
    """Whether ``members`` (consecutive atomic units) may form one FSDP2 group.

    A single unit always may. Several may when: none is the root, all are
    called, none of their modules encloses another's (``fully_shard`` groups
    must not overlap), their numel adds up to at most ``cap``, and their
    trainable parameters share one dtype (FSDP2 reduce-scatters a group in
    one dtype). Every sub-run of an allowed run is allowed, which makes the
    greedy grouping optimal.
    """
    if len(members) <= 1:
        return True
    if any(u.is_root or u.first_use is None for u in members):
        return False
    if sum(u.numel for u in members) > cap:
        return False
    fqns = [m for u in members for m in u.module_fqns]
    for i, a in enumerate(fqns):
        for b in fqns[i + 1 :]:
            if is_within(a, b) or is_within(b, a):
                return False
    dtypes: set[str] = set()
    for u in members:
        for m in u.module_fqns:
            dtypes |= trainable_dtypes.get(m, frozenset())
    return len(dtypes) <= 1


def merge_units(members: Sequence[WrapUnit]) -> WrapUnit:
    """One unit holding the modules and parameters of ``members``, in order."""
    if len(members) == 1:
        return members[0]
    firsts = [u.first_use for u in members if u.first_use is not None]
    lasts = [u.last_use for u in members if u.last_use is not None]
    return WrapUnit(
        module_fqns=tuple(m for u in members for m in u.module_fqns),
        param_fqns=tuple(p for u in members for p in u.param_fqns),
        numel=sum(u.numel for u in members),
        bytes=sum(u.bytes for u in members),
        first_use=min(firsts) if firsts else None,
        last_use=max(lasts) if lasts else None,
    )


def min_contiguous_groups(sizes: Sequence[int], cap: int) -> int:
    """Fewest groups of consecutive items with each group's sum at most ``cap``.

    An item larger than ``cap`` forms a group alone. The greedy scan (extend
    the current group while it fits) is optimal: after ``k`` groups it has
    covered at least as many items as any valid grouping into ``k`` groups,
    because a sub-run of a run that fits also fits. This is the least number
    of all-gathers per forward that any contiguous bucketing of these unit
    sizes can reach under the cap.

    Args:
        sizes: unit sizes in execution order (elements, ``>= 0``).
        cap: group size cap (elements, ``> 0``).

    Returns:
        The number of groups (``0`` for no sizes).

    Raises:
        TypeError: ``cap`` is not an int (or is a bool).
        ValueError: ``cap <= 0`` or a negative size.

    Example:
        >>> min_contiguous_groups([4, 4, 4, 9, 1], cap=8)
        4
    """
    check_int(cap, "min_contiguous_groups: cap", minimum=1, unit="elements")
    groups = 0
    current: int | None = None
    for i, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"min_contiguous_groups: sizes[{i}] is negative ({size})")
        if current is not None and current + size <= cap:
            current += size
        else:
            groups += 1
            current = size
    return groups


#: Alias of :func:`min_contiguous_groups` (its earlier name, kept for callers of it).
min_groups_lower_bound = min_contiguous_groups


def can_group(
    members: Sequence[WrapUnit],
    trainable_dtypes: dict[str, frozenset[str]],
    cap: int | float = float("inf"),
) -> bool:
    """Whether consecutive atomic units ``members`` may form one FSDP2 group
    of at most ``cap`` elements (no cap by default); see :func:`bucket_units`.
    Every sub-run of an allowed run is allowed."""
    return _can_group(members, cap, trainable_dtypes)  # type: ignore[arg-type]
