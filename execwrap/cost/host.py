"""What disturbs a timing: the host's steal and the machine's other processes.

On a virtual machine the hypervisor may run other guests while this
machine's vCPUs have work: that time is *steal*, counted by the kernel per
CPU (``/proc/stat``'s 8th column, read through :func:`psutil.cpu_times`) in
jiffies (10 ms on most Linux builds). A timing that the host interrupted
measures the host's neighbours, not FSDP: on the 2-vCPU machine this project
is developed on, one benchmark run saw no steal during calibration and 22.5
CPU-seconds of it during one model's timed steps, whose 12 plans all measured
7-27% slower than in a run with 0.1% steal (2 gloo ranks; the README's
*Auto-planning: predicted vs measured*).

Steal sees only the hypervisor, not other processes on the same machine: three
back-to-back calibrations while another job used both cores differed by up to
4.3x (a 256 MiB all-gather: 637 / 147 / 134 ms) and each saw under 0.3% steal.
So while a set of processes is registered as the measurement's own
(:func:`own_processes`: calibration registers its ranks on this host), a
reading also counts the CPU time of every other process: the machine's busy
CPU time (``user + nice + system`` of ``/proc/stat``, through
:func:`psutil.cpu_times`; interrupt time is left out, as gloo's loopback
traffic is accounted there) minus the own processes' (``user + system`` of
each, all threads, :meth:`psutil.Process.cpu_times`). Both counters tick in
jiffies, so a reading is a sample: a tick that lands while another process
runs is counted, one that lands on an own process is not.

:func:`disturbance` says how much disturbed a sample between two
:func:`disturbance_reading` values (all steal; other processes' CPU time over
:data:`OTHERS_TOLERANCE` of the machine's during the sample, since on a shared
machine some tick always lands elsewhere); :class:`StealMeter` measures both
over a stretch of time; :func:`clean_samples` keeps the samples that nothing
disturbed, when there are enough of them, and :func:`clean_median` is their
median. Where the OS reports no steal (bare metal, not Linux) and no own
processes are registered, every reading is 0 and every sample counts.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

__all__ = [
    "CLEAN_SHARE_MIN",
    "StealMeter",
    "clean_median",
    "clean_samples",
    "OTHERS_TOLERANCE",
    "disturbance",
    "disturbance_reading",
    "other_process_seconds",
    "own_processes",
    "steal_seconds",
]

#: The processes a measurement counts as its own (:func:`own_processes`); empty: none.
_OWN: list[psutil.Process] = []

#: The least share of samples without steal for :func:`clean_median` to use only
#: those; with fewer, the host interrupted most samples and all of them count.
CLEAN_SHARE_MIN = 0.5


def steal_seconds() -> float:
    """CPU seconds of steal since boot, summed over this machine's CPUs (``0.0``
    where the OS does not report steal)."""
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


@contextmanager
def own_processes(pids: Iterable[int]) -> Iterator[None]:
    """Within the block, :func:`disturbance_reading` also counts the CPU time of every
    process but ``pids`` (those of them on this machine; the others are skipped)."""
    own = []
    for pid in dict.fromkeys(pids):
        try:
            own.append(psutil.Process(pid))
        except psutil.Error:
            continue
    saved = list(_OWN)
    _OWN[:] = own
    try:
        yield
    finally:
        _OWN[:] = saved


def other_process_seconds() -> float:
    """CPU seconds of processes other than the registered own ones, since boot, over
    all CPUs: the machine's ``user + nice + system`` minus the own processes'
    ``user + system`` (``0.0`` while none are registered). Differences of two
    readings count; the value itself also holds the own processes' past."""
    if not _OWN:
        return 0.0
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system
    own = 0.0
    for proc in _OWN:
        try:
            times = proc.cpu_times()
        except psutil.Error:
            continue
        own += times.user + times.system
    return float(busy - own)


#: Share of the machine's CPU time during a sample (wall time x CPUs) that other
#: processes may take before the sample counts as disturbed. A tick (10 ms) that lands
#: on another process in a 1 ms sample is over it; one tick in a 64 ms sample on 2 CPUs
#: (8%) is not; another job using both cores is.
OTHERS_TOLERANCE = 0.25


def disturbance_reading() -> tuple[float, float]:
    """``(steal, other processes)`` CPU seconds since boot: :func:`steal_seconds` and
    :func:`other_process_seconds` (``0.0`` while no own processes are registered)."""
    return steal_seconds(), other_process_seconds()


