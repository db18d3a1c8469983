"""Small sentence helpers for the plan's notes and messages.

Counts (``3 parameters``), lists of FQNs (``'a', 'b' and 'c'``; long lists cut
as ``'a', 'b', ... (5 more)``) and phrases (``modules 'a' and 'b'``). FQNs are
written with :func:`tracing.fqn.quoted`: in quotes, the root as ``<root>``.

>>> fqn_and_list(["", "blocks.0", "head"])
"<root>, 'blocks.0' and 'head'"
>>> listed(["x", "y", "z"], limit=2)
'x, y, ... (1 more)'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tracing.fqn import quoted

__all__ = [
    "fqn_and_list",
    "fqn_list",
    "listed",
    "modules_named",
    "param_count",
    "plural",
    "printable",
]


def plural(n: int, word: str = "parameter") -> str:
    """``1 parameter``, ``2 parameters`` (``word`` with an ``s`` unless ``n == 1``)."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def param_count(params: Sequence[str], numel: Mapping[str, int]) -> str:
    """``3 parameters, 120 elements``: how many ``params`` and their total numel."""
    return f"{plural(len(params))}, {sum(numel[p] for p in params)} elements"


def listed(items: Sequence[str], limit: int = 8) -> str:
    """``items`` joined by commas; past ``limit``, cut as ``a, b, ... (5 more)``."""
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def fqn_list(fqns: Iterable[str], limit: int = 8) -> str:
    """Quoted FQNs joined by commas (:func:`listed`): ``'a', <root>, ... (2 more)``."""
    return listed([quoted(f) for f in fqns], limit)


def fqn_and_list(fqns: Iterable[str], limit: int = 8) -> str:
    """``'a'``, ``'a' and 'b'``, ``'a', 'b' and 'c'``; past ``limit``,
    ``'a', ..., 'h' and 3 more``."""
    items = [quoted(f) for f in fqns]
    if len(items) > limit:
        return ", ".join(items[:limit]) + f" and {len(items) - limit} more"
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def modules_named(fqns: Sequence[str]) -> str:
    """``module 'a'`` / ``modules 'a' and 'b'``."""
    return f"module{'s' if len(fqns) != 1 else ''} {fqn_and_list(fqns)}"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on written as its
    Python escape: each character that ``str.isprintable`` rejects, except the
    space (C0 and C1 controls such as ESC ``\\x1b``, CR, BEL and DEL; Unicode
    format characters such as the bidirectional overrides ``\\u202e``; line and
    paragraph separators; lone surrogates; non-space blanks such as
    ``\\xa0``) becomes ``\\xHH``, ``\\uHHHH`` or ``\\UHHHHHHHH``.

    Printable text, backslashes included, is left as it is, so the rule can be
    applied twice without harm (what it writes is printable). It is the rule
    for text people read on a screen: the command line's output and the
    report's chart labels; ``report.json`` keeps the exact names.

    >>> printable("blocks.0\\x1b[2J\\u202e")
    'blocks.0\\\\x1b[2J\\\\u202e'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
