"""Orders compared and drawn: divergence between two orders, drift over iterations, graphs.

These read :class:`tracing.ExecutionOrder` objects and nothing of FSDP or of plans:

* :mod:`~execwrap.order.divergence`: :func:`first_divergence`, the first call where two
  orders differ (used by the cross-rank check and ``execwrap diff``);
* :mod:`~execwrap.order.monitor`: :class:`OrderMonitor`, drift of later iterations;
* :mod:`~execwrap.order.graph`: :func:`build_order_graph`, the order as a networkx graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.order.divergence import Divergence, first_divergence
    from execwrap.order.graph import build_order_graph, order_subgraph
    from execwrap.order.monitor import DriftEvent, OrderMonitor

_EXPORTS: dict[str, str] = {
    "Divergence": "execwrap.order.divergence",
    "first_divergence": "execwrap.order.divergence",
    "build_order_graph": "execwrap.order.graph",
    "order_subgraph": "execwrap.order.graph",
    "DriftEvent": "execwrap.order.monitor",
    "OrderMonitor": "execwrap.order.monitor",
}

__all__ = [
    "Divergence",
    "DriftEvent",
    "OrderMonitor",
    "build_order_graph",
    "first_divergence",
    "order_subgraph",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
