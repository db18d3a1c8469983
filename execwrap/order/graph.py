"""The order graph: how modules follow one another, and where two orders part.

:func:`build_order_graph` turns one or more :class:`~tracing.ExecutionOrder`
objects (iterations, ranks) into a ``networkx.DiGraph``; :func:`order_subgraph`
keeps only the "runs next" edges of one phase. (Where two orders first differ
is :func:`execwrap.order.divergence.first_divergence`.)

Node keys are FQN strings, exactly as in the orders: module FQNs (the root is
``""``) and canonical parameter FQNs. ``nn.Module`` forbids a submodule and a
parameter of the same name, so the two never collide; the node attribute
``kind`` (``"module"`` / ``"param"``) tells them apart. All attributes are
``str``/``int``/``bool`` scalars, so ``networkx.write_graphml`` writes the graph
as is ("not recorded" is ``-1`` for indices and ``""`` for names).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Collection
from typing import Literal

import networkx as nx

from tracing.fqn import display, innermost, owner_fqn, parent_fqn
from tracing.order import ExecutionOrder

__all__ = [
    "Phase",
    "build_order_graph",
    "order_subgraph",
]

logger = logging.getLogger(__name__)

Phase = Literal["forward", "backward"]
_PHASES: tuple[str, ...] = ("forward", "backward")

#: Edge roles. One DiGraph edge per (u, v) pair carries every role it plays.
_NEXT = "next"
_CONTAINS = "contains"
_USES = "uses"


def _enclosing_module(fqn: str, modules: Collection[str]) -> str | None:
    """Nearest strict ancestor of module ``fqn`` that is a node; ``None`` for the
    root and when no ancestor (not even the root ``""``) is one."""
    parent = parent_fqn(fqn)
    if parent is None:
        return None
    found = innermost(parent, modules)
    return found if found in modules else None


def _edge_kind(data: dict[str, object]) -> str:
    roles = []
    if data.get("contains"):
        roles.append(_CONTAINS)
    if int(data.get("forward", 0)) or int(data.get("backward", 0)):  # type: ignore[call-overload]
        roles.append(_NEXT)
    if int(data.get("uses", 0)):  # type: ignore[call-overload]
        roles.append(_USES)
    return "+".join(roles)


def build_order_graph(*orders: ExecutionOrder) -> nx.DiGraph:
    """Build the order graph of one or more execution orders.

    Nodes:
        * one per module FQN (every module of ``module_classes`` plus every
          module called): ``kind="module"``, ``class_name`` (``""`` if
          unknown), ``own_numel`` (elements of the parameters the module owns
          directly, canonical names only), ``call_count`` (forward calls summed
          over all orders), ``backward_count``, ``first_call`` (smallest index
          of a first forward call over the orders, ``-1`` if never called),
          ``label`` (``"<root>"`` for ``""``).
        * one per canonical parameter FQN: ``kind="param"``, ``numel``
          (elements), ``bytes``, ``dtype``, ``requires_grad``, ``owner``
          (module FQN), ``aliases`` (other FQNs of a tied tensor, ``","``-joined),
          ``first_use`` (call index of its first forward use, ``-1`` if none).

    Edges (one per ordered pair; each carries every role it plays):
        * "runs next": ``forward`` / ``backward`` count how often module ``v``
          was called right after module ``u`` (forward from
          ``module_forward_order``, backward from ``module_backward_order``),
          summed over the orders;
        * containment: ``contains=True`` from a module to each child module and
          to each parameter it owns (under any of the parameter's names);
        * use: ``uses`` counts the forward uses of parameter ``v`` while module
          ``u`` ran (from ``param_uses``).

        ``kind`` lists the roles, ``"+"``-joined: ``"next"``, ``"contains"``,
        ``"uses"``, ``"contains+next"``, ...

    Given several orders, counts add up: a stable order whose modules run once
    is a single path in :func:`order_subgraph` with every count equal to the
    number of orders, and a divergence is a node with two successors.

    Args:
        *orders: one or more execution orders (of the same model).

    Returns:
        The graph; ``graph.graph`` holds ``num_orders`` and ``methods``.

    Raises:
        ValueError: no order given.
        TypeError: an argument is not an :class:`~tracing.ExecutionOrder`.

    Example:
        >>> a = ExecutionOrder(module_forward_order=["", "l0", "l2", "l1"])
        >>> g = order_subgraph(build_order_graph(a, a))
        >>> [(u, v, d["forward"]) for u, v, d in g.edges(data=True)]
        [('', 'l0', 2), ('l0', 'l2', 2), ('l2', 'l1', 2)]
    """
    _check_orders(orders)
    graph = nx.DiGraph(
        num_orders=len(orders),
        methods=",".join(o.method for o in orders),
    )
    module_fqns = _add_module_nodes(graph, orders)
    for fqn in module_fqns:
        parent = _enclosing_module(fqn, module_fqns)
        if parent is not None:
            _add_role(graph, parent, fqn, contains=True)
    _add_param_nodes(graph, orders, module_fqns)
    _add_next_and_uses(graph, orders)
    for _, _, data in graph.edges(data=True):
        data["kind"] = _edge_kind(data)
    logger.debug(
        "order graph: %d nodes, %d edges from %d order(s)",
        graph.number_of_nodes(),
        graph.number_of_edges(),
        len(orders),
    )
    return graph


def _check_orders(orders: tuple[ExecutionOrder, ...]) -> None:
    if not orders:
        raise ValueError("build_order_graph needs at least one ExecutionOrder")
    for i, order in enumerate(orders):
        if not isinstance(order, ExecutionOrder):
            raise TypeError(
                f"build_order_graph: argument {i} is a {type(order).__name__}, expected an "
                "ExecutionOrder (capture one with tracing.capture_execution_order)"
            )


def _add_module_nodes(graph: nx.DiGraph, orders: tuple[ExecutionOrder, ...]) -> dict[str, None]:
    """Add a node per module (in definition order first, then as first called)
    with its call counts; returns the module FQNs (an ordered set)."""
    module_fqns: dict[str, None] = {}
    for order in orders:
        for fqn in order.module_classes:
            module_fqns.setdefault(fqn, None)
    for order in orders:
        for fqn in (*order.module_forward_order, *order.module_backward_order):
            module_fqns.setdefault(fqn, None)
        for use in order.param_uses:
            module_fqns.setdefault(use.module_fqn, None)
    class_names: dict[str, str] = {}
    for order in orders:
        for fqn, cls in order.module_classes.items():
            class_names.setdefault(fqn, cls)
    for fqn in module_fqns:
        graph.add_node(
            fqn,
            kind="module",
            label=display(fqn),
            class_name=class_names.get(fqn, ""),
            own_numel=0,
            call_count=0,
            backward_count=0,
            first_call=-1,
        )
    for order in orders:
        for i, fqn in enumerate(order.module_forward_order):
            data = graph.nodes[fqn]
            data["call_count"] += 1
            if data["first_call"] == -1 or i < data["first_call"]:
                data["first_call"] = i
        for fqn in order.module_backward_order:
            graph.nodes[fqn]["backward_count"] += 1
    return module_fqns


def _add_param_nodes(
    graph: nx.DiGraph, orders: tuple[ExecutionOrder, ...], module_fqns: dict[str, None]
) -> None:
    """Add a node per canonical parameter (the first order that knows it
    describes it) and the containment edges from its modules."""
    for order in orders:
        first_use = order.param_first_use_index()
        for fqn, info in order.params.items():
            if fqn in graph:
                continue
            owner = owner_fqn(fqn)
            aliases = order.shared_params.get(fqn, [])
            graph.add_node(
                fqn,
                kind="param",
                label=fqn,
                numel=info.numel,
                bytes=info.bytes,
                dtype=info.dtype,
                requires_grad=info.requires_grad,
                owner=owner,
                aliases=",".join(aliases),
                first_use=first_use.get(fqn, -1),
            )
            if owner in graph and graph.nodes[owner].get("kind") == "module":
                graph.nodes[owner]["own_numel"] += info.numel
            for name in (fqn, *aliases):
                holder = owner_fqn(name)
                if holder not in module_fqns:
                    holder = _enclosing_module(holder, module_fqns) or ""
                if holder in graph:
                    _add_role(graph, holder, fqn, contains=True)


def _add_next_and_uses(graph: nx.DiGraph, orders: tuple[ExecutionOrder, ...]) -> None:
    """Add the "runs next" edges of both phases and the parameter-use edges
    (a parameter seen only in ``param_uses`` gets a node with zero sizes)."""
    for order in orders:
        for phase, calls in (
            ("forward", order.module_forward_order),
            ("backward", order.module_backward_order),
        ):
            for u, v in itertools.pairwise(calls):
                _add_role(
                    graph, u, v, forward=int(phase == "forward"), backward=int(phase == "backward")
                )
        for use in order.param_uses:
            for fqn in use.param_fqns:
                if fqn not in graph:
                    graph.add_node(
                        fqn,
                        kind="param",
                        label=fqn,
                        numel=0,
                        bytes=0,
                        dtype="",
                        requires_grad=True,
                        owner=owner_fqn(fqn),
                        aliases="",
                        first_use=use.call_index,
                    )
                _add_role(graph, use.module_fqn, fqn, uses=1)


def _add_role(
    graph: nx.DiGraph,
    u: str,
    v: str,
    *,
    contains: bool = False,
    forward: int = 0,
    backward: int = 0,
    uses: int = 0,
) -> None:
    if not graph.has_edge(u, v):
        graph.add_edge(u, v, kind="", contains=False, forward=0, backward=0, uses=0)
    data = graph.edges[u, v]
    data["contains"] = bool(data["contains"] or contains)
    data["forward"] += forward
    data["backward"] += backward
    data["uses"] += uses


def order_subgraph(graph: nx.DiGraph, phase: Phase = "forward") -> nx.DiGraph:
    """The "runs next" edges of one phase, as a new graph over module nodes.

    Args:
        graph: a graph from :func:`build_order_graph`.
        phase: ``"forward"`` or ``"backward"``.

    Returns:
        A ``DiGraph`` with the module nodes that take part in ``phase`` and one
        edge per "runs next" pair whose ``phase`` count is positive; the edge
        attribute ``phase`` (e.g. ``"forward"``) holds the count.

    Raises:
        ValueError: ``phase`` is not ``"forward"`` or ``"backward"``.
    """
    if phase not in _PHASES:
        raise ValueError(f"order_subgraph: phase must be one of {_PHASES}, got {phase!r}")
    out = nx.DiGraph(phase=phase)
    for u, v, data in graph.edges(data=True):
        count = int(data.get(phase, 0))
        if count > 0:
            out.add_node(u, **graph.nodes[u])
            out.add_node(v, **graph.nodes[v])
            out.add_edge(u, v, **{phase: count})
    return out
