"""Charts of predicted cost: the step timeline and the auto-planner's candidates.

Both come from the simulator (:func:`execwrap.simulate_step`) and are drawn
with matplotlib (no ``pyplot``), returned as inline SVG like
:mod:`execwrap.report.charts`:

* :func:`step_timeline_figure`: the predicted timeline of one training step,
  one lane per stream (compute, all-gather, reduce-scatter), a bar per event
  (``StepEstimate.timeline``).
* :func:`candidates_figure`: every candidate the auto-planner simulated,
  predicted step time against predicted peak memory, the chosen plan and the
  baselines labelled, the memory budget drawn as a vertical line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from matplotlib.figure import Figure

from execwrap.report.charts import to_inline_svg
from execwrap.util.formatting import byte_unit, format_bytes

__all__ = [
    "HSDP_LANE",
    "LANES",
    "candidates_figure",
    "candidates_svg",
    "step_timeline_figure",
    "step_timeline_svg",
    "time_unit",
]

#: Timeline lanes, top to bottom: ``(stream name, lane label, colour)``.
LANES = (
    ("compute", "compute", "#4c72b0"),
    ("all_gather", "all-gather", "#55a868"),
    ("reduce_scatter", "reduce-scatter", "#dd8452"),
)
#: The lane of HSDP's all-reduces across replicas, below :data:`LANES` when a step has one.
HSDP_LANE = ("all_reduce", "all-reduce (HSDP)", "#937860")
_CHOSEN = "#c44e52"
_BASELINE = "#8172b3"
_SEARCHED = "#9aa5b1"
#: Events a lane labels inside their bar at most (the rest stay unlabelled).
MAX_BAR_LABELS = 40


def time_unit(seconds: float) -> tuple[str, float]:
    """``(unit, seconds per unit)`` to show ``seconds`` in: s, ms or µs."""
    if seconds >= 1.0:
        return "s", 1.0
    if seconds >= 1e-3:
        return "ms", 1e-3
    return "µs", 1e-6


def step_timeline_svg(estimate: Any, *, title: str = "") -> str:
    """:func:`step_timeline_figure` as inline SVG."""
    return to_inline_svg(step_timeline_figure(estimate, title=title), "steptimeline")


def step_timeline_figure(estimate: Any, *, title: str = "") -> Figure:
    """The predicted timeline of one step: compute, all-gather, reduce-scatter lanes
    (and HSDP's all-reduce lane when the step has one).

    Args:
        estimate: a :class:`~execwrap.simulate.StepEstimate`; its ``timeline``
            events have ``stream`` (one of :data:`LANES`' names), ``label``,
            ``start_s`` and ``end_s`` (seconds from the step's start).
        title: the chart title (default: the predicted step time).
    """
    events = list(estimate.timeline)
    end = max([float(e.end_s) for e in events] + [float(estimate.step_time_s), 1e-9])
    unit, scale = time_unit(end)
    fig = Figure(figsize=(11, 2.8), layout="constrained")
    ax = fig.subplots()
    hsdp = any(e.stream == HSDP_LANE[0] for e in events)
    lanes = [*LANES, HSDP_LANE] if hsdp else list(LANES)
    for row, (stream, _, color) in enumerate(lanes):
        lane = [e for e in events if e.stream == stream]
        bars = [(e.start_s / scale, max((e.end_s - e.start_s) / scale, 0.0)) for e in lane]
        ax.broken_barh(
            bars, (row - 0.38, 0.76), facecolors=color, edgecolors="white", linewidth=0.3
        )
        if len(lane) <= MAX_BAR_LABELS:
            for e, (x, w) in zip(lane, bars, strict=True):
                if w > end / scale * (len(str(e.label)) + 2) / 150:  # the label fits its bar
                    ax.text(
                        x + w / 2,
                        row,
                        str(e.label),
                        ha="center",
                        va="center",
                        fontsize=6,
                        color="white",
                        clip_on=True,
                    )
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([label for _, label, _ in lanes])
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(0, end / scale)
    ax.set_xlabel(f"time from the start of the step ({unit})")
    ax.grid(axis="x", alpha=0.3)
    step = float(estimate.step_time_s)
    ax.set_title(
        title
        or f"Predicted step: {step / scale:.3g} {unit} "
        f"(compute {float(estimate.compute_time_s) / scale:.3g} {unit}, copies and bookkeeping "
        f"{float(getattr(estimate, 'overhead_time_s', 0.0)) / scale:.3g} {unit}, exposed "
        f"communication {float(estimate.exposed_comm_s) / scale:.3g} {unit})",
        fontsize=10,
    )
    return fig


def candidates_svg(search: Any, *, extra: Mapping[str, tuple[float, int]] | None = None) -> str:
    """:func:`candidates_figure` as inline SVG."""
    return to_inline_svg(candidates_figure(search, extra=extra), "candidates")


def candidates_figure(
    search: Any, *, extra: Mapping[str, tuple[float, int]] | None = None
) -> Figure:
    """Predicted step time against predicted peak memory, one point per candidate.

    Args:
        search: a :class:`~execwrap.plan.search_record.PlanSearch` (``plan.search``).
        extra: more labelled points, name -> ``(step seconds, peak bytes)``
            (e.g. the report's baseline policies, simulated alike).

    The chosen candidate is a red star, baselines purple diamonds (labelled),
    the other candidates grey dots; the budget (``search.memory_budget``) is a
    dashed vertical line, candidates right of it do not fit.
    """
    cands = list(search.candidates)
    extra = dict(extra or {})
    peaks = [c.peak_memory_bytes for c in cands] + [p for _, p in extra.values()]
    times = [c.step_time_s for c in cands] + [t for t, _ in extra.values()]
    budget = search.memory_budget
    mem_unit, mem_scale = byte_unit(max(peaks + [budget or 0, 1]))
    t_unit, t_scale = time_unit(max(times + [1e-9]))
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = fig.subplots()

    def xy(points: list[tuple[str, float, int]]) -> tuple[list[float], list[float]]:
        return [p / mem_scale for _, _, p in points], [t / t_scale for _, t, _ in points]

    plain = [
        (c.label, c.step_time_s, c.peak_memory_bytes)
        for i, c in enumerate(cands)
        if c.kind == "searched" and i != search.chosen
    ]
    ax.scatter(*xy(plain), s=14, color=_SEARCHED, label=f"searched ({len(plain)})", zorder=2)
    labelled = [
        (c.label, c.step_time_s, c.peak_memory_bytes)
        for i, c in enumerate(cands)
        if c.kind == "baseline" and i != search.chosen
    ] + [(name, t, p) for name, (t, p) in extra.items()]
    if labelled:
        ax.scatter(*xy(labelled), s=36, marker="D", color=_BASELINE, label="baselines", zorder=3)
    best = search.best
    chosen = [(best.label, best.step_time_s, best.peak_memory_bytes)]
    ax.scatter(
        *xy(chosen), s=160, marker="*", color=_CHOSEN, label=f"chosen: {best.label}", zorder=4
    )
    for name, x, y in _joined_labels(labelled + chosen, mem_scale, t_scale):
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
    if budget is not None:
        ax.axvline(
            budget / mem_scale,
            color=_CHOSEN,
            linestyle="--",
            linewidth=1,
            label=f"budget {format_bytes(budget)}",
        )
    ax.set_xlabel(f"predicted peak memory per rank ({mem_unit})")
    ax.set_ylabel(f"predicted step time ({t_unit})")
    ax.set_title(
        f"Candidate plans ({len(cands)} simulated, {search.world_size} ranks)", fontsize=10
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    return fig


def _joined_labels(
    points: list[tuple[str, float, int]], mem_scale: float, t_scale: float
) -> list[tuple[str, float, float]]:
    """One label per drawn position: names of points that coincide (to 3
    significant digits) joined with ``" / "``, in order."""
    by_place: dict[tuple[str, str], list[str]] = {}
    place: dict[tuple[str, str], tuple[float, float]] = {}
    for name, t, p in points:
        key = (f"{p / mem_scale:.3g}", f"{t / t_scale:.3g}")
        by_place.setdefault(key, []).append(_short(name))
        place.setdefault(key, (p / mem_scale, t / t_scale))
    return [(" / ".join(names), *place[key]) for key, names in by_place.items()]


def _short(label: str, width: int = 36) -> str:
    return label if len(label) <= width else label[: width - 1] + "…"
