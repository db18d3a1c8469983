"""Execution-order reports: JSON, CSV, GraphML and a self-contained HTML page.

:func:`write_report` turns an :class:`~tracing.ExecutionOrder` (or a
:class:`~execwrap.plan.wrap_plan.WrapPlan`, which carries its order) into files that
people read, diff and plot:

* ``report.json``: the order, the plan (units, groups, notes, stats) and the
  baselines' stats, with ``schema_version`` (:data:`REPORT_SCHEMA_VERSION`).
* ``calls.csv``: one row per module call (forward, backward, recompute).
* ``params.csv``: one row per parameter.
* ``order.graphml``: the order graph of :func:`execwrap.order.graph.build_order_graph`
  with typed attributes, readable by ``networkx.read_graphml``, Gephi and yEd.
* ``report.html``: one file with no external resources: a summary, charts
  drawn with matplotlib and embedded as inline SVG, the units table in
  execution order, notes, and the call and parameter tables. matplotlib is
  optional (``pip install 'execwrap[report]'``); without it the page has the
  tables and one line saying how to get the charts.

The files are written as one set: a reader sees the old complete set or the
new one, whenever the writer stops (:mod:`~execwrap.report.file_set`). Each
format has one escaping rule for names, applied by its writer (see
:mod:`~execwrap.report.csv_files`, :mod:`~execwrap.report.graphml_file`,
:mod:`~execwrap.report.html_page`).

Modules: :mod:`~execwrap.report.writer` (:func:`write_report`),
:mod:`~execwrap.report.files` (formats, file names, schema version),
:mod:`~execwrap.report.context` (what every file is made from),
:mod:`~execwrap.report.tables` (the call and parameter rows), one module per
format (:mod:`~execwrap.report.json_file`, :mod:`~execwrap.report.csv_files`,
:mod:`~execwrap.report.graphml_file`, :mod:`~execwrap.report.html_page`,
:mod:`~execwrap.report.charts`), :mod:`~execwrap.util.formatting` (bytes,
counts, reasons) and :mod:`~execwrap.report.plans` (what a report reads from
a plan).

Like :mod:`execwrap`, this package imports each name on first use (PEP 562):
the command line reads :data:`REPORT_FORMATS` and :data:`REPORT_FILES`
without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.report.files import REPORT_FILES, REPORT_FORMATS, REPORT_SCHEMA_VERSION
    from execwrap.report.graphml_file import graphml_unescape
    from execwrap.report.html_page import NO_CHARTS_LINE
    from execwrap.report.plans import plan_to_dict, stats_to_dict, unsharded_timeline
    from execwrap.report.tables import iter_calls, own_numel
    from execwrap.report.writer import write_report
    from execwrap.util.formatting import byte_unit, format_bytes, format_numel, short_reason

#: Public name -> module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "REPORT_FILES": "execwrap.report.files",
    "REPORT_FORMATS": "execwrap.report.files",
    "REPORT_SCHEMA_VERSION": "execwrap.report.files",
    "byte_unit": "execwrap.util.formatting",
    "format_bytes": "execwrap.util.formatting",
    "format_numel": "execwrap.util.formatting",
    "short_reason": "execwrap.util.formatting",
    "graphml_unescape": "execwrap.report.graphml_file",
    "NO_CHARTS_LINE": "execwrap.report.html_page",
    "plan_to_dict": "execwrap.report.plans",
    "stats_to_dict": "execwrap.report.plans",
    "unsharded_timeline": "execwrap.report.plans",
    "iter_calls": "execwrap.report.tables",
    "own_numel": "execwrap.report.tables",
    "write_report": "execwrap.report.writer",
}

__all__ = [
    "NO_CHARTS_LINE",
    "REPORT_FILES",
    "REPORT_FORMATS",
    "REPORT_SCHEMA_VERSION",
    "byte_unit",
    "format_bytes",
    "format_numel",
    "graphml_unescape",
    "iter_calls",
    "own_numel",
    "plan_to_dict",
    "short_reason",
    "stats_to_dict",
    "unsharded_timeline",
    "write_report",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
