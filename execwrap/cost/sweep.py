"""The calibration's sweep of bare collectives and copies, by buffer size.

:func:`sweep` times ``all_gather_single``, ``reduce_scatter_single`` (float32,
``ReduceOp.AVG``) and a copy into a fresh buffer at each of :func:`sweep_sizes`,
as FSDP2 issues them, on every rank of the group (it issues collectives); the
medians are over the runs the host did not interrupt
(:func:`~execwrap.cost.host.clean_median`). :mod:`execwrap.cost.calibrate`
turns them into curves.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from execwrap.cost.fixed_costs import sync_device
from execwrap.cost.host import clean_median, disturbance, disturbance_reading

__all__ = [
    "cache_evictor",
    "collective_times",
    "SMALLEST_BYTES",
    "sweep",
    "sweep_sizes",
    "timed_runs",
]

#: The sweep's smallest buffer, bytes.
SMALLEST_BYTES = 4 * 1024


def sweep_sizes(max_bytes: int, world_size: int) -> list[int]:
    """Buffer sizes of the sweep: 4 KiB times powers of 4 up to 1 MiB, then powers of 2
    and the midpoints 1.5 times each (1, 1.5, 2, 3, 4, 6 MiB, ...) up to ``max_bytes``,
    each a multiple of ``4 * world_size`` bytes (whole float32 shards). Large sizes
    are denser: on CPU a collective's time bends where its buffers outgrow the caches
    and glibc's mmap threshold (32 MiB: a fresh 33.6 MiB all-gather output took 32 ms,
    a 31 MiB one 16 ms, 2 gloo ranks), and a line from 16 to 64 MiB overpriced a
    25 MiB all-gather by half against FSDP2 steps.

    >>> sweep_sizes(2**20, 2)
    [4096, 16384, 65536, 262144, 1048576]
    >>> [n / 2**20 for n in sweep_sizes(8 * 2**20, 2)[4:]]
    [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0]
    """
    step = 4 * world_size
    sizes: list[int] = []
    size = SMALLEST_BYTES
    while size <= max(max_bytes, SMALLEST_BYTES * 4):
        sizes.append(-(-size // step) * step)
        if size < 2**20:
            size *= 4
        else:
            half = size * 3 // 2
            if half <= max_bytes:
                sizes.append(-(-half // step) * step)
            size *= 2
    return sizes


def _repeats_for(nbytes: int) -> int:
    """More runs for small (noisy, cheap) sizes than for large ones."""
    return 15 if nbytes <= 2**20 else 9 if nbytes <= 16 * 2**20 else 7


def _collective_fn(
    kind: str, nbytes: int, group: dist.ProcessGroup, dev: torch.device
) -> Callable[[], None]:
    """One all-gather (output ``nbytes``), reduce-scatter (input ``nbytes``) or all-reduce
    (``nbytes`` in place) as FSDP2 issues it: into a freshly allocated output,
    reduce-scatters of float32 with AVG."""
    world = dist.get_world_size(group)
    full = torch.zeros(nbytes // 4, dtype=torch.float32, device=dev)
    shard = torch.zeros(nbytes // 4 // world, dtype=torch.float32, device=dev)
    if kind == "all_gather":

        def run() -> None:
            dist.all_gather_single(torch.empty_like(full), shard, group=group)

    elif kind == "all_reduce":  # HSDP's: in place, on the reduce-scatter's output

        def run() -> None:
            dist.all_reduce(full, group=group)

    else:

        def run() -> None:
            dist.reduce_scatter_single(
                torch.empty_like(shard), full, op=dist.ReduceOp.AVG, group=group
            )

    return run


def sweep(
    sizes: list[int], group: dist.ProcessGroup, dev: torch.device, *, repeat: int = 1
) -> tuple[list[float], list[float], list[float]]:
    """Median seconds per size of an all-gather, a reduce-scatter and a copy into a fresh
    buffer (:func:`_fresh_copy_fn`): each size's runs back to back (a barrier before each
    collective), so the allocator hands the freed buffer back as a training loop's steady
    state does. (Interleaving sizes instead makes every run page-fault fresh memory: a
    25 MB all-gather took 27-37 ms that way and 13-14 ms inside FSDP2 steps, 2 gloo ranks.)
    Before each run the caches are flushed (:func:`cache_evictor`): in a training step
    a collective's buffers are cold, and a buffer that fits in the last-level cache
    would otherwise be timed hot (a 3 MiB reduce-scatter took 2.9 ms hot and 4.9 ms
    after an 8 MiB write, 2 gloo ranks; 12 MiB ones the same either way).
    Disturbances only ever add time; :meth:`CollectiveCurve.from_samples` drops a size
    slower than a larger one."""
    out: dict[str, list[float]] = {"all_gather": [], "reduce_scatter": [], "copy": []}
    evict = cache_evictor(dev)
    for n in sizes:
        for kind in out:
            fn = _fresh_copy_fn(n, dev) if kind == "copy" else _collective_fn(kind, n, group, dev)
            fn()  # warm-up
            before = evict if kind == "copy" else lambda: (evict(), dist.barrier(group=group))
            runs = timed_runs(fn, dev, _repeats_for(n) * repeat, before=before)
            out[kind].append(max(clean_median(*runs), 1e-9))
    return out["all_gather"], out["reduce_scatter"], out["copy"]


def collective_times(
    kind: str, sizes: list[int], group: dist.ProcessGroup, dev: torch.device, *, repeat: int = 1
) -> list[float]:
    """Median seconds per size of ``kind`` (``"all_gather"``, ``"reduce_scatter"`` or
    ``"all_reduce"``) over ``group``, timed as :func:`sweep` times its collectives (a
    cache flush and a barrier before each run). Every rank of the world calls it, every
    group of that shape at once (as a mesh dimension's groups run in a step)."""
    evict = cache_evictor(dev)
    out = []
    for n in sizes:
        fn = _collective_fn(kind, n, group, dev)
        fn()  # warm-up
        runs = timed_runs(
            fn, dev, _repeats_for(n) * repeat, before=lambda: (evict(), dist.barrier(group=group))
        )
        out.append(max(clean_median(*runs), 1e-9))
    return out


def timed_runs(
    fn: Callable[[], object],
    dev: torch.device,
    runs: int,
    *,
    before: Callable[[], object] | None = None,
) -> tuple[list[float], list[float]]:
    """Seconds of each of ``runs`` runs of ``fn()`` (the device synchronised before
    and after each), and what disturbed each (CPU seconds over all CPUs of the host's
    steal and, during calibration, of other processes:
    :func:`~execwrap.cost.host.disturbance`): the arguments of
    :func:`~execwrap.cost.host.clean_median`. ``before()`` runs untimed before each
    run (a cache flush, a barrier).
    """
    times, steals = [], []
    for _ in range(runs):
        if before is not None:
            before()
        sync_device(dev)
        reading = disturbance_reading()
        t0 = time.perf_counter()
        fn()
        sync_device(dev)
        times.append(time.perf_counter() - t0)
        steals.append(disturbance(reading, disturbance_reading(), times[-1]))
    return times, steals


def _last_level_cache_bytes() -> int:
    """The CPU's largest cache in bytes (Linux sysfs; 32 MiB where it can't be read)."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * scale)
        except (ValueError, OSError):
            continue
    return max(sizes, default=32 * 2**20)


def cache_evictor(dev: torch.device) -> Callable[[], None]:
    """A function that flushes the CPU caches (writes a buffer of twice the last-level
    cache, at least 16 MiB); a no-op on CUDA, where NCCL's buffers are not the CPU's."""
    if dev.type == "cuda":
        return lambda: None
    buf = torch.empty(max(2 * _last_level_cache_bytes(), 16 * 2**20) // 4, dtype=torch.float32)

    def evict() -> None:
        buf.fill_(1.0)

    return evict


def _fresh_copy_fn(nbytes: int, dev: torch.device) -> Callable[[], None]:
    """A copy of ``nbytes`` into a newly allocated buffer, as FSDP2's copy-out fills new
    unsharded storage (allocation and first-touch page faults included)."""
    src = torch.ones(max(1, nbytes // 4), device=dev)

    def run() -> None:
        torch.empty_like(src).copy_(src)

    return run
