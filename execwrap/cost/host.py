"""Steal time: the CPU time a virtual machine's host gives to other guests.

On a virtual machine the hypervisor may run other guests while this
machine's vCPUs have work: that time is *steal*, counted by the kernel per
CPU (``/proc/stat``'s 8th column, read through :func:`psutil.cpu_times`) in
jiffies (10 ms on most Linux builds). A timing that the host interrupted
measures the host's neighbours, not FSDP: on the 2-vCPU machine this project
is developed on, one benchmark run saw no steal during calibration and 22.5
CPU-seconds of it during one model's timed steps, whose 12 plans all measured
7-27% slower than in a run with 0.1% steal (2 gloo ranks; the README's
*Auto-planning: predicted vs measured*).

:class:`StealMeter` measures the steal over a stretch of time;
:func:`clean_samples` keeps the samples the host did not interrupt, when there
are enough of them, and :func:`clean_median` is their median. Where the OS
reports no steal (bare metal, not Linux) every reading is 0 and every sample
counts.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil

__all__ = ["CLEAN_SHARE_MIN", "StealMeter", "clean_median", "clean_samples", "steal_seconds"]

#: The least share of samples without steal for :func:`clean_median` to use only
#: those; with fewer, the host interrupted most samples and all of them count.
CLEAN_SHARE_MIN = 0.5


def steal_seconds() -> float:
    """CPU seconds of steal since boot, summed over this machine's CPUs (``0.0``
    where the OS does not report steal)."""
    return float(getattr(psutil.cpu_times(), "steal", 0.0))


@dataclass
class StealMeter:
    """Steal over one or more stretches of time (each a ``with`` block).

    Attributes:
        steal_s: CPU seconds of steal over everything measured so far (all CPUs).
        wall_s: wall seconds measured so far.

    Example:
        >>> meter = StealMeter()
        >>> with meter:
        ...     pass
        >>> meter.share() >= 0.0
        True
    """

    steal_s: float = 0.0
    wall_s: float = 0.0
    _start: tuple[float, float] | None = field(default=None, init=False, repr=False, compare=False)

    def __enter__(self) -> StealMeter:
        self._start = (steal_seconds(), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._start is not None
        steal0, t0 = self._start
        self.steal_s += max(0.0, steal_seconds() - steal0)
        self.wall_s += time.perf_counter() - t0
        self._start = None

    def share(self) -> float:
        """Steal as a share of the CPU time the machine had (wall time x CPUs)."""
        cpus = psutil.cpu_count() or 1
        return self.steal_s / (self.wall_s * cpus) if self.wall_s > 0 else 0.0


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
