"""Shared helpers for benchmarks: machine description, tables, dated results.

Example:
    >>> from benchmarks._common import machine_info, markdown_table
    >>> "torch" in machine_info()
    True
    >>> print(markdown_table(["a", "b"], [[1, 2]]))
    | a | b |
    |---|---|
    | 1 | 2 |
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["RESULTS_DIR", "machine_info", "markdown_table", "median", "write_result"]

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
