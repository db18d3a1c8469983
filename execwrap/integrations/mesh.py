"""The framework's mesh, passed to the plan: HSDP's replicas and tensor parallelism.

A framework fixes its device mesh from its own configuration (torchtitan's
``data_parallel_replicate_degree`` / ``tensor_parallel_degree``, accelerate's
``ParallelismConfig(dp_replicate_size=..., tp_size=...)``, Lightning's
``ModelParallelStrategy(data_parallel_size, tensor_parallel_size)``). A policy
that plans its units when it is applied plans for that mesh
(:func:`plan_for_mesh`): its shard group, its replicas (HSDP's all-reduces) and,
with tensor parallelism, the local shards of the DTensor parameters. A policy
given its own ``mesh`` keeps it (``apply_fully_shard`` then checks it against
the framework's).
"""

from __future__ import annotations

import logging
from typing import Any

from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
from execwrap.util.mesh import MeshShape

__all__ = ["plan_for_mesh"]

logger = logging.getLogger(__name__)


def plan_for_mesh(policy_or_plan: Any, shape: MeshShape) -> None:
    """Give a :class:`~execwrap.ParamExecOrderWrapPolicy` without a ``mesh`` the
    framework's ``shape`` when it has replicas or tensor parallelism (a plan, or a
    policy with its own mesh, is left as it is).

    Example:
        >>> policy = ParamExecOrderWrapPolicy()
        >>> plan_for_mesh(policy, MeshShape(2, 8))
        >>> policy.mesh
        MeshShape(replicate=2, shard=8, tp=1)
    """
    if not isinstance(policy_or_plan, ParamExecOrderWrapPolicy) or policy_or_plan.mesh is not None:
        return
    if shape.hybrid or shape.tp > 1:
        logger.debug("plan_for_mesh: the policy plans for the framework's mesh %s", shape.label)
        policy_or_plan.mesh = shape
