"""Short, one-line texts for the terminal: messages, exception summaries, tables.

>>> shorten("a\\n  b " + "c" * 200, 12)
'a b cccc...'
>>> article("int"), article("Linear")
('an int', 'a Linear')
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["article", "exc_line", "one_line", "print_table", "shorten"]

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(value: Any) -> str:
    """``str(value)`` with every run of whitespace (newlines too) as one space."""
    return " ".join(str(value).split())


def shorten(value: Any, limit: int = 160) -> str:
    """:func:`one_line`, cut to ``limit`` characters with ``"..."``."""
    text = one_line(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def exc_line(exc: BaseException, limit: int = 120) -> str:
    """``"TypeName: first line of the message"``, shortened to ``limit`` characters
    (terminal colour codes removed)."""
    lines = _ANSI_RE.sub("", str(exc)).strip().splitlines()
    first = lines[0].strip() if lines else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return shorten(text, limit)


def article(word: str) -> str:
    """``"int"`` -> ``"an int"``, ``"dict"`` -> ``"a dict"`` (for type names)."""
    vowel = word[:1].lower() in "aeiou" and not word.lower().startswith(("uni", "use", "usu"))
    return f"{'an' if vowel else 'a'} {word}"


def print_table(rows: Sequence[tuple[str, str]]) -> None:
    """Print ``key  value`` rows, indented two spaces, keys in one column."""
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"  {key:<{width}}  {value}")
