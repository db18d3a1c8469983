"""The terminal summary of ``execwrap report``: :func:`summary_rows` and :func:`print_notes`.

The plan's numbers come from :func:`execwrap.plan.figures.plan_figures`, the
one computation the HTML page, ``report.json`` and ``execwrap show`` read too.
The notes that matter are printed after the table, warnings before the rest,
at most :data:`MAX_NOTES` of them; the others are counted and left to
``report.html``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from execwrap.cli.text import echo, shorten
from execwrap.plan.figures import PlanFigures, notes_by_severity, plan_figures
from execwrap.util.formatting import format_bytes, format_numel, short_reason

if TYPE_CHECKING:
    import torch.nn as nn

    from execwrap.cli.options import ReportOptions
    from execwrap.plan.wrap_plan import WrapPlan
    from tracing import ExecutionOrder

__all__ = ["MAX_NOTES", "print_notes", "summary_rows"]

#: Notes printed under the summary table; the rest are counted.
MAX_NOTES = 5
#: Characters of one note on the terminal.
_NOTE_WIDTH = 300


def summary_rows(
    model: nn.Module,
    order: ExecutionOrder,
    capture_s: float,
    plan: WrapPlan,
    baselines: dict[str, WrapPlan],
    options: ReportOptions,
    device_memory: int | None = None,
) -> list[tuple[str, str]]:
    """The table: what was captured and planned, the plan's figures, the baselines
    (a baseline predicted over ``device_memory`` bytes per rank says by how much)."""
    fig = plan_figures(plan, options.prefetch)
    bucket = options.bucket_numel
    bucket_text = (
        "auto"
        if bucket == "auto"
        else "-"
        if bucket is None
        else f"{format_numel(bucket)} elements"
    )
    rows = [
        ("model", f"{type(model).__name__} ({options.model_path})"),
        ("parameters", f"{len(order.params)} ({format_numel(order.total_numel())} elements)"),
        ("input", options.input_text or "-"),
        ("capture", f"{order.method} ({capture_s:.2f} s)"),
        *(
            [("compute times", f"{order.timing_method} ({order.timing_device})")]
            if order.has_timing
            else []
        ),
        ("fallback reason", _fallback_text(order)),
        ("policy", options.policy.text)
        if options.plan_file is None
        else ("plan file", str(options.plan_file)),
        ("bucket size", bucket_text),
        ("units", str(fig.groups)),
        *_collective_rows(fig),
        *_estimate_rows(plan, fig, options),
    ]
    for name, base in baselines.items():
        bfig = plan_figures(base, options.prefetch)
        text = (
            f"{bfig.groups} units, {bfig.all_gathers_per_step} all-gathers/step, peak "
            f"{format_bytes(bfig.peak_unsharded_bytes)}"
        )
        peak = bfig.peak_memory_bytes
        if peak is not None and device_memory is not None and peak > device_memory:
            text += (
                f"; predicted peak {format_bytes(peak)} per rank, over the device's memory by "
                f"{format_bytes(peak - device_memory)}"
            )
        rows.append((f"baseline {name}", text))
    return rows


def print_notes(plan: WrapPlan, has_html: bool) -> None:
    """The plan's notes, warnings first, at most :data:`MAX_NOTES`, each one line;
    ``N more in report.html`` (or ``plan.notes`` of ``report.json``) for the rest."""
    tagged = notes_by_severity(list(plan.notes))
    if not tagged:
        return
    echo(f"notes ({len(tagged)}):")
    for severity, note in tagged[:MAX_NOTES]:
        echo(f"  {severity}: {shorten(note, _NOTE_WIDTH)}")
    rest = len(tagged) - MAX_NOTES
    if rest > 0:
        where = "report.html" if has_html else "report.json (plan.notes)"
        echo(f"  {rest} more in {where}")


def _fallback_text(order: ExecutionOrder) -> str:
    """Why capture did not stay symbolic: the ladder's reason, or that a timed
    runtime capture was asked for (``--bucket-size auto`` with an input)."""
    if order.fallback_reason:
        return short_reason(order.fallback_reason)
    if order.method == "runtime" and order.has_timing:
        return "- (not tried: the auto-planner needs compute times, recorded at run time)"
    return "-"


def _collective_rows(fig: PlanFigures) -> list[tuple[str, str]]:
    """All-gathers per step and the peak of unsharded parameters, at the settings
    the figures are for."""
    if not fig.chosen:
        return [
            ("all-gathers/step", str(fig.all_gathers_per_step)),
            (f"peak unsharded (prefetch {fig.prefetch})", format_bytes(fig.peak_unsharded_bytes)),
        ]
    return [
        ("all-gathers/step", f"{fig.all_gathers_per_step} (the auto plan's choices)"),
        (
            f"peak unsharded (prefetch {fig.prefetch}, as chosen)",
            format_bytes(fig.peak_unsharded_bytes),
        ),
    ]


def _estimate_rows(
    plan: WrapPlan, fig: PlanFigures, options: ReportOptions
) -> list[tuple[str, str]]:
    """The auto plan's choices and predicted step, when it has them."""
    if fig.step_time_s is None or fig.peak_memory_bytes is None:
        return []
    rows = [
        ("auto plan", plan.search.best.label if plan.search is not None else "-"),
        ("prefetch (chosen)", str(fig.prefetch)),
        ("groups not resharded", str(len(fig.kept_unsharded))),
        ("predicted step", f"{fig.step_time_s * 1e3:.3f} ms"),
        ("predicted peak memory", format_bytes(fig.peak_memory_bytes)),
    ]
    if fig.memory_budget is not None:
        default = options.memory_budget is None
        rows.append(
            (
                "memory budget",
                format_bytes(fig.memory_budget)
                + (" (the device's memory minus a reserve: see the notes)" if default else ""),
            )
        )
    if plan.training is not None:
        modes = plan.checkpoint_modes()
        counts = [f"{modes.count(m)} {m}" for m in ("full", "selective") if m in modes]
        rows.append(("training step", plan.training.describe()))
        rows.append(("units checkpointed", ", ".join(counts) if counts else "none"))
    return rows
