"""Shared benchmark helpers: machine description, tables, options, timing, RSS, units.

What several benchmarks repeat, in one place:

* :func:`machine_info`, :func:`markdown_table`, :func:`median`,
  :func:`write_result`: the machine description, GitHub markdown tables and
  dated result files (under :data:`RESULTS_DIR`) with a machine header.
* :func:`add_output_args` / :func:`publish`: the ``--quick``, ``--no-write``
  and ``--out DIR`` options and printing plus writing a result, so every
  benchmark behaves alike.
* :func:`interleaved`: A/B(/C...) timing where each repeat runs every variant
  once, rotating which goes first, so drift (thermal, other load) hits all of
  them alike; medians are taken by the caller.
* :func:`peak_rss_bytes`, :func:`run_child`: peak resident memory of this
  process, and running one measurement in a fresh Python process so a peak
  belongs to one configuration only.

Example:
    >>> "torch" in machine_info()
    True
    >>> print(markdown_table(["a", "b"], [[1, 2]]))
    | a | b |
    |---|---|
    | 1 | 2 |
    >>> times = interleaved({"a": lambda: None, "b": lambda: None}, repeats=3)
    >>> sorted(times.wall), len(times.cpu["a"])
    (['a', 'b'], 3)
    >>> fmt_bytes(3 * 2**30)
    '3.00 GiB'
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

__all__ = [
    "REPO_ROOT",
    "RESULTS_DIR",
    "Timings",
    "add_output_args",
    "fmt_bytes",
    "fmt_ratio",
    "interleaved",
    "load_average",
    "machine_info",
    "machine_line",
    "markdown_table",
    "median",
    "peak_rss_bytes",
    "publish",
    "run_child",
    "write_result",
]

#: The repository root (the folder holding ``benchmarks/``).
REPO_ROOT = Path(__file__).resolve().parent.parent

#: Where dated markdown results are written.
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict[str, str]:
    """Torch version, CPU model, core counts, Python and platform, as strings.

    ``cores`` is ``os.cpu_count()``; ``torch_threads`` is
    ``torch.get_num_threads()`` (the intra-op threads a benchmark really uses).
    """
    return {
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "torch_threads": str(torch.get_num_threads()),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }


def median(values: Sequence[float]) -> float:
    """Median of ``values`` (raises ``ValueError`` when empty)."""
    if not values:
        raise ValueError("median of an empty sequence")
    return float(statistics.median(values))


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table (also readable as plain text in a terminal)."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |"]
    lines.append("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def write_result(name: str, body: str, *, results_dir: Path | None = None) -> Path:
    """Write ``body`` as ``<results_dir>/<name>-<YYYY-MM-DD_HHMMSS>.md`` with a machine header.

    Args:
        name: benchmark name, used in the file name and title.
        body: markdown body (tables, notes).
        results_dir: folder; default :data:`RESULTS_DIR`.

    Returns:
        The path written.
    """
    folder = results_dir or RESULTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now()
    path = folder / f"{name}-{now:%Y-%m-%d_%H%M%S}.md"
    info = machine_info()
    header = [f"# {name}", "", f"Date: {now:%Y-%m-%d %H:%M:%S}", ""]
    header += [f"- {k}: {v}" for k, v in info.items()]
    path.write_text("\n".join(header) + "\n\n" + body.rstrip() + "\n", encoding="utf-8")
    return path


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


#: The 1-minute load average when this module was first imported (the run's start).
START_LOAD = _loadavg()


def add_output_args(parser: argparse.ArgumentParser) -> None:
    """Add ``--quick``, ``--no-write`` and ``--out DIR`` to ``parser``."""
    parser.add_argument(
        "--quick", action="store_true", help="smallest sizes, fewest repeats (< 30 s)"
    )
    parser.add_argument("--no-write", action="store_true", help="do not write a result file")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the dated result file (default: benchmarks/results/)",
    )


def load_average() -> str:
    """The current 1-minute load average, as text (``"n/a"`` if unknown)."""
    load = _loadavg()
    return "n/a" if load is None else f"{load:.2f}"


def machine_line() -> str:
    """One line: torch version, CPU model, cores, torch threads, load average."""
    info = machine_info()
    return (
        f"torch {info['torch']} | {info['cpu']} | {info['cores']} cores, "
        f"{info['torch_threads']} torch threads | load average {load_average()}"
    )


def publish(name: str, note: str, table: str, args: argparse.Namespace) -> Path | None:
    """Print ``table`` and, unless ``--no-write``, write ``note`` + ``table`` as a dated result.

    The result records the 1-minute load average at the start and at the end
    of the run (full runs made on a busy machine are unreliable; the numbers
    say how busy it was; a benchmark's own processes count too) and whether
    ``--quick`` was used.

    Returns:
        The path written, or ``None`` with ``--no-write``.
    """
    print(machine_line())
    print(table)
    if args.no_write:
        return None
    mode = "quick" if args.quick else "full"
    start = "n/a" if START_LOAD is None else f"{START_LOAD:.2f}"
    footer = (
        f"\nMode: {mode}; 1-minute load average at the start of the run: {start}, "
        f"at the end: {load_average()}.\n"
    )
    path = write_result(name, note.rstrip() + "\n\n" + table + "\n" + footer, results_dir=args.out)
    print(f"wrote {path}")
    return path


class Timings(NamedTuple):
    """Seconds per variant from :func:`interleaved`, one entry per repeat.

    Attributes:
        wall: wall-clock seconds (``time.perf_counter``).
        cpu: CPU seconds of this process, all threads (``time.process_time``).
            On a shared machine, time stolen by other processes shows in
            ``wall`` but not in ``cpu``; a ratio that holds in both is real.
    """

    wall: dict[str, list[float]]
    cpu: dict[str, list[float]]


def interleaved(
    variants: Mapping[str, Callable[[], Any]],
    *,
    repeats: int,
    warmup: int = 0,
    before: Callable[[str], Any] | None = None,
    after: Callable[[str], Any] | None = None,
) -> Timings:
    """Time each variant ``repeats`` times, interleaved; return seconds per variant.

    Each round runs every variant once; the starting variant rotates from
    round to round so none always runs first (on a colder or warmer cache).
    ``warmup`` untimed rounds run first. ``before(name)`` and ``after(name)``
    run, untimed, around every call of variant ``name`` (e.g. a
    ``gc.collect()``, or attaching and removing hooks).
    """
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            if before is not None:
                before(name)
            variants[name]()
            if after is not None:
                after(name)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if before is not None:
                before(name)
            c0 = time.process_time()
            t0 = time.perf_counter()
            variants[name]()
            t1 = time.perf_counter()
            c1 = time.process_time()
            if after is not None:
                after(name)
            wall[name].append(t1 - t0)
            cpu[name].append(c1 - c0)
    return Timings(wall, cpu)


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (``ru_maxrss``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kilobytes, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def run_child(module: str, function: str, kwargs: Mapping[str, Any], *, timeout_s: float) -> Any:
    """Run ``module.function(**kwargs)`` in a fresh Python process; return its JSON result.

    The function must return JSON-serialisable data. A fresh process makes
    ``peak_rss_bytes()`` inside it belong to that one call.

    Raises:
        RuntimeError: the child failed (its stderr is in the message).
    """
    code = (
        "import json, sys, importlib\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        f"fn = getattr(importlib.import_module({module!r}), {function!r})\n"
        "result = fn(**json.loads(sys.argv[1]))\n"
        "print('@@RESULT@@' + json.dumps(result))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(dict(kwargs))],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{module}.{function}({dict(kwargs)}) failed in a child process "
            f"(exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@") :])
    raise RuntimeError(f"{module}.{function} printed no result:\n{proc.stdout[-2000:]}")


def fmt_bytes(n: float) -> str:
    """Bytes as ``"1.23 GiB"`` / ``"45.6 MiB"`` / ``"789 KiB"``."""
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**10:.0f} KiB"


def fmt_ratio(x: float) -> str:
    """A ratio as ``"1.034x"``."""
    return f"{x:.3f}x"
