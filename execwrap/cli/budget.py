"""``--memory-budget SIZE``: sizes in bytes as people write them, and the budget's checks.

:func:`parse_bytes` reads ``40GiB``, ``8GB``, ``4096`` or ``40e9``;
:func:`memory_budget_option` refuses what ``plan_wrap`` would refuse (a budget
``<= 0``, with the same advice in terms of the option) and a bare number
below 1 MiB (a forgotten unit). :func:`join_negative_values` lets a negative
budget reach that check: argparse takes ``-5GiB`` after ``--memory-budget``
for an option of its own and answers only "expected one argument". Imports no
torch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction

from execwrap.cli.errors import CLIError

__all__ = ["MAX_BYTES", "join_negative_values", "memory_budget_option", "parse_bytes"]

_BYTES_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*([a-zA-Z]*)\s*$")
_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: The largest size accepted, bytes: torch counts memory in int64.
MAX_BYTES = 2**63 - 1
#: Options whose value may start with ``-`` and a digit (a negative size).
_SIZE_OPTIONS = ("--memory-budget",)
_NEGATIVE = re.compile(r"^-\.?\d")


def parse_bytes(text: str) -> int:
    """Parse a size in bytes with an optional unit.

    ``"40GiB"`` -> ``42_949_672_960`` (binary: KiB, MiB, GiB, TiB are powers of
    1024); ``"8GB"`` -> ``8_000_000_000`` (decimal: KB, MB, GB, TB);
    ``"4096"`` / ``"4096B"`` -> ``4096``; ``"40e9"`` -> ``40_000_000_000`` (as in
    Python). Units are case-insensitive; a bare ``K``/``M``/``G`` is refused as ambiguous.
    A leading ``-`` gives a negative size, for the caller to refuse in its own words.

    Raises:
        ValueError: not a number with one of these units, not a whole number
            of bytes, or more than :data:`MAX_BYTES` (``1e400``).

    >>> parse_bytes("40GiB"), parse_bytes("-5GiB")
    (42949672960, -5368709120)
    """
    match = _BYTES_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _BYTE_UNITS:
        hint = (
            f"; {match.group(2)!r} is ambiguous: write {match.group(2)}iB (powers of 1024) or "
            f"{match.group(2)}B (powers of 1000)"
            if match and unit in ("k", "m", "g", "t")
            else ""
        )
        raise ValueError(
            f"invalid size {text!r}: expected a number of bytes with an optional unit, e.g. "
            f"40GiB, 512MiB or 8GB{hint}"
        )
    value = Fraction(match.group(1)) * _BYTE_UNITS[unit]  # exact: 1e400 stays a number
    if value.denominator != 1:
        raise ValueError(f"invalid size {text!r}: not a whole number of bytes")
    if abs(value) > MAX_BYTES:
        raise ValueError(
            f"invalid size {text!r}: more bytes than any device holds (at most 2**63 - 1 "
            "bytes, 8 EiB, the largest size torch counts)"
        )
    return int(value)


def memory_budget_option(text: str) -> int:
    """``--memory-budget`` in bytes per rank.

    Raises:
        CLIError: not a size (:func:`parse_bytes`); zero or negative (as
            ``plan_wrap``'s ``memory_budget``: leave the option out for no
            limit); a bare number below 1 MiB (a forgotten unit: ``40`` is 40
            bytes).

    >>> memory_budget_option("-5GiB")
    Traceback (most recent call last):
    ...
    execwrap.cli.errors.CLIError: --memory-budget '-5GiB': must be > 0 bytes per rank, got -5368709120; leave --memory-budget out to plan within the device's memory
    """
    try:
        budget = parse_bytes(text)
    except ValueError as exc:
        raise CLIError(f"--memory-budget: {exc}") from None
    if budget <= 0:
        raise CLIError(
            f"--memory-budget {text!r}: must be > 0 bytes per rank, got {budget}; leave "
            "--memory-budget out to plan within the device's memory"
        )
    bare = not re.sub(r"[\d.\seE+-]", "", text)  # no unit: bytes
    if bare and budget < 2**20:  # below 1 MiB: a forgotten unit
        # A number a person writes in GiB (up to a few TiB) is echoed with the unit;
        # a larger one, whose unit cannot be guessed, gets the usual examples.
        example = text.strip() if budget < 10_000 else "40"
        raise CLIError(
            f"--memory-budget {text!r} is {budget} bytes, below 1 MiB per rank, too little "
            f"for a training step: write the unit, e.g. {example}GiB or {example}GB (a bare "
            "number is bytes)"
        )
    return budget


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``--memory-budget -5GiB`` joined into ``--memory-budget=-5GiB``.

    argparse reads an argument that starts with ``-`` as an option unless it is
    a plain negative number (``-5``), so ``--memory-budget -5GiB`` would end in
    "expected one argument"; joined, the value reaches
    :func:`memory_budget_option`, which says what is wrong with it.

    >>> join_negative_values(["report", "--memory-budget", "-5GiB", "--out", "r"])
    ['report', '--memory-budget=-5GiB', '--out', 'r']
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in _SIZE_OPTIONS and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out
