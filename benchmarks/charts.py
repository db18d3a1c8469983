"""Charts of the benchmarks' result files, drawn for the documentation.

The benchmarks write dated markdown results under ``benchmarks/results/``
(:func:`benchmarks._bench.write_result`); this module reads them back and draws
what the documentation shows beside their tables (``docs/benchmarks/``):

* ``autoplan-predicted-vs-measured.png``: the latest ``autoplan`` run, each
  plan's predicted step time and peak memory against the measured ones, one
  colour per model, with the ±10% band of the claim;
* ``autoplan-claims-over-runs.png``: every full ``autoplan`` run in date order:
  Spearman, median absolute error, auto / best of grid and auto / per-block,
  per model, with each claim's bound;
* ``estimate-predicted-vs-measured.png``: the latest ``estimate`` run, the
  roofline estimate of each model's forward and backward against the measured.

``benchmarks/autoplan.py`` and ``benchmarks/estimate.py`` call
:func:`draw_for_result` after writing a result (into :data:`CHARTS_DIR` when the
result went to ``benchmarks/results/``, else beside the result);
``python -m benchmarks.charts`` redraws them all. matplotlib is imported only to
draw (``pip install 'execwrap[report]'``); reading needs nothing but Python.
The PNGs carry no date or version, so the same results draw the same bytes.
"""

from __future__ import annotations

import argparse
import datetime
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CHARTS_DIR",
    "RESULTS_DIR",
    "AutoplanRun",
    "EstimateRun",
    "PlanResult",
    "main",
    "draw_for_result",
    "markdown_tables",
    "parse_number",
    "read_autoplan",
    "read_estimate",
    "result_files",
    "write_autoplan_charts",
    "write_charts",
    "write_estimate_chart",
]

#: Where the documentation's benchmark charts live (committed with the docs).
CHARTS_DIR = Path(__file__).resolve().parent.parent / "docs" / "_static" / "benchmarks"

