"""A cluster's topology, and NCCL's time for a collective over any process group of it.

A :class:`Topology` is nodes of ``gpus_per_node`` GPUs, joined inside a node by
NVLink/NVSwitch (``intra_node_bytes_per_s``, NCCL's bus bandwidth per GPU) and
between nodes by an InfiniBand or RoCE network (``inter_node_bytes_per_s``,
one NIC per GPU). A process group is priced by the links it spans
(:meth:`Topology.span`: how many nodes hold its ranks, for the group of
``size`` ranks ``stride`` apart that holds rank 0, ranks numbered node by
node), with NCCL's own tuning model as torch's inductor reproduces it
(``torch/_inductor/comm_analysis.py``, ``_nccl_algo_time``, adapted from
``nccl/src/graph/tuning.cc``, ``ncclTunerConstantsDefaults``):

* each protocol (LL, LL128, Simple) of each algorithm is a line ``time =
  latency + nbytes / algorithm_bandwidth``;
* ring: ``p - 1`` steps for an all-gather or a reduce-scatter, ``2 (p - 1)`` for an
  all-reduce, of which ``nodes - 1`` (all-reduce: ``2 (nodes - 1)``) cross the
  network: ``latency = baseLat + (steps - inter_steps) * intraLat + inter_steps *
  interLat`` (intraLat at least the network overhead, 1 us, 3 us for Simple, once
  the group spans nodes); ``algorithm_bandwidth = bus_bandwidth * p / steps``;
* tree (all-reduce only): ``latency = baseLat + 2 ((p / nodes - 1) intraLat +
  log2(nodes) interLat)``, half the bus bandwidth, NCCL's correction factor for
  medium sizes;
* the bus bandwidth is NVLink's inside one node and the NIC's across nodes, times
  comm_analysis's NIC efficiency ``0.77 + 0.23 min(1, (nodes - 1) / 7)`` (its
  multi-rail factor for more than two nodes is left out); each protocol caps it
  (LL: half of it and ``llMaxBws``; LL128: 120/128 of it and the per-channel cap,
  off across nodes).

The collective's curve is the best (algorithm, protocol) at each size.
Where this departs from comm_analysis: a group's nodes are counted from its
ranks (comm_analysis assumes ``ceil(size / gpus_per_node)``, which is wrong
for a strided group such as HSDP's replicate group: 16 ranks 8 apart span 16
nodes, not 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from execwrap.cost.curve import CollectiveCurve, CurveSegment

__all__ = [
    "COLLECTIVES",
    "FAMILIES",
    "NETWORKS",
    "Collective",
    "Topology",
    "nccl_curve",
]

Collective = Literal["all_gather", "reduce_scatter", "all_reduce"]
#: The collectives a topology prices.
COLLECTIVES: tuple[str, ...] = ("all_gather", "reduce_scatter", "all_reduce")
#: Inter-node networks a topology names (NCCL's model prices both alike: comm_analysis's
#: ``IB_NDR`` is "400 Gbps InfiniBand / RoCE").
NETWORKS: tuple[str, ...] = ("infiniband", "roce")

# --- NCCL tuning constants, from torch/_inductor/comm_analysis.py (torch 2.13), which copies
# --- nccl/src/graph/tuning.cc (ncclTunerConstantsDefaults). Microseconds; [LL, LL128, Simple].
#: baseLat[Tree], baseLat[Ring]
_BASE_LAT_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
#: hwLat[NVLINK][Tree / Ring]
_HW_LAT_NVLINK_US = {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)}
#: hwLat[NET][Tree / Ring]
_HW_LAT_NET_US = {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)}
#: The GPU families of NCCL's tables (compCapIndex 1, 2, 3 of comm_analysis).
FAMILIES: tuple[str, ...] = ("ampere", "hopper", "blackwell")
#: llMaxBws[compCapIndex][1 node, 2 nodes, more] (GB/s); across nodes comm_analysis reads
#: row 0 (Volta): [39.0, 39.0, 20.4].
_LL_MAX_BW_GBPS = {
    "ampere": (87.7, 22.5, 19.0),
    "hopper": (141.0, 45.0, 35.0),
    "blackwell": (282.0, 90.0, 70.0),
    "volta": (39.0, 39.0, 20.4),
}
#: perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws [1 node, 2 nodes, more] (GB/s).
_RING_LL128_GBPS = {
    "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 36.7),
    "blackwell": (40.0, 40.0, 40.0),
}
_TREE_LL128_GBPS = {
    "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 29.0),
    "blackwell": (55.6, 31.67, 20.0),
}
_TREE_GBPS = {
    "ampere": (24.0, 23.6, 17.8),
    "hopper": (38.7, 41.4, 36.0),
    "blackwell": (70.0, 42.8, 24.0),
}
#: treeCorrectionFactor[LL, LL128, Simple][log2(nbytes / 64)], for 64 B .. 256 MiB.
_TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5)
    + (0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6)
    + (0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0, 1.0),
    (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5)
    + (0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9, 0.9),
)
#: comm_analysis's _GPU_NCHANNELS: NCCL channels (one SM each) per collective.
NCHANNELS = {"ampere": 8, "hopper": 16, "blackwell": 32}


@dataclass(frozen=True)
class Topology:
    """Nodes of GPUs, the link inside a node and the network between nodes.

    Attributes:
        gpus_per_node: GPUs (ranks) per node; ranks are numbered node by node.
        family: the GPU family of NCCL's tables (:data:`FAMILIES`).
        intra_node_bytes_per_s: NVLink/NVSwitch bus bandwidth per GPU, bytes/s.
        inter_node_bytes_per_s: the network's bandwidth per GPU (one NIC per
            GPU), bytes/s; ``None`` for a single node (no network).
        network: ``"infiniband"`` or ``"roce"`` (:data:`NETWORKS`; ``""``: none).
        source: where the figures come from.

    Example:
        >>> t = Topology(8, "hopper", 370e9, 50e9, "infiniband")
        >>> t.span(16, 1), t.span(16, 8)
        ((2, 8), (16, 1))
        >>> round(t.curve("all_gather", 8).time(2**30) * 1e3, 3)
        2.571
    """

    gpus_per_node: int
    family: str
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float | None = None
    network: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ValueError(
                f"Topology.gpus_per_node must be an int >= 1, got {self.gpus_per_node!r}"
            )
        if self.family not in FAMILIES:
            raise ValueError(
                f"Topology.family must be one of {list(FAMILIES)} (NCCL's tables), got "
                f"{self.family!r}"
            )
        for name in ("intra_node_bytes_per_s", "inter_node_bytes_per_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"Topology.{name} must be a finite number > 0, got {value!r}")
        if self.inter_node_bytes_per_s is not None and self.network not in NETWORKS:
            raise ValueError(
                f"Topology.network must be one of {list(NETWORKS)} with an inter-node "
                f"bandwidth, got {self.network!r}"
            )

    # ---------------------------------------------------------------- spans
    def span(self, size: int, stride: int = 1) -> tuple[int, int]:
        """``(nodes, most ranks on one node)`` of the group of ``size`` ranks ``stride``
        apart that holds rank 0 (ranks ``0, stride, ..., (size - 1) * stride``).

        >>> Topology(8, "hopper", 370e9, 50e9, "roce").span(4, 2)
        (1, 4)
        """
        per_node: dict[int, int] = {}
        for k in range(size):
            node = k * stride // self.gpus_per_node
            per_node[node] = per_node.get(node, 0) + 1
        return len(per_node), max(per_node.values(), default=0)

    def crosses_nodes(self, size: int, stride: int = 1) -> bool:
        """Whether that group spans more than one node (its collectives use the network)."""
        return self.span(size, stride)[0] > 1

    # ---------------------------------------------------------------- times
    def curve(self, collective: Collective, size: int, stride: int = 1) -> CollectiveCurve:
        """Seconds of ``collective`` over that group by buffer bytes (the whole buffer:
        an all-gather's output, a reduce-scatter's input, an all-reduce's tensor).

        Raises:
            ValueError: an unknown collective, or a group spanning nodes on a
                topology without a network.
        """
        if collective not in COLLECTIVES:
            raise ValueError(
                f"Topology.curve: collective must be one of {list(COLLECTIVES)}, got {collective!r}"
            )
        nodes, _ = self.span(size, stride)
        if nodes > 1 and self.inter_node_bytes_per_s is None:
            raise ValueError(
                f"Topology.curve: a group of {size} ranks {stride} apart spans {nodes} nodes of "
                f"{self.gpus_per_node}, but this topology has no inter-node network (one node): "
                "use a preset for several nodes (e.g. 'h100-ib-400g')"
            )
        return nccl_curve(collective, size, nodes, self)

    # ---------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "gpus_per_node": self.gpus_per_node,
            "family": self.family,
            "intra_node_bytes_per_s": self.intra_node_bytes_per_s,
            "inter_node_bytes_per_s": self.inter_node_bytes_per_s,
            "network": self.network,
            "source": self.source,
        }


def nccl_curve(collective: str, ranks: int, nodes: int, topology: Topology) -> CollectiveCurve:
    """The best (algorithm, protocol) time of ``collective`` over ``ranks`` ranks on
    ``nodes`` nodes (module docstring); all-gather and reduce-scatter as the lower
    envelope of the ring's lines, all-reduce (ring and tree, whose correction factor
    bends the lines) sampled at every power of two from 64 B to 1 TiB. One rank: free.
    """
    if ranks <= 1:
        return CollectiveCurve((CurveSegment(None, 0.0, 0.0),))
    lines = _lines(collective, "ring", ranks, nodes, topology)
    if collective != "all_reduce":
        return CollectiveCurve.lower_envelope([(lat, 1.0 / bw) for lat, bw, _ in lines])
    tree = _lines(collective, "tree", ranks, nodes, topology)
    sizes = [2**k for k in range(6, 41)]
    times = [
        min(
            [lat + n / bw for lat, bw, _ in lines]
            + [lat + n / (bw * _tree_factor(p, n)) for lat, bw, p in tree]
        )
        for n in sizes
    ]
    return CollectiveCurve.from_samples(sizes, times)


def _tree_factor(proto: int, nbytes: int) -> float:
    """NCCL's tree correction factor of protocol ``proto`` at ``nbytes`` (1 above 256 MiB)."""
    log_size = max(0, (nbytes >> 6).bit_length() - 1)
    return _TREE_CORRECTION[proto][log_size] if log_size < 24 else 1.0


