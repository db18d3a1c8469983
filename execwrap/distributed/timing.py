"""One timing on every rank: the compute times an auto plan is made from, agreed before planning.

The auto-planner (``plan_wrap(..., bucket_numel="auto")``) weighs each unit's
compute time, read from the order's timing fields, against its
communication. Each rank times its own capture
(``record_execution_order(..., timing=True)``), and two ranks never measure
the same microseconds: a small difference can tip the search to another
grouping on one rank (seen on 2 gloo ranks: ``group 1 is ['blocks.0', ...,
'blocks.5'] on rank 0 and ['blocks.0', ..., 'blocks.4'] on rank 1``), and
``apply_fully_shard``'s cross-rank check then refuses the plans.

:func:`agree_timing` makes the planner's inputs identical by construction:
every rank sends its timing fields in one ``all_gather_object`` (its status
folded in, so a rank that cannot take part is named on the others), and every
rank continues with the whole timing record of the *slowest* rank (the largest
step time: to the end of backward, else of forward; ties go to the lowest
rank).

Why one rank's whole record, and why the slowest:

* whole: the timing fields are one timeline per rank (each call's start and
  duration, when its backward began, when backward ended), from which the
  planner cuts per-unit segments (:func:`execwrap.simulate.unit_compute`). A
  per-call maximum or mean mixes timelines (a call could seem to start before
  the call enclosing it) and describes no run;
* slowest: in data-parallel training every collective waits for the last rank
  to arrive, so the slowest rank paces the step, and its times are what the
  step costs. A mean describes no rank, and rank 0's record is as arbitrary as
  any other's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from typing import Any

import torch.distributed as dist

from execwrap.distributed.status import describe_error, is_distributed, raise_failures
from execwrap.errors import OrderDivergenceError
from tracing.order import ExecutionOrder
from tracing.order_fields import TIMING_FIELDS

__all__ = ["agree_timing", "step_seconds"]

logger = logging.getLogger(__name__)

#: What one rank sends: ``(global rank, (calls, order digest, step seconds, timing
#: fields) or None, error text or None)``.
_Payload = tuple[int, tuple[int, str, float, dict[str, Any]] | None, str | None]


def step_seconds(order: ExecutionOrder) -> float:
    """Seconds of the timed step: to the end of backward when recorded, else to the
    end of the last forward call; ``0.0`` without timing."""
    if not order.has_timing:
        return 0.0
    if order.backward_end_s is not None:
        return float(order.backward_end_s)
    return max(
        (s + d for s, d in zip(order.forward_start_s, order.forward_times_s, strict=False)),
        default=0.0,
    )


def _calls_digest(order: ExecutionOrder) -> str:
    text = json.dumps(list(order.module_forward_order), separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def agree_timing(
    order: ExecutionOrder,
    group: dist.ProcessGroup | None = None,
    *,
    where: str = "plan_wrap",
) -> ExecutionOrder:
    """``order`` with the timing fields of the slowest rank of ``group``, the same on every rank.

    Collective: one ``all_gather_object`` (see the module docstring for the
    choice of record). Without an initialised process group, or with one rank,
    ``order`` is returned as it is; so it is when no rank has timing.

    Args:
        order: this rank's order (its module calls must be every rank's).
        group: the process group (default: ``WORLD``).
        where: the caller, for messages.

    Returns:
        A copy of ``order`` whose timing fields (:data:`tracing.order_fields.TIMING_FIELDS`)
        are the slowest rank's; ``order`` itself when this rank's record is chosen.

    Raises:
        RankFailure: another rank could not take part (its order is not an
            :class:`ExecutionOrder`, ...), naming it; this rank's own error when
            it is the one.
        OrderDivergenceError: on every rank, when the ranks' module calls
            differ (timings of other calls cannot be exchanged).

    Example:
        >>> agree_timing(ExecutionOrder()).has_timing  # no process group: unchanged
        False
    """
    if not is_distributed(group):
        return order
    phase = f"{where}: the ranks' agreement on compute times"
    error: Exception | None = None
    mine: _Payload
    try:
        fields = {name: getattr(order, name) for name in TIMING_FIELDS}
        entry = (len(order.module_forward_order), _calls_digest(order), step_seconds(order), fields)
        mine = (dist.get_rank(), entry, None)
    except Exception as e:
        error = e
        mine = (dist.get_rank(), None, describe_error(e))
    gathered: list[_Payload | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    entries = sorted((g for g in gathered if g is not None), key=lambda g: g[0])
    raise_failures(phase, tuple((r, text) for r, _, text in entries if text), error)
    return _chosen(order, [(r, e) for r, e, _ in entries if e is not None], where)


def _chosen(
    order: ExecutionOrder,
    entries: list[tuple[int, tuple[int, str, float, dict[str, Any]]]],
    where: str,
) -> ExecutionOrder:
    """The order with the slowest timed rank's fields (``entries`` by rank)."""
    ref_rank, (ref_calls, ref_digest, _, _) = entries[0]
    for rank, (calls, digest, _, _) in entries[1:]:
        if digest != ref_digest:
            raise OrderDivergenceError(
                f"{where}: rank {rank} captured other module calls than rank {ref_rank} "
                f"({calls} calls against {ref_calls}), so the ranks would plan from different "
                "orders. Capture the same order on every rank (same inputs, same control "
                "flow); execwrap.check_order_across_ranks(order) names the first call that "
                "differs",
                ranks=(ref_rank, rank),
            )
    timed = [(rank, e) for rank, e in entries if e[3]["forward_times_s"]]
    if not timed:
        return order
    # the slowest step; ties: the lowest rank
    rank, (_, _, seconds, fields) = max(timed, key=lambda t: (t[1][2], -t[0]))
    fastest = min(e[2] for _, e in timed)
    logger.info(
        "%s: compute times from rank %d, the slowest of %d timed ranks (step %.3g s; the "
        "fastest %.3g s), so that every rank plans from the same times",
        where,
        rank,
        len(timed),
        seconds,
        fastest,
    )
    if rank == dist.get_rank():
        return order
    return dataclasses.replace(order, **fields)
