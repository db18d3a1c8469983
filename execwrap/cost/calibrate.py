"""Calibration: measure a :class:`~execwrap.cost.CostModel` on the live process group.

:func:`calibration_fields` runs on every rank of the group (it issues
collectives) and returns the model's constructor arguments, measured on rank
0 and broadcast (``broadcast_object_list``), so that every rank plans alike.
The measurements, in 40-55 s on 2 gloo ranks of a 2-core CPU:

* collectives (:mod:`execwrap.cost.sweep`): a log sweep (factor 4 to 1 MiB, then
  denser) of buffer sizes from 4 KiB to ``max_bytes`` of
  ``all_gather_single`` and ``reduce_scatter_single`` with ``ReduceOp.AVG``
  into freshly allocated outputs (what FSDP2 calls for float32), each size's
  runs back to back (the allocator's steady state, as in a training loop)
  with the CPU caches flushed and a barrier before each (in a step a
  collective's buffers are cold), the median per size; the curve is
  piecewise-linear through the medians, a size slower than a larger one
  dropped (:meth:`~execwrap.cost.CollectiveCurve.from_samples`); on CPU,
  once multiplied by the in-step factors (below), the curve is one
  alpha-beta line from 256 KiB to 32 MiB (:data:`CPU_BANDWIDTH_RANGE`);
* copies: the same sweep of copies into freshly allocated buffers (as FSDP2's copy-out
  fills new unsharded storage: large fresh ones pay their page faults), and the
  bandwidth of a 64 MiB copy between allocated buffers;
* compute rates: a square matmul loop (FLOP/s), the copy (memory traffic is
  twice the bytes copied) and a loop of one-element adds (the fixed cost per op);
* overlap: a matmul loop alone, an async all-gather alone, and both at once; overlap
  ``(t_matmul + t_gather - t_both) / min(t_matmul, t_gather)`` in ``[0, 1]`` (hidden share);
* FSDP2's costs inside a step (:mod:`execwrap.cost.fixed_costs`): how much slower or
  faster a collective runs in a step than in the sweep, by size (the curves are
  multiplied by these factors) and the fixed cost per group and per parameter tensor of
  each collective, from the forward and backward of real ``fully_shard`` steps of
  synthetic stacks;
* the optimizer (:mod:`execwrap.cost.optimizer`): ``AdamW.step`` over
  ``DTensor`` parameters, 4 to 32 of each local size from 4 KiB to 16 MiB (its
  size-dependent cost per tensor) and of 16 elements (its fixed cost per tensor);
* activation checkpointing's host work (:mod:`execwrap.cost.checkpoint_timing`: tiny
  transformer blocks, plain, fully and selectively checkpointed; per region and per op);
* the device's memory (:func:`measure_device_memory`: the CUDA device's total, or
  the host's memory per rank on CPU);
* on CPU, the wait at a collective for the slowest rank after compute
  (:mod:`execwrap.cost.sync_wait`: spans of 1, 4 and 16 ms of matmuls with
  and without a collective after each), the model's ``sync_jitter``.

Every median is over the runs that nothing disturbed: the host gave none of
this machine's CPU time to other guests (steal) and no process other than the
group's ranks on this machine was seen on a CPU (:mod:`execwrap.cost.host`),
when at least half of the runs were such (the FSDP2 stacks repeat rounds until
enough are); the steal share and the other processes' share of the CPU time
over the whole calibration are named in ``source`` and warned of above
:data:`STEAL_WARN_SHARE` and :data:`LOAD_WARN_SHARE`. Each phase is logged at INFO with
its progress (``execwrap calibrate`` shows it). On CUDA, timings synchronise the device;
collectives run on the current device. Calibration never changes the process group or
the default dtype, and frees what it allocated.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from execwrap.cost.checkpoint_timing import measure_checkpoint_overhead
from execwrap.cost.curve import CollectiveCurve
from execwrap.cost.fit import bandwidth_line
from execwrap.cost.fixed_costs import (
    fsdp_fixed_costs,
    in_step_curve,
)
from execwrap.cost.host import StealMeter, clean_median, own_processes
from execwrap.cost.mesh_sweep import measure_mesh_groups
from execwrap.cost.optimizer import measure_optimizer
from execwrap.cost.sweep import SMALLEST_BYTES, sweep, sweep_sizes, timed_runs
from execwrap.cost.sync_wait import measure_sync_wait
from tracing.checks import is_int
from tracing.rates import ComputeRates

__all__ = [
    "CPU_BANDWIDTH_RANGE",
    "LOAD_WARN_SHARE",
    "NO_PROCESS_GROUP_HINT",
    "STEAL_WARN_SHARE",
    "calibration_fields",
    "measure_compute_rates",
    "measure_device_memory",
]

logger = logging.getLogger(__name__)

#: What to do when no process group is initialised.
NO_PROCESS_GROUP_HINT = (
    "CostModel.calibrate needs an initialised process group on every rank: call "
    "torch.distributed.init_process_group('gloo') (or 'nccl' on GPUs) first, launched with "
    "torchrun (e.g. `torchrun --nproc_per_node=2 -m execwrap calibrate --out cost.json`)"
)

_COPY_BYTES = 64 * 2**20
#: On CPU, the size range ``[low, high)`` in bytes over which the in-step all-gather
#: and reduce-scatter curves are one alpha-beta line
#: (:func:`~execwrap.cost.fit.bandwidth_line`). ``low`` is the smallest
#: size an in-step factor is measured at (256 KiB stacks); ``high`` is glibc's largest
#: mmap threshold (``DEFAULT_MMAP_THRESHOLD_MAX``, 32 MiB on 64-bit, mallopt(3)): a
#: larger buffer always comes from fresh mmap pages and page-faults on every use, and
#: the sweep's 32 MiB all-gathers took 2.2-3.0x the per-byte time of its 24 MiB ones
#: (2 gloo ranks), so above it the curve stays piecewise through the medians.
#: Measured on 5 recorded benchmark runs (their raw calibration samples re-fitted and
#: the same measured grids re-predicted, 3 models each): the Spearman rank correlation
#: of predicted vs measured step time rose from 0.860 to 0.931 on average (>= 0.9 in
#: 12 of 15 model-runs instead of 8), and the spread across runs of a bucket-of-2
#: plan's error minus the per-block plan's fell from 14.0 to 3.4 points (GPT) and
#: from 11.7 to 4.1 (Llama).
CPU_BANDWIDTH_RANGE = (256 * 2**10, 32 * 2**20)


def calibration_fields(
    group: dist.ProcessGroup | None = None,
    *,
    device: torch.device | str | None = None,
    max_bytes: int | None = None,
    repeat: int = 1,
    mesh: Any = None,
) -> dict[str, Any]:
    """Measure (see the module docstring) and return the CostModel's arguments; with a
    2-D ``mesh``, over all its ranks and then each of its dimensions' groups
    (:mod:`execwrap.cost.mesh_sweep`).

    ``repeat`` multiplies the runs of the sweep, the optimizer loop, the
    overlap measurement and the FSDP2 stacks (their medians then come from
    ``repeat`` times as many samples; the compute rates are measured as
    always).

    Raises:
        RuntimeError: no process group is initialised (:data:`NO_PROCESS_GROUP_HINT`).
        ValueError: ``max_bytes`` is not a positive int, or ``repeat`` not an int >= 1;
            ``device`` is neither a CPU nor an available CUDA device.
    """
    _check_arguments(repeat, device)
    group = dist.group.WORLD if group is None else group
    assert group is not None
    backend = str(dist.get_backend(group))
    world = dist.get_world_size(group)
    dev = _device(device, backend)
    if max_bytes is None:
        max_bytes = 2**30 if dev.type == "cuda" else 64 * 2**20
    _check_max_bytes(max_bytes)
    sizes = sweep_sizes(max_bytes, world)
    m, host = _measure(group, dev, sizes, repeat, mesh)
    sweep_ag, sweep_rs, in_step = m["sweep_ag"], m["sweep_rs"], m["in_step"]
    _warn_of_steal(host, group)
    ag_curve = in_step_curve(sweep_ag, sizes, [(n, a) for n, a, _ in in_step.factors])
    rs_curve = in_step_curve(sweep_rs, sizes, [(n, b) for n, _, b in in_step.factors])
    if dev.type == "cpu":
        ag_curve = bandwidth_line(ag_curve, sizes, *CPU_BANDWIDTH_RANGE)
        rs_curve = bandwidth_line(rs_curve, sizes, *CPU_BANDWIDTH_RANGE)
    fields: dict[str, Any] = {
        "device_type": dev.type,
        "backend": backend,
        "world_size": world,
        "all_gather": ag_curve,
        "reduce_scatter": rs_curve,
        "copy_bytes_per_s": m["copy_rate"],
        "copy_curve": m["copy_curve"],
        "group_overhead_s": in_step.group_overhead_s,
        "param_overhead_s": in_step.param_overhead_s,
        "overlap": m["overlap"],
        "compute": m["rates"],
        "optimizer_param_overhead_s": m["optimizer_param_s"],
        "optimizer_curve": m["optimizer_curve"],
        "sync_jitter": m["jitter"],
        "checkpoint_overhead": m["checkpoint_overhead"],
        "device_memory_bytes": measure_device_memory(dev, world),
        "mesh_groups": m["mesh_groups"],
        "source": _source(world, backend, dev, host, repeat, in_step.describe(), m["jitter"]),
        "torch_version": str(torch.__version__),
    }
    return _broadcast(fields, group, dev)


def _broadcast(
    fields: dict[str, Any], group: dist.ProcessGroup, dev: torch.device
) -> dict[str, Any]:
    """Rank 0's fields, on every rank of ``group``."""
    box: list[Any] = [fields]
    src = dist.get_global_rank(group, 0) if group is not dist.group.WORLD else 0
    dist.broadcast_object_list(
        box, src=src, group=group, device=dev if dev.type == "cuda" else None
    )
    logger.info("calibrate: %s", box[0]["source"])
    return dict(box[0])


