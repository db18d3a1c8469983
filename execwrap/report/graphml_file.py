"""``order.graphml``: the order graph with typed attributes.

The graph of :func:`execwrap.graph.build_order_graph`, with attributes GraphML
can type (``long`` / ``double`` / ``boolean`` / ``string``), readable by
``networkx.read_graphml``, Gephi and yEd. With a plan, module and parameter
nodes carry ``unit``: the index in ``plan.units`` of the unit managing them,
``-1`` for none (the graph's convention for "not recorded").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING, Any

import networkx as nx

from execwrap.graph import build_order_graph

if TYPE_CHECKING:
    from execwrap.report.context import ReportContext

__all__ = ["graphml_safe", "order_graph", "write_graphml"]


def write_graphml(ctx: ReportContext, f: IO[bytes]) -> None:
    """Write :func:`order_graph` to ``f`` as pretty-printed UTF-8 GraphML."""
    nx.write_graphml(order_graph(ctx), f, encoding="utf-8", prettyprint=True)


def order_graph(ctx: ReportContext) -> Any:
    """The report's order graph, GraphML-safe, with ``unit`` attributes."""
    graph = graphml_safe(build_order_graph(ctx.order))
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
    return graph


def graphml_safe(graph: Any) -> Any:
    """Copy ``graph`` with attributes GraphML can type: one type per key.

    ``None`` values are dropped, sequences become ``";"``-joined strings, and a
    key that holds several types is unified (int+float -> float, else str).
    """
    out = type(graph)()
    out.graph.update({k: _scalar(v) for k, v in graph.graph.items() if v is not None})
    for n, data in graph.nodes(data=True):
        out.add_node(n, **{k: _scalar(v) for k, v in data.items() if v is not None})
    for u, v, data in graph.edges(data=True):
        out.add_edge(u, v, **{k: _scalar(x) for k, x in data.items() if x is not None})
    _unify(d for _, d in out.nodes(data=True))
    _unify(d for _, _, d in out.edges(data=True))
    return out


def _scalar(v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple, set, frozenset)):
        return ";".join(str(x) for x in v)
    return str(v)


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