#: The benchmarks' result files (``benchmarks._bench.RESULTS_DIR``, without importing torch).
RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Colour per autoplan model (the others take matplotlib's cycle).
_MODEL_COLOURS = {"wide": "#4c72b0", "gpt": "#dd8452", "llama": "#55a868"}
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_UNITS = {"B": 2**-20, "KiB": 2**-10, "MiB": 1.0, "GiB": 2**10, "TiB": 2**20}


@dataclass(frozen=True)
class PlanResult:
    """One plan of one model in an ``autoplan`` result.

    Attributes:
        plan: the plan's name (``"per-block, prefetch 1"``, ``"auto"``...).
        predicted_ms: predicted step time, milliseconds.
        measured_ms: measured step time (median over the timed steps), ms.
        predicted_peak_mib: predicted peak memory per rank, MiB.
        measured_peak_mib: the memory tracker's peak, MiB.
    """

    plan: str
    predicted_ms: float
    measured_ms: float
    predicted_peak_mib: float
    measured_peak_mib: float


@dataclass(frozen=True)
class AutoplanRun:
    """One full ``autoplan`` result file, read back.

    Attributes:
        path: the result file.
        date: when the result was written (its ``Date:`` line).
        claims: model -> claim column -> the number in it (``"Spearman"``,
            ``"median abs. error"`` in percent, ``"auto / best of grid"``,
            ``"auto / per-block"``, ``"auto / always-wrap"``, ``"budget"``: the
            measured peak over the budget); a column the run lacks is absent.
        plans: model -> its plans' predicted and measured figures, in table order.
    """

    path: Path
    date: datetime.datetime
    claims: dict[str, dict[str, float]]
    plans: dict[str, list[PlanResult]] = field(default_factory=dict)


@dataclass(frozen=True)
class EstimateRun:
    """One ``estimate`` result file: model -> (phase -> (measured ms, estimated ms)).

    Attributes:
        path: the result file.
        date: its ``Date:`` line.
        phases: model -> ``{"forward": (measured, estimated), "backward": (...)}``,
            milliseconds.
    """

    path: Path
    date: datetime.datetime
    phases: dict[str, dict[str, tuple[float, float]]]


def parse_number(cell: str) -> float:
    """The figure a result table's cell states, in the cell's own unit.

    ``"423.2 [397.2, 438.5]"`` -> 423.2 (a median and its quartiles),
    ``"12.8%"`` -> 12.8, ``"0.976x (buckets of 2)"`` -> 0.976,
    ``"181.1 MiB / 184.2 MiB = 0.983"`` -> 0.983 (the ratio after ``=``),
    ``"1.13 GiB"`` -> 1157.12 (sizes in MiB), ``"179.7 MiB †"`` -> 179.7.

    Raises:
        ValueError: the cell holds no number.
    """
    text = cell.split("=")[-1] if "=" in cell else cell
    match = _NUMBER.search(text)
    if match is None:
        raise ValueError(f"no number in result table cell {cell!r}")
    value = float(match.group())
    unit = text[match.end() :].split()
    if unit and unit[0] in _UNITS:
        value *= _UNITS[unit[0]]
    return value


def markdown_tables(text: str) -> list[tuple[str, list[str], list[list[str]]]]:
    """Every GitHub markdown table of ``text``: ``(heading, header, rows)``.

    ``heading`` is the text of the last ``#`` heading above the table (``""``
    before any); cells are stripped.
    """
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    heading = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = _cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            tables.append((heading, header, rows))
            continue
        i += 1
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _date(text: str, path: Path) -> datetime.datetime:
    match = re.search(r"^Date: (\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})$", text, re.M)
    if match is None:
        raise ValueError(f"{path}: no 'Date: YYYY-MM-DD HH:MM:SS' line (not a benchmark result?)")
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")


def _column(header: list[str], start: str) -> int | None:
    for i, name in enumerate(header):
        if name.startswith(start):
            return i
    return None


#: Claim name -> how its column's header starts in the claims table.
_CLAIMS = {
    "Spearman": "Spearman",
    "median abs. error": "median abs. error",
    "auto / best of grid": "auto / best of grid",
    "auto / per-block": "auto / per-block",
    "auto / always-wrap": "auto / always-wrap",
    "budget": "budget: measured peak / budget",
}


def read_autoplan(path: Path) -> AutoplanRun:
    """Read one ``autoplan`` result file (claims table and every model's plan table).

    Raises:
        ValueError: no ``Date:`` line, or no claims table (a table whose first
            column is ``model`` with a Spearman column).
    """
    text = path.read_text(encoding="utf-8")
    date = _date(text, path)
    claims: dict[str, dict[str, float]] = {}
    plans: dict[str, list[PlanResult]] = {}
    for heading, header, rows in markdown_tables(text):
        if header[0] == "model" and _column(header, "Spearman") is not None:
            for row in rows:
                claims[row[0]] = {
                    name: parse_number(row[col])
                    for name, start in _CLAIMS.items()
                    if (col := _column(header, start)) is not None
                }
        elif header[0] == "plan" and _column(header, "predicted step") is not None:
            model = heading.split(":")[0].strip()
            cols = [
                _column(header, "predicted step"),
                _column(header, "measured step"),
                _column(header, "predicted peak"),
                _column(header, "measured peak"),
            ]
            if any(c is None for c in cols):
                continue
            plans[model] = [
                PlanResult(row[0], *(parse_number(row[c]) for c in cols if c is not None))
                for row in rows
            ]
    if not claims:
        raise ValueError(
            f"{path}: no claims table (| model | Spearman ... |): not an autoplan result"
        )
    return AutoplanRun(path, date, claims, plans)


def read_estimate(path: Path) -> EstimateRun:
    """Read one ``estimate`` result file (forward and backward, measured and estimated).

    Raises:
        ValueError: no ``Date:`` line, or no table with forward/backward
            measured and estimated columns.
    """
    text = path.read_text(encoding="utf-8")
    date = _date(text, path)
    phases: dict[str, dict[str, tuple[float, float]]] = {}
    for _heading, header, rows in markdown_tables(text):
        cols = {
            phase: (_column(header, f"{phase} measured"), _column(header, f"{phase} estimated"))
            for phase in ("forward", "backward")
        }
        if any(m is None or e is None for m, e in cols.values()):
            continue
        for row in rows:
            phases[row[0]] = {
                phase: (parse_number(row[m]), parse_number(row[e]))
                for phase, (m, e) in cols.items()
                if m is not None and e is not None
            }
    if not phases:
        raise ValueError(f"{path}: no forward/backward measured-vs-estimated table")
    return EstimateRun(path, date, phases)


def result_files(results_dir: Path, benchmark: str) -> list[Path]:
    """``<benchmark>-*.md`` result files of full runs (``Mode: quick`` ones left out),
    oldest first."""
    files = sorted(results_dir.glob(f"{benchmark}-*.md"))
    return [f for f in files if "Mode: quick" not in f.read_text(encoding="utf-8")]


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def _identity(ax: Any, values: Sequence[float], band: float) -> None:
    low, high = min(values) * 0.9, max(values) * 1.1
    ax.plot([low, high], [low, high], color="#444444", linewidth=1, label="predicted = measured")
    ax.fill_between(
        [low, high],
        [low * (1 - band), high * (1 - band)],
        [low * (1 + band), high * (1 + band)],
        color="#cccccc",
        alpha=0.4,
        label=f"within {band:.0%}",
    )
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.grid(True, alpha=0.3)


def _colour(model: str) -> str | None:
    return _MODEL_COLOURS.get(model)


def _scatter_panel(ax: Any, run: AutoplanRun, kind: str) -> None:
    values: list[float] = []
    for model, plans in run.plans.items():
        if kind == "step":
            xs = [p.measured_ms for p in plans]
            ys = [p.predicted_ms for p in plans]
        else:
            xs = [p.measured_peak_mib for p in plans]
            ys = [p.predicted_peak_mib for p in plans]
        ax.scatter(xs, ys, s=22, color=_colour(model), label=model, zorder=3)
        values += xs + ys
    if values:
        _identity(ax, values, 0.10)
    unit = "ms" if kind == "step" else "MiB"
    what = "step time" if kind == "step" else "peak memory per rank"
    ax.set_xlabel(f"measured {what} ({unit})")
    ax.set_ylabel(f"predicted {what} ({unit})")
    ax.legend(fontsize=8, loc="upper left")


def write_autoplan_charts(results_dir: Path, out_dir: Path) -> list[Path]:
    """Draw the two ``autoplan`` charts from the result files in ``results_dir``.

    Returns:
        The PNGs written (none when ``results_dir`` has no full autoplan result).
    """
    runs = [read_autoplan(p) for p in result_files(results_dir, "autoplan")]
    if not runs:
        return []
    latest = runs[-1]
    fig = _figure(10, 4.6)
    step_ax, peak_ax = fig.subplots(1, 2)
    _scatter_panel(step_ax, latest, "step")
    _scatter_panel(peak_ax, latest, "peak")
    step_ax.set_title("step time, every plan of each model")
    peak_ax.set_title("peak memory, every plan of each model")
    fig.suptitle(
        f"autoplan {latest.date:%Y-%m-%d %H:%M} ({latest.path.name}): predicted vs measured"
    )
    written = [_save(fig, out_dir / "autoplan-predicted-vs-measured.png")]
    written.append(_save(_claims_figure(runs), out_dir / "autoplan-claims-over-runs.png"))
    return written


#: (claim, axis label, bound drawn, bound's label) for the claims chart's panels.
_PANELS = (
    ("Spearman", "Spearman, predicted vs measured ranks", 0.9, ">= 0.9"),
    ("median abs. error", "median abs. error of step time (%)", 10.0, "<= 10%"),
    ("auto / best of grid", "auto plan / best plan of the grid", 1.03, "<= 1.03x"),
    ("auto / per-block", "auto plan / per-block plan", 1.0, "< 1x"),
)


def _claims_figure(runs: Sequence[AutoplanRun]) -> Any:
    fig = _figure(11, 7.5)
    axes = fig.subplots(2, 2, sharex=True).flatten()
    models = sorted({m for run in runs for m in run.claims}, key=_model_order)
    positions = list(range(len(runs)))
    for ax, (claim, label, bound, bound_label) in zip(axes, _PANELS, strict=True):
        for model in models:
            xs = [i for i in positions if claim in runs[i].claims.get(model, {})]
            ys = [runs[i].claims[model][claim] for i in xs]
            ax.plot(
                xs, ys, marker="o", markersize=3.5, linewidth=1, color=_colour(model), label=model
            )
        ax.axhline(bound, color="#c44e52", linestyle="--", linewidth=1, label=bound_label)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    ticks = positions[:: max(1, len(positions) // 12)]
    for ax in axes[2:]:
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{runs[i].date:%m-%d %H:%M}" for i in ticks], rotation=60, fontsize=7)
        ax.set_xlabel("run (result file's date)")
    fig.suptitle(f"autoplan: the claims over {len(runs)} full runs, oldest to latest")
    return fig


def _model_order(model: str) -> tuple[int, str]:
    order = list(_MODEL_COLOURS)
    return (order.index(model) if model in order else len(order), model)


def write_estimate_chart(results_dir: Path, out_dir: Path) -> list[Path]:
    """Draw the latest ``estimate`` run's estimated against measured phase times.

    Returns:
        The PNG written (none when ``results_dir`` has no full estimate result).
    """
    files = result_files(results_dir, "estimate")
    if not files:
        return []
    run = read_estimate(files[-1])
    fig = _figure(5.6, 4.8)
    ax = fig.subplots()
    values: list[float] = []
    colours = {model: f"C{i}" for i, model in enumerate(run.phases)}
    for phase, marker in (("forward", "o"), ("backward", "s")):
        for model, phases in run.phases.items():
            measured, estimated = phases[phase]
            ax.scatter(measured, estimated, marker=marker, s=30, color=colours[model], zorder=3)
            ax.annotate(
                f"{model}, {phase}",
                (measured, estimated),
                fontsize=7,
                xytext=(4, -3),
                textcoords="offset points",
            )
            values += [measured, estimated]
    _identity(ax, values, 0.10)
    ax.set_xlabel("measured (ms)")
    ax.set_ylabel("estimated on the meta device (ms)")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(f"estimate {run.date:%Y-%m-%d %H:%M}: roofline vs measured", fontsize=10)
    return [_save(fig, out_dir / "estimate-predicted-vs-measured.png")]


def write_charts(results_dir: Path, out_dir: Path) -> list[Path]:
    """Every chart this module draws, from ``results_dir`` into ``out_dir``."""
    return write_autoplan_charts(results_dir, out_dir) + write_estimate_chart(results_dir, out_dir)


def draw_for_result(result: Path | None, out: Path | None) -> list[Path]:
    """What a benchmark calls after writing ``result``: redraw the charts.

    Args:
        result: the result file just written (``None``: ``--no-write``, nothing
            is drawn).
        out: the benchmark's ``--out`` folder; ``None`` (results went to
            ``benchmarks/results/``) draws into :data:`CHARTS_DIR`, else the
            charts go beside the result, so that runs elsewhere never touch the
            documentation's charts.

    Returns:
        The PNGs written; none without matplotlib (one line says how to get it).
    """
    if result is None:
        return []
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("charts not drawn: matplotlib is missing (pip install 'execwrap[report]')")
        return []
    written = write_charts(result.parent, CHARTS_DIR if out is None else out)
    for path in written:
        print(f"wrote {path}")
    return written


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.charts``: redraw the documentation's benchmark charts."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS_DIR, help="result files' folder")
    parser.add_argument("--out", type=Path, default=CHARTS_DIR, help="folder for the PNGs")
    args = parser.parse_args(argv)
    for path in write_charts(args.results, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
