"""``report.html``: one self-contained page (no scripts, no external resources).

Sections, in order: a summary, the charts (:mod:`execwrap.report.charts`,
inline SVG), the units table in execution order, the baselines, the notes,
and the call and parameter tables (folded). matplotlib is optional
(``pip install 'execwrap[report]'``); without it the page has the tables and
:data:`NO_CHARTS_LINE` instead of charts.

One escaping rule, applied to every text (:func:`html_text`): characters a
reader cannot see or that a browser would act on (controls, bidirectional
overrides, lone surrogates) are shown as Python escapes
(:func:`execwrap.util.text.printable`, the rule of the terminal and the charts),
then the text is HTML-escaped (``&``, ``<``, ``>`` and quotes).
"""

from __future__ import annotations

import dataclasses
import html
import logging
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

import torch

from execwrap.plan.figures import notes_by_severity
from execwrap.report import tables
from execwrap.report.files import REPORT_SCHEMA_VERSION
from execwrap.report.ownership import GENERATOR_META
from execwrap.report.plans import unsharded_timeline
from execwrap.report.tables import CALLS_COLUMNS, PARAMS_COLUMNS
from execwrap.util.formatting import blank, format_bytes, format_numel, short_reason
from execwrap.util.text import printable
from tracing.fqn import display
from tracing.order import ExecutionOrder

if TYPE_CHECKING:
    from execwrap.report.context import ReportContext

__all__ = ["NO_CHARTS_LINE", "html_text", "render_html", "timeline_caption", "write_html"]

logger = logging.getLogger(__name__)

#: The line the HTML page shows instead of charts when matplotlib is missing.
NO_CHARTS_LINE = "Charts need matplotlib: pip install 'execwrap[report]'"


def html_text(text: str) -> str:
    """Any text as the page shows it: :func:`~execwrap.util.text.printable`, then
    ``html.escape`` (quotes included, so it is safe in attribute values too)."""
    return html.escape(printable(text))


def write_html(ctx: ReportContext, f: IO[bytes]) -> None:
    """Write :func:`render_html` to ``f`` as UTF-8."""
    f.write(render_html(ctx).encode("utf-8"))


