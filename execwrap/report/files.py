"""The files of a report: its formats, their file names and the JSON schema version.

Importing this module loads nothing heavy (no torch), so the command line
checks ``--format`` and ``--out`` against it before anything else is imported.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "REPORT_FILES",
    "REPORT_FORMATS",
    "REPORT_SCHEMA_VERSION",
    "check_formats",
    "report_paths",
]

#: Version of the JSON report layout (the ``"schema_version"`` key of
#: ``report.json``; the embedded order keeps its own version).
REPORT_SCHEMA_VERSION = 1

#: The formats :func:`~execwrap.report.write_report` knows, in the order it writes them.
REPORT_FORMATS: tuple[str, ...] = ("json", "csv", "graphml", "html")

#: Result key -> file name, per format (``csv`` writes two files).
REPORT_FILES: dict[str, dict[str, str]] = {
    "json": {"json": "report.json"},
    "csv": {"calls_csv": "calls.csv", "params_csv": "params.csv"},
    "graphml": {"graphml": "order.graphml"},
    "html": {"html": "report.html"},
}


def check_formats(formats: Sequence[str] | str) -> list[str]:
    """The requested formats, lower-cased, without repeats, in the order given.

    Args:
        formats: format names, or one comma-separated string of them.

    Raises:
        ValueError: a name not in :data:`REPORT_FORMATS`, or no name at all.
    """
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


def report_paths(out_dir: str | os.PathLike[str], formats: Sequence[str]) -> dict[str, Path]:
    """Result key -> the file a report of ``formats`` writes in ``out_dir``."""
    return {key: Path(out_dir) / name for fmt in formats for key, name in REPORT_FILES[fmt].items()}
