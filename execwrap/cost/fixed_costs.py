"""FSDP2's costs inside a training step that a bare collective loop does not show.

:func:`fsdp_fixed_costs` runs on every rank of the group (it issues
collectives) and measures, from real ``fully_shard`` steps of synthetic stacks,
how FSDP2's collectives and bookkeeping inside a step differ from the
calibration's sweep of bare collectives (an :class:`InStepCosts`):

* ``factors``: how much slower (or faster) an all-gather and a
  reduce-scatter of a group's size run inside a step than in the
  calibration's sweep, at the sizes of the larger stacks (256 KiB, 2 and
  8 MiB); :func:`in_step_curve` multiplies a sweep curve by them. In a step
  a collective follows FSDP2's copy-in and the ranks arrive at it apart.
  On 2 gloo ranks the factors came out between 0.5x and 2.1x, and moved by
  up to 1.5x between calibrations (a stack's slope is a difference of two
  noisy medians);
* ``group_overhead_s``: fixed seconds per FSDP2 group per collective it
  issues (the hooks' Python path, the all-gather / reduce-scatter set-up);
* ``param_overhead_s``: seconds per parameter tensor of a group per
  collective (per-parameter views, unsharded storage, DTensor gradients).

The stacks (:data:`STACKS`) are groups of ``k`` bias-free ``Linear(d, d)``
layers, each group its own ``fully_shard`` unit, with several group counts,
plus the same stacks unsharded, all timed in interleaved rounds (median of
:data:`ROUNDS`, over the runs the host did not interrupt), forward and backward
apart. For each stack and phase the least-squares slope over the group count
of sharded minus unsharded time is one group's cost in that phase, which the
simulator prices as

* forward: ``AG(S) + copy(S / W) + k * copy(S / k) + (g + k t)``;
* backward: ``AG(S) + RS(S) + copy(S / W) + k * copy(S / k) + copy(S) +
  2 (g + k t)`` (the all-gather again, the gradients' copy-in and
  reduce-scatter),

with ``S`` the group's bytes, ``AG``/``RS``/``copy`` the calibrated curves
(:func:`fit_in_step`). The stacks of 1 KiB tensors, whose collectives are
all latency, give ``g`` and ``t``: the non-negative least-squares solution of
their four equations, each divided by its measured slope. Each larger stack
then gives the in-step all-gather time of its size from its forward (what
is left after copies and fixed costs) and the reduce-scatter time from its
backward; their ratios to the sweep's are the factors, kept within
:data:`FACTOR_RANGE` (one disturbed stack cannot price a size at 0 or 5x).
(One factor per collective for every size, fitted together with ``g`` and
``t``, was tried first: the fit traded the factor against ``g`` and moved
from 1.1x to 1.6x between calibrations.)
"""

from __future__ import annotations

import gc
import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from execwrap.cost.curve import CollectiveCurve
from execwrap.cost.fit import nonnegative_least_squares
from execwrap.cost.host import CLEAN_SHARE_MIN, clean_median, disturbance, disturbance_reading

logger = logging.getLogger(__name__)

__all__ = [
    "ROUNDS",
    "STACKS",
    "InStepCosts",
    "FACTOR_RANGE",
    "fit_in_step",
    "fsdp_fixed_costs",
    "in_step_curve",
    "interleaved_medians",
    "group_bytes",
    "stacks_within",
    "sync_device",
]

#: ``(layers per group k, width d, group counts)`` of the synthetic stacks: groups
#: of 1 and 8 tensors of 1 KiB (16 x 16), of 1 and 8 tensors of 256 KiB
#: (256 x 256: 256 KiB and 2 MiB groups) and of 2 tensors of 4 MiB (8 MiB groups).
STACKS: tuple[tuple[int, int, tuple[int, ...]], ...] = (
    (1, 16, (4, 12, 24)),
    (8, 16, (4, 12, 24)),
    (1, 256, (4, 12, 24)),
    (8, 256, (2, 6, 12)),
    (2, 1024, (1, 2, 4)),
)
#: Interleaved rounds; the median round is used, as a training step's time is read
#: as the median of its steps (over the rounds without steal, up to twice as many
#: rounds run while the host interrupts them: :func:`interleaved_medians`).
ROUNDS = 15
#: Rows of a stack's input batch. (256 rows, so that the ranks arrive at the
#: collectives apart after some compute, as in a step, raised the first design's
#: single factors to 1.69x / 1.43x and lowered the fixed cost per group to 0.45 ms:
#: per-block plans were then predicted 9-16% too slow and always-wrap ones 22-30%
#: too fast.)
_BATCH = 4


