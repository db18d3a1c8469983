"""The device mesh a plan is applied on: HSDP's (replicate, shard) mesh, tensor parallelism.

* :func:`fsdp_mesh`: the mesh ``apply_fully_shard`` passes to ``fully_shard``:
  the caller's (its data-parallel part when it has a ``"tp"`` dimension), or,
  when none is given and the plan is for HSDP, one built from ``plan.mesh``
  (:func:`build_mesh`); checked against the plan, so that a 2-D mesh is never
  silently taken as HSDP with another shard group than the plan's (FSDP2 takes
  any 2-D mesh as ``(replicate, shard)``);
* :func:`check_fsdp1_hybrid`: FSDP1's ``HYBRID_SHARD`` / ``_HYBRID_SHARD_ZERO2``
  process-group pair (or 2-D ``device_mesh``) against the plan's mesh;
* :func:`applied_mesh`: the mesh FSDP really shards a module over, read back from
  FSDP2's parameter group or FSDP1's process groups.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from execwrap.plan.wrap_plan import WrapPlan
from execwrap.util.mesh import MeshShape

__all__ = ["HSDP_DIM_NAMES", "applied_mesh", "build_mesh", "check_fsdp1_hybrid", "fsdp_mesh"]

logger = logging.getLogger(__name__)

#: The dimension names of the meshes :func:`build_mesh` makes (torchtitan's).
HSDP_DIM_NAMES = ("dp_replicate", "dp_shard")


def build_mesh(shape: MeshShape, device_type: str | None = None) -> DeviceMesh:
    """``init_device_mesh`` of a ``(replicate, shard)`` shape, dimensions named
    :data:`HSDP_DIM_NAMES` (collective: every rank calls it).

    Args:
        shape: the plan's mesh (``tp`` must be 1: a tensor-parallel mesh is the
            caller's, its DTensors already live on it).
        device_type: ``"cuda"`` or ``"cpu"`` (default: ``"cuda"`` for NCCL, else ``"cpu"``).

    Raises:
        RuntimeError: no process group is initialised.
        ValueError: the world size is not the shape's ranks, or ``shape.tp > 1``.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "apply_fully_shard: the plan is for a mesh of shape "
            f"({shape.replicate}, {shape.shard}), which needs an initialised process group: "
            "call torch.distributed.init_process_group first (torchrun)"
        )
    if shape.tp > 1:
        raise ValueError(
            f"apply_fully_shard: the plan is for tensor parallelism (tp {shape.tp}); pass the "
            "mesh your parallelize_module used (mesh=init_device_mesh(..., mesh_dim_names="
            "('dp_replicate', 'dp_shard', 'tp')))"
        )
    world = dist.get_world_size()
    if world != shape.world_size:
        raise ValueError(
            f"apply_fully_shard: the plan's mesh ({shape.replicate}, {shape.shard}) holds "
            f"{shape.world_size} ranks but the world has {world}: plan again with "
            f"world_size={world}, or pass mesh="
        )
    if device_type is None:
        nccl = "nccl" in str(dist.get_backend())
        device_type = "cuda" if nccl and torch.cuda.is_available() else "cpu"
    return init_device_mesh(
        device_type, (shape.replicate, shape.shard), mesh_dim_names=HSDP_DIM_NAMES
    )


def fsdp_mesh(model: nn.Module, plan: WrapPlan, mesh: DeviceMesh | None) -> Any:
    """The mesh ``fully_shard`` gets (module docstring); a WARNING when an auto plan
    made for FSDP over every rank is applied on a 2-D mesh (HSDP: another shard group).

    Args:
        model: the model to shard (its DTensor parameters, for tensor parallelism).
        plan: the plan (its ``mesh``; its ``estimate``: an auto plan's).
        mesh: the caller's mesh, or ``None``.

    Returns:
        A ``DeviceMesh``, or ``None`` (FSDP2's default: a 1-D mesh over every rank).

    Raises:
        ValueError: the caller's mesh has a shard group of another size than the
            plan's, or a ``"tp"`` dimension while no parameter of ``model`` is a DTensor
            (the message says what to pass).
    """
    plan_mesh = plan.mesh
    if mesh is None:
        if plan_mesh is None or (not plan_mesh.hybrid and plan_mesh.tp == 1):
            return None
        return build_mesh(plan_mesh)
    shape = MeshShape.from_device_mesh(mesh, where="apply_fully_shard")
    fsdp = mesh
    if shape.tp > 1:
        _check_dtensors(model, mesh, shape)
        names = tuple(mesh.mesh_dim_names or ())
        fsdp = mesh[names[:-1]] if len(names) > 2 else mesh[names[0]]
    if plan_mesh is None and shape.hybrid and plan.estimate is not None:
        logger.warning(
            "apply_fully_shard: the plan was made for FSDP over all %d ranks, but fully_shard "
            "takes this %s mesh as HSDP (%d replicas of %d-rank shard groups): its memory and "
            'step time differ from plan.estimate; plan with mesh=%s (or mesh="auto")',
            plan.estimate.world_size,
            shape.label,
            shape.replicate,
            shape.shard,
            (shape.replicate, shape.shard),
        )
    if plan_mesh is not None and (plan_mesh.replicate, plan_mesh.shard) != (
        shape.replicate,
        shape.shard,
    ):
        raise ValueError(
            f"apply_fully_shard: the plan shards each parameter over {plan_mesh.shard} ranks "
            f"(mesh {plan_mesh.label}, replicate x shard) but fully_shard would shard over "
            f"{shape.shard} with this mesh ({shape.label}); pass a mesh of shape "
            f"({plan_mesh.replicate}, {plan_mesh.shard}) (or mesh=None to build it), or plan "
            f"again with mesh={(shape.replicate, shape.shard)}"
        )
    return fsdp


