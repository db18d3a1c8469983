"""Write an execution-order report: :func:`write_report`.

It checks its arguments, builds one :class:`~execwrap.report.context.ReportContext`,
and writes the requested files as one set: a reader sees the old complete
set or the new one (:func:`~execwrap.report.file_set.write_file_set`).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from execwrap.report import csv_files, graphml_file, html_page, json_file
from execwrap.report.context import ReportContext
from execwrap.report.file_set import write_file_set
from execwrap.report.files import REPORT_FILES, REPORT_FORMATS, check_formats, report_paths
from execwrap.report.plans import is_plan
from tracing.checks import check_int
from tracing.order import ExecutionOrder

__all__ = ["FILE_WRITERS", "write_report"]

logger = logging.getLogger(__name__)

#: The writer of each report file, by format key (:data:`~execwrap.report.files.REPORT_FILES`):
#: a function ``(context, binary file) -> None`` of that format's module.
FILE_WRITERS: dict[str, Callable[[ReportContext, IO[bytes]], None]] = {
    "json": json_file.write_json,
    "calls_csv": csv_files.write_calls_csv,
    "params_csv": csv_files.write_params_csv,
    "graphml": graphml_file.write_graphml,
    "html": html_page.write_html,
}


def write_report(
    order_or_plan: Any,
    out_dir: str | os.PathLike[str],
    formats: Sequence[str] = REPORT_FORMATS,
    *,
    prefetch: int = 1,
    baselines: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> dict[str, Path]:
    """Write an execution-order report in the given formats.

    Args:
        order_or_plan: an :class:`~tracing.ExecutionOrder`, or a
            :class:`~execwrap.plan.wrap_plan.WrapPlan` (its ``order`` is reported too).
        out_dir: folder to write into; created if missing.
        formats: any of ``"json"``, ``"csv"``, ``"graphml"``, ``"html"``.
        prefetch: prefetch depth (units all-gathered ahead of the running one)
            used for the plan's stats and the memory chart; ``>= 0``.
        baselines: other plans of the *same* order to compare with, by name
            (e.g. ``{"always_wrap_policy": plan_wrap(model, order)}``); their
            stats go into the JSON and the HTML, and their unsharded-memory
            curves are drawn next to the plan's. Needs a plan.
        title: page title; default ``"execwrap report: <model class>"``.

    Returns:
        Result key -> path written: ``"json"``, ``"calls_csv"``,
        ``"params_csv"``, ``"graphml"``, ``"html"`` (only the requested ones;
        see :data:`~execwrap.report.files.REPORT_FILES`).

    Raises:
        ValueError: an unknown format, a negative ``prefetch``, baselines
            without a plan, or a baseline planned from another order.
        TypeError: ``order_or_plan`` is neither an order nor a plan, a
            baseline is not a plan, or ``prefetch`` is not an int.
        ValueError: ``out_dir`` is empty (``""``: say ``"."`` for the current folder).
        execwrap.report.ownership.ForeignFilesError: a file the report would
            write is there and execwrap did not write it, or a report file it would
            replace or remove was changed since execwrap wrote it (a
            ``FileExistsError``; nothing is touched: choose another folder).
        OSError: ``out_dir`` cannot be created or written; nothing is left
            behind in it.

    Example:
        >>> from execwrap.demo_models import build_demo_model
        >>> from tracing import trace_execution_order
        >>> order = trace_execution_order(build_demo_model(2))
        >>> paths = write_report(order, "out", formats=("json",))  # doctest: +SKIP
        >>> sorted(paths)  # doctest: +SKIP
        ['json']
    """
    if not str(out_dir).strip():
        raise ValueError(
            'write_report: out_dir is empty; name the report folder (e.g. "execwrap-report", '
            'or "." for the current folder)'
        )
    order, plan = _split(order_or_plan)
    formats = check_formats(formats)
    check_int(prefetch, "write_report: prefetch")
    baselines = _check_baselines(dict(baselines or {}), order, plan)
    ctx = ReportContext(order, plan, prefetch, baselines, title)
    targets = report_paths(out_dir, formats)
    write_file_set(
        Path(out_dir),
        {path.name: functools.partial(FILE_WRITERS[key], ctx) for key, path in targets.items()},
        known_names=[name for files in REPORT_FILES.values() for name in files.values()],
    )
    logger.debug("wrote report files %s", {k: str(p) for k, p in targets.items()})
    return targets


def _split(order_or_plan: Any) -> tuple[ExecutionOrder, Any]:
    """``(order, plan)``; ``plan`` is ``None`` for a bare order."""
    if isinstance(order_or_plan, ExecutionOrder):
        return order_or_plan, None
    if is_plan(order_or_plan):
        return order_or_plan.order, order_or_plan
    raise TypeError(
        "write_report: expected an ExecutionOrder or a WrapPlan, "
        f"got {type(order_or_plan).__name__}"
    )


def _check_baselines(baselines: dict[str, Any], order: ExecutionOrder, plan: Any) -> dict[str, Any]:
    if baselines and plan is None:
        raise ValueError(
            "write_report: baselines need a plan to compare with; pass a WrapPlan, "
            "not a bare ExecutionOrder"
        )
    for name, base in baselines.items():
        if not is_plan(base):
            raise TypeError(
                f"write_report: baseline {name!r} must be a WrapPlan, got {type(base).__name__}"
            )
        if base.order.module_forward_order != order.module_forward_order:
            raise ValueError(
                f"write_report: baseline {name!r} was planned from another execution order; "
                "plan every baseline from the same order as the report"
            )
    return baselines
