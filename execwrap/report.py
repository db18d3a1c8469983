"""Execution-order reports: JSON, CSV, GraphML and a self-contained HTML page.

:func:`write_report` turns an :class:`~tracing.ExecutionOrder` (or a
:class:`~execwrap.plan.WrapPlan`, which carries its order) into files that
people read, diff and plot:

* ``report.json``: the order, the plan (units, groups, notes, stats) and the
  baselines' stats, with ``schema_version`` (:data:`REPORT_SCHEMA_VERSION`).
* ``calls.csv``: one row per module call (forward, backward, recompute).
* ``params.csv``: one row per parameter.
* ``order.graphml``: the order graph of :func:`execwrap.graph.build_order_graph`
  with typed attributes (GraphML ``long`` / ``double`` / ``boolean`` /
  ``string``), readable by ``networkx.read_graphml``, Gephi and yEd.
* ``report.html``: one file with no external resources: a summary, charts
  drawn with matplotlib and embedded as inline SVG, the units table in
  execution order, notes, and the call and parameter tables. matplotlib is
  optional (``pip install 'execwrap[report]'``); without it the page has the
  tables and one line saying how to get the charts.

Every file is first written to a temporary name in the output folder; only
when every requested file has been written are they renamed into place, so
an interrupted run leaves neither a half-written file nor a temporary one (nor
an empty output folder it created). A folder in the way of a report file is
found before anything is written.
"""

from __future__ import annotations

import csv
import errno
import html
import io
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import torch

from tracing.fqn import ROOT_NAME
from tracing.order import ExecutionOrder

__all__ = [
    "NO_CHARTS_LINE",
    "REPORT_FILES",
    "REPORT_FORMATS",
    "REPORT_SCHEMA_VERSION",
    "byte_unit",
    "format_bytes",
    "format_numel",
    "iter_calls",
    "own_numel",
    "plan_to_dict",
    "short_reason",
    "stats_to_dict",
    "unsharded_timeline",
    "write_report",
]

logger = logging.getLogger(__name__)

#: Version of the JSON report layout (the ``"schema_version"`` key of
#: ``report.json``; the embedded order keeps its own version).
REPORT_SCHEMA_VERSION = 1

#: The formats :func:`write_report` knows, in the order it writes them.
REPORT_FORMATS: tuple[str, ...] = ("json", "csv", "graphml", "html")

#: Result key -> file name, per format (``csv`` writes two files).
REPORT_FILES: dict[str, dict[str, str]] = {
    "json": {"json": "report.json"},
    "csv": {"calls_csv": "calls.csv", "params_csv": "params.csv"},
    "graphml": {"graphml": "order.graphml"},
    "html": {"html": "report.html"},
}

#: The line the HTML page shows instead of charts when matplotlib is missing.
NO_CHARTS_LINE = "Charts need matplotlib: pip install 'execwrap[report]'"

CALLS_CSV_COLUMNS = ("index", "phase", "fqn", "class", "unit", "own_numel")
PARAMS_CSV_COLUMNS = (
    "fqn",
    "forward_index",
    "first_forward_call",
    "backward_index",
    "unit",
    "numel",
    "dtype",
    "shape",
    "requires_grad",
    "shared_with",
)


# --------------------------------------------------------------------------- API
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
            :class:`~execwrap.plan.WrapPlan` (its ``order`` is reported too).
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
        see :data:`REPORT_FILES`).

    Raises:
        ValueError: an unknown format, a negative ``prefetch``, baselines
            without a plan, or a baseline planned from another order.
        TypeError: ``order_or_plan`` is neither an order nor a plan.
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
    order, plan = _split(order_or_plan)
    formats = _check_formats(formats)
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"write_report: prefetch must be an int >= 0, got {prefetch!r}")
    baselines = dict(baselines or {})
    if baselines and plan is None:
        raise ValueError(
            "write_report: baselines need a plan to compare with; pass a WrapPlan, "
            "not a bare ExecutionOrder"
        )
    for name, base in baselines.items():
        if not _is_plan(base):
            raise TypeError(
                f"write_report: baseline {name!r} must be a WrapPlan, got {type(base).__name__}"
            )
        if base.order.module_forward_order != order.module_forward_order:
            raise ValueError(
                f"write_report: baseline {name!r} was planned from another execution order; "
                "plan every baseline from the same order as the report"
            )
    ctx = _ReportContext(order, plan, prefetch, baselines, title)
    writers: dict[str, Callable[[IO[bytes]], None]] = {
        "json": ctx.write_json,
        "calls_csv": ctx.write_calls_csv,
        "params_csv": ctx.write_params_csv,
        "graphml": ctx.write_graphml,
        "html": ctx.write_html,
    }
    targets = {
        key: Path(out_dir) / name for fmt in formats for key, name in REPORT_FILES[fmt].items()
    }
    _write_all_atomically({path: writers[key] for key, path in targets.items()})
    logger.debug("wrote report files %s", {k: str(p) for k, p in targets.items()})
    return targets


