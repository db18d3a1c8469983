"""Command-line start-up: ``execwrap --help`` vs ``python -c "import torch"``.

Every variant is a fresh Python process (this interpreter, the repository
first on ``PYTHONPATH``), run to completion with its output discarded; the
variants take turns (the first one rotates each round, one untimed warm-up
round first), medians of the repeats:

* ``python -c pass``: the interpreter's own start-up, the floor;
* ``execwrap --help``: ``python -m execwrap --help`` (the ``execwrap``
  console script runs the same ``execwrap.cli:main``);
* ``execwrap report --help``;
* ``execwrap report --bucket-size 2Q``: an argument error (exit 2);
* ``python -c "import torch"``: what any command that loads torch pays first.

Times are wall clock per process and the children's CPU time (user + system,
``getrusage(RUSAGE_CHILDREN)``), which other load on the machine inflates
less. One untimed ``python -X importtime`` run per variant records whether it
imported torch. Target: ``execwrap --help`` <= 0.25x ``import torch``.

Usage::

    python -m benchmarks.startup            # 15 repeats
    python -m benchmarks.startup --quick    # 3 repeats (< 30 s)
    python benchmarks/startup.py --repeats 31
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._bench import (
    REPO_ROOT,
    add_output_args,
    fmt_ratio,
    interleaved,
    markdown_table,
    median,
    publish,
)

__all__ = ["VARIANTS", "imports_torch", "main", "run"]

TARGET_RATIO = 0.25
BASELINE = 'python -c "import torch"'
TARGET = "execwrap --help"

#: Variant name -> (interpreter arguments, expected exit status).
VARIANTS: dict[str, tuple[list[str], int]] = {
    "python -c pass": (["-c", "pass"], 0),
    "execwrap --help": (["-m", "execwrap", "--help"], 0),
    "execwrap report --help": (["-m", "execwrap", "report", "--help"], 0),
    "execwrap report --bucket-size 2Q": (["-m", "execwrap", "report", "--bucket-size", "2Q"], 2),
    BASELINE: (["-c", "import torch"], 0),
}


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT) + (os.pathsep + path if path else "")}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _runner(name: str, cpu: dict[str, list[float]]) -> Callable[[], None]:
    """A function that runs variant ``name`` once and appends its CPU seconds to ``cpu``."""
    args, expected = VARIANTS[name]
    command, env = [sys.executable, *args], _env()

    def run_once() -> None:
        before = _children_cpu_s()
        proc = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        cpu[name].append(_children_cpu_s() - before)
        if proc.returncode != expected:
            raise RuntimeError(f"{name}: exit {proc.returncode}, expected {expected}")

    return run_once


def imports_torch(name: str) -> bool:
    """Whether variant ``name`` imports torch (one ``python -X importtime`` run)."""
    args, _ = VARIANTS[name]
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        cwd=REPO_ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    names = [
        line.split("|")[2].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    ]
    return any(n == "torch" or n.startswith("torch.") for n in names)


def run(*, repeats: int, warmup: int) -> list[dict[str, Any]]:
    """Time every variant, interleaved; one row per variant with medians and ratios."""
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    runners = {name: _runner(name, cpu) for name in VARIANTS}
    times = interleaved(runners, repeats=repeats, warmup=warmup)
    cpu = {name: values[warmup:] for name, values in cpu.items()}  # drop the warm-up runs
    wall = {name: median(ts) for name, ts in times.wall.items()}
    cpu_med = {name: median(ts) for name, ts in cpu.items()}
    return [
        {
            "variant": name,
            "repeats": repeats,
            "wall_s": wall[name],
            "cpu_s": cpu_med[name],
            "vs_torch": wall[name] / wall[BASELINE],
            "vs_torch_cpu": cpu_med[name] / cpu_med[BASELINE],
            "imports_torch": imports_torch(name),
        }
        for name in VARIANTS
    ]


def _table(rows: list[dict[str, Any]]) -> str:
    header = [
        "command",
        "repeats",
        "wall (ms)",
        "CPU (ms)",
        f"vs import torch (target for --help <= {TARGET_RATIO}x)",
        "same, CPU time",
        "imports torch",
    ]
    body = [
        [
            f"`{r['variant']}`",
            r["repeats"],
            f"{r['wall_s'] * 1e3:.1f}",
            f"{r['cpu_s'] * 1e3:.1f}",
            fmt_ratio(r["vs_torch"]),
            fmt_ratio(r["vs_torch_cpu"]),
            "yes" if r["imports_torch"] else "no",
        ]
        for r in rows
    ]
    return markdown_table(header, body)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints a table and writes a dated result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 15)
    rows = run(repeats=repeats, warmup=1)
    target = next(r for r in rows if r["variant"] == TARGET)
    verdict = "met" if target["vs_torch"] <= TARGET_RATIO else "missed"
    note = (
        "Start-up of the `execwrap` command line next to `import torch`: each command a fresh "
        f"`{Path(sys.executable).name}` process with the repository first on `PYTHONPATH`, "
        "output discarded, the commands interleaved round by round (the first rotates), one "
        "untimed warm-up round, medians of wall time and of the child's CPU time (user + "
        'system). `execwrap --help` runs as `python -m execwrap --help`. "imports torch" '
        "comes from one `python -X importtime` run of each command.\n\n"
        f"`execwrap --help` / `import torch`: {fmt_ratio(target['vs_torch'])} wall, "
        f"{fmt_ratio(target['vs_torch_cpu'])} CPU (target <= {TARGET_RATIO}x: {verdict}).\n"
    )
    publish("startup", note, _table(rows), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