def _check_arguments(repeat: Any, device: Any) -> None:
    if not (is_int(repeat) and repeat >= 1):
        raise ValueError(f"calibrate: repeat must be an int >= 1, got {repeat!r}")
    if device is not None:
        _checked_device(device)
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(NO_PROCESS_GROUP_HINT)


def _measure(
    group: dist.ProcessGroup, dev: torch.device, sizes: list[int], repeat: int, mesh: Any
) -> tuple[dict[str, Any], StealMeter]:
    """Every measurement of the module docstring (with ``mesh``, each of its dimensions'
    groups too), each phase logged with its progress, with the group's ranks on this
    machine as the own processes: the results by name, and the steal and other
    processes' time over them."""
    phases = _Phases((7 if dev.type == "cpu" else 6) + (mesh is not None))
    with own_processes(_local_pids(group)), StealMeter() as host:
        phases.next("the sweep of collectives and copies")
        ag, rs, copies = sweep(sizes, group, dev, repeat=repeat)
        sweep_ag = CollectiveCurve.from_samples(sizes, ag)
        sweep_rs = CollectiveCurve.from_samples(sizes, rs)
        phases.next("compute rates")
        copy_rate = _copy_rate(dev)
        rates = measure_compute_rates(dev, copy_bytes_per_s=copy_rate)
        phases.next("the optimizer step")
        optimizer_curve, optimizer_param_s = measure_optimizer(group, dev, repeat=repeat)
        phases.next("activation checkpointing's host work")
        checkpoint_overhead = measure_checkpoint_overhead(dev)
        phases.next("compute beside a collective (overlap)")
        overlap = _overlap(group, dev, repeat=repeat)
        copy_curve = CollectiveCurve.from_samples(sizes, copies)
        phases.next("FSDP2 steps of synthetic stacks (fixed costs, in-step factors)")
        in_step = fsdp_fixed_costs(
            group, dev, sweep_ag, sweep_rs, copy_curve, max_bytes=sizes[-1], repeat=repeat
        )
        # only where collectives block the training thread does the simulator use it
        if dev.type == "cpu":
            phases.next("the wait for the slowest rank")
        jitter = measure_sync_wait(group, dev, repeat=repeat) if dev.type == "cpu" else 0.0
        if mesh is not None:
            phases.next("each mesh dimension's group")
        groups = (
            ()
            if mesh is None
            else measure_mesh_groups(mesh, dev, sizes[-1], factors=in_step.factors, repeat=repeat)
        )
    phases.done()
    return {
        "sweep_ag": sweep_ag,
        "sweep_rs": sweep_rs,
        "copy_rate": copy_rate,
        "rates": rates,
        "optimizer_curve": optimizer_curve,
        "optimizer_param_s": optimizer_param_s,
        "checkpoint_overhead": checkpoint_overhead,
        "overlap": overlap,
        "copy_curve": copy_curve,
        "in_step": in_step,
        "jitter": jitter,
        "mesh_groups": groups,
    }, host