def _check_dtensors(model: nn.Module, mesh: DeviceMesh, shape: MeshShape) -> None:
    """A ``tp`` dimension needs the model's tensor-parallel parameters as DTensors."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        names = tuple(mesh.mesh_dim_names or ())
        raise ValueError(
            f"apply_fully_shard: the mesh {tuple(mesh.shape)} {names} has a tensor-parallel "
            f"dimension ({names[-1]!r}, {shape.tp} ranks) but no parameter of "
            f"{type(model).__name__} is a DTensor: apply the tensor-parallel plan first "
            f"(torch.distributed.tensor.parallel.parallelize_module(model, mesh[{names[-1]!r}], "
            "plan)), or pass FSDP's part of the mesh alone (mesh["
            f"{names[0]!r}]) to shard without tensor parallelism"
        )


def check_fsdp1_hybrid(plan_mesh: MeshShape | None, root_kwargs: Mapping[str, Any]) -> None:
    """FSDP1's sharding strategy and process groups against the plan's mesh.

    Raises:
        ValueError: the plan is for HSDP but FSDP1 shards over every rank, or its
            hybrid groups have other sizes than the plan's (the message says what to pass).
    """
    if plan_mesh is None:
        return
    strategy = str(getattr(root_kwargs.get("sharding_strategy"), "name", ""))
    hybrid = strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
    found = _fsdp1_shape(root_kwargs, hybrid)
    if found is None or (found.replicate, found.shard) == (plan_mesh.replicate, plan_mesh.shard):
        return
    raise ValueError(
        f"ParamExecOrderWrapPolicy: the plan shards over {plan_mesh.shard} ranks (mesh "
        f"{plan_mesh.label}, replicate x shard) but FSDP({strategy or 'FULL_SHARD'}) shards "
        f"over {found.shard} (replicate x shard {found.label}): pass "
        "sharding_strategy=ShardingStrategy.HYBRID_SHARD with device_mesh=init_device_mesh("
        f"device, ({plan_mesh.replicate}, {plan_mesh.shard})) to FSDP, or plan with mesh="
        f"{(found.replicate, found.shard)}"
    )


def _fsdp1_shape(root_kwargs: Mapping[str, Any], hybrid: bool) -> MeshShape | None:
    """The ``(replicate, shard)`` FSDP1 will use, from its kwargs (``None``: unknown)."""
    mesh = root_kwargs.get("device_mesh")
    if mesh is not None:
        return MeshShape.from_device_mesh(mesh) if hybrid else MeshShape(1, mesh.size())
    group: Any = root_kwargs.get("process_group")
    if isinstance(group, tuple) and len(group) == 2:
        return MeshShape(group[1].size(), group[0].size())
    if not (dist.is_available() and dist.is_initialized()):
        return None
    size = dist.get_world_size() if group is None else group.size()
    if hybrid:  # FSDP1 builds the pair itself: shard within the node's devices
        per_node = torch.cuda.device_count() if torch.cuda.is_available() else size
        return MeshShape(size // max(1, min(per_node, size)), min(per_node, size))
    return MeshShape(1, size)


def applied_mesh(module: nn.Module) -> MeshShape | None:
    """The ``(replicate, shard)`` FSDP shards ``module`` over, read back from FSDP:
    FSDP2's parameter group (its ``mesh_info``) or FSDP1's process groups; ``None`` when
    ``module`` has no FSDP of its own.

    Example:
        >>> applied_mesh(model.get_submodule("blocks.0"))  # doctest: +SKIP
        MeshShape(replicate=2, shard=2, tp=1)
    """
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(module, FullyShardedDataParallel):
        pg: Any = module.process_group
        shard = pg.size()
        inter = getattr(module, "_inter_node_pg", None)
        hybrid = module.sharding_strategy.name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
        return MeshShape(inter.size() if hybrid and inter is not None else 1, shard)
    if isinstance(module, FSDPModule):
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None:
            return None
        info: Any = group.mesh_info
        replicate = getattr(info, "replicate_mesh_size", 1)
        return MeshShape(replicate, info.shard_mesh_size)
    return None
