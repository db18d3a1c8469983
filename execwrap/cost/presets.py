"""Cost-model presets for common GPU clusters, each constant with its public source.

Collective curves follow NCCL's own tuning model as torch's inductor
reproduces it (``torch/_inductor/comm_analysis.py``, adapted from
``nccl/src/graph/tuning.cc``, ``ncclTunerConstantsDefaults``): for a ring
all-gather or reduce-scatter over ``W`` ranks, each protocol (LL, LL128,
Simple) is a line ``time = latency + nbytes / algorithm_bandwidth`` with

* ``latency = baseLat[ring][proto] + (W - 1 - inter_steps) * intraLat +
  inter_steps * interLat`` (``inter_steps = nodes - 1``), where intraLat is at
  least the network overhead (1 us, 3 us for Simple) on several nodes;
* ``algorithm_bandwidth = bus_bandwidth * W / (W - 1)`` (NCCL's ring
  bus-bandwidth convention: ``nbytes`` is the whole buffer), the bus bandwidth
  capped per protocol (LL: half the link and ``llMaxBws``; LL128: 120/128 of
  it; LL128 is off across InfiniBand nodes);

and the curve is the best protocol at each size (the lower envelope). Each
preset names its GPU model (:mod:`execwrap.cost.gpus`: peak rates per dtype,
memory bandwidth, host link, from datasheets); ``gpu=`` puts another GPU
model in the same cluster (its family's NVLink bandwidth and NCCL constants
replace the preset's: A100 nodes on the InfiniBand preset's fabric, say). These are estimates: measure your
own cluster with ``execwrap calibrate``.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any

from execwrap.cost.curve import CollectiveCurve
from execwrap.cost.gpus import GPUS, MEMORY_EFFICIENCY, gpu_compute_rates
from execwrap.cost.host_link import HostLink

__all__ = ["PRESETS", "Preset", "preset_fields"]

# --- NCCL tuning constants, from torch/_inductor/comm_analysis.py (torch 2.13), which copies
# --- nccl/src/graph/tuning.cc (ncclTunerConstantsDefaults). Microseconds.
#: baseLat[Ring][LL, LL128, Simple]
_BASE_LAT_RING_US = (6.6, 14.0, 8.4)
#: hwLat[NVLINK][Ring][LL, LL128, Simple]
_HW_LAT_NVLINK_RING_US = (0.6, 1.9, 3.4)
#: hwLat[NET][Ring][LL, LL128, Simple]
_HW_LAT_NET_RING_US = (2.7, 4.0, 14.0)
#: llMaxBws[Hopper][1 node] / llMaxBws[Ampere][1 node] (GB/s); across nodes comm_analysis reads
#: row 0 (llMaxBws[0] = [39.0, 39.0, 20.4]): 39.0 for 2 nodes, 20.4 for more.
_LL_MAX_BW_GBPS = {"hopper": 141.0, "ampere": 87.7, "2-nodes": 39.0, "more-nodes": 20.4}
#: perChMaxRingLL128Bws per channel (GB/s) x _GPU_NCHANNELS (Hopper 16, Ampere 8 channels).
_LL128_CAP_GBPS = {"hopper": 16 * 36.7, "ampere": 8 * 20.0}

# --- Link bandwidths per GPU (GB/s), from comm_analysis.py's _GPU_NVLINK_BW and
# --- _GPU_INTER_NODE_BW (NVIDIA's NVLink figures, nccl/src/graph/topo.h; NDR 400 Gb/s = 50 GB/s
# --- per NIC with one NIC per GPU, as on DGX H100).
_NVLINK_BW_GBPS = {"hopper": 370.0, "ampere": 240.0}
_IB_NDR_BW_GBPS = 50.0

#: Streaming multiprocessors (H100 SXM5: 132; A100: 108; NVIDIA architecture whitepapers).
_SMS = {"hopper": 132, "ampere": 108}
#: NCCL channels (one SM each) per collective: comm_analysis.py's _GPU_NCHANNELS.
_NCHANNELS = {"hopper": 16, "ampere": 8}
#: Assumed, not sourced: FSDP2's GPU-side fixed cost per group per collective (the copy-in and
#: copy-out kernels and events, a few kernel launches of ~5 us each); measure with calibrate.
_GROUP_OVERHEAD_S = 10e-6
#: Assumed, not sourced: the fraction of a PCIe link's bandwidth a pinned copy achieves, and
#: of the host's DRAM bandwidth a CPU optimizer step achieves (the compute's 75%).
_HOST_EFFICIENCY = 0.75


@dataclass(frozen=True)
class Preset:
    """One named cluster.

    Attributes:
        name: the preset's name.
        gpu: ``"hopper"`` or ``"ampere"`` (the tables' row).
        gpus_per_node: GPUs per node (8).
        default_world_size: the world size used when none is given.
        inter_node: whether ranks span nodes over InfiniBand.
        description: one line for ``--help`` and reports.
        device: the GPU model (a key of :data:`execwrap.cost.gpus.GPUS`).
    """

    name: str
    gpu: str
    gpus_per_node: int
    default_world_size: int
    inter_node: bool
    description: str
    device: str = "h100-sxm5-80gb"


#: Preset name -> :class:`Preset`.
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("h100-nvlink-8", "hopper", 8, 8, False, "8x H100 SXM in one node, NVLink/NVSwitch"),
        Preset(
            "h100-ib-400g", "hopper", 8, 16, True, "H100 nodes of 8 over 400 Gb/s NDR InfiniBand"
        ),
        Preset(
            "a100-nvlink-8",
            "ampere",
            8,
            8,
            False,
            "8x A100 SXM 80GB in one node, NVLink",
            "a100-sxm4-80gb",
        ),
    )
}


def preset_fields(
    name: str, world_size: int | None = None, gpu: str | None = None
) -> dict[str, Any]:
    """Constructor arguments of :class:`~execwrap.cost.CostModel` for a preset.

    Args:
        name: a key of :data:`PRESETS`.
        world_size: ranks, an int or a NumPy integer (default: the
            preset's); within one node for the NVLink presets, several whole
            nodes for the InfiniBand ones.
        gpu: the GPU model (default: the preset's; :data:`execwrap.cost.gpus.GPUS`).

    Raises:
        ValueError: unknown name (the message lists the presets), a world
            size the preset does not describe, or an unknown GPU model.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown cost-model preset {name!r}; choose one of {sorted(PRESETS)}")
    p = PRESETS[name]
    w = p.default_world_size if world_size is None else world_size
    if isinstance(w, numbers.Integral) and not isinstance(w, bool):
        w = int(w)  # a NumPy integer is stored (and saved) as an int
    if not isinstance(w, int) or isinstance(w, bool) or w < 2:
        raise ValueError(f"preset {name!r}: world_size must be an int >= 2, got {world_size!r}")
    if not p.inter_node and w > p.gpus_per_node:
        raise ValueError(
            f"preset {name!r} describes one node of {p.gpus_per_node} GPUs; world_size {w} spans "
            "nodes: use an InfiniBand preset (e.g. 'h100-ib-400g') or calibrate"
        )
    if p.inter_node and (w % p.gpus_per_node or w < 2 * p.gpus_per_node):
        raise ValueError(
            f"preset {name!r} describes whole nodes of {p.gpus_per_node} GPUs; world_size must be "
            f"a multiple of {p.gpus_per_node} and >= {2 * p.gpus_per_node}, got {w}"
        )
    device = _device(p, gpu)
    family = GPUS[device].family
    curve = _ring_curve(dataclasses.replace(p, gpu=family), w)
    hbm = GPUS[device].memory_bytes_per_s
    overlap = 1.0 - _NCHANNELS[family] / _SMS[family]
    return {
        "device_type": "cuda",
        "backend": "nccl",
        "world_size": w,
        "all_gather": curve,
        "reduce_scatter": curve,
        # a copy reads and writes each byte: half the memory traffic rate
        "copy_bytes_per_s": MEMORY_EFFICIENCY * hbm / 2,
        "group_overhead_s": _GROUP_OVERHEAD_S,
        "overlap": overlap,
        "compute": gpu_compute_rates(device),
        "optimizer_param_overhead_s": 0.0,
        "host": _host_link(device),
        "device_memory_bytes": GPUS[device].memory_bytes,
        "source": f"preset {name}: {p.description}"
        + ("" if device == p.device else f", GPU {device}")
        + " (NCCL tuning tables via torch/_inductor/comm_analysis.py; NVIDIA datasheets)",
    }


def _device(p: Preset, gpu: str | None) -> str:
    """The preset's GPU model, or ``gpu`` (a key of :data:`GPUS`)."""
    if gpu is None:
        return p.device
    if gpu not in GPUS:
        raise ValueError(
            f"preset {p.name!r}: unknown GPU model {gpu!r}; choose one of {sorted(GPUS)}"
        )
    return gpu


def _host_link(device: str) -> HostLink:
    """The GPU's PCIe link and its host's CPU optimizer rate (see :mod:`execwrap.cost.gpus`)."""
    g = GPUS[device]
    return HostLink(
        _HOST_EFFICIENCY * g.pcie_bytes_per_s,
        _HOST_EFFICIENCY * g.pcie_bytes_per_s,
        _HOST_EFFICIENCY * g.host_memory_bytes_per_s,
        source=f"{device}: PCIe per direction and host DRAM per GPU at 75% (assumed)",
    )


def _ring_curve(p: Preset, world_size: int) -> CollectiveCurve:
    """The lower envelope of the ring LL / LL128 / Simple lines (see the module docstring)."""
    nodes = -(-world_size // p.gpus_per_node)
    steps = world_size - 1
    inter_steps = nodes - 1
    if p.inter_node:
        # comm_analysis: IB uses the inter-node bandwidth, scaled by NIC efficiency
        # 0.77 + 0.23 * min(1, (nodes - 1) / 7) (its multi-rail factor for > 2 nodes is left out).
        bw = _IB_NDR_BW_GBPS * (0.77 + 0.23 * min(1.0, (nodes - 1) / 7))
        ll_max = _LL_MAX_BW_GBPS["2-nodes" if nodes == 2 else "more-nodes"]
    else:
        bw = _NVLINK_BW_GBPS[p.gpu]
        ll_max = _LL_MAX_BW_GBPS[p.gpu]
    protos = {
        "LL": min(ll_max, bw * 0.5),
        "LL128": min(bw * 120.0 / 128.0, _LL128_CAP_GBPS[p.gpu]),
        "Simple": bw,
    }
    lines: list[tuple[float, float]] = []
    for k, (proto, bus_bw) in enumerate(protos.items()):
        if proto == "LL128" and nodes > 1:
            continue  # comm_analysis: LL128 off across IB nodes
        intra = _HW_LAT_NVLINK_RING_US[k]
        if nodes > 1:
            intra = max(intra, 3.0 if proto == "Simple" else 1.0)  # netOverhead
        lat_us = (
            _BASE_LAT_RING_US[k]
            + (steps - inter_steps) * intra
            + inter_steps * _HW_LAT_NET_RING_US[k]
        )
        algo_bw = bus_bw * world_size / steps  # GB/s = 1e9 bytes/s
        lines.append((lat_us * 1e-6, 1.0 / (algo_bw * 1e9)))
    return CollectiveCurve.lower_envelope(lines)
