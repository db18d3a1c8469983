"""``calls.csv`` and ``params.csv``: the report's two tables as CSV.

UTF-8, ``\\n`` line ends, a header row of
:data:`~execwrap.report.tables.CALLS_COLUMNS` /
:data:`~execwrap.report.tables.PARAMS_COLUMNS`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

from execwrap.report.tables import CALLS_COLUMNS, PARAMS_COLUMNS

if TYPE_CHECKING:
    from execwrap.report.context import ReportContext

__all__ = ["write_calls_csv", "write_csv", "write_params_csv"]


def write_calls_csv(ctx: ReportContext, f: IO[bytes]) -> None:
    """One row per module call."""
    write_csv(f, CALLS_COLUMNS, ctx.calls_rows())


def write_params_csv(ctx: ReportContext, f: IO[bytes]) -> None:
    """One row per parameter."""
    write_csv(f, PARAMS_COLUMNS, ctx.params_rows())


def write_csv(f: IO[bytes], header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Write ``header`` and ``rows`` to the binary file ``f`` as UTF-8 CSV."""
    text = io.TextIOWrapper(f, encoding="utf-8", newline="")
    try:
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(header)
        for row in rows:
            writer.writerow(row)
        text.flush()
    finally:
        text.detach()