#: The range in-step factors are kept within.
FACTOR_RANGE = (0.5, 2.5)
#: Group bytes up to which a collective is latency: the 1 KiB stacks' groups (up to
#: 8 tensors of 1 KiB), priced by the sweep as it is.
_LATENCY_BYTES = 8 * 2**10


@dataclass(frozen=True)
class InStepCosts:
    """What :func:`fsdp_fixed_costs` measured (see the module docstring).

    Attributes:
        factors: ``(bytes, all-gather factor, reduce-scatter factor)`` per larger
            stack, by size: the in-step time over the sweep curve's.
        group_overhead_s: seconds per group per collective.
        param_overhead_s: seconds per parameter tensor per collective.
    """

    factors: tuple[tuple[int, float, float], ...]
    group_overhead_s: float
    param_overhead_s: float

    def describe(self) -> str:
        """The factors in one line: ``"all-gather 0.95x / 1.96x / 0.99x, reduce-scatter
        0.93x / 1.09x / 0.97x the sweep's at 256 KiB / 2 MiB / 8 MiB"``."""
        sizes = " / ".join(_size(n) for n, _, _ in self.factors)
        ag = " / ".join(f"{a:.2f}x" for _, a, _ in self.factors)
        rs = " / ".join(f"{r:.2f}x" for _, _, r in self.factors)
        return f"all-gather {ag}, reduce-scatter {rs} the sweep's at {sizes}"


def _size(nbytes: int) -> str:
    return f"{nbytes // 2**20} MiB" if nbytes >= 2**20 else f"{nbytes // 2**10} KiB"


def in_step_curve(
    curve: CollectiveCurve, sizes: Sequence[int], factors: Sequence[tuple[int, float]]
) -> CollectiveCurve:
    """``curve`` multiplied by the in-step factor of each size.

    The factor is 1 up to :data:`_LATENCY_BYTES` (where ``g`` and ``t`` were
    fitted on the sweep's own times), linear in log-size from there to the
    first measured ``(bytes, factor)`` point and between points, and the last
    point's beyond it. The curve is resampled at ``sizes``, ``_LATENCY_BYTES``
    and the factors' sizes; no sample is priced below the sweep's time at
    ``_LATENCY_BYTES`` (a factor below 1 would otherwise pull the latency region
    down with it, as :meth:`CollectiveCurve.from_samples` keeps times
    non-decreasing by the smallest time at a size or above).

    >>> flat = CollectiveCurve.from_samples([2**10, 2**30], [1e-3, 1e-3])
    >>> c = in_step_curve(flat, [2**16, 2**26], [(2**18, 0.5), (2**21, 2.0)])
    >>> [round(c.time(n) * 1e3, 3) for n in (2**13, 2**18, 2**21, 2**26)]
    [1.0, 1.0, 2.0, 2.0]
    """
    points = [(_LATENCY_BYTES, 1.0), *sorted((int(n), float(f)) for n, f in factors)]

    def factor(n: int) -> float:
        if n <= points[0][0]:
            return 1.0
        for (n0, f0), (n1, f1) in itertools.pairwise(points):
            if n <= n1:
                w = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
                return f0 + w * (f1 - f0)
        return points[-1][1]

    floor = curve.time(_LATENCY_BYTES)
    at = sorted({*(int(n) for n in sizes), *(n for n, _ in points)})
    return CollectiveCurve.from_samples(
        at,
        [
            curve.time(n) if n <= _LATENCY_BYTES else max(floor, curve.time(n) * factor(n))
            for n in at
        ],
    )


