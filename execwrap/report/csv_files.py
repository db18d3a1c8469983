"""``calls.csv`` and ``params.csv``: the report's two tables as CSV.

UTF-8, ``\\n`` line ends, a header row of
:data:`~execwrap.report.tables.CALLS_COLUMNS` /
:data:`~execwrap.report.tables.PARAMS_COLUMNS`.

One escaping rule, applied to every cell by :func:`write_csv`
(:func:`csv_cell`): module and parameter names come from the model and may
start with a character that makes a spreadsheet evaluate the cell as a
formula (``=``, ``+``, ``-``, ``@``, tab, carriage return). Such a text cell is
written with a single quote in front, as OWASP's CSV injection guidance
recommends (https://owasp.org/www-community/attacks/CSV_Injection); a cell
that itself starts with a quote gets one more, so the rule is reversible:
strip one leading ``'`` from a text cell that starts with one. Number cells
are written as numbers. A row holding a carriage return in a cell is written
with every cell quoted (CSV readers end a line at a bare carriage return). A
lone surrogate (not encodable as UTF-8) is written as a backslash escape
(``\\ud800``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

from execwrap.report import tables
from execwrap.report.tables import CALLS_COLUMNS, PARAMS_COLUMNS

if TYPE_CHECKING:
    from execwrap.report.context import ReportContext

__all__ = ["FORMULA_PREFIXES", "csv_cell", "write_calls_csv", "write_csv", "write_params_csv"]

#: First characters that make a spreadsheet read a text cell as a formula
#: (OWASP CSV injection: ``= + - @``, tab, carriage return), and the quote
#: that neutralises them (so a cell starting with it is quoted too).
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r", "'")


def csv_cell(value: Any) -> Any:
    """A cell as :func:`write_csv` writes it: a text starting with one of
    :data:`FORMULA_PREFIXES` gets a leading ``'``; anything else is unchanged.

    >>> csv_cell("=1+2"), csv_cell("-x"), csv_cell(-1), csv_cell("blocks.0")
    ("'=1+2", "'-x", -1, 'blocks.0')
    """
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def write_calls_csv(ctx: ReportContext, f: IO[bytes]) -> None:
    """One row per module call."""
    write_csv(f, CALLS_COLUMNS, tables.calls_rows(ctx))


def write_params_csv(ctx: ReportContext, f: IO[bytes]) -> None:
    """One row per parameter."""
    write_csv(f, PARAMS_COLUMNS, tables.params_rows(ctx))


def write_csv(f: IO[bytes], header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Write ``header`` and ``rows`` to the binary file ``f`` as UTF-8 CSV,
    every cell through :func:`csv_cell`."""
    text = io.TextIOWrapper(f, encoding="utf-8", errors="backslashreplace", newline="")
    try:
        writer = csv.writer(text, lineterminator="\n")
        # csv quotes a cell holding a line end of its own lineterminator only, but
        # readers also end a line at a carriage return: quote such rows whole.
        quoted = csv.writer(text, lineterminator="\n", quoting=csv.QUOTE_ALL)
        writer.writerow([csv_cell(h) for h in header])
        for row in rows:
            cells = [csv_cell(c) for c in row]
            cr = any(isinstance(c, str) and "\r" in c for c in cells)
            (quoted if cr else writer).writerow(cells)
        text.flush()
    finally:
        text.detach()