def render_html(ctx: ReportContext) -> str:
    """The whole page."""
    e = html_text
    parts: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        GENERATOR_META,
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(ctx.title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{e(ctx.title)}</h1>",
    ]
    parts += _summary(ctx)
    parts += _charts(ctx)
    parts += _predicted(ctx)
    parts += _units(ctx)
    parts += _baselines(ctx)
    parts += _notes(ctx)
    parts += _folded_table("calls", "Module calls", "calls", CALLS_COLUMNS, tables.calls_rows(ctx))
    parts += _folded_table(
        "params", "Parameters", "parameters", PARAMS_COLUMNS, tables.params_rows(ctx)
    )
    parts += [
        "<footer>",
        f"<p>execwrap report schema {REPORT_SCHEMA_VERSION}; order captured with torch "
        f"{e(ctx.order.torch_version)}; written with torch {e(str(torch.__version__))}.</p>",
        "</footer>",
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(parts)


def timeline_caption(order: ExecutionOrder) -> str:
    """The units-timeline caption: says how its backward half was drawn."""
    head = (
        "Units over one step: each forward bar spans the forward calls of a unit's "
        "modules (and their submodules); "
    )
    if order.param_backward_order:
        return head + (
            "each backward bar spans the unit's parameters in the gradient-ready order "
            f"recorded by {order.method} capture."
        )
    return head + "backward is drawn mirrored (this capture recorded no gradient-ready order)."


# ------------------------------------------------------------------ sections
def _summary(ctx: ReportContext) -> list[str]:
    order = ctx.order
    rows: list[tuple[str, str]] = [
        ("Model", ctx.model_class or "-"),
        ("Capture method", order.method),
        ("Fallback reason", short_reason(order.fallback_reason)),
        ("Module calls (forward)", str(len(order.module_forward_order))),
        ("Parameters", f"{len(order.params)} ({format_numel(order.total_numel())} elements)"),
        ("Tied parameters", str(len(order.shared_params))),
    ]
    rows += _plan_summary(ctx)
    out = ['<section id="summary">', "<h2>Summary</h2>", '<table class="summary">']
    for key, value in rows:
        out.append(f"<tr><th>{html_text(key)}</th><td>{html_text(value)}</td></tr>")
    out += ["</table>", "</section>"]
    return out


def _plan_summary(ctx: ReportContext) -> list[tuple[str, str]]:
    if ctx.plan is None:
        return [("Plan", "none (the report was written from an order alone)")]
    st = ctx.stats()
    fig = ctx.figures()
    policy = str(getattr(ctx.plan, "policy_name", "") or "-")
    bucket = getattr(ctx.plan, "bucket_numel", None)
    if getattr(ctx.plan, "search", None) is not None:
        bucket_text = "auto (auto-planner)"
    else:
        bucket_text = "-" if bucket is None else f"{format_numel(bucket)} elements"
    chosen = " (the auto plan's choices)" if fig.chosen else ""
    rows = [
        ("Policy", policy),
        ("Bucket size", bucket_text),
        ("Groups (FSDP units)", str(fig.groups)),
        ("Prefetch and resharding", fig.settings),
        (f"All-gathers per step{chosen}", str(fig.all_gathers_per_step)),
        ("Reduce-scatters per step", str(fig.reduce_scatters_per_step)),
    ]
    if not fig.chosen:
        rows.append(
            (
                "All-gathers per step (no reshard after forward)",
                str(st.all_gathers_per_step_no_reshard),
            )
        )
    return rows + [
        ("Largest unit", format_bytes(st.largest_unit_bytes)),
        (
            f"Peak unsharded bytes (prefetch {fig.prefetch}{', as chosen' if fig.chosen else ''})",
            f"{format_bytes(fig.peak_unsharded_bytes)} ({fig.peak_unsharded_bytes} B)",
        ),
    ]


def _charts(ctx: ReportContext) -> list[str]:
    out = ['<section id="charts">', "<h2>Charts</h2>"]
    if ctx.plan is None:
        return out + ["<p>No plan: charts need a WrapPlan.</p>", "</section>"]
    try:
        import matplotlib  # noqa: F401  (the optional extra execwrap[report])

        from execwrap.report import charts
    except ImportError as exc:
        logger.debug("no charts: %s", exc)
        return out + [f'<p class="no-charts">{html_text(NO_CHARTS_LINE)}</p>', "</section>"]
    named = ctx.named_plans()
    timelines = {name: unsharded_timeline(plan, ctx.prefetch) for name, plan, _ in named}
    peaks = {name: int(st.peak_unsharded_bytes) for name, _, st in named}
    fig = ctx.figures()  # the plan at the settings it runs with, as the summary says
    timelines["plan"] = unsharded_timeline(
        ctx.plan,
        fig.prefetch,
        reshard_after_forward=ctx.plan.reshard_after_forward if fig.chosen else True,
    )
    peaks["plan"] = fig.peak_unsharded_bytes
    try:
        timeline_svg = charts.units_timeline_svg(ctx.plan)
        memory_svg = charts.memory_svg(timelines, peaks, prefetch=ctx.prefetch)
    except Exception as exc:  # a broken matplotlib must not cost the whole report
        logger.warning("report charts failed, writing the page without them: %s", exc)
        line = f"Charts failed: {type(exc).__name__}: {exc}"
        return out + [f'<p class="no-charts">{html_text(line)}</p>', "</section>"]
    return out + [
        '<figure class="chart" id="chart-timeline">',
        timeline_svg,
        f"<figcaption>{html_text(timeline_caption(ctx.order))}</figcaption>",
        "</figure>",
        '<figure class="chart" id="chart-memory">',
        memory_svg,
        f"<figcaption>Unsharded parameter bytes at each unit step: this plan ({fig.settings}) "
        f"next to the baseline policies (prefetch {ctx.prefetch}, every group but the root "
        "resharded after forward; dashed: predicted peak).</figcaption>",
        "</figure>",
        "</section>",
    ]


def _predicted(ctx: ReportContext) -> list[str]:
    """The predicted step (``plan.estimate``): numbers, memory breakdown, the
    stream timeline and the auto-planner's candidates chart; nothing without an
    estimate."""
    estimate = getattr(ctx.plan, "estimate", None) if ctx.plan is not None else None
    if estimate is None:
        return []
    e = html.escape
    plan = ctx.plan
    rows = [
        ("Predicted step time", f"{estimate.step_time_s * 1e3:.3f} ms"),
        ("Compute (the optimizer step included)", f"{estimate.compute_time_s * 1e3:.3f} ms"),
        (
            "Copies and per-group bookkeeping (compute stream)",
            f"{getattr(estimate, 'overhead_time_s', 0.0) * 1e3:.3f} ms",
        ),
        ("Exposed communication", f"{estimate.exposed_comm_s * 1e3:.3f} ms"),
        ("Predicted peak memory per rank", format_bytes(int(estimate.peak_memory_bytes))),
        ("Prefetch", str(blank(plan.prefetch))),
        ("Groups not resharded after forward", _kept_groups(plan)),
        *_step_rows(plan),
    ]
    search = plan.search
    if search is not None:
        budget = search.memory_budget
        rows += [
            ("Memory budget", "none" if budget is None else format_bytes(budget)),
            ("Candidates simulated", f"{len(search.candidates)} in {search.seconds:.2f} s"),
            ("Cost model", search.cost_model),
        ]
    out = ['<section id="predicted">', "<h2>Predicted step (simulator)</h2>"]
    out.append('<table class="summary">')
    out += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows]
    out.append("</table>")
    parts = _memory_parts(estimate)
    if parts:
        out.append(_table("memory", ("Memory at the peak", "Bytes"), parts))
    return out + _cost_charts(ctx, estimate, search) + ["</section>"]


