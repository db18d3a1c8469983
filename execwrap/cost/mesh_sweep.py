"""Calibration on a live 2-D mesh: each mesh dimension's process group, measured.

``CostModel.calibrate(mesh=mesh)`` runs the flat calibration on every rank of the
mesh (the world group's curves) and then :func:`measure_mesh_groups`: a sweep of
the shard group's all-gather and reduce-scatter (the collectives HSDP runs inside
a shard group, multiplied by the in-step factors measured on FSDP2 stacks, as the
flat curves are) and of the replicate group's all-reduce (HSDP's all-reduce of
each gradient shard, a bare ``dist.all_reduce``: its sweep as measured). Every
group of a dimension runs its collectives at the same time, as in a training
step, so a replicate group's all-reduce shares the network with the others'.
The curves are kept as :class:`~execwrap.cost.mesh.GroupCurves` in the model's
``mesh_groups``; :meth:`~execwrap.cost.CostModel.for_mesh` prices that mesh
with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from execwrap.cost.curve import CollectiveCurve
from execwrap.cost.fixed_costs import in_step_curve
from execwrap.cost.mesh import GroupCurves
from execwrap.cost.sweep import collective_times, sweep_sizes
from execwrap.util.mesh import MeshShape

__all__ = ["measure_mesh_groups"]


def measure_mesh_groups(
    mesh: Any,
    dev: torch.device,
    max_bytes: int,
    *,
    factors: Sequence[tuple[int, float, float]] = (),
    repeat: int = 1,
) -> tuple[GroupCurves, ...]:
    """The curves of the shard and replicate groups of a 2-D ``(replicate, shard)`` mesh.

    Collective: every rank of the mesh calls it.

    Args:
        mesh: a 2-D ``DeviceMesh`` (dimension 0 replicate, 1 shard, as FSDP2 takes it).
        dev: the device the collectives run on.
        max_bytes: the largest buffer of the sweep.
        factors: ``(bytes, all-gather factor, reduce-scatter factor)`` in-step factors
            (:mod:`execwrap.cost.fixed_costs`; empty: none).
        repeat: how many times as many runs.

    Raises:
        ValueError: ``mesh`` is not 2-D.
    """
    shape = MeshShape.from_device_mesh(mesh, where="CostModel.calibrate")
    if mesh.ndim != 2 or shape.tp != 1:
        raise ValueError(
            f"CostModel.calibrate: mesh must be a 2-D (replicate, shard) DeviceMesh, got shape "
            f"{tuple(mesh.shape)}: pass init_device_mesh(device, (replicate, shard))"
        )
    shard, replicate = mesh.get_group(1), mesh.get_group(0)
    out = []
    if shape.shard > 1:
        sizes = sweep_sizes(max_bytes, shape.shard)
        ag = _curve(sizes, collective_times("all_gather", sizes, shard, dev, repeat=repeat))
        rs = _curve(sizes, collective_times("reduce_scatter", sizes, shard, dev, repeat=repeat))
        if factors:
            ag = in_step_curve(ag, sizes, [(n, a) for n, a, _ in factors])
            rs = in_step_curve(rs, sizes, [(n, b) for n, _, b in factors])
        out.append(GroupCurves("shard", shape.shard, 1, all_gather=ag, reduce_scatter=rs))
    if shape.replicate > 1:
        sizes = sweep_sizes(max_bytes, 1)
        ar = _curve(sizes, collective_times("all_reduce", sizes, replicate, dev, repeat=repeat))
        out.append(GroupCurves("replicate", shape.replicate, shape.shard, all_reduce=ar))
    return tuple(out)


def _curve(sizes: list[int], times: list[float]) -> CollectiveCurve:
    return CollectiveCurve.from_samples(sizes, times)
