"""The cluster a job is sized for: :class:`Cluster`, from a preset or a calibrated file.

``execwrap fit --cluster h100-nvlink-8 --nodes 1`` prices the step on a cited preset
(:data:`execwrap.cost.presets.PRESETS`) or on a cost model measured by
``execwrap calibrate`` (a JSON file). The ranks are ``nodes x`` the preset's GPUs per
node, as one flat FSDP mesh: an NVLink preset describes one node, an InfiniBand preset
(``h100-ib-400g``) two nodes or more; a calibrated file describes the ranks it was
measured on. Sharding within a node and replicating across nodes (HSDP) is not priced
here yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from execwrap.cost import CostModel
from execwrap.cost.presets import PRESETS
from tracing.checks import check_int

__all__ = ["Cluster", "cluster_of"]


@dataclass(frozen=True)
class Cluster:
    """The cluster a job is sized for.

    Attributes:
        name: the preset's name, or the calibrated file's path.
        nodes: nodes of the job.
        world_size: ranks (GPUs), one flat FSDP mesh over all of them.
        cost_model: the cost model the step is priced with, for ``world_size`` ranks.
        description: one line: what the cluster is.
    """

    name: str
    nodes: int
    world_size: int
    cost_model: CostModel
    description: str

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (the cost model by its source, not its curves)."""
        return {
            "name": self.name,
            "nodes": self.nodes,
            "world_size": self.world_size,
            "description": self.description,
            "device_memory_bytes": self.cost_model.device_memory_bytes,
        }


def cluster_of(cluster: str | Path | CostModel, nodes: int = 1) -> Cluster:
    """The :class:`Cluster` of a preset name, a calibrated cost model file or a cost model.

    Args:
        cluster: a preset (``"h100-nvlink-8"``, ``"h100-ib-400g"``, ``"a100-nvlink-8"``),
            the path of a cost model written by ``execwrap calibrate`` /
            :meth:`CostModel.save <execwrap.cost.CostModel.save>`, or a :class:`CostModel`.
        nodes: nodes of the job (``>= 1``): a preset's GPUs per node times ``nodes``
            ranks; a calibrated model stands for the ranks it was measured on (``nodes``
            must then be 1, or what it was measured on).

    Returns:
        The cluster.

    Raises:
        ValueError: ``nodes`` below 1; a preset that does not describe that many nodes
            (one node for an NVLink preset, two or more for an InfiniBand one: the
            message says which to use); an unknown preset name that is not a file (the
            message lists the presets); a malformed cost model file.

    Example:
        >>> c = cluster_of("h100-nvlink-8")
        >>> c.world_size, c.description
        (8, '8 GPUs: 8x H100 SXM in one node, NVLink/NVSwitch')
    """
    check_int(nodes, "nodes", minimum=1, unit="nodes")
    if isinstance(cluster, CostModel):
        return _calibrated(cluster, nodes, "the given cost model")
    text = str(cluster)
    if text in PRESETS:
        return _preset(text, nodes)
    path = Path(text)
    if not path.is_file():
        raise ValueError(
            f"cluster {text!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a cost "
            "model file; pass a preset name or the JSON file written by execwrap calibrate"
        )
    return _calibrated(CostModel.load(path), nodes, str(path))


def _preset(name: str, nodes: int) -> Cluster:
    preset = PRESETS[name]
    if not preset.inter_node and nodes > 1:
        raise ValueError(
            f"cluster {name!r} is one node of {preset.gpus_per_node} GPUs (NVLink); for "
            f"{nodes} nodes use an InfiniBand preset such as 'h100-ib-400g', or a cost model "
            "calibrated on the job's nodes"
        )
    if preset.inter_node and nodes < 2:
        raise ValueError(
            f"cluster {name!r} describes two or more nodes over InfiniBand; pass --nodes 2 or "
            "more, or use 'h100-nvlink-8' for one node"
        )
    world = preset.gpus_per_node * nodes
    what = f"{world} GPUs: {preset.description}"
    return Cluster(name, nodes, world, CostModel.preset(name, world_size=world), what)


def _calibrated(cost_model: CostModel, nodes: int, name: str) -> Cluster:
    if nodes != 1:
        raise ValueError(
            f"cluster {name!r} is a calibrated cost model of {cost_model.world_size} ranks as "
            "measured; pass --nodes 1 (it prices the ranks it was measured on), or calibrate "
            "on the job's nodes"
        )
    ranks, kind = cost_model.world_size, f"{cost_model.device_type}, {cost_model.backend}"
    what = f"{ranks} ranks: calibrated ({kind})"
    return Cluster(name, nodes, cost_model.world_size, cost_model, what)
