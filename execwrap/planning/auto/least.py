"""The least-memory configuration: the plan every memory question starts from.

Of the configurations the joint auto-planner may choose for one training step, the one
that needs the least memory per rank is: every unit its own group, explicit prefetch
0 (:data:`LEAST_PREFETCH`), every group but the root resharded after forward
(:func:`least_reshard`: the root never is, FSDP2's default and the only root setting
the planner prices; resharding it is not even less memory, since the root is then
gathered again in backward and that all-gather's buffers can land at the peak), every
unit it may checkpoint fully checkpointed, and CPU offload where the device has host
memory and the cost model its rates (:func:`may_offload`).

Three places ask for it, and must agree: the auto-planner's baseline for each step
variant (:mod:`~execwrap.planning.auto.variants`), the mesh search's probe of a shape
(:mod:`~execwrap.planning.auto.mesh`) and the largest micro-batch that fits
(:mod:`execwrap.sizing.largest`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from execwrap.cost import CostModel
    from execwrap.plan.training_step import TrainingStep
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = ["LEAST_PREFETCH", "least_memory_step", "least_reshard", "may_offload"]

#: Explicit prefetch depth of the least-memory configuration (FSDP2's implicit only).
LEAST_PREFETCH = 0


def may_offload(cost_model: CostModel) -> bool:
    """Whether the cost model's device has host memory to offload to, and its rates."""
    return cost_model.device_type != "cpu" and cost_model.host is not None


def least_reshard(plan: WrapPlan) -> list[bool]:
    """``reshard_after_forward`` per unit of ``plan``: every unit but the root."""
    return [not u.is_root for u in plan.units]


def least_memory_step(
    step: TrainingStep,
    cost_model: CostModel,
    *,
    checkpointing: bool = True,
    offload: bool = True,
) -> TrainingStep:
    """``step`` with every unit fully checkpointed (if ``checkpointing``) and CPU offload
    (if ``offload`` and :func:`may_offload`); its precision, micro-batches and
    accumulation mode stay the user's."""
    if checkpointing:
        step = dataclasses.replace(
            step, checkpointing="full", checkpoint_every=1, unit_checkpointing={}
        )
    if offload and may_offload(cost_model):
        step = dataclasses.replace(step, offload="cpu")
    return step