# ------------------------------------------------------------------ atomic I/O
def _write_all_atomically(writers: Mapping[Path, Callable[[IO[bytes]], None]]) -> None:
    """Write every file to a temp name in its folder, then rename all into place.

    Before anything is written, every target is checked: one that exists as
    a folder raises :class:`IsADirectoryError` naming it. If any writer raises
    (``KeyboardInterrupt`` included), every temporary file is removed, no
    target is touched (a target that existed before keeps its old content),
    and the folders this call created are removed again.
    """
    for path in writers:
        if path.is_dir():
            raise IsADirectoryError(
                errno.EISDIR, "a folder is in the way of a report file", str(path)
            )
    mode = _file_mode()
    staged: list[tuple[str, Path]] = []
    created: list[Path] = []  # folders this call made, outermost first
    try:
        for path, writer in writers.items():
            created += _make_folder(path.parent)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                writer(f)
            os.chmod(tmp, mode)  # mkstemp creates 0600; give the usual 0666 & ~umask
        for tmp, path in staged:
            try:
                os.replace(tmp, path)
            except OSError as exc:  # name the target, not our temporary file
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
    except BaseException:
        for tmp, _ in staged:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        if not any(path.exists() for _, path in staged):
            for folder in reversed(created):
                try:
                    folder.rmdir()  # only if still empty
                except OSError:
                    break
        raise


