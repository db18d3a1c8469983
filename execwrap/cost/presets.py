"""Cost-model presets for common GPU clusters, each constant with its public source.

A preset is nodes of 8 GPUs of one model (:mod:`execwrap.cost.gpus`: peak rates
per dtype, memory bandwidth, host link, from datasheets) joined by NVLink inside
a node and, for the multi-node presets, by one 200/400/800 Gb/s InfiniBand or
RoCE NIC per GPU: a :class:`~execwrap.cost.topology.Topology`, whose collectives
follow NCCL's own tuning model as torch's inductor reproduces it
(``torch/_inductor/comm_analysis.py``; the model is written out in
:mod:`execwrap.cost.topology`). The cost model's all-gather and reduce-scatter
curves are those of the group of all ``world_size`` ranks (a ring LL / LL128 /
Simple lower envelope: ``latency = baseLat + (W - 1 - inter_steps) * intraLat +
inter_steps * interLat``, ``algorithm_bandwidth = bus_bandwidth * W / (W - 1)``);
:meth:`~execwrap.cost.CostModel.for_mesh` prices any other group of a mesh over
the same ranks from the topology. ``gpu=`` puts another GPU model in the same
cluster (its family's NVLink bandwidth and NCCL constants replace the preset's:
A100 nodes on the InfiniBand preset's fabric, say). These are estimates: measure
your own cluster with ``execwrap calibrate``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

from execwrap.cost.gpus import GPUS, MEMORY_EFFICIENCY, gpu_compute_rates
from execwrap.cost.host_link import HostLink
from execwrap.cost.topology import NCHANNELS, Topology

__all__ = ["PRESETS", "Preset", "preset_fields", "preset_topology"]

# --- Link bandwidths per GPU (bytes/s). NVLink: comm_analysis.py's _GPU_NVLINK_BW (NVIDIA's
# --- NVLink figures, nccl/src/graph/topo.h). Network: one NIC per GPU, its line rate in bytes
# --- (400 Gb/s = 50 GB/s: comm_analysis.py's _GPU_INTER_NODE_BW for Hopper; 200 Gb/s HDR = 25 GB/s
# --- for Ampere), from the node's datasheet named by each preset.
_NVLINK_BW = {"ampere": 240e9, "hopper": 370e9, "blackwell": 720e9}
_NIC_200G, _NIC_400G, _NIC_800G = 25e9, 50e9, 100e9

#: Streaming multiprocessors (H100 SXM5: 132; A100: 108; NVIDIA architecture whitepapers;
#: B200: 148, two dies of 74, NVIDIA Blackwell architecture technical brief).
_SMS = {"hopper": 132, "ampere": 108, "blackwell": 148}
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
        gpu: the GPU family of NCCL's tables (``"ampere"``, ``"hopper"``, ``"blackwell"``).
        gpus_per_node: GPUs per node (8).
        default_world_size: the world size used when none is given.
        inter_node: whether ranks span nodes over a network.
        description: one line for ``--help`` and reports.
        device: the GPU model (a key of :data:`execwrap.cost.gpus.GPUS`).
        nic_bytes_per_s: the network's bandwidth per GPU (one NIC each), bytes/s
            (``None``: one node).
        network: ``"infiniband"`` or ``"roce"`` (``""``: one node).
        source: the datasheet or page the node's NVLink and NICs come from.
    """

    name: str
    gpu: str
    gpus_per_node: int
    default_world_size: int
    inter_node: bool
    description: str
    device: str = "h100-sxm5-80gb"
    nic_bytes_per_s: float | None = None
    network: str = ""
    source: str = ""


_DGX_H100 = "NVIDIA DGX H100 datasheet: 8x H100 SXM5, NVLink 4 via NVSwitch, 8x ConnectX-7 400 Gb/s"


def _nodes(
    name: str, device: str, family: str, nic: float, network: str, description: str, source: str
) -> Preset:
    """A preset of whole nodes of 8 GPUs over a network (16 ranks by default)."""
    return Preset(name, family, 8, 16, True, description, device, nic, network, source)


#: Preset name -> :class:`Preset`.
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "h100-nvlink-8",
            "hopper",
            8,
            8,
            False,
            "8x H100 SXM in one node, NVLink/NVSwitch",
            source=_DGX_H100,
        ),
        _nodes(
            "h100-ib-400g",
            "h100-sxm5-80gb",
            "hopper",
            _NIC_400G,
            "infiniband",
            "H100 nodes of 8 over 400 Gb/s NDR InfiniBand",
            _DGX_H100,
        ),
        Preset(
            "a100-nvlink-8",
            "ampere",
            8,
            8,
            False,
            "8x A100 SXM 80GB in one node, NVLink",
            "a100-sxm4-80gb",
            source="NVIDIA DGX A100 datasheet: 8x A100 SXM4 80GB, NVLink 3 via NVSwitch",
        ),
        _nodes(
            "h100-roce-400g",
            "h100-sxm5-80gb",
            "hopper",
            _NIC_400G,
            "roce",
            "H100 nodes of 8 over 400 Gb/s RoCE per GPU",
            "Meta's Grand Teton as torchtitan describes it (benchmarks/"
            "llama3_h100_202412_torchtitan.md: 'RDMA network with 400 Gb/s per GPU'); "
            "comm_analysis.py's network corrections were fitted on Grand Teton RoCE",
        ),
        _nodes(
            "h200-ib-400g",
            "h200-sxm-141gb",
            "hopper",
            _NIC_400G,
            "infiniband",
            "H200 nodes of 8 over 400 Gb/s NDR InfiniBand",
            "NVIDIA DGX H200 datasheet: 8x H200 SXM, NVLink 4 via NVSwitch, 8x ConnectX-7 400 Gb/s",
        ),
        _nodes(
            "a100-ib-200g",
            "a100-sxm4-80gb",
            "ampere",
            _NIC_200G,
            "infiniband",
            "A100 nodes of 8 over 200 Gb/s HDR InfiniBand",
            "NVIDIA DGX A100 datasheet: 8x A100 SXM4, NVLink 3 via NVSwitch, "
            "8x ConnectX-6 200 Gb/s HDR",
        ),
        _nodes(
            "b200-ib-400g",
            "b200-sxm-180gb",
            "blackwell",
            _NIC_400G,
            "infiniband",
            "B200 nodes of 8 over 400 Gb/s NDR InfiniBand",
            "NVIDIA DGX B200 datasheet: 8x B200, NVLink 5 via NVSwitch, 8x ConnectX-7 400 Gb/s",
        ),
        _nodes(
            "b200-ib-800g",
            "b200-sxm-180gb",
            "blackwell",
            _NIC_800G,
            "infiniband",
            "B200 nodes of 8 over 800 Gb/s XDR InfiniBand",
            "NVIDIA HGX B200 with ConnectX-8 SuperNICs (ConnectX-8 datasheet: 800 Gb/s per "
            "port; Quantum-X800 XDR InfiniBand)",
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
    topology = preset_topology(p, device)
    curve = topology.curve("all_gather", w)
    family = topology.family
    hbm = GPUS[device].memory_bytes_per_s
    overlap = 1.0 - NCHANNELS[family] / _SMS[family]
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
        "topology": topology,
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


def preset_topology(p: Preset, device: str) -> Topology:
    """The preset's :class:`~execwrap.cost.topology.Topology` with GPU model ``device``:
    its family's NVLink bandwidth and NCCL constants, the preset's network."""
    family = GPUS[device].family
    return Topology(
        p.gpus_per_node,
        family,
        _NVLINK_BW[family],
        p.nic_bytes_per_s,
        p.network,
        source=p.source,
    )
