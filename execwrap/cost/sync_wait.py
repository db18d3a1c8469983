"""The wait at a collective for ranks that arrive apart, by the compute before it.

Ranks that run the same compute between two collectives still finish it at
different times: the host's scheduler, caches and other threads jitter each
rank's compute, and a collective starts only when the slowest rank reaches
it. Each collective then costs, beyond its own time, the expected lead of the
slowest rank over the others, which grows with the compute since the last
collective (the jitter of a longer span is larger). Fewer, larger FSDP groups
meet less often, so they pay this wait fewer times.

:func:`measure_sync_wait` measures it on the live process group: at each
compute span of :data:`SPANS_S` (a loop of small matmuls), ``m`` spans with a
one-element all-reduce after each (*synced*) against the same ``m`` spans
with one all-reduce at the end (*free*), the two interleaved in rounds with
every other level (medians over the runs the host did not interrupt,
:func:`execwrap.cost.fixed_costs.interleaved_medians`). Per collective,
``(synced - free) / (m - 1)`` is the collective's own time plus the wait;
the same difference with no compute between the collectives is subtracted,
as the calibration's sweep and FSDP2 stacks already price a collective met
at once. The wait grows like the square root of the span (a rank's lead is
the sum of many small independent delays: its spread grows like the square
root of their number), so each level gives ``wait / sqrt(span)`` and their
median (:func:`jitter_from_waits`, ``>= 0``) is the
:class:`~execwrap.cost.CostModel`'s ``sync_jitter``;
:meth:`~execwrap.cost.CostModel.sync_wait_time` prices a collective after
``c`` seconds of compute at ``sync_jitter * sqrt(c)``. (Three levels, one
coefficient: each level's wait alone moved by up to 2x between calibrations.)

Measured on 2 gloo ranks of a 2-vCPU virtual machine (2026-12-02): FSDP2
units of one 16 x 16 ``Linear`` plus a parameter-free matmul chain cost
1.8-2.0 ms more per unit in forward than unsharded with no compute between
the collectives, 2.1-3.0 ms with 4.6 ms of compute per unit and 3.1 ms with
17 ms; over eight benchmark runs, merging two of a GPT's or a Llama's blocks
into one FSDP group saved 1.5-2x the time the cost model without this wait
predicted. The simulator adds the wait only where collectives block the
training thread (``CostModel.synchronous_collectives``, gloo on CPU); on GPUs
the host runs ahead of the device and the wait is not modelled.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from execwrap.cost.fixed_costs import interleaved_medians, sync_device

logger = logging.getLogger(__name__)

__all__ = ["SPANS_S", "RUN_S", "jitter_from_waits", "measure_sync_wait"]

#: The compute spans between collectives, seconds.
SPANS_S = (1e-3, 4e-3, 16e-3)
#: Compute per timed run, seconds: a span of ``s`` is repeated ``RUN_S / s`` times.
RUN_S = 64e-3
#: Rounds of the interleaved runs (times ``repeat``).
ROUNDS = 15
#: Side of the square float32 matmul a span is made of.
_MM_SIDE = 96


def measure_sync_wait(group: dist.ProcessGroup, dev: torch.device, *, repeat: int = 1) -> float:
    """The ``sync_jitter`` of ``group`` (seconds per square-root second; module
    docstring). Every rank of ``group`` calls it (it issues collectives); rank 0's
    value is the one to keep (the caller broadcasts it).

    Args:
        group: the process group.
        dev: the device the compute and the collectives run on.
        repeat: ``repeat * ROUNDS`` rounds.

    Returns:
        The coefficient, ``>= 0``.
    """
    a = torch.randn(_MM_SIDE, _MM_SIDE, device=dev)
    flag = torch.zeros(1, device=dev)
    per_mm = _agreed_max(_mm_seconds(a, dev), group, dev)
    fns: dict[str, Callable[[], tuple[float, ...]]] = {}
    # (span, matmuls per span, collectives per run)
    levels = [
        (span, max(1, round(span / per_mm)) if span else 0, max(2, round(RUN_S / max(span, 1e-3))))
        for span in (0.0, *SPANS_S)
    ]
    for span, mms, meets in levels:
        fns[f"synced {span}"] = _run(a, flag, mms, meets, True, group, dev)
        fns[f"free {span}"] = _run(a, flag, mms, meets, False, group, dev)
    med = interleaved_medians(fns, dev, group, rounds=ROUNDS * repeat)
    spans, waits = [], []
    for span, _, meets in levels:
        synced, free = med[f"synced {span}"][0], med[f"free {span}"][0]
        spans.append(free / meets)
        waits.append((synced - free) / (meets - 1))
    extra = [w - waits[0] for w in waits[1:]]
    jitter = jitter_from_waits(spans[1:], extra)
    logger.debug(
        "calibrate: wait per collective %s ms after %s ms of compute: sync_jitter %.3g",
        [round(w * 1e3, 3) for w in extra],
        [round(c * 1e3, 2) for c in spans[1:]],
        jitter,
    )
    return jitter


def jitter_from_waits(spans: list[float], waits: list[float]) -> float:
    """The median of ``wait / sqrt(span)`` over the measured levels, at least ``0``.

    Args:
        spans: compute seconds between collectives, one per level (``> 0``).
        waits: the measured wait per collective at each, seconds.

    >>> round(jitter_from_waits([1e-3, 4e-3, 16e-3], [0.3e-3, 1.0e-3, 1.2e-3]), 5)
    0.00949
    >>> jitter_from_waits([1e-3, 4e-3], [-1e-4, -2e-4])
    0.0
    """
    ratios = [w / math.sqrt(c) for c, w in zip(spans, waits, strict=True) if c > 0]
    return max(0.0, statistics.median(ratios)) if ratios else 0.0


def _mm_seconds(a: torch.Tensor, dev: torch.device) -> float:
    """Median seconds of one ``a @ a`` (9 runs of 20, after a warm-up)."""
    for _ in range(20):
        torch.mm(a, a)
    runs = []
    for _ in range(9):
        sync_device(dev)
        t0 = time.perf_counter()
        for _ in range(20):
            torch.mm(a, a)
        sync_device(dev)
        runs.append((time.perf_counter() - t0) / 20)
    return statistics.median(runs)


def _agreed_max(value: float, group: dist.ProcessGroup, dev: torch.device) -> float:
    """The largest ``value`` over the ranks (every rank builds the same spans)."""
    t = torch.tensor([value], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return max(float(t.item()), 1e-7)


def _run(
    a: torch.Tensor,
    flag: torch.Tensor,
    mms: int,
    meets: int,
    synced: bool,
    group: dist.ProcessGroup,
    dev: torch.device,
) -> Callable[[], tuple[float, ...]]:
    """``meets`` spans of ``mms`` matmuls, an all-reduce of ``flag`` after each
    (``synced``) or after the last only; returns ``(seconds,)``."""

    def run() -> tuple[float, ...]:
        t0 = time.perf_counter()
        for i in range(meets):
            for _ in range(mms):
                torch.mm(a, a)
            if synced or i == meets - 1:
                dist.all_reduce(flag, group=group)
        sync_device(dev)
        return (time.perf_counter() - t0,)

    run()
    return run