class _Phases:
    """Logs each phase of the calibration at INFO, with ``extra={"progress": (done,
    total, name)}`` for a progress display (``execwrap calibrate``'s), and the end."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done_count = 0
        self.started = time.perf_counter()

    def next(self, name: str) -> None:
        self.done_count += 1
        logger.info(
            "calibrate: %d/%d %s (%.0f s)",
            self.done_count,
            self.total,
            name,
            time.perf_counter() - self.started,
            extra={"progress": (self.done_count - 1, self.total, name)},
        )

    def done(self) -> None:
        logger.info(
            "calibrate: measured in %.0f s",
            time.perf_counter() - self.started,
            extra={"progress": (self.total, self.total, "done")},
        )


def _local_pids(group: dist.ProcessGroup) -> list[int]:
    """Process ids of the group's ranks on this machine (one ``all_gather_object``)."""
    me = (platform.node(), os.getpid())
    ranks: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(ranks, me, group=group)
    return [pid for host, pid in ranks if host == me[0]]


def _check_max_bytes(max_bytes: Any) -> None:
    if not (is_int(max_bytes) and max_bytes >= SMALLEST_BYTES):
        raise ValueError(f"calibrate: max_bytes must be an int >= {SMALLEST_BYTES}: {max_bytes!r}")


