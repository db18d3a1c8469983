"""``fit.html``: the answer of ``execwrap fit`` as one self-contained page.

The summary rows (:mod:`execwrap.sizing.summary`), the memory per GPU at the peak by
category (a bar per category, no script), the auto-planner's candidates (predicted step
time against peak memory: :func:`execwrap.report.cost_charts.candidates_svg`), the
predicted step's timeline (:func:`execwrap.report.cost_charts.step_timeline_svg`) and the
plain-FSDP2 recipe. Texts are escaped as the report's page escapes them
(:func:`execwrap.report.html_page.html_text`); without matplotlib the charts are replaced
by :data:`execwrap.report.html_page.NO_CHARTS_LINE`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from execwrap.report.html_page import NO_CHARTS_LINE, html_text
from execwrap.report.ownership import GENERATOR_META
from execwrap.sizing.recipes import recipe
from execwrap.sizing.result import FitResult
from execwrap.sizing.summary import memory_rows, summary_rows
from tracing.atomic import atomic_write_text

__all__ = ["render_fit_page", "write_fit_page"]

_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}"
    "table{border-collapse:collapse}td,th{padding:.2em .8em;text-align:left}"
    "td.bar{width:30em}div.bar{background:#4c78a8;height:1em}"
    "pre{background:#f4f4f4;padding:1em;overflow:auto}"
)


def render_fit_page(result: FitResult, *, plan_path: str = "plan.json") -> str:
    """The whole page of ``result`` (module docstring)."""
    e = html_text
    title = f"execwrap fit: {result.model}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        GENERATOR_META,
        f"<title>{e(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        f"<h1>{e(title)}</h1>",
        _table(summary_rows(result)),
        *_memory(result),
        *_charts(result),
    ]
    if result.plan is not None:
        text = recipe(result, "fsdp2", plan_path=plan_path)
        parts += ["<h2>Recipe (plain FSDP2)</h2>", f"<pre>{e(text)}</pre>"]
    elif result.reason:
        parts += ["<h2>Why nothing fits</h2>", f"<p>{e(result.reason)}</p>"]
    parts += ["</body>", "</html>", ""]
    return "\n".join(parts)


def write_fit_page(result: FitResult, path: str | os.PathLike[str]) -> None:
    """Write :func:`render_fit_page` to ``path`` (UTF-8, atomically: temp file + rename)."""
    atomic_write_text(Path(path), render_fit_page(result))


def _memory(result: FitResult) -> list[str]:
    memory = result.memory
    if memory is None:
        return []
    total = max(memory.total, 1)
    parts = memory.to_dict()
    rows = []
    for (label, text), key in zip(
        memory_rows(result),
        [k for k, v in parts.items() if k != "total" and v] + ["total"],
        strict=True,
    ):
        width = 100 * parts[key] / total
        bar = f'<div class="bar" style="width:{width:.1f}%"></div>'
        rows.append(
            f'<tr><td>{html_text(label)}</td><td>{html_text(text)}</td><td class="bar">{bar}</td></tr>'
        )
    return ["<h2>Memory per GPU at the peak</h2>", "<table>", *rows, "</table>"]


def _charts(result: FitResult) -> list[str]:
    plan = result.plan
    if plan is None or plan.estimate is None:
        return []
    try:
        from execwrap.report.cost_charts import candidates_svg, step_timeline_svg
    except ImportError:  # matplotlib is optional
        return [f"<p>{html_text(NO_CHARTS_LINE)}</p>"]
    parts = []
    if plan.search is not None:
        parts += ["<h2>Candidates</h2>", candidates_svg(plan.search)]
    parts += ["<h2>The predicted step</h2>", step_timeline_svg(plan.estimate)]
    return parts


def _table(rows: Sequence[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{html_text(k)}</th><td>{html_text(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"
