"""The explicit prefetch schedule of FSDP2 groups: :func:`prefetch_schedule`.

For each group in forward order (first call in ``order.module_forward_order``),
the group's FSDP state prefetches the next ``prefetch`` groups in forward, and
the next ``prefetch`` groups in backward order: the order in which their first
gradient became ready (``order.param_backward_order``, runtime capture) when
every executed group has one, else the reverse forward order. The root
prefetches the first groups of each direction. Groups that never run in
forward, and groups without parameters (nothing to all-gather; their
neighbours prefetch past them), are not prefetched. Groups that run entirely
before the first use of a trainable parameter never run backward (their
outputs need no grad) and are left out of the backward lists.

:func:`execwrap.fsdp.fsdp2.apply_fully_shard` turns the schedule into
``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``
calls, the way torchtitan sets them for its transformer blocks, but for any
model and any grouping; the step simulator (:mod:`execwrap.simulate`) replays
the same lists.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from execwrap.plan.spans import OrderFacts
from tracing.order import ExecutionOrder

__all__ = ["prefetch_schedule"]

logger = logging.getLogger(__name__)


def prefetch_schedule(
    groups: Sequence[Sequence[str]],
    order: ExecutionOrder,
    *,
    param_fqns: Sequence[Sequence[str]] | None = None,
    prefetch: int = 1,
    facts: OrderFacts | None = None,
) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Which groups each group prefetches, forward and backward.

    Args:
        groups: module FQNs of each group (the root group ``[""]`` included or
            not; it prefetches but is never prefetched).
        order: the execution order.
        param_fqns: canonical parameter FQNs of each group. Groups without
            parameters have nothing to all-gather and are left out (their
            neighbours prefetch past them). The backward order comes from
            ``order.param_backward_order`` (the first ready gradient of each
            group); without ``param_fqns``, without a gradient order, or when
            a group has no gradient there (frozen), it is the reverse forward
            order.
        prefetch: groups ahead to prefetch.
        facts: ``OrderFacts(order)``, when the caller keeps one for many
            schedules of the same order (default: computed here).

    Returns:
        ``(forward, backward)``: group index -> indices of the groups it
        prefetches, for every group that runs in forward (the root first).
        Groups that run entirely before the first use of a trainable parameter
        never run backward (their outputs need no grad) and are left out of
        the backward lists.

    Raises:
        ValueError: ``facts`` are of another order.

    Example:
        >>> order = ExecutionOrder(module_forward_order=["", "a", "b", "c"])
        >>> prefetch_schedule([[""], ["c"], ["a"], ["b"]], order)
        ({0: [2], 2: [3], 3: [1], 1: []}, {0: [1], 1: [3], 3: [2], 2: []})
    """
    if facts is None:
        facts = OrderFacts(order)
    elif facts.order is not order:
        raise ValueError("prefetch_schedule: facts are of another order")
    roots = [i for i, fqns in enumerate(groups) if "" in fqns]
    uses = _first_uses(groups, facts, param_fqns, roots)
    forward = sorted((i for i in uses if i not in roots), key=lambda i: (uses[i], i))
    backward = _backward_sequence(forward, uses, facts, param_fqns)
    backward = _runs_backward(backward, groups, facts, param_fqns)
    reached = [r for r in roots if r in uses]
    return _prefetch_lists(forward, reached, prefetch), _prefetch_lists(backward, reached, prefetch)


# ------------------------------------------------------------------ prefetch_schedule helpers
def _first_uses(
    groups: Sequence[Sequence[str]],
    facts: OrderFacts,
    param_fqns: Sequence[Sequence[str]] | None,
    roots: list[int],
) -> dict[int, int]:
    """Group index -> first forward call of its modules, for the groups to schedule
    (those that run, with parameters to all-gather when ``param_fqns`` is given;
    root groups always)."""
    first = facts.first_call
    return {
        i: min(first[f] for f in fqns if f in first)
        for i, fqns in enumerate(groups)
        if any(f in first for f in fqns) and (param_fqns is None or param_fqns[i] or i in roots)
    }


def _backward_sequence(
    forward: list[int],
    uses: dict[int, int],
    facts: OrderFacts,
    param_fqns: Sequence[Sequence[str]] | None,
) -> list[int]:
    """The groups in backward order: by first ready gradient when every group has
    one in ``order.param_backward_order``, else reverse forward order."""
    backward = list(reversed(forward))
    if param_fqns is None or not facts.order.param_backward_order:
        return backward
    ready = facts.gradient_ready
    keys: dict[int, int] = {}
    for i in forward:
        positions = [ready[p] for p in param_fqns[i] if p in ready]
        if positions:
            keys[i] = min(positions)
    if len(keys) == len(forward):
        return sorted(forward, key=lambda i: (keys[i], -uses[i]))
    logger.debug(
        "prefetch_schedule: groups without gradients in param_backward_order; "
        "using reverse forward order for backward"
    )
    return backward


def _runs_backward(
    backward: list[int],
    groups: Sequence[Sequence[str]],
    facts: OrderFacts,
    param_fqns: Sequence[Sequence[str]] | None,
) -> list[int]:
    """``backward`` without the groups that run entirely before the first
    trainable parameter's use: they never run backward (see
    ``WrapPlan.runs_backward``), so nothing prefetches them there."""
    first_trainable = facts.first_trainable
    if first_trainable is None:
        return backward
    spans = facts.spans
    return [
        i
        for i in backward
        if (spans.span(groups[i], param_fqns[i] if param_fqns else ())[1] or 0) >= first_trainable
    ]


def _prefetch_lists(sequence: list[int], roots: list[int], prefetch: int) -> dict[int, list[int]]:
    """Each group -> the ``prefetch`` groups after it in ``sequence``; each root ->
    the first ``prefetch`` groups."""
    result: dict[int, list[int]] = {r: sequence[:prefetch] for r in roots}
    for k, i in enumerate(sequence):
        result[i] = sequence[k + 1 : k + 1 + prefetch]
    return result
