"""Report charts drawn with matplotlib, returned as inline SVG strings.

Used by the HTML page (:mod:`execwrap.report.html_page`). Importing this
module raises ``ImportError`` when matplotlib is not installed
(``execwrap[report]``), which the page turns into one line instead of charts.

Figures are built with :class:`matplotlib.figure.Figure` directly (no
``pyplot``: no global figure state, nothing ever shown) and rendered by the
SVG backend. The SVG is made fit for inlining into HTML: no XML prolog, no
DOCTYPE, no namespace URLs, no metadata, and element ids prefixed per chart so
two charts on one page never share an id.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from execwrap.util.formatting import byte_unit, format_bytes
from execwrap.util.text import printable
from tracing.fqn import ancestors, display

__all__ = [
    "memory_figure",
    "memory_svg",
    "unit_tick_indices",
    "units_timeline_figure",
    "units_timeline_svg",
]

_FORWARD_COLOR = "#4c72b0"
_BACKWARD_COLOR = "#dd8452"
_LINE_COLORS = ("#4c72b0", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


def to_inline_svg(fig: Figure, prefix: str) -> str:
    """Render ``fig`` as SVG markup ready to paste into an HTML page."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.hashsalt": prefix, "svg.fonttype": "path"}):
        fig.savefig(
            buf,
            format="svg",
            bbox_inches="tight",
            metadata={"Date": None, "Creator": None, "Format": None, "Type": None},
        )
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg, count=2)
    svg = re.sub(r'\bid="', f'id="{prefix}-', svg)
    svg = re.sub(r'href="#', f'href="#{prefix}-', svg)
    svg = re.sub(r"url\(#", f"url(#{prefix}-", svg)
    return svg.strip()


#: Tick labels on the timeline's unit axis: at most this many, in this font size.
MAX_UNIT_LABELS = 60
LABEL_FONTSIZE = 8


def units_timeline_svg(plan: Any) -> str:
    """The units timeline of :func:`units_timeline_figure` as inline SVG."""
    return to_inline_svg(units_timeline_figure(plan), "timeline")


def units_timeline_figure(plan: Any) -> Figure:
    """Bars per unit over one step: the forward span, then the backward span.

    The forward half's x axis is the module-call index of
    ``plan.order.module_forward_order`` (``0 .. N-1``); a unit's span covers
    every call of its modules and their descendants. The backward half
    (``N .. 2N``) comes from ``plan.order.param_backward_order`` when the
    capture recorded one (runtime capture): the gradient-ready order of the
    parameters, scaled onto ``N .. 2N``, each unit spanning its parameters.
    Otherwise (symbolic capture) the forward spans are drawn mirrored.
    """
    calls = plan.order.module_forward_order
    n = len(calls)
    units = list(plan.units)
    spans = _forward_spans(plan)
    grads = _backward_spans(plan)
    # unit index -> (x, width) of its forward and of its backward bar
    forward: dict[int, tuple[float, float]] = {
        i: (lo, hi - lo + 1) for i, (lo, hi) in spans.items()
    }
    backward: dict[int, tuple[float, float]]
    if grads is not None:
        backward = {i: (n + start * n, width * n) for i, (start, width) in grads.items()}
    else:
        backward = {i: (2 * n - hi - 1, hi - lo + 1) for i, (lo, hi) in spans.items()}
    height = min(1.5 + 0.25 * len(units), 24.0)
    fig = Figure(figsize=(10, height), layout="constrained")
    ax = fig.subplots()
    for i in range(len(units)):
        for bars, color in ((forward, _FORWARD_COLOR), (backward, _BACKWARD_COLOR)):
            if i in bars:
                ax.broken_barh([bars[i]], (i - 0.4, 0.8), facecolors=color)
    ax.axvline(n, color="#888", linestyle="--", linewidth=1)
    ax.set_xlim(0, max(2 * n, 1))
    ax.set_ylim(len(units) - 0.5, -0.5)
    ticks = unit_tick_indices(len(units))
    ax.set_yticks(ticks)
    ax.set_yticklabels([_unit_label(i, units[i]) for i in ticks], fontsize=LABEL_FONTSIZE)
    ax.set_ylabel(
        "unit (execution order)"
        + ("" if len(ticks) == len(units) else f"; one label per {ticks[1] - ticks[0]} units")
    )
    if grads is not None:
        ax.set_xlabel("module call index (forward) | gradient-ready parameter order (backward)")
    else:
        ax.set_xlabel("module call index (forward | backward, mirrored)")
    ax.set_title("Units over one training step: forward (blue) | backward (orange)")
    ax.grid(axis="x", alpha=0.3)
    return fig