def _source(
    world: int,
    backend: str,
    dev: torch.device,
    host: StealMeter,
    repeat: int,
    factors: str,
    jitter: float,
) -> str:
    """The calibrated model's ``source``: where, when, how long, the host's steal,
    the in-step factors and the wait for the slowest rank."""
    return (
        f"calibrated on {world} {backend} ranks ({dev.type}, {_machine()}) on "
        f"{datetime.date.today().isoformat()} in {host.wall_s:.1f} s"
        f"{f' (repeat {repeat})' if repeat > 1 else ''}, host steal {host.share():.1%}, "
        f"other processes {host.others_share():.1%} of the CPU time; "
        f"in-step factors: {factors}; a collective waits "
        f"{jitter * math.sqrt(1e-3) * 1e3:.2f} ms for the slowest rank after 1 ms of compute"
    )


#: Share of the CPU time that the host may take during calibration (steal) before
#: calibration warns: above it, the runs it dropped as interrupted were many.
STEAL_WARN_SHARE = 0.02


#: Share of the machine's CPU time that other processes may take during calibration
#: before calibration warns (their ticks disturbed the samples they landed in).
LOAD_WARN_SHARE = 0.05


def _warn_of_steal(host: StealMeter, group: dist.ProcessGroup) -> None:
    """A WARNING (from the group's rank 0) when the host took more than
    :data:`STEAL_WARN_SHARE` of the CPU time during calibration, and one when other
    processes on this machine took more than :data:`LOAD_WARN_SHARE`."""
    others = host.others_share()
    if others > LOAD_WARN_SHARE and dist.get_rank(group) == 0:
        logger.warning(
            "calibrate: other processes used %.1f%% of this machine's CPU time during the "
            "%.0f s of calibration; runs they disturbed were left out or repeated where "
            "enough others were not, but the figures may still be slow: calibrate again "
            "when the machine is idle",
            100 * others,
            host.wall_s,
        )
    share = host.share()
    if share > STEAL_WARN_SHARE and dist.get_rank(group) == 0:
        logger.warning(
            "calibrate: the host gave %.1f%% of this machine's CPU time to other guests "
            "(steal) during the %.0f s of calibration; runs it interrupted were left out "
            "where enough others were not, but the figures may still be slow: calibrate "
            "again when the host is quieter",
            100 * share,
            host.wall_s,
        )


def measure_compute_rates(
    device: torch.device | str = "cpu", *, copy_bytes_per_s: float | None = None
) -> ComputeRates:
    """The device's compute rates, measured in this process (no process group needed).

    A square matmul loop (FLOP/s; float32 on CPU, bfloat16 on CUDA), a 64 MiB
    copy (memory traffic: twice the bytes copied per second) and a loop of
    one-element adds (the fixed cost per op), medians of several runs.

    Args:
        device: where to measure.
        copy_bytes_per_s: a copy rate measured already (skips the copy).

    Example:
        >>> rates = measure_compute_rates("cpu")  # doctest: +SKIP
        >>> order = record_execution_order(meta_model, meta_inputs, timing=rates)  # doctest: +SKIP
    """
    dev = torch.device(device)
    copy_rate = _copy_rate(dev) if copy_bytes_per_s is None else copy_bytes_per_s
    return ComputeRates(dev.type, _matmul_rate(dev), 2 * copy_rate, _op_overhead(dev))


