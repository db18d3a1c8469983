"""Optimal contiguous partitions by dynamic programming.

The auto-planner (:mod:`execwrap.planning.auto.search`) cuts a sequence of units (in
execution order) into consecutive groups. When the cost of a grouping is the
sum of one cost per group, the best grouping is found exactly by the classic
recurrence over prefixes (Bellman 1957; the "optimal partition of a
sequence" of Jackson et al., "An algorithm for optimal partitioning of data
on an interval", IEEE SPL 2005)::

    best[0] = 0
    best[j] = min over i < j with [i, j) allowed of best[i] + cost(i, j)

in ``O(n * L)`` cost evaluations, ``L`` the longest allowed group. Costs
equal within a relative ``1e-12`` count as ties, broken towards fewer groups,
then towards the grouping whose last group starts earliest (applied from the
end backwards), so the result is deterministic and never depends on float
noise in the order of summation.

An allowed group here is an interval ``[i, j)`` with ``j <= reach[i]``: every
sub-interval of an allowed interval is allowed (true of FSDP2 groups: see
:func:`execwrap.planning.bucketing.bucket_units`), so ``reach`` is non-decreasing.

:func:`best_labelled_partition` also gives each group one of several labels (the
auto-planner's: an activation-checkpointing mode per group) whose cost is the
group's under that label. The choice of one group's label does not change any
other group's cost, so the cheapest label of each interval is the one an optimal
cut uses for it, and the recurrence over prefixes stays exact: it is run over
``min over labels of cost(i, j, label)``, ties going to the earlier label.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence

__all__ = ["best_labelled_partition", "best_partition", "partition_cost"]

#: Relative tolerance under which two costs count as equal (tie-breaking).
_REL_TOL = 1e-12


def best_partition(
    reach: Sequence[int], cost: Callable[[int, int], float]
) -> tuple[float, list[tuple[int, int]]]:
    """The cheapest cut of ``range(n)`` into consecutive allowed intervals.

    Args:
        reach: ``n`` entries; ``reach[i]`` is the largest ``j`` such that the
            interval ``[i, j)`` may form one group (``i < reach[i] <= n``; a
            single item always may). Must be non-decreasing.
        cost: ``cost(i, j)`` is the cost of group ``[i, j)`` (any unit, e.g.
            seconds); ``math.inf`` forbids that group.

    Returns:
        ``(total, groups)``: the least total cost and the groups as
        ``(start, stop)`` pairs in order. ``(0.0, [])`` for ``n == 0``;
        ``(math.inf, [])`` when every cut has an infinite cost.

    Raises:
        ValueError: ``reach`` is out of range or decreasing.

    Example:
        Groups of items of sizes ``[4, 4, 4, 9, 1]`` holding at most 8 (an
        item alone always fits), one unit of cost per group:

        >>> sizes = [4, 4, 4, 9, 1]
        >>> def cost(i, j):
        ...     return 1.0 if j - i == 1 or sum(sizes[i:j]) <= 8 else math.inf
        >>> best_partition([5, 5, 5, 5, 5], cost)
        (4.0, [(0, 1), (1, 3), (3, 4), (4, 5)])
    """
    n = len(reach)
    _check_reach(reach)
    best = [math.inf] * (n + 1)
    count = [0] * (n + 1)
    start_of = [0] * (n + 1)
    best[0] = 0.0
    first = 0  # smallest i with reach[i] >= j (reach is non-decreasing)
    for j in range(1, n + 1):
        while reach[first] < j:
            first += 1
        for i in range(first, j):
            if math.isinf(best[i]):
                continue
            c = cost(i, j)
            if math.isinf(c):
                continue
            total = best[i] + c
            if _better(total, count[i] + 1, best[j], count[j]):
                best[j], count[j], start_of[j] = total, count[i] + 1, i
    if math.isinf(best[n]):
        return math.inf, []
    groups: list[tuple[int, int]] = []
    j = n
    while j > 0:
        groups.append((start_of[j], j))
        j = start_of[j]
    groups.reverse()
    return best[n], groups


def best_labelled_partition(
    reach: Sequence[int],
    cost: Callable[[int, int, Hashable], float],
    labels: Sequence[Hashable],
) -> tuple[float, list[tuple[int, int]], list[Hashable]]:
    """The cheapest cut of ``range(n)`` into allowed intervals, each with one of ``labels``.

    Args:
        reach: as for :func:`best_partition`.
        cost: ``cost(i, j, label)`` is the cost of group ``[i, j)`` under ``label``
            (``math.inf`` forbids that pair).
        labels: the labels, in order of preference on a tie.

    Returns:
        ``(total, groups, chosen)``: the least total cost, the groups as
        ``(start, stop)`` pairs, and each group's label (``(math.inf, [], [])`` when
        every cut has an infinite cost).

    Raises:
        ValueError: no labels; ``reach`` out of range or decreasing.

    Example:
        Each group is "fast" (3 per group, one item only) or "small" (2.5 per item
        plus 1, any size):

        >>> def cost(i, j, label):
        ...     if label == "fast":
        ...         return 3.0 if j - i == 1 else math.inf
        ...     return 2.5 * (j - i) + 1
        >>> best_labelled_partition([3, 3, 3], cost, ["fast", "small"])
        (8.5, [(0, 3)], ['small'])
        >>> best_labelled_partition([1, 2, 3], cost, ["fast", "small"])
        (9.0, [(0, 1), (1, 2), (2, 3)], ['fast', 'fast', 'fast'])
    """
    if not labels:
        raise ValueError("best_labelled_partition: labels must not be empty")
    chosen: dict[tuple[int, int], Hashable] = {}

    def best(i: int, j: int) -> float:
        least, pick = math.inf, labels[0]
        for label in labels:
            value = cost(i, j, label)
            if value < least:
                least, pick = value, label
        chosen[(i, j)] = pick
        return least

    total, groups = best_partition(reach, best)
    return total, groups, [chosen[g] for g in groups]


def partition_cost(groups: Sequence[tuple[int, int]], cost: Callable[[int, int], float]) -> float:
    """The total ``cost`` of ``groups`` (``(start, stop)`` pairs), as
    :func:`best_partition` counts it."""
    return math.fsum(cost(i, j) for i, j in groups)


def _better(total: float, groups: int, incumbent: float, incumbent_groups: int) -> bool:
    """Whether ``total`` (over ``groups`` groups) beats the incumbent: clearly
    cheaper, or equal within :data:`_REL_TOL` with fewer groups. On a full
    tie the incumbent (found with the earlier last cut) stays."""
    if math.isinf(incumbent):
        return True
    scale = max(abs(total), abs(incumbent), 1e-300)
    if total < incumbent - _REL_TOL * scale:
        return True
    return abs(total - incumbent) <= _REL_TOL * scale and groups < incumbent_groups


def _check_reach(reach: Sequence[int]) -> None:
    n = len(reach)
    previous = 0
    for i, r in enumerate(reach):
        if not (i < r <= n):
            raise ValueError(f"best_partition: reach[{i}] = {r} is outside ({i}, {n}]")
        if r < previous:
            raise ValueError(
                f"best_partition: reach must be non-decreasing; reach[{i}] = {r} < "
                f"reach[{i - 1}] = {previous}"
            )
        previous = r
