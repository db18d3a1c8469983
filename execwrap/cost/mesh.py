"""A cost model over a 2-D mesh: each mesh dimension's process group priced on its own links.

HSDP over a ``(replicate, shard)`` mesh (FSDP2's ``fully_shard(mesh=2-D mesh)``,
``_fsdp_collectives.foreach_reduce``) all-gathers and reduce-scatters within a
shard group and then all-reduces each gradient shard across the replicate group.
:meth:`execwrap.cost.CostModel.for_mesh` turns a model of ``N`` ranks into the
model one shard group sees (:func:`mesh_fields`): ``world_size`` is the shard
group's size, ``all_gather`` and ``reduce_scatter`` its curves, ``all_reduce``
the replicate group's, ``mesh`` the shape. Each group's curves come from, in
this order:

1. a measurement of that group (:class:`GroupCurves`, from
   ``CostModel.calibrate(mesh=...)``: :mod:`execwrap.cost.mesh_sweep`);
2. the model's own curves, when the group is every rank (the flat calibration);
3. the model's :class:`~execwrap.cost.topology.Topology` (every preset has one):
   NCCL's model over the links the group spans.

A group none of them prices is an error naming what to pass instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from execwrap.cost.curve import CollectiveCurve
from execwrap.util.mesh import MeshShape
from execwrap.util.text import plural

__all__ = ["GroupCurves", "mesh_fields"]


@dataclass(frozen=True)
class GroupCurves:
    """The measured curves of one process group of a mesh (in-step factors applied).

    Attributes:
        dim: the mesh dimension (``"shard"`` or ``"replicate"``).
        size: its ranks.
        stride: the distance between its ranks (the group of rank 0: ``0, stride, ...``).
        all_gather: seconds of an all-gather by output bytes (``None``: not measured).
        reduce_scatter: seconds of a reduce-scatter by input bytes (``None``: not measured).
        all_reduce: seconds of an all-reduce by tensor bytes (``None``: not measured).
    """

    dim: str
    size: int
    stride: int
    all_gather: CollectiveCurve | None = None
    reduce_scatter: CollectiveCurve | None = None
    all_reduce: CollectiveCurve | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        out: dict[str, Any] = {"dim": self.dim, "size": self.size, "stride": self.stride}
        for name in ("all_gather", "reduce_scatter", "all_reduce"):
            curve = getattr(self, name)
            out[name] = None if curve is None else curve.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupCurves:
        """Inverse of :meth:`to_dict` (fields checked by :mod:`execwrap.cost.model_fields`)."""
        return cls(
            str(data["dim"]),
            int(data["size"]),
            int(data["stride"]),
            *(
                None if data.get(k) is None else CollectiveCurve.from_dict(data[k])
                for k in ("all_gather", "reduce_scatter", "all_reduce")
            ),
        )


def mesh_fields(cost_model: Any, mesh: Any) -> dict[str, Any]:
    """The fields :meth:`~execwrap.cost.CostModel.for_mesh` replaces (module docstring).

    Args:
        cost_model: a :class:`~execwrap.cost.CostModel` of ``N`` ranks, not yet
            resolved for a mesh.
        mesh: a :class:`~execwrap.util.mesh.MeshShape` (or a tuple, or a
            ``DeviceMesh``) of ``N`` ranks.

    Raises:
        ValueError: the mesh does not hold the model's ranks; the model is already
            for a mesh; a group neither measured, nor every rank, nor priceable from
            a topology (the message says what to pass).
    """
    cm = cost_model
    if cm.mesh is not None:
        raise ValueError(
            f"CostModel.for_mesh: this cost model is already for mesh {cm.mesh.label} (its "
            "curves are one shard group's); call for_mesh on the cost model of all the ranks"
        )
    shape = MeshShape.of(mesh, world_size=cm.world_size, where="CostModel.for_mesh")
    size, stride = shape.group("shard")
    replicas, replica_stride = shape.group("replicate")
    all_reduce = None  # the replicate group first: what a flat calibration cannot price
    if replicas > 1:
        all_reduce = _curve(cm, shape, "replicate", "all_reduce", replicas, replica_stride)
    all_gather = _curve(cm, shape, "shard", "all_gather", size, stride)
    reduce_scatter = _curve(cm, shape, "shard", "reduce_scatter", size, stride)
    return {
        "world_size": size,
        "all_gather": all_gather,
        "reduce_scatter": reduce_scatter,
        "all_reduce": all_reduce,
        "all_reduce_own_link": _own_link(cm, shape),
        "mesh": shape,
        "source": f"{cm.source}; mesh {shape.label} (replicate x shard)",
    }


def _own_link(cm: Any, shape: MeshShape) -> bool:
    """Whether the replicate group's all-reduces run on other links than the shard
    group's collectives (one of them inside a node, the other across nodes): then they
    do not share bandwidth (FSDP2 runs them on their own stream for this reason)."""
    if cm.topology is None or not shape.hybrid:
        return False
    return cm.topology.crosses_nodes(*shape.group("shard")) != cm.topology.crosses_nodes(
        *shape.group("replicate")
    )


def _curve(
    cm: Any, shape: MeshShape, dim: str, collective: str, size: int, stride: int
) -> CollectiveCurve:
    """One collective of one mesh group (module docstring's three sources)."""
    for group in cm.mesh_groups:
        if (group.size, group.stride) == (size, stride) and getattr(group, collective):
            return getattr(group, collective)  # type: ignore[no-any-return]
    if size == cm.world_size and stride == 1 and collective != "all_reduce":
        return getattr(cm, collective)  # type: ignore[no-any-return]
    if cm.topology is not None:
        return cm.topology.curve(collective, size, stride)  # type: ignore[no-any-return]
    origin = cm.source.split(";")[0].strip() or "unnamed"
    measured = ", ".join(f"{g.dim} {g.size} x {g.stride}" for g in cm.mesh_groups)
    what = (
        f"measured the groups ({measured}) of another mesh"
        if measured
        else f"was calibrated flat, on one group of {plural(cm.world_size, 'rank')},"
    )
    return _raise(
        f"cost model ({origin}) {what} and knows no topology: it cannot price the "
        f"{collective.replace('_', '-')} over the {dim} group of {plural(size, 'rank')} "
        f"{stride} apart of mesh {shape.label} (replicate x shard); calibrate on that mesh "
        "(CostModel.calibrate(mesh=init_device_mesh(device, "
        f"({shape.replicate}, {shape.shard}), mesh_dim_names=('dp_replicate', 'dp_shard')))) "
        "or use a preset that knows the cluster's topology (CostModel.preset("
        f"{'h100-nvlink-8' if cm.world_size <= 8 else 'h100-ib-400g'!r}, "
        f"world_size={cm.world_size}))"
    )


def _raise(message: str) -> CollectiveCurve:
    raise ValueError(message)