def measure_device_memory(device: torch.device, world_size: int) -> int:
    """The memory of one rank's device, bytes: on CUDA the device's total
    (``torch.cuda.mem_get_info``); on CPU the host's memory divided among its ranks
    (``LOCAL_WORLD_SIZE``, which torchrun sets; without it every one of the
    ``world_size`` ranks is taken to run on this host)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    import psutil

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0) or world_size
    return int(psutil.virtual_memory().total) // max(1, local)


# ------------------------------------------------------------------ measurements
def _device(device: torch.device | str | None, backend: str) -> torch.device:
    if device is not None:
        return _checked_device(device)
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _checked_device(device: torch.device | str) -> torch.device:
    """``device`` as a ``torch.device``, if calibration can time on it."""
    dev = torch.device(device)
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(
            f"calibrate: device must be a CPU or CUDA device, got {str(dev)!r}: the "
            "collectives and copies are timed on it"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"calibrate: device {str(dev)!r}, but CUDA is not available here; pass "
            "device='cpu' (gloo) or run on a GPU machine (nccl)"
        )
    return dev


def _median_time(
    fn: Callable[[], Any], dev: torch.device, *, repeats: int, warmup: int = 1
) -> float:
    """Median seconds of ``fn()`` (device synchronised around each run) over the runs
    the host did not interrupt (:func:`~execwrap.cost.host.clean_median`)."""
    for _ in range(warmup):
        fn()
    return clean_median(*timed_runs(fn, dev, repeats))


def _copy_rate(dev: torch.device) -> float:
    """Bytes copied per second between two 64 MiB buffers (the memory bandwidth)."""
    src = torch.ones(_COPY_BYTES // 4, device=dev)
    dst = torch.empty_like(src)
    seconds = _median_time(lambda: dst.copy_(src), dev, repeats=9)
    return _COPY_BYTES / max(seconds, 1e-9)


def _matmul_rate(dev: torch.device) -> float:
    """Achieved FLOP/s of a square matmul (float32 on CPU, bfloat16 on CUDA)."""
    n = 4096 if dev.type == "cuda" else 512
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    seconds = _median_time(lambda: torch.mm(a, b), dev, repeats=9, warmup=2)
    return 2.0 * n**3 / max(seconds, 1e-9)


def _op_overhead(dev: torch.device) -> float:
    """Seconds per tiny op (a one-element in-place add), the eager dispatch cost."""
    x = torch.zeros(1, device=dev)
    loops = 200

    def run() -> None:
        for _ in range(loops):
            x.add_(1.0)

    return _median_time(run, dev, repeats=7) / loops


def _overlap(group: dist.ProcessGroup, dev: torch.device, *, repeat: int = 1) -> float:
    """Share of the shorter of a matmul loop and an async all-gather hidden when both run
    (medians of ``5 * repeat`` runs each)."""
    world = dist.get_world_size(group)
    runs = 5 * repeat
    nbytes = (256 if dev.type == "cuda" else 8) * 2**20
    full = torch.zeros(nbytes // 4, device=dev)
    shard = torch.zeros(nbytes // 4 // world, device=dev)

    def gather() -> None:
        work = dist.all_gather_single(full, shard, group=group, async_op=True)
        assert work is not None
        work.wait()

    dist.barrier(group=group)
    t_gather = _median_time(gather, dev, repeats=runs)
    n = 2048 if dev.type == "cuda" else 256
    a = torch.randn(n, n, device=dev)
    t_mm = _median_time(lambda: torch.mm(a, a), dev, repeats=runs)
    loops = max(1, math.ceil(t_gather / max(t_mm, 1e-9)))

    def matmuls() -> None:
        for _ in range(loops):
            torch.mm(a, a)

    def both() -> None:
        work = dist.all_gather_single(full, shard, group=group, async_op=True)
        matmuls()
        assert work is not None
        work.wait()

    t_compute = _median_time(matmuls, dev, repeats=runs)
    dist.barrier(group=group)
    t_both = _median_time(both, dev, repeats=runs)
    hidden = t_compute + t_gather - t_both
    return float(min(1.0, max(0.0, hidden / max(min(t_compute, t_gather), 1e-9))))


def _machine() -> str:
    import platform

    return f"{platform.node() or 'unknown host'}, {platform.processor() or platform.machine()}"