def _make_folder(folder: Path) -> list[Path]:
    """``mkdir -p folder``; returns the folders it created, outermost first."""
    missing: list[Path] = []
    probe = folder
    while not probe.exists() and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    folder.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def _file_mode() -> int:
    """``0o666`` less the process umask: the mode ``open()`` would give a new file."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


# -------------------------------------------------------------- input handling
def _is_plan(obj: Any) -> bool:
    return hasattr(obj, "units") and isinstance(getattr(obj, "order", None), ExecutionOrder)


def _split(order_or_plan: Any) -> tuple[ExecutionOrder, Any]:
    if isinstance(order_or_plan, ExecutionOrder):
        return order_or_plan, None
    if _is_plan(order_or_plan):
        return order_or_plan.order, order_or_plan
    raise TypeError(
        "write_report: expected an ExecutionOrder or a WrapPlan, "
        f"got {type(order_or_plan).__name__}"
    )


def _check_formats(formats: Sequence[str] | str) -> list[str]:
    if isinstance(formats, str):
        formats = [f for f in formats.split(",") if f]
    out: list[str] = []
    for fmt in formats:
        fmt = str(fmt).strip().lower()
        if fmt not in REPORT_FORMATS:
            raise ValueError(
                f"write_report: unknown format {fmt!r}; choose from {', '.join(REPORT_FORMATS)}"
            )
        if fmt not in out:
            out.append(fmt)
    if not out:
        raise ValueError(f"write_report: no format given; choose from {', '.join(REPORT_FORMATS)}")
    return out


# ------------------------------------------------------------ plan adapters
def plan_to_dict(plan: Any, prefetch: int = 1) -> dict[str, Any]:
    """The ``"plan"`` entry of ``report.json``: :meth:`WrapPlan.to_dict` with
    its ``"stats"`` computed at ``prefetch`` (``to_dict`` uses prefetch 1)."""
    data = plan.to_dict()
    data["stats"] = stats_to_dict(plan.stats(prefetch))
    return data


def stats_to_dict(stats: Any) -> dict[str, Any]:
    """A :class:`~execwrap.plan.PlanStats` as a JSON-ready dict (tuples as lists)."""
    return dict(stats.to_dict())


def unsharded_timeline(plan: Any, prefetch: int = 1) -> list[int]:
    """Unsharded parameter bytes at each unit step of one training step.

    The bytes of :meth:`WrapPlan.unsharded_timeline` (its docstring states
    the model of the step): ``2 * len(plan.units)`` entries, forward then
    backward; the maximum is ``plan.stats(prefetch).peak_unsharded_bytes``.
    """
    return [int(step.unsharded_bytes) for step in plan.unsharded_timeline(prefetch)]


# ------------------------------------------------------------------- helpers
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def byte_unit(n: float) -> tuple[str, int]:
    """The binary unit :func:`format_bytes` shows ``n`` bytes in, and its size.

    ``byte_unit(1536)`` -> ``("KiB", 1024)``; ``byte_unit(100)`` -> ``("B", 1)``.
    Charts use it to pick one axis unit for all their values (pass the largest).
    """
    value = abs(float(n))
    for power, unit in enumerate(_BYTE_UNITS):
        if value < 1024 ** (power + 1) or unit == _BYTE_UNITS[-1]:
            return unit, 1024**power
    raise AssertionError("unreachable")


def format_bytes(n: int | None) -> str:
    """``1536`` -> ``"1.50 KiB"`` (binary units, see :func:`byte_unit`)."""
    if n is None:
        return "-"
    unit, size = byte_unit(n)
    return f"{int(n)} B" if unit == "B" else f"{n / size:.2f} {unit}"


def short_reason(text: str | None, limit: int = 160) -> str:
    """The first line of ``text``, cut to ``limit`` characters with ``"..."``.

    How the terminal and HTML summaries show a fallback reason (the full text
    stays in ``report.json``); ``None`` -> ``"-"``.
    """
    if not text:
        return "-"
    lines = [line.strip() for line in str(text).strip().splitlines()]
    first = lines[0] if lines else ""
    if len(first) > limit:
        return first[: limit - 3].rstrip() + "..."
    return first + (" ..." if len(lines) > 1 else "")


def format_numel(n: int | None) -> str:
    """``1234567`` -> ``"1.23M"`` (decimal suffixes, elements)."""
    if n is None:
        return "-"
    for div, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}".rstrip("0").rstrip(".") + suffix
    return str(n)


def own_numel(order: ExecutionOrder) -> dict[str, int]:
    """Module FQN -> elements of its own (directly held, canonical) parameters."""
    out: dict[str, int] = {}
    for fqn, info in order.params.items():
        owner = fqn.rpartition(".")[0]
        out[owner] = out.get(owner, 0) + info.numel
    return out


def iter_calls(order: ExecutionOrder) -> Iterator[tuple[int, str, str]]:
    """``(index, phase, module_fqn)`` for every recorded module call.

    Phases: ``"forward"`` (``module_forward_order``), ``"backward"``
    (``module_backward_order``), ``"recompute"`` (``recompute_order``); the
    index counts within its phase.
    """
    for phase, calls in (
        ("forward", order.module_forward_order),
        ("backward", order.module_backward_order),
        ("recompute", order.recompute_order),
    ):
        for i, fqn in enumerate(calls):
            yield i, phase, fqn


def _graphml_safe(graph: Any) -> Any:
    """Copy ``graph`` with attributes GraphML can type: one type per key.

    ``None`` values are dropped, sequences become ``";"``-joined strings, and a
    key that holds several types is unified (int+float -> float, else str).
    """

    def scalar(v: Any) -> Any:
        if isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, (list, tuple, set, frozenset)):
            return ";".join(str(x) for x in v)
        return str(v)

    out = type(graph)()
    out.graph.update({k: scalar(v) for k, v in graph.graph.items() if v is not None})
    for n, data in graph.nodes(data=True):
        out.add_node(n, **{k: scalar(v) for k, v in data.items() if v is not None})
    for u, v, data in graph.edges(data=True):
        out.add_edge(u, v, **{k: scalar(x) for k, x in data.items() if x is not None})

    def unify(items: Iterable[dict[str, Any]]) -> None:
        items = list(items)
        types: dict[str, set[type]] = {}
        for d in items:
            for k, v in d.items():
                types.setdefault(k, set()).add(type(v))
        for k, ts in types.items():
            if len(ts) < 2:
                continue
            target: Callable[[Any], Any] = float if ts <= {int, float} else str
            for d in items:
                if k in d:
                    d[k] = target(d[k])

    unify(d for _, d in out.nodes(data=True))
    unify(d for _, _, d in out.edges(data=True))
    return out


# -------------------------------------------------------------- the writers
class _ReportContext:
    """Everything the writers share, computed once."""

    def __init__(
        self,
        order: ExecutionOrder,
        plan: Any,
        prefetch: int,
        baselines: dict[str, Any],
        title: str | None,
    ) -> None:
        self.order = order
        self.plan = plan
        self.prefetch = prefetch
        self.baselines = baselines
        self.model_class = order.module_classes.get("", "")
        self.title = title or f"execwrap report: {self.model_class or 'model'}"
        self.param_unit: dict[str, int] = {}
        self.module_unit: dict[str, int | None] = {}
        if plan is not None:
            for i, unit in enumerate(plan.units):
                for fqn in unit.param_fqns:
                    self.param_unit.setdefault(fqn, i)
        self._stats: dict[str | None, Any] = {}

    # shared pieces ------------------------------------------------------
    def stats(self, name: str | None = None) -> Any:
        """Stats of the plan (``name=None``) or of a baseline, cached."""
        if name not in self._stats:
            plan = self.plan if name is None else self.baselines[name]
            self._stats[name] = plan.stats(self.prefetch)
        return self._stats[name]

    def named_plans(self) -> list[tuple[str, Any, Any]]:
        """``(name, plan, stats)``: the plan (named ``"plan"``), then each baseline."""
        return [("plan", self.plan, self.stats())] + [
            (name, base, self.stats(name)) for name, base in self.baselines.items()
        ]

    def unit_of(self, module_fqn: str) -> int | None:
        """Index of the unit managing ``module_fqn`` (``None`` without a plan)."""
        if self.plan is None:
            return None
        if module_fqn not in self.module_unit:
            self.module_unit[module_fqn] = self.plan.unit_of_module(module_fqn)
        return self.module_unit[module_fqn]

    def to_json_dict(self) -> dict[str, Any]:
        plan = None
        baselines: dict[str, Any] = {}
        if self.plan is not None:
            plan = {**self.plan.to_dict(), "stats": stats_to_dict(self.stats())}
            for name, base in self.baselines.items():
                baselines[name] = {
                    "policy_name": str(getattr(base, "policy_name", "") or ""),
                    "bucket_numel": getattr(base, "bucket_numel", None),
                    "groups": [list(g) for g in base.groups],
                    "stats": stats_to_dict(self.stats(name)),
                }
        return {
            "schema_version": REPORT_SCHEMA_VERSION,
            "kind": "execwrap-report",
            "title": self.title,
            "model_class": self.model_class,
            "prefetch": self.prefetch,
            "order": self.order.to_dict(),
            "plan": plan,
            "baselines": baselines,
        }

    # JSON -----------------------------------------------------------------
    def write_json(self, f: IO[bytes]) -> None:
        text = json.dumps(self.to_json_dict(), indent=1)
        f.write(text.encode("utf-8"))

    # CSV ------------------------------------------------------------------
    def calls_rows(self) -> Iterator[list[Any]]:
        own = own_numel(self.order)
        classes = self.order.module_classes
        for index, phase, fqn in iter_calls(self.order):
            unit = self.unit_of(fqn)
            yield [
                index,
                phase,
                fqn,
                classes.get(fqn, ""),
                "" if unit is None else unit,
                own.get(fqn, 0),
            ]

    def params_rows(self) -> Iterator[list[Any]]:
        order = self.order
        forward_index = {fqn: i for i, fqn in enumerate(order.param_forward_order)}
        first_call = order.param_first_use_index()
        backward_index: dict[str, int] = {}
        for i, fqn in enumerate(order.param_backward_order):
            backward_index.setdefault(fqn, i)
        for fqn, info in order.params.items():
            unit = self.param_unit.get(fqn)
            yield [
                fqn,
                _blank(forward_index.get(fqn)),
                _blank(first_call.get(fqn)),
                _blank(backward_index.get(fqn)),
                _blank(unit),
                info.numel,
                info.dtype,
                "x".join(str(s) for s in info.shape),
                info.requires_grad,
                ";".join(order.shared_params.get(fqn, [])),
            ]

    def write_calls_csv(self, f: IO[bytes]) -> None:
        _write_csv(f, CALLS_CSV_COLUMNS, self.calls_rows())

    def write_params_csv(self, f: IO[bytes]) -> None:
        _write_csv(f, PARAMS_CSV_COLUMNS, self.params_rows())

    # GraphML ----------------------------------------------------------------
    def graph(self) -> Any:
        from execwrap.graph import build_order_graph

        graph = _graphml_safe(build_order_graph(self.order))
        graph.graph["model_class"] = self.model_class
        graph.graph["method"] = self.order.method
        if self.plan is not None:
            # "unit": index in plan.units of the unit managing the module or
            # parameter, -1 for none (the graph's convention for "not recorded").
            for node, data in graph.nodes(data=True):
                if data.get("kind") == "module":
                    unit = self.unit_of(str(node))
                elif data.get("kind") == "param":
                    unit = self.param_unit.get(str(node))
                else:
                    continue
                data["unit"] = -1 if unit is None else unit
        return graph

    def write_graphml(self, f: IO[bytes]) -> None:
        import networkx as nx

        nx.write_graphml(self.graph(), f, encoding="utf-8", prettyprint=True)

    # HTML -------------------------------------------------------------------
    def write_html(self, f: IO[bytes]) -> None:
        f.write(self.render_html().encode("utf-8"))

    def render_html(self) -> str:
        e = html.escape
        parts: list[str] = [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{e(self.title)}</title>",
            f"<style>{_CSS}</style>",
            "</head>",
            "<body>",
            f"<h1>{e(self.title)}</h1>",
        ]
        parts += self._html_summary()
        parts += self._html_charts()
        parts += self._html_units()
        parts += self._html_baselines()
        parts += self._html_notes()
        parts += self._html_calls()
        parts += self._html_params()
        parts += [
            "<footer>",
            f"<p>execwrap report schema {REPORT_SCHEMA_VERSION}; order captured with torch "
            f"{e(self.order.torch_version)}; written with torch {e(str(torch.__version__))}.</p>",
            "</footer>",
            "</body>",
            "</html>",
            "",
        ]
        return "\n".join(parts)

    def _html_summary(self) -> list[str]:
        order = self.order
        rows: list[tuple[str, str]] = [
            ("Model", self.model_class or "-"),
            ("Capture method", order.method),
            ("Fallback reason", short_reason(order.fallback_reason)),
            ("Module calls (forward)", str(len(order.module_forward_order))),
            (
                "Parameters",
                f"{len(order.params)} ({format_numel(order.total_numel())} elements)",
            ),
            ("Tied parameters", str(len(order.shared_params))),
        ]
        if self.plan is not None:
            st = self.stats()
            policy = str(getattr(self.plan, "policy_name", "") or "-")
            bucket = getattr(self.plan, "bucket_numel", None)
            rows += [
                ("Policy", policy),
                ("Bucket size", "-" if bucket is None else f"{format_numel(bucket)} elements"),
                ("Units", str(st.num_units)),
                ("All-gathers per step", str(st.all_gathers_per_step)),
                (
                    "All-gathers per step (no reshard after forward)",
                    str(st.all_gathers_per_step_no_reshard),
                ),
                ("Largest unit", format_bytes(st.largest_unit_bytes)),
                (
                    f"Peak unsharded bytes (prefetch {self.prefetch})",
                    f"{format_bytes(st.peak_unsharded_bytes)} ({st.peak_unsharded_bytes} B)",
                ),
            ]
        else:
            rows.append(("Plan", "none (the report was written from an order alone)"))
        out = ['<section id="summary">', "<h2>Summary</h2>", '<table class="summary">']
        for key, value in rows:
            out.append(f"<tr><th>{html.escape(key)}</th><td>{html.escape(value)}</td></tr>")
        out += ["</table>", "</section>"]
        return out

    def _html_charts(self) -> list[str]:
        out = ['<section id="charts">', "<h2>Charts</h2>"]
        if self.plan is None:
            out += ["<p>No plan: charts need a WrapPlan.</p>", "</section>"]
            return out
        try:
            import matplotlib  # noqa: F401  (the optional extra execwrap[report])

            from execwrap import _charts
        except ImportError as exc:
            logger.debug("no charts: %s", exc)
            out += [f'<p class="no-charts">{html.escape(NO_CHARTS_LINE)}</p>', "</section>"]
            return out
        named = self.named_plans()
        timelines = {name: unsharded_timeline(plan, self.prefetch) for name, plan, _ in named}
        peaks = {name: int(st.peak_unsharded_bytes) for name, _, st in named}
        try:
            timeline_svg = _charts.units_timeline_svg(self.plan)
            memory_svg = _charts.memory_svg(timelines, peaks, prefetch=self.prefetch)
        except Exception as exc:  # a broken matplotlib must not cost the whole report
            logger.warning("report charts failed, writing the page without them: %s", exc)
            line = f"Charts failed: {type(exc).__name__}: {exc}"
            return out + [f'<p class="no-charts">{html.escape(line)}</p>', "</section>"]
        out += [
            '<figure class="chart" id="chart-timeline">',
            timeline_svg,
            f"<figcaption>{html.escape(self.timeline_caption())}</figcaption>",
            "</figure>",
            '<figure class="chart" id="chart-memory">',
            memory_svg,
            f"<figcaption>Unsharded parameter bytes at each unit step, prefetch {self.prefetch}: "
            "this plan next to the baseline policies (dashed: predicted peak).</figcaption>",
            "</figure>",
            "</section>",
        ]
        return out

    def timeline_caption(self) -> str:
        """The units-timeline caption: says how its backward half was drawn."""
        head = (
            "Units over one step: each forward bar spans the forward calls of a unit's "
            "modules (and their submodules); "
        )
        if self.order.param_backward_order:
            return head + (
                "each backward bar spans the unit's parameters in the gradient-ready order "
                f"recorded by {self.order.method} capture."
            )
        return head + (
            "backward is drawn mirrored (this capture recorded no gradient-ready order)."
        )

    def _html_units(self) -> list[str]:
        out = ['<section id="units">', "<h2>Units in execution order</h2>"]
        if self.plan is None:
            return out + ["<p>No plan.</p>", "</section>"]
        out.append(
            _html_table(
                "units",
                ("#", "Modules", "Parameters", "Elements", "Bytes", "First use", "Last use"),
                (
                    (
                        i,
                        ", ".join(_root_name(m) for m in u.module_fqns),
                        len(u.param_fqns),
                        u.numel,
                        format_bytes(u.bytes),
                        _blank(u.first_use),
                        _blank(u.last_use),
                    )
                    for i, u in enumerate(self.plan.units)
                ),
            )
        )
        out.append("</section>")
        return out

    def _html_baselines(self) -> list[str]:
        if self.plan is None:
            return []
        out = ['<section id="baselines">', "<h2>Compared with baseline policies</h2>"]
        out.append(
            _html_table(
                "baselines",
                (
                    "Plan",
                    "Policy",
                    "Units",
                    "All-gathers per step",
                    "Largest unit",
                    "Peak unsharded",
                ),
                (
                    (
                        name,
                        str(getattr(plan, "policy_name", "") or "-"),
                        st.num_units,
                        st.all_gathers_per_step,
                        format_bytes(st.largest_unit_bytes),
                        format_bytes(st.peak_unsharded_bytes),
                    )
                    for name, plan, st in self.named_plans()
                ),
            )
        )
        out.append("</section>")
        return out

    def _html_notes(self) -> list[str]:
        out = ['<section id="notes">', "<h2>Notes</h2>"]
        notes = list(self.plan.notes) if self.plan is not None else []
        if self.order.fallback_reason:
            notes.insert(0, f"Symbolic tracing failed: {self.order.fallback_reason}")
        if not notes:
            return out + ["<p>None.</p>", "</section>"]
        out.append('<ul class="notes">')
        out += [f"<li>{html.escape(str(n))}</li>" for n in notes]
        out += ["</ul>", "</section>"]
        return out

    def _html_calls(self) -> list[str]:
        return _html_folded_table(
            "calls", "Module calls", "calls", CALLS_CSV_COLUMNS, self.calls_rows()
        )

    def _html_params(self) -> list[str]:
        return _html_folded_table(
            "params", "Parameters", "parameters", PARAMS_CSV_COLUMNS, self.params_rows()
        )


def _blank(value: int | None) -> int | str:
    return "" if value is None else value


def _root_name(fqn: str) -> str:
    return fqn if fqn else ROOT_NAME


def _write_csv(f: IO[bytes], header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    text = io.TextIOWrapper(f, encoding="utf-8", newline="")
    try:
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(header)
        for row in rows:
            writer.writerow(row)
        text.flush()
    finally:
        text.detach()


def _html_folded_table(
    name: str, heading: str, noun: str, header: Sequence[str], rows: Iterable[Sequence[Any]]
) -> list[str]:
    """A ``<section id=name>`` holding a folded table of ``rows`` (class ``name``)."""
    rows = list(rows)
    return [
        f'<section id="{name}">',
        f"<h2>{heading}</h2>",
        f"<details><summary>{len(rows)} {noun}</summary>",
        _html_table(name, header, rows),
        "</details>",
        "</section>",
    ]


def _html_table(cls: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    e = html.escape
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