def _step_rows(plan: Any) -> list[tuple[str, str]]:
    """The training step's settings and how many units each checkpointing mode has."""
    step = getattr(plan, "training", None)
    if step is None:
        return []
    modes = _checkpoint_modes(plan)
    counts = [f"{modes.count(m)} {m}" for m in ("full", "selective") if m in modes]
    return [
        ("Training step", step.describe()),
        ("Units checkpointed", ", ".join(counts) if counts else "none"),
    ]


def _checkpoint_modes(plan: Any) -> list[str]:
    """Each unit's checkpointing mode (``"none"`` without a training step)."""
    modes = getattr(plan, "checkpoint_modes", None)
    return list(modes()) if callable(modes) else ["none"] * len(plan.units)


def _kept_groups(plan: Any) -> str:
    if getattr(plan, "reshard_after_forward", None) is None:
        return "-"
    kept = [plan.units[i].label for i in plan.kept_unsharded()]
    return ", ".join(kept) if kept else "none"


def _memory_parts(estimate: Any) -> list[tuple[str, str]]:
    memory = getattr(estimate, "memory", None)
    if memory is None or not dataclasses.is_dataclass(memory):
        return []
    out = []
    for f in dataclasses.fields(memory):
        value = getattr(memory, f.name)
        if isinstance(value, int):
            out.append((f.name.replace("_", " "), f"{format_bytes(value)} ({value} B)"))
    return out


def _cost_charts(ctx: ReportContext, estimate: Any, search: Any) -> list[str]:
    try:
        import matplotlib  # noqa: F401  (the optional extra execwrap[report])

        from execwrap.report import cost_charts
    except ImportError:
        return [f'<p class="no-charts">{html.escape(NO_CHARTS_LINE)}</p>']
    extra = {
        name: (float(base.estimate.step_time_s), int(base.estimate.peak_memory_bytes))
        for name, base in ctx.baselines.items()
        if getattr(base, "estimate", None) is not None
    }
    try:
        svgs = [("chart-step", cost_charts.step_timeline_svg(estimate), _STEP_CAPTION)]
        if search is not None:
            svgs.append(
                (
                    "chart-candidates",
                    cost_charts.candidates_svg(search, extra=extra),
                    _CANDIDATES_CAPTION,
                )
            )
    except Exception as exc:  # a broken matplotlib must not cost the whole report
        logger.warning("report cost charts failed, writing the page without them: %s", exc)
        return [f'<p class="no-charts">{html.escape(f"Charts failed: {exc}")}</p>']
    out: list[str] = []
    for fig_id, svg, caption in svgs:
        out += [
            f'<figure class="chart" id="{fig_id}">',
            svg,
            f"<figcaption>{html.escape(caption)}</figcaption>",
            "</figure>",
        ]
    return out


