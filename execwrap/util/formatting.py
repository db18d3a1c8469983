"""How reports write numbers and reasons: bytes, element counts, one-line reasons.

Shared by every report format, the charts and the command line's summary, so
a value reads the same in the terminal, the HTML tables and the charts.
Loads nothing heavy (no torch).

>>> format_bytes(1536), format_numel(1_234_567), short_reason("first\\nsecond")
('1.50 KiB', '1.23M', 'first ...')
"""

from __future__ import annotations

__all__ = ["blank", "byte_unit", "format_bytes", "format_numel", "short_reason"]

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
    """``1536`` -> ``"1.50 KiB"`` (binary units, see :func:`byte_unit`); ``None`` -> ``"-"``."""
    if n is None:
        return "-"
    unit, size = byte_unit(n)
    return f"{int(n)} B" if unit == "B" else f"{n / size:.2f} {unit}"


def format_numel(n: int | None) -> str:
    """``1234567`` -> ``"1.23M"`` (decimal suffixes, elements); ``None`` -> ``"-"``."""
    if n is None:
        return "-"
    for div, suffix in ((10**9, "G"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}".rstrip("0").rstrip(".") + suffix
    return str(n)


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


def blank(value: int | None) -> int | str:
    """A table cell for an optional index: ``None`` -> ``""``."""
    return "" if value is None else value
