"""Short, one-line texts for the terminal: messages, exception summaries, tables.

Everything the command line prints goes through :func:`echo`, which applies
the terminal's one escaping rule (:func:`terminal_safe`, which is
:func:`execwrap.util.text.printable`): names read from a
model or a saved file may hold escape sequences or control characters, and
they are shown escaped, never sent to the terminal.

>>> shorten("a\\n  b " + "c" * 200, 12)
'a b ccccc...'
>>> article("int"), article("Linear")
('an int', 'a Linear')
>>> terminal_safe("blocks.0\\x1b[2J\\u202e")
'blocks.0\\\\x1b[2J\\\\u202e'
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import IO, Any

from execwrap.util.text import printable as terminal_safe

__all__ = [
    "article",
    "echo",
    "exc_line",
    "one_line",
    "print_table",
    "shorten",
    "terminal_safe",
]

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def echo(text: str = "", *, file: IO[str] | None = None) -> None:
    """Print one line of ``text`` with :func:`terminal_safe` applied, to
    ``file`` (default ``sys.stdout``). Characters the stream's encoding cannot
    write are written as backslash escapes instead of raising."""
    stream = file if file is not None else sys.stdout
    line = terminal_safe(text)
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        line = line.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # a stream that names no codec Python knows
        line = line.encode("ascii", "backslashreplace").decode("ascii")
    print(line, file=stream)


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
        echo(f"  {key:<{width}}  {value}")
