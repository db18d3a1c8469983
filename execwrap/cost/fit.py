"""The calibration's least-squares fits: non-negative least squares, and one
alpha-beta line over a size range of a curve."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from execwrap.cost.curve import CollectiveCurve

__all__ = ["bandwidth_line", "nonnegative_least_squares"]


def bandwidth_line(
    curve: CollectiveCurve, sizes: Sequence[int], low_bytes: int, high_bytes: int
) -> CollectiveCurve:
    """``curve`` with one alpha-beta line over ``[low_bytes, high_bytes)``.

    The curve is resampled at ``sizes``, its own segment ends and ``low_bytes``;
    the samples in the range are replaced by the line ``latency + bytes * slope``
    (both ``>= 0``) that minimises their squared *relative* error
    (:func:`nonnegative_least_squares` on rows ``(1 / t, n / t)`` against 1), the
    others kept: one line averages the noise of neighbouring medians, which merged
    and unmerged units compare (:data:`execwrap.cost.calibrate.CPU_BANDWIDTH_RANGE`
    says where it is used and what it changed).

    Args:
        curve: the curve (seconds by bytes).
        sizes: sizes to resample at, bytes.
        low_bytes, high_bytes: the range, bytes (``low_bytes`` in it, ``high_bytes`` not).

    Returns:
        The new curve; ``curve`` itself if fewer than two sizes lie in the range.

    >>> wobbly = CollectiveCurve.from_samples([1, 2, 3, 4, 8], [1.0, 2.0, 2.0, 4.0, 30.0])
    >>> line = bandwidth_line(wobbly, [1, 2, 3, 4, 8], 2, 8)
    >>> [round(line.time(n), 4) for n in (1, 2, 3, 4, 8)]
    [1.0, 1.7778, 2.4444, 3.1111, 30.0]
    """
    bounds = (s.up_to_bytes for s in curve.segments if s.up_to_bytes is not None)
    at = sorted({*(int(n) for n in sizes), *bounds, int(low_bytes)})
    times = {n: curve.time(n) for n in at}
    inside = [n for n in at if low_bytes <= n < high_bytes]
    if len(inside) < 2:
        return curve
    latency, slope = nonnegative_least_squares(
        [[1.0 / times[n], n / times[n]] for n in inside], [1.0] * len(inside)
    )
    return CollectiveCurve.from_samples(
        at, [latency + slope * n if n in inside else times[n] for n in at]
    )


def nonnegative_least_squares(rows: Sequence[Sequence[float]], rhs: Sequence[float]) -> list[float]:
    """``x >= 0`` minimising ``|A x - b|`` for a few unknowns: every subset of unknowns
    solved by least squares (the others 0), the best feasible one kept.

    >>> [round(v, 6) for v in nonnegative_least_squares([[1, 0], [0, 1], [1, 1]], [1, 2, 3])]
    [1.0, 2.0]
    >>> nonnegative_least_squares([[1.0, 1.0], [1.0, 2.0]], [1.0, -1.0])
    [0.0, 0.0]
    """
    n = len(rows[0])
    best = [0.0] * n
    best_err = sum(b * b for b in rhs)
    for size in range(1, n + 1):
        for subset in itertools.combinations(range(n), size):
            a = torch.tensor([[r[j] for j in subset] for r in rows], dtype=torch.float64)
            b = torch.tensor(list(rhs), dtype=torch.float64).unsqueeze(1)
            # columns scaled to unit norm (they may differ by orders of magnitude)
            scale = a.norm(dim=0).clamp_min(1e-30)
            sol = torch.linalg.lstsq(a / scale, b).solution.squeeze(1) / scale
            if bool((sol < 0).any()):
                continue
            x = [0.0] * n
            for j, v in zip(subset, sol.tolist(), strict=True):
                x[j] = float(v)
            err = sum(
                (sum(r[j] * x[j] for j in range(n)) - bb) ** 2
                for r, bb in zip(rows, rhs, strict=True)
            )
            if err < best_err - 1e-30:
                best, best_err = x, err
    return best
