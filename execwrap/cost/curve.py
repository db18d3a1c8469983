"""Collective time as a function of message size: latency plus bytes over bandwidth, piecewise.

A :class:`CollectiveCurve` is a list of :class:`CurveSegment` over size
ranges; each is the classic alpha-beta model ``time = latency_s + nbytes *
seconds_per_byte`` (Hockney, "The communication challenge for MPP", Parallel
Computing 20(3), 1994), fitted to its own range because collectives change
algorithm and protocol with size (NCCL switches LL / LL128 / Simple; gloo
switches ring and direct algorithms). A curve is built from measured points
(:meth:`CollectiveCurve.from_samples`: piecewise-linear through the medians
of a log sweep) or from the lower envelope of a few alpha-beta lines
(:meth:`CollectiveCurve.lower_envelope`: the best protocol at each size, the
way NCCL's tuner picks one).

Sizes are bytes of the whole (unsharded) buffer: an all-gather's output, a
reduce-scatter's input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CollectiveCurve", "CurveSegment"]


@dataclass(frozen=True)
class CurveSegment:
    """``time = latency_s + nbytes * seconds_per_byte`` for ``nbytes <= up_to_bytes``.

    Attributes:
        up_to_bytes: the largest size this segment covers (bytes); ``None`` for
            the last segment, which covers every larger size.
        latency_s: the line's intercept, seconds.
        seconds_per_byte: the line's slope (the inverse of the bandwidth).
    """

    up_to_bytes: int | None
    latency_s: float
    seconds_per_byte: float

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Bytes per second (``inf`` for a flat segment)."""
        return math.inf if self.seconds_per_byte <= 0 else 1.0 / self.seconds_per_byte


