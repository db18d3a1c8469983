"""FSDP1 and plans it cannot build: :func:`check_fsdp1_builds`.

FSDP1 (``FullyShardedDataParallel(model, auto_wrap_policy=policy)``) wraps one
module per unit. ``ParamExecOrderWrapPolicy(..., bucket_numel=N)`` merges units
into FSDP2 groups (``fully_shard([m1, m2])``); FSDP1 builds such a group only
when one module holds exactly its units. Otherwise it would build other units
than the plan's, and the plan's figures would describe a step that does not
run, so the policy refuses under FSDP1 and says what to use instead.
"""

from __future__ import annotations

from execwrap.plan.wrap_plan import WrapPlan
from execwrap.util.text import listed

__all__ = ["check_fsdp1_builds"]


def check_fsdp1_builds(bucket_numel: int | str | None, plan: WrapPlan) -> None:
    """Refuse a plan FSDP1 would not build as planned, before anything is wrapped.

    Any ``bucket_numel="auto"`` plan (its groups, prefetch, resharding and
    predicted step are FSDP2's), and bucketed groups that no module holds
    exactly (FSDP1 wraps one module per unit: :meth:`WrapPlan.fsdp1_parent`).
    A plan whose every group FSDP1 builds (one module holds each) passes: FSDP1
    then builds the plan's units.

    Args:
        bucket_numel: the policy's ``bucket_numel``.
        plan: the plan built for FSDP1.

    Raises:
        ValueError: naming the groups FSDP1 cannot build and what to use instead.
    """
    fix = (
        "For FSDP1 leave bucket_numel out and choose the units with init_policy (e.g. a "
        "ModuleWrapPolicy of a larger block class, or functools.partial("
        "size_based_auto_wrap_policy, min_num_params=N)); for this plan use FSDP2: "
        "execwrap.apply_fully_shard(model, policy, mesh=mesh"
    )
    if bucket_numel == "auto":
        raise ValueError(
            'ParamExecOrderWrapPolicy(bucket_numel="auto") plans for FSDP2: its groups, prefetch '
            "depth, reshard_after_forward per group and predicted step are FSDP2's, and FSDP1 "
            f'builds none of them (it wraps one module per unit). {fix}, prefetch="auto")'
        )
    split = [u for u in plan.units if len(u.module_fqns) > 1 and plan.fsdp1_parent(u) is None]
    if bucket_numel is not None and split:
        groups = listed(["[" + ", ".join(repr(m) for m in u.module_fqns) + "]" for u in split], 3)
        raise ValueError(
            f"ParamExecOrderWrapPolicy(bucket_numel={bucket_numel}) merged units into FSDP2 "
            f"groups that FSDP1 cannot build: no module holds exactly the units of "
            f"{len(split)} of {len(plan.units)} groups ({groups}), so FSDP1 "
            f"would build {len(plan.fsdp1_modules())} units where the plan has "
            f"{len(plan.units)}. {fix})"
        )