def _lines(
    collective: str, algo: str, ranks: int, nodes: int, t: Topology
) -> list[tuple[float, float, int]]:
    """``(latency_s, algorithm bytes/s, protocol)`` of each enabled protocol of ``algo``."""
    family = t.family
    index2 = min(nodes - 1, 2)
    if nodes == 1:
        bw = t.intra_node_bytes_per_s / 1e9
    else:
        assert t.inter_node_bytes_per_s is not None
        bw = t.inter_node_bytes_per_s / 1e9 * (0.77 + 0.23 * min(1.0, (nodes - 1) / 7))
    ll_max = _LL_MAX_BW_GBPS[family if nodes == 1 else "volta"][index2]
    channels = NCHANNELS[family]
    all_reduce = collective == "all_reduce"
    steps = 2 * (ranks - 1) if all_reduce else ranks - 1
    inter_steps = 0 if nodes == 1 else (2 if all_reduce else 1) * (nodes - 1)
    out: list[tuple[float, float, int]] = []
    for proto in range(3):
        if proto == 1 and nodes > 1:
            continue  # comm_analysis: LL128 off across IB nodes
        if algo == "ring":
            bus = (
                min(ll_max, bw * 0.5),
                min(bw * 120.0 / 128.0, channels * _RING_LL128_GBPS[family][index2]),
                bw,
            )[proto]
            algo_bw = bus * ranks / steps
        else:
            factor = 7.0 / 9.0 if nodes == 1 else 120.0 / 128.0
            bus = (
                min(bw / 3.8, ll_max),
                min(bw * factor, channels * _TREE_LL128_GBPS[family][index2]),
                min(bw * 0.92, channels * _TREE_GBPS[family][index2]),
            )[proto]
            algo_bw = bus * 0.5
        intra = _HW_LAT_NVLINK_US[algo][proto]
        if nodes > 1:
            intra = max(intra, 3.0 if proto == 2 else 1.0)  # netOverhead
        inter = _HW_LAT_NET_US[algo][proto]
        base = _BASE_LAT_US[algo][proto]
        if algo == "ring":
            lat = base + (steps - inter_steps) * intra + inter_steps * inter
        else:
            lat = base + 2 * ((ranks // nodes - 1) * intra + (nodes.bit_length() - 1) * inter)
        out.append((lat * 1e-6, algo_bw * 1e9, proto))
    return out