_STEP_CAPTION = (
    "Predicted timeline of one training step of this plan (execwrap.simulate_step): one lane "
    "per stream; all-gathers and reduce-scatters run beside compute as far as the cost "
    "model's overlap allows."
)
_CANDIDATES_CAPTION = (
    "Every plan the auto-planner simulated: predicted step time against predicted peak memory "
    "per rank. Star: the chosen plan; diamonds: baselines; dashed line: the memory budget."
)


def _units(ctx: ReportContext) -> list[str]:
    out = ['<section id="units">', "<h2>Units in execution order</h2>"]
    if ctx.plan is None:
        return out + ["<p>No plan.</p>", "</section>"]
    header = (
        "#",
        "Modules",
        "Parameters",
        "Elements",
        "Bytes",
        "First use",
        "Last use",
        "Checkpointing",
    )
    modes = _checkpoint_modes(ctx.plan)
    rows = (
        (
            i,
            ", ".join(display(m) for m in u.module_fqns),
            len(u.param_fqns),
            u.numel,
            format_bytes(u.bytes),
            blank(u.first_use),
            blank(u.last_use),
            modes[i],
        )
        for i, u in enumerate(ctx.plan.units)
    )
    return out + [_table("units", header, rows), "</section>"]


def _baselines(ctx: ReportContext) -> list[str]:
    if ctx.plan is None:
        return []
    out = ['<section id="baselines">', "<h2>Compared with baseline policies</h2>"]
    header = ("Plan", "Policy", "Units", "All-gathers per step", "Largest unit", "Peak unsharded")
    rows = (
        (
            name,
            str(getattr(plan, "policy_name", "") or "-"),
            st.num_units,
            st.all_gathers_per_step,
            format_bytes(st.largest_unit_bytes),
            format_bytes(st.peak_unsharded_bytes),
        )
        for name, plan, st in ctx.named_plans()
    )
    return out + [_table("baselines", header, rows), "</section>"]


def _notes(ctx: ReportContext) -> list[str]:
    """The plan's notes, warnings first (:func:`~execwrap.plan.figures.notes_by_severity`),
    after why symbolic tracing failed, if it did."""
    out = ['<section id="notes">', "<h2>Notes</h2>"]
    notes = notes_by_severity(list(ctx.plan.notes)) if ctx.plan is not None else []
    if ctx.order.fallback_reason:
        notes.insert(0, ("info", f"Symbolic tracing failed: {ctx.order.fallback_reason}"))
    if not notes:
        return out + ["<p>None.</p>", "</section>"]
    out.append('<ul class="notes">')
    for severity, note in notes:
        if severity == "warning":
            out.append(f'<li class="warning"><strong>Warning:</strong> {html_text(note)}</li>')
        else:
            out.append(f"<li>{html_text(note)}</li>")
    out += ["</ul>", "</section>"]
    return out


# -------------------------------------------------------------------- tables
def _folded_table(
    name: str, heading: str, noun: str, header: Sequence[str], rows: Iterable[Sequence[Any]]
) -> list[str]:
    """A ``<section id=name>`` holding a folded table of ``rows`` (class ``name``)."""
    rows = list(rows)
    return [
        f'<section id="{name}">',
        f"<h2>{heading}</h2>",
        f"<details><summary>{len(rows)} {noun}</summary>",
        _table(name, header, rows),
        "</details>",
        "</section>",
    ]


def _table(cls: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    e = html_text
    out = [f'<table class="{e(cls)}">', "<thead><tr>"]
    out += [f"<th>{e(str(h))}</th>" for h in header]
    out += ["</tr></thead>", "<tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>")
    out += ["</tbody>", "</table>"]
    return "".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2em auto;max-width:1200px;
padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:.2em .5em;text-align:left;vertical-align:top}
thead th{background:#f4f4f4}table.summary th{background:#f8f8f8;font-weight:600;
white-space:nowrap;min-width:16em}
table.summary td{white-space:normal;overflow-wrap:anywhere}
td{font-family:ui-monospace,Menlo,Consolas,monospace}
figure.chart{margin:1em 0}figure.chart svg{max-width:100%;height:auto}
figcaption{font-size:.85em;color:#555}.no-charts{color:#a15c00}
footer{margin-top:2em;font-size:.8em;color:#777}
"""