def group_bytes(k: int, d: int, world: int) -> int:
    """Bytes of one stack group: ``k`` float32 ``d x d`` layers, dim 0 padded to a
    multiple of ``world`` as FSDP2 pads it."""
    return k * -(-d // world) * world * d * 4


def stacks_within(
    max_bytes: int | None, world: int
) -> tuple[tuple[int, int, tuple[int, ...]], ...]:
    """The :data:`STACKS` whose groups are at most ``max_bytes`` (the sweep's largest
    size: a factor above it would compare with an extrapolated curve); all for ``None``.

    >>> [(k, d) for k, d, _ in stacks_within(2**20, 2)]
    [(1, 16), (8, 16), (1, 256)]
    """
    return tuple(
        s for s in STACKS if max_bytes is None or group_bytes(s[0], s[1], world) <= max_bytes
    )


def fsdp_fixed_costs(
    group: dist.ProcessGroup,
    dev: torch.device,
    ag: CollectiveCurve,
    rs: CollectiveCurve,
    copy: CollectiveCurve,
    *,
    max_bytes: int | None = None,
    repeat: int = 1,
) -> InStepCosts:
    """Measure (module docstring) the in-step factors and fixed costs.

    Args:
        group: the process group (every rank calls this).
        dev: the device FSDP2 runs on.
        ag: the all-gather curve (seconds by output bytes), from the calibration's sweep.
        rs: the reduce-scatter curve (seconds by input bytes), from the sweep.
        copy: seconds of a copy into a fresh buffer, by bytes.
        max_bytes: the sweep's largest size: larger stacks are not run
            (:func:`stacks_within`).
        repeat: run ``repeat * ROUNDS`` rounds (medians of more samples), and up to
            as many again while rounds are interrupted by the host (steal).

    Returns:
        The :class:`InStepCosts` (rank 0's and every other rank's may differ;
        the caller broadcasts rank 0's).
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(group, dev.type)
    world = dist.get_world_size(group)
    stacks = stacks_within(max_bytes, world)
    fns: dict[str, Callable[[], tuple[float, ...]]] = {}
    for k, d, counts in stacks:
        for n in counts:
            for sharded in (True, False):
                model = nn.Sequential(
                    *[
                        nn.Sequential(*[nn.Linear(d, d, bias=False) for _ in range(k)])
                        for _ in range(n)
                    ]
                ).to(dev)
                if sharded:
                    for unit in model:
                        fully_shard(unit, mesh=mesh)
                    fully_shard(model, mesh=mesh)
                fns[f"{k}/{d}/{n}/{sharded}"] = _step_fn(model, d, dev)
    times = interleaved_medians(fns, dev, group, rounds=ROUNDS * repeat)
    # Free the FSDP stacks now (they hold the process group in reference cycles): a gloo
    # worker thread that drops a backward-time collective while the interpreter shuts
    # down aborts the process (torch 2.13; see tests/_dist.py).
    del fns, model
    gc.collect()

    def slope(k: int, d: int, counts: Sequence[int], phase: int) -> float:
        """Seconds one more group adds to ``phase`` (0 forward, 1 backward)."""
        extra = [
            times[f"{k}/{d}/{n}/True"][phase] - times[f"{k}/{d}/{n}/False"][phase] for n in counts
        ]
        return statistics.linear_regression(list(counts), extra).slope

    slopes = {(k, d): (slope(k, d, c, 0), slope(k, d, c, 1)) for k, d, c in stacks}
    # only the group's rank 0 warns of a clamped factor: its numbers are the ones kept
    factors, per_group, per_tensor = fit_in_step(
        slopes, ag, rs, copy, world, warn=dist.get_rank(group) == 0
    )
    return InStepCosts(factors, per_group, per_tensor)


def fit_in_step(
    slopes: dict[tuple[int, int], tuple[float, float]],
    ag: CollectiveCurve,
    rs: CollectiveCurve,
    copy: CollectiveCurve,
    world: int,
    *,
    warn: bool = True,
) -> tuple[tuple[tuple[int, float, float], ...], float, float]:
    """``(factors, group_overhead_s, param_overhead_s)`` from one group's measured
    forward and backward seconds per stack (module docstring).

    Args:
        slopes: ``(k, d) -> (forward, backward)`` seconds one more group of ``k``
            ``d x d`` float32 layers adds to a step; stacks of at most
            ``_LATENCY_BYTES`` per group give the fixed costs, the others the
            factors.
        ag, rs, copy: the sweep curves (seconds by bytes).
        world: ranks.
        warn: log a WARNING for a factor kept within :data:`FACTOR_RANGE`
            (``False``: a debug line; ranks whose numbers are not kept).

    Returns:
        ``((bytes, all-gather factor, reduce-scatter factor), ...)`` by size, each
        factor within :data:`FACTOR_RANGE`, and the fixed costs (``>= 0``).

    Raises:
        ValueError: no stack of at most ``_LATENCY_BYTES`` per group.

    Slopes made from known values (copies negligible) give those values back:

    >>> ag = CollectiveCurve.from_samples([1024, 2**20, 2**23], [1e-4, 1e-3, 4e-3])
    >>> rs = CollectiveCurve.from_samples([1024, 2**20, 2**23], [2e-4, 2e-3, 8e-3])
    >>> copy = CollectiveCurve.from_samples([1024, 2**23], [1e-15, 1e-12])
    >>> def slope(k, d, a, b, g=2e-4, t=1e-5):
    ...     gather, scatter = a * ag.time(k * d * d * 4), b * rs.time(k * d * d * 4)
    ...     return (gather + g + k * t, gather + scatter + 2 * (g + k * t))
    >>> slopes = {(1, 16): slope(1, 16, 1, 1), (8, 16): slope(8, 16, 1, 1),
    ...           (8, 256): slope(8, 256, 1.5, 1.2)}
    >>> factors, g, t = fit_in_step(slopes, ag, rs, copy, 2)
    >>> [(n, round(a, 6), round(b, 6)) for n, a, b in factors], round(g, 9), round(t, 9)
    ([(2097152, 1.5, 1.2)], 0.0002, 1e-05)
    """

    def parts(k: int, d: int) -> tuple[int, float, float, float]:
        nbytes = group_bytes(k, d, world)
        copies = copy.time(nbytes // world) + k * copy.time(nbytes // k)  # copy-in, copy-out
        return nbytes, ag.time(nbytes), rs.time(nbytes), copies

    rows: list[list[float]] = []
    rhs: list[float] = []
    for (k, d), (fwd, bwd) in slopes.items():
        nbytes, gather, scatter, copies = parts(k, d)
        if k * d * d * 4 > _LATENCY_BYTES:  # unpadded: the stack's own size decides
            continue
        for slope, row, known in (
            (fwd, [1.0, float(k)], copies + gather),
            (bwd, [2.0, 2.0 * k], copies + copy.time(nbytes) + gather + scatter),
        ):
            weight = 1.0 / max(abs(slope), 1e-6)  # relative errors: noise grows with the time
            rows.append([v * weight for v in row])
            rhs.append((slope - known) * weight)
    if not rows:
        raise ValueError(f"fit_in_step: no stack of at most {_LATENCY_BYTES} bytes per group")
    g, t = nonnegative_least_squares(rows, rhs)
    factors = []
    for (k, d), (fwd, bwd) in sorted(slopes.items(), key=lambda kv: parts(*kv[0])[0]):
        nbytes, gather, scatter, copies = parts(k, d)
        if k * d * d * 4 <= _LATENCY_BYTES:
            continue
        fixed = g + k * t
        gather_in_step = fwd - copies - fixed
        scatter_in_step = bwd - gather_in_step - copies - copy.time(nbytes) - 2 * fixed
        raw = (gather_in_step / max(gather, 1e-12), scatter_in_step / max(scatter, 1e-12))
        factors.append((nbytes, *_clamped(nbytes, raw, warn=warn)))
    return tuple(factors), g, t


def _clamped(nbytes: int, raw: tuple[float, float], *, warn: bool) -> tuple[float, float]:
    """``raw`` (all-gather, reduce-scatter factors) kept within :data:`FACTOR_RANGE`,
    with a warning (``warn``; else a debug line) naming the factors that were outside it."""
    low, high = FACTOR_RANGE
    kept = tuple(min(high, max(low, f)) for f in raw)
    outside = [
        f"{f:.2f}x {name}"
        for name, f, k in zip(("all-gather", "reduce-scatter"), raw, kept, strict=True)
        if f != k
    ]
    if outside:
        (logger.warning if warn else logger.debug)(
            "calibrate: the in-step %s of %d-byte groups (%s) %s kept within %s: a disturbed "
            "stack; calibrate again on a quiet machine",
            "factors" if len(outside) > 1 else "factor",
            nbytes,
            ", ".join(outside),
            "were" if len(outside) > 1 else "was",
            FACTOR_RANGE,
        )
    return kept[0], kept[1]


def _step_fn(model: nn.Module, width: int, dev: torch.device) -> Callable[[], tuple[float, ...]]:
    """The forward and backward of ``model`` on a ``_BATCH x width`` batch (gradients
    set to ``None`` first, as a training step's ``zero_grad``), warmed up; it returns
    its phases' seconds."""
    x = torch.randn(_BATCH, width, device=dev)

    def step() -> tuple[float, ...]:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = model(x).sum()
        sync_device(dev)
        t1 = time.perf_counter()
        loss.backward()
        sync_device(dev)
        return (t1 - t0, time.perf_counter() - t1)

    step()
    return step


def sync_device(dev: torch.device) -> None:
    """Wait for ``dev``'s queued work (CUDA); nothing to wait for on CPU."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def interleaved_medians(
    fns: dict[str, Callable[[], tuple[float, ...]]],
    dev: torch.device,
    group: dist.ProcessGroup,
    *,
    rounds: int,
) -> dict[str, tuple[float, ...]]:
    """Median seconds of each phase of each function, run in rounds (each once per
    round, in the same order on every rank: they may issue collectives), a barrier
    before each run.

    A run is *clean* when no rank's host took CPU time during it and no other process
    of its machine took more than a quarter of it (:func:`~execwrap.cost.host.disturbance`, the
    most over ranks: one all-reduce per round, so that every rank sees the same readings
    and runs the same rounds). Rounds are added, up to ``2 * rounds`` in all, until
    every function has ``rounds`` clean runs, while at least half of the runs so far
    were clean (on a machine that stays busy more rounds would not be), and each median is over the function's
    clean runs when it has at least half of ``rounds`` of them, else over all its
    runs (:func:`~execwrap.cost.host.clean_median`). Steal matters most here: with a
    collective every millisecond, a stalled vCPU stalls both ranks (2 gloo ranks,
    4.9% steal during calibration: the 1 KiB stacks' medians 1.1-1.9x those of a
    calibration without steal, and the fixed cost per group 1154 vs 755 µs).
    """
    names = list(fns)
    times: dict[str, list[tuple[float, ...]]] = {k: [] for k in names}
    steals: dict[str, list[float]] = {k: [] for k in names}
    done = 0
    while done < rounds or _more_rounds(done, rounds, _fewest_clean(steals)):
        stolen = []
        for k in names:
            dist.barrier(group=group)
            sync_device(dev)
            before, t0 = disturbance_reading(), time.perf_counter()
            times[k].append(fns[k]())
            stolen.append(disturbance(before, disturbance_reading(), time.perf_counter() - t0))
        most = torch.tensor(stolen, dtype=torch.float64, device=dev)
        dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
        for k, s in zip(names, most.tolist(), strict=True):
            steals[k].append(float(s))
        done += 1
    logger.debug(
        "calibrate: %d round(s) of the FSDP2 stacks; the fewest clean runs of a stack: %d",
        done,
        _fewest_clean(steals),
    )
    enough = math.ceil(CLEAN_SHARE_MIN * rounds)
    return {
        k: tuple(clean_median(phase, steals[k], minimum=enough) for phase in zip(*v, strict=True))
        for k, v in times.items()
    }


def _more_rounds(done: int, rounds: int, clean: int) -> bool:
    """Whether another round may bring every function to ``rounds`` clean runs:
    fewer than ``2 * rounds`` done, fewer clean than ``rounds``, at least half clean.

    >>> _more_rounds(10, 10, 8), _more_rounds(10, 10, 4), _more_rounds(20, 10, 9)
    (True, False, False)
    """
    return done < 2 * rounds and clean < rounds and 2 * clean >= done


def _fewest_clean(steals: dict[str, list[float]]) -> int:
    """The fewest runs without steal of any function."""
    return min((sum(1 for s in v if s <= 0.0) for v in steals.values()), default=0)
