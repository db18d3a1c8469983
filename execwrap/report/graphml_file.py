"""``order.graphml``: the order graph with typed attributes.

The graph of :func:`execwrap.order.graph.build_order_graph`, with attributes GraphML
can type (``long`` / ``double`` / ``boolean`` / ``string``), readable by
``networkx.read_graphml``, Gephi and yEd. With a plan, module and parameter
nodes carry ``unit``: the index in ``plan.units`` of the unit managing them,
``-1`` for none (the graph's convention for "not recorded").

One escaping rule, applied by :func:`graphml_safe` to every node id and every
text value (:func:`graphml_escape`): XML 1.0 cannot carry most control
characters (a name with ``\\x0b`` would make the file unreadable), and XML
parsers turn a carriage return into a newline. So each character a parser
would reject or change (U+0000 to U+001F except tab and newline, lone
surrogates, U+FFFE, U+FFFF) is written as ``\\xHH`` / ``\\uHHHH``, and a
backslash as ``\\\\``; every other character is written as it is.
:func:`graphml_unescape` gives the exact name back::

    g = networkx.read_graphml("order.graphml")
    names = {graphml_unescape(n) for n in g}  # the model's FQNs
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING, Any

import networkx as nx

from execwrap.order.graph import build_order_graph

if TYPE_CHECKING:
    from execwrap.report.context import ReportContext

__all__ = ["graphml_escape", "graphml_safe", "graphml_unescape", "order_graph", "write_graphml"]

# What an XML 1.0 parser rejects or rewrites (Char production, and CR -> LF
# line-end normalisation: https://www.w3.org/TR/xml/#charsets, #sec-line-ends),
# and the backslash that starts an escape.
_UNSAFE = re.compile("[\\\\\x00-\x08\x0b-\x1f\ud800-\udfff\ufffe\uffff]")
_ESCAPE = re.compile(r"\\(\\|x[0-9a-f]{2}|u[0-9a-f]{4})")


def graphml_escape(text: str) -> str:
    """``text`` as :mod:`~execwrap.report.graphml_file` writes it (see the rule there).

    >>> graphml_escape("a\\x0bb\\\\c"), graphml_escape("blocks.0")
    ('a\\\\x0bb\\\\\\\\c', 'blocks.0')
    """
    return _UNSAFE.sub(_escape_char, text)


def _escape_char(match: re.Match[str]) -> str:
    c = match.group()
    if c == "\\":
        return "\\\\"
    code = ord(c)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def graphml_unescape(text: str) -> str:
    """The exact text :func:`graphml_escape` was given: ``graphml_unescape(graphml_escape(s)) == s``.

    >>> graphml_unescape("a\\\\x0bb")
    'a\\x0bb'
    """
    return _ESCAPE.sub(_unescape_match, text)


def _unescape_match(match: re.Match[str]) -> str:
    body = match.group(1)
    return "\\" if body == "\\" else chr(int(body[1:], 16))


def write_graphml(ctx: ReportContext, f: IO[bytes]) -> None:
    """Write :func:`order_graph` to ``f`` as pretty-printed UTF-8 GraphML."""
    nx.write_graphml(order_graph(ctx), f, encoding="utf-8", prettyprint=True)


def order_graph(ctx: ReportContext) -> Any:
    """The report's order graph, GraphML-safe, with ``unit`` attributes."""
    graph = build_order_graph(ctx.order)
    graph.graph["model_class"] = ctx.model_class
    graph.graph["method"] = ctx.order.method
    if ctx.plan is not None:
        for node, data in graph.nodes(data=True):
            if data.get("kind") == "module":
                unit = ctx.unit_of(str(node))
            elif data.get("kind") == "param":
                unit = ctx.param_unit.get(str(node))
            else:
                continue
            data["unit"] = -1 if unit is None else unit
    return graphml_safe(graph)


def graphml_safe(graph: Any) -> Any:
    """Copy ``graph`` with attributes GraphML can type: one type per key.

    ``None`` values are dropped, sequences become ``";"``-joined strings, and a
    key that holds several types is unified (int+float -> float, else str).
    Node ids and text values go through :func:`graphml_escape`.
    """
    out = type(graph)()
    out.graph.update({k: _scalar(v) for k, v in graph.graph.items() if v is not None})
    for n, data in graph.nodes(data=True):
        out.add_node(_node_id(n), **{k: _scalar(v) for k, v in data.items() if v is not None})
    for u, v, data in graph.edges(data=True):
        attrs = {k: _scalar(x) for k, x in data.items() if x is not None}
        out.add_edge(_node_id(u), _node_id(v), **attrs)
    _unify(d for _, d in out.nodes(data=True))
    _unify(d for _, _, d in out.edges(data=True))
    return out


def _node_id(n: Any) -> Any:
    return graphml_escape(n) if isinstance(n, str) else n


def _scalar(v: Any) -> Any:
    if isinstance(v, str):
        return graphml_escape(v)
    if isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        return graphml_escape(";".join(str(x) for x in v))
    return graphml_escape(str(v))


def _unify(items: Iterable[dict[str, Any]]) -> None:
    """Give each key one type across ``items`` (int+float -> float, else str)."""
    items = list(items)
    types: dict[str, set[type]] = {}
    for d in items:
        for k, v in d.items():
            types.setdefault(k, set()).add(type(v))
    for k, ts in types.items():
        if len(ts) < 2:
            continue
        target: Callable[[Any], Any] = float if ts <= {int, float} else str
        for d in items:
            if k in d:
                d[k] = target(d[k])