def unit_tick_indices(num_units: int) -> list[int]:
    """The units that get a y tick label: all of them up to
    :data:`MAX_UNIT_LABELS`, else every k-th (k as small as fits)."""
    step = max(1, -(-num_units // MAX_UNIT_LABELS))
    return list(range(0, num_units, step))


def _forward_spans(plan: Any) -> dict[int, list[int]]:
    """Unit index -> ``[first, last]`` forward call index of it or its modules."""
    by_module: dict[str, int | None] = {}
    spans: dict[int, list[int]] = {}
    for t, fqn in enumerate(plan.order.module_forward_order):
        for anc in ancestors(fqn):  # the called module's unit and every enclosing one run
            if anc not in by_module:
                by_module[anc] = plan.unit_of_module(anc)
            unit = by_module[anc]
            if unit is not None:  # calls come in order: the first one set the start
                spans.setdefault(unit, [t, t])[1] = t
    return spans


def _backward_spans(plan: Any) -> dict[int, tuple[float, float]] | None:
    """Unit index -> ``(start, width)`` as fractions of the backward half, from
    the recorded gradient-ready parameter order; ``None`` when none was recorded."""
    order = plan.order
    grads = list(order.param_backward_order)
    if not grads:
        return None
    unit_of: dict[str, int] = {}
    for i, unit in enumerate(plan.units):
        for fqn in unit.param_fqns:
            unit_of.setdefault(fqn, i)
    canonical = order.alias_to_canonical()
    positions: dict[int, list[int]] = {}
    for k, fqn in enumerate(grads):
        unit = unit_of.get(canonical.get(fqn, fqn))
        if unit is not None:
            positions.setdefault(unit, [k, k])[1] = k
    total = len(grads)
    return {u: (lo / total, (hi - lo + 1) / total) for u, (lo, hi) in positions.items()}


def _unit_label(i: int, unit: Any) -> str:
    names = [printable(display(m)) for m in unit.module_fqns]
    label = names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]} ({len(names)})"
    if len(label) > 40:
        label = "…" + label[-39:]
    return f"#{i} {label}"


def memory_svg(
    timelines: Mapping[str, Sequence[int]],
    peaks: Mapping[str, int],
    *,
    prefetch: int,
) -> str:
    """The memory chart of :func:`memory_figure` as inline SVG."""
    return to_inline_svg(memory_figure(timelines, peaks, prefetch=prefetch), "memory")


def memory_figure(
    timelines: Mapping[str, Sequence[int]],
    peaks: Mapping[str, int],
    *,
    prefetch: int,
) -> Figure:
    """Unsharded parameter memory over one step, one panel per plan, side by side.

    The y axis unit is the binary unit (B, KiB, MiB, ...) that
    :func:`~execwrap.util.formatting.format_bytes` shows the largest value in, so the
    chart reads like the report's tables.

    Args:
        timelines: plan name -> unsharded bytes per unit step, forward then
            backward (``2 * num_units`` entries), from
            :func:`~execwrap.report.plans.unsharded_timeline`.
        peaks: plan name -> the peak its stats predict (drawn dashed).
        prefetch: prefetch depth, for the title.
    """
    names = list(timelines)
    largest = max([max(t, default=0) for t in timelines.values()] + list(peaks.values()) + [0])
    unit, size = byte_unit(largest)
    fig = Figure(figsize=(min(4.2 * len(names), 14), 3.8), layout="constrained")
    axes = fig.subplots(1, len(names), sharey=True, squeeze=False)[0]
    for k, (ax, name) in enumerate(zip(axes, names, strict=True)):
        values = [v / size for v in timelines[name]]
        color = _LINE_COLORS[k % len(_LINE_COLORS)]
        xs = range(len(values) + 1)  # one more edge so the last step has a width
        ys = values + values[-1:]
        ax.step(xs, ys, where="post", color=color, linewidth=1.2)
        ax.fill_between(xs, ys, step="post", alpha=0.15, color=color)
        peak = peaks.get(name)
        if peak is not None:
            ax.axhline(peak / size, color="#c44e52", linestyle="--", linewidth=1)
        if values:
            ax.axvline(len(values) / 2, color="#888", linestyle=":", linewidth=1)
        title = f"{name}\n{len(values) // 2} units, peak {format_bytes(peak or 0)}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("unit step (forward | backward)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"unsharded parameters ({unit})")
    fig.suptitle(f"Unsharded parameter memory, prefetch {prefetch}", fontsize=10)
    return fig