def disturbance(before: tuple[float, float], after: tuple[float, float], wall_s: float) -> float:
    """CPU seconds that disturbed a sample of ``wall_s`` wall seconds between two
    :func:`disturbance_reading` values: all of the host's steal, and the other
    processes' time when it is over :data:`OTHERS_TOLERANCE` of the machine's CPU
    time during the sample; ``0.0``: undisturbed.

    >>> disturbance((1.0, 5.0), (1.0, 5.01), 0.064)  # one tick in 64 ms: tolerated
    0.0
    >>> round(disturbance((1.0, 5.0), (1.0, 5.01), 0.001), 3)  # one tick in 1 ms
    0.01
    >>> disturbance((1.0, 5.0), (1.5, 5.0), 0.064)  # any steal
    0.5
    """
    steal = max(0.0, after[0] - before[0])
    others = max(0.0, after[1] - before[1])
    cpus = psutil.cpu_count() or 1
    return steal + (others if others > OTHERS_TOLERANCE * wall_s * cpus else 0.0)


@dataclass
class StealMeter:
    """Steal over one or more stretches of time (each a ``with`` block).

    Attributes:
        steal_s: CPU seconds of steal over everything measured so far (all CPUs).
        wall_s: wall seconds measured so far.
        others_s: CPU seconds of processes other than the registered own ones
            (:func:`own_processes`; ``0`` while none are registered).

    Example:
        >>> meter = StealMeter()
        >>> with meter:
        ...     pass
        >>> meter.share() >= 0.0
        True
    """

    steal_s: float = 0.0
    wall_s: float = 0.0
    others_s: float = 0.0
    _start: tuple[float, float, float] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __enter__(self) -> StealMeter:
        self._start = (steal_seconds(), other_process_seconds(), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None
        steal0, others0, t0 = self._start
        self.steal_s += max(0.0, steal_seconds() - steal0)
        self.others_s += max(0.0, other_process_seconds() - others0)
        self.wall_s += time.perf_counter() - t0
        self._start = None

    def share(self) -> float:
        """Steal as a share of the CPU time the machine had (wall time x CPUs)."""
        return self._share(self.steal_s)

    def others_share(self) -> float:
        """Other processes' CPU time as a share of the machine's (wall time x CPUs)."""
        return self._share(self.others_s)

    def _share(self, seconds: float) -> float:
        cpus = psutil.cpu_count() or 1
        return seconds / (self.wall_s * cpus) if self.wall_s > 0 else 0.0


def clean_samples(
    samples: Sequence[float], steals: Sequence[float], *, minimum: int | None = None
) -> list[float]:
    """The samples the host did not interrupt, when there are enough of them.

    Args:
        samples: measured values (e.g. seconds), one per sample.
        steals: steal seconds during each sample (:func:`steal_seconds` differences).
        minimum: how many clean samples are enough (default: :data:`CLEAN_SHARE_MIN`
            of all samples, rounded up).

    Returns:
        The samples with no steal when there are at least ``minimum``; else every
        sample (the host interrupted too many of them).

    Raises:
        ValueError: ``steals`` of another length than ``samples``.

    >>> clean_samples([1.0, 9.0, 2.0, 3.0], [0.0, 0.01, 0.0, 0.0])
    [1.0, 2.0, 3.0]
    >>> clean_samples([1.0, 9.0, 8.0], [0.0, 0.01, 0.02])
    [1.0, 9.0, 8.0]
    >>> clean_samples([1.0, 9.0, 8.0], [0.0, 0.01, 0.02], minimum=1)
    [1.0]
    """
    if len(samples) != len(steals):
        raise ValueError(
            f"clean_samples: {len(samples)} sample(s) and {len(steals)} steal reading(s); "
            "expected one reading per sample"
        )
    if minimum is None:
        minimum = math.ceil(CLEAN_SHARE_MIN * len(samples))
    clean = [float(v) for v, s in zip(samples, steals, strict=True) if s <= 0.0]
    return clean if clean and len(clean) >= minimum else [float(v) for v in samples]


def clean_median(
    samples: Sequence[float], steals: Sequence[float], *, minimum: int | None = None
) -> float:
    """Median of :func:`clean_samples` (same arguments).

    Raises:
        ValueError: no samples, or ``steals`` of another length.

    >>> clean_median([1.0, 9.0, 2.0, 3.0], [0.0, 0.01, 0.0, 0.0])
    2.0
    """
    if not samples:
        raise ValueError("clean_median: no samples")
    return float(statistics.median(clean_samples(samples, steals, minimum=minimum)))