@dataclass(frozen=True)
class CollectiveCurve:
    """Seconds of one collective by buffer size, piecewise alpha-beta.

    Attributes:
        segments: in increasing size order; every segment but the last has an
            ``up_to_bytes``.

    Example:
        >>> curve = CollectiveCurve.from_samples([1024, 2048, 4096], [1e-4, 1.5e-4, 2.5e-4])
        >>> round(curve.time(3072), 9), round(curve.time(8192), 9)
        (0.0002, 0.00045)
    """

    segments: tuple[CurveSegment, ...]

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError("CollectiveCurve needs at least one segment")
        last = -1
        for i, seg in enumerate(self.segments):
            final = i == len(self.segments) - 1
            if (seg.up_to_bytes is None) != final:
                raise ValueError(
                    "CollectiveCurve: only the last segment may (and must) have up_to_bytes=None; "
                    f"segment {i} has up_to_bytes={seg.up_to_bytes!r}"
                )
            if seg.up_to_bytes is not None and seg.up_to_bytes <= last:
                raise ValueError("CollectiveCurve: segments must be in increasing size order")
            if not (math.isfinite(seg.latency_s) and math.isfinite(seg.seconds_per_byte)):
                raise ValueError(f"CollectiveCurve: segment {i} is not finite: {seg}")
            if seg.seconds_per_byte < 0:
                raise ValueError(f"CollectiveCurve: segment {i} has a negative slope: {seg}")
            last = seg.up_to_bytes if seg.up_to_bytes is not None else last

    def time(self, nbytes: int) -> float:
        """Seconds for a buffer of ``nbytes`` bytes (``0.0`` for ``nbytes <= 0``)."""
        if nbytes <= 0:
            return 0.0
        for seg in self.segments:
            if seg.up_to_bytes is None or nbytes <= seg.up_to_bytes:
                return max(0.0, seg.latency_s + nbytes * seg.seconds_per_byte)
        raise AssertionError("unreachable: the last segment is unbounded")

    @property
    def latency_s(self) -> float:
        """Time of the smallest message (the first segment's intercept, ``>= 0``)."""
        return max(0.0, self.segments[0].latency_s)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Bandwidth for large messages (the last segment's)."""
        return self.segments[-1].bandwidth_bytes_per_s

    # ----------------------------------------------------------- building
    @classmethod
    def from_samples(cls, sizes: Sequence[int], times_s: Sequence[float]) -> CollectiveCurve:
        """Piecewise-linear through measured ``(size, median time)`` points.

        Times are first made non-decreasing in size by the smallest time
        measured at that size or any larger one (a suffix minimum): timing noise
        only ever adds time (another process, a late wake-up), so a point above
        a larger message's time is a disturbed one, and a running maximum would
        carry one disturbed point to every larger size. Below the smallest size
        the time is the smallest size's (the latency floor); above the largest,
        the last segment's line continues.

        Args:
            sizes: buffer sizes in bytes (distinct, > 0).
            times_s: the median seconds measured at each size.

        Raises:
            ValueError: fewer than two points, sizes not distinct and
                positive, or a time not finite and positive.
        """
        if len(sizes) != len(times_s) or len(sizes) < 2:
            raise ValueError(
                "CollectiveCurve.from_samples needs two or more (size, time) points, got "
                f"{len(sizes)} sizes and {len(times_s)} times"
            )
        points = sorted(zip((int(s) for s in sizes), (float(t) for t in times_s), strict=True))
        if points[0][0] <= 0 or len({s for s, _ in points}) != len(points):
            raise ValueError(
                f"CollectiveCurve.from_samples: sizes must be distinct and > 0: {sizes}"
            )
        if any(not math.isfinite(t) or t <= 0 for _, t in points):
            raise ValueError(f"CollectiveCurve.from_samples: times must be > 0: {times_s}")
        monotone: list[tuple[int, float]] = []
        for s, t in reversed(points):
            monotone.append((s, min(t, monotone[-1][1]) if monotone else t))
        monotone.reverse()
        segments = [CurveSegment(monotone[0][0], monotone[0][1], 0.0)]
        for k, ((s0, t0), (s1, t1)) in enumerate(zip(monotone, monotone[1:], strict=False)):
            slope = (t1 - t0) / (s1 - s0)
            last = k == len(monotone) - 2
            segments.append(CurveSegment(None if last else s1, t0 - s0 * slope, slope))
        return cls(tuple(segments))

    @classmethod
    def lower_envelope(cls, lines: Sequence[tuple[float, float]]) -> CollectiveCurve:
        """The cheapest of several alpha-beta lines at every size.

        Args:
            lines: ``(latency_s, seconds_per_byte)`` per algorithm/protocol.

        Returns:
            A curve whose segments follow the best line over each size range.
        """
        if not lines:
            raise ValueError("CollectiveCurve.lower_envelope needs at least one line")
        current = min(lines, key=lambda ln: (ln[0], ln[1]))
        segments: list[CurveSegment] = []
        start = 0.0
        while True:
            # the next line to become cheaper: the smallest crossing after ``start``
            best: tuple[float, tuple[float, float]] | None = None
            for ln in lines:
                if ln[1] >= current[1]:
                    continue
                cross = (ln[0] - current[0]) / (current[1] - ln[1])
                if cross > start and (best is None or cross < best[0]):
                    best = (cross, ln)
            if best is None:
                segments.append(CurveSegment(None, current[0], current[1]))
                return cls(tuple(segments))
            segments.append(CurveSegment(int(best[0]), current[0], current[1]))
            start, current = best[0], best[1]

    # -------------------------------------------------------- serialising
    def to_dict(self) -> list[dict[str, Any]]:
        """JSON-ready list of segments."""
        return [
            {
                "up_to_bytes": s.up_to_bytes,
                "latency_s": s.latency_s,
                "seconds_per_byte": s.seconds_per_byte,
            }
            for s in self.segments
        ]

    @classmethod
    def from_dict(cls, data: Any) -> CollectiveCurve:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: ``data`` is not a list of segments.
        """
        if not isinstance(data, list):
            raise ValueError(f"expected a list of curve segments, got {type(data).__name__}")
        try:
            return cls(
                tuple(
                    CurveSegment(
                        None if s["up_to_bytes"] is None else int(s["up_to_bytes"]),
                        float(s["latency_s"]),
                        float(s["seconds_per_byte"]),
                    )
                    for s in data
                )
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed curve segment: {e!r}") from e
