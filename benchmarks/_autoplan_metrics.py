"""The claims ``benchmarks/autoplan.py`` checks, computed from its rows.

:func:`spearman` is Spearman's rank correlation (Spearman 1904) as the
Pearson correlation of the ranks, ties given their average rank (the
definition ``scipy.stats.spearmanr`` uses). :func:`claims` turns one model's
rows into the figures of issue 11's "Done when".

Example:
    >>> spearman([1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0])
    1.0
    >>> spearman([1.0, 2.0, 3.0], [3.0, 2.0, 1.0])
    -1.0
    >>> round(spearman([1.0, 2.0, 2.0, 4.0], [1.0, 3.0, 2.0, 4.0]), 4)
    0.9487
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = [
    "AUTO",
    "AUTO_BUDGET",
    "MEMORY_TOLERANCE",
    "claims",
    "ranks",
    "spearman",
    "split_half_spearman",
    "steal_share",
]

#: Names of the auto plans in the grid.
AUTO = "auto"
AUTO_BUDGET = "auto, under a budget"
#: Relative difference under which a predicted peak counts as matching the tracker.
MEMORY_TOLERANCE = 0.10


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of ``values``, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation of ``a`` and ``b`` (``nan`` if a side is constant)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("spearman needs two sequences of the same length >= 2")
    try:
        return statistics.correlation(ranks(a), ranks(b))
    except statistics.StatisticsError:  # a constant side
        return math.nan


def _typical_spread(rows: Sequence[dict[str, Any]]) -> float:
    """The median over plans of a plan's interquartile range of step times over its
    median step time (``nan`` when the rows carry no ``spread_s``)."""
    spreads = [
        (r["spread_s"][1] - r["spread_s"][0]) / r["measured_s"] for r in rows if r.get("spread_s")
    ]
    return statistics.median(spreads) if spreads else math.nan


def split_half_spearman(rows: Sequence[dict[str, Any]]) -> float:
    """Spearman of the plans' median steps over the even-numbered timed steps against
    the odd-numbered ones (``halves_s`` of each row; ``nan`` without them): how well
    the run's own measurements rank the plans against themselves, what a
    prediction's Spearman can be judged against. Each half has half the steps, so
    it is a lower estimate of the full run's self-agreement; between runs the
    agreement is lower again (the machine drifts between runs).

    >>> rows = [{"halves_s": (1.0, 1.1)}, {"halves_s": (2.0, 1.9)}, {"halves_s": (3.0, 3.2)}]
    >>> split_half_spearman(rows)
    1.0
    """
    halves: list[tuple[float, float]] = [r["halves_s"] for r in rows if r.get("halves_s")]
    if len(rows) < 2 or len(halves) < len(rows):
        return math.nan
    return spearman([h[0] for h in halves], [h[1] for h in halves])


def steal_share(rows: Sequence[dict[str, Any]], cpus: int) -> float:
    """The host's steal during the timed steps of every plan, as a share of the CPU
    time the machine had (each row's ``steals_s`` over its ``steps_s``; ``nan``
    without them).

    >>> rows = [{"steals_s": [0.1], "steps_s": [2.0]}, {"steals_s": [0.0], "steps_s": [3.0]}]
    >>> steal_share(rows, 2)
    0.01
    """
    if not rows or any("steals_s" not in r or "steps_s" not in r for r in rows):
        return math.nan
    wall = sum(sum(r["steps_s"]) for r in rows)
    return sum(sum(r["steals_s"]) for r in rows) / (wall * cpus) if wall > 0 else math.nan


def claims(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The figures of one model's rows (one row per plan, see ``benchmarks.autoplan``).

    Returns:
        ``spearman``, ``median_abs_error`` (fraction), ``auto_vs_best`` and
        ``best_name`` (the best measured plan of the grid, auto plans excluded),
        ``auto_vs_per_block`` (against the better of per-block with prefetch
        0 and 1), ``auto_vs_always``, ``memory_within`` (plans whose predicted
        peak is within :data:`MEMORY_TOLERANCE` of the measured one),
        ``plans``, ``budget`` and ``budget_peak`` (the budgeted auto plan's
        budget and measured peak), ``spread`` (the median over plans of the
        interquartile range of a plan's step times over its median: how much
        of a difference between plans is noise), ``split_half`` (the run's
        odd steps ranked against its even steps, :func:`split_half_spearman`)
        and ``all_met``.
    """
    by_name = {r["name"]: r for r in rows}
    predicted = [r["predicted_s"] for r in rows]
    measured = [r["measured_s"] for r in rows]
    errors = [abs(p / m - 1) for p, m in zip(predicted, measured, strict=True)]
    grid = [r for r in rows if r["name"] not in (AUTO, AUTO_BUDGET)]
    best = min(grid, key=lambda r: r["measured_s"])
    auto = by_name[AUTO]["measured_s"]
    per_block = min(
        by_name[n]["measured_s"] for n in ("per-block, prefetch 0", "per-block, prefetch 1")
    )
    always = by_name["always-wrap units"]["measured_s"]
    within = sum(
        1 for r in rows if abs(r["predicted_peak"] / r["measured_peak"] - 1) <= MEMORY_TOLERANCE
    )
    budgeted = by_name[AUTO_BUDGET]
    out = {
        "spearman": spearman(predicted, measured),
        "median_abs_error": statistics.median(errors),
        "auto_vs_best": auto / best["measured_s"],
        "best_name": best["name"],
        "auto_vs_per_block": auto / per_block,
        "auto_vs_always": auto / always,
        "memory_within": within,
        "plans": len(rows),
        "budget": budgeted["budget"],
        "budget_peak": budgeted["measured_peak"],
        "spread": _typical_spread(rows),
        "split_half": split_half_spearman(rows),
    }
    out["all_met"] = bool(
        out["spearman"] >= 0.9
        and out["median_abs_error"] <= 0.10
        and out["auto_vs_best"] <= 1.03
        and out["auto_vs_per_block"] < 1.0
        and out["auto_vs_always"] < 1.0
        and within >= 3
        and budgeted["measured_peak"] <= budgeted["budget"]
    )
    return out
