"""execwrap: execution-order FSDP wrap planning.

Captures the order in which a model really uses its parameters (``tracing``),
plans FSDP units and size-capped buckets from it, applies the plan to FSDP1
and FSDP2, and writes reports.

Importing ``execwrap`` loads nothing heavy: each name below is imported from
its module the first time it is used (PEP 562), so ``execwrap --help`` starts
without torch and ``torch.distributed.fsdp`` is loaded only by what needs it
(the FSDP1 policy, ``apply_fully_shard``, torch's wrap policies).

Besides its own names and ``tracing``'s, ``execwrap`` re-exports torch's FSDP
auto-wrap policies that are passed as ``init_policy``, so that one import
serves both FSDP1 and FSDP2 users: ``ModuleWrapPolicy``, ``CustomPolicy``,
``always_wrap_policy``, ``size_based_auto_wrap_policy``,
``transformer_auto_wrap_policy`` and ``lambda_auto_wrap_policy`` (from
``torch.distributed.fsdp.wrap``). torch's ``enable_wrap``/``wrap`` context
managers are not re-exported: they wrap by hand, which a plan replaces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from torch.distributed.fsdp.wrap import (
        CustomPolicy,
        ModuleWrapPolicy,
        always_wrap_policy,
        lambda_auto_wrap_policy,
        size_based_auto_wrap_policy,
        transformer_auto_wrap_policy,
    )

    from execwrap.cost import CostModel
    from execwrap.errors import (
        ExecwrapError,
        MemoryBudgetError,
        OrderDivergenceError,
        ParamMismatchError,
        PlanError,
        RankFailure,
    )
    from execwrap.fsdp.accumulation import GRADIENT_SYNCS, accumulate_gradients
    from execwrap.fsdp.checkpointing import (
        CHECKPOINT_MODES,
        apply_checkpointing,
        selective_checkpoint_policy,
    )
    from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
    from execwrap.fsdp.fsdp2 import apply_fully_shard
    from execwrap.fsdp.mesh import applied_mesh
    from execwrap.fsdp.ranks import check_order_across_ranks, order_fingerprint
    from execwrap.fsdp.restart import load_checkpoint, restart_fully_shard, save_checkpoint
    from execwrap.order.divergence import Divergence, first_divergence
    from execwrap.order.graph import build_order_graph, order_subgraph
    from execwrap.order.monitor import DriftEvent, OrderMonitor
    from execwrap.plan.compare import compare_plans
    from execwrap.plan.pinned import load_plan, plan_changes, save_plan
    from execwrap.plan.prefetch import prefetch_schedule
    from execwrap.plan.search_record import PlanSearch
    from execwrap.plan.stats import PlanStats, TimelineStep
    from execwrap.plan.training_step import Precision, TrainingStep
    from execwrap.plan.unit import WrapUnit
    from execwrap.plan.wrap_plan import WrapPlan
    from execwrap.planning.bucketing import min_contiguous_groups
    from execwrap.planning.micro_batch import MicroBatchFit, largest_micro_batch
    from execwrap.planning.planner import plan_wrap, policy_units
    from execwrap.report.writer import write_report
    from execwrap.simulate import (
        MemoryBreakdown,
        StepEstimate,
        UnitCompute,
        simulate_step,
        unit_compute,
    )
    from execwrap.util.mesh import MeshShape
    from tracing import ExecutionOrder, TracingConfig, TracingError

#: Public name -> module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    # torch's auto-wrap policies, passed as init_policy
    "CustomPolicy": "torch.distributed.fsdp.wrap",
    "ModuleWrapPolicy": "torch.distributed.fsdp.wrap",
    "always_wrap_policy": "torch.distributed.fsdp.wrap",
    "lambda_auto_wrap_policy": "torch.distributed.fsdp.wrap",
    "size_based_auto_wrap_policy": "torch.distributed.fsdp.wrap",
    "transformer_auto_wrap_policy": "torch.distributed.fsdp.wrap",
    # tracing
    "ExecutionOrder": "tracing",
    "TracingConfig": "tracing",
    "TracingError": "tracing",
    # execwrap
    "Divergence": "execwrap.order.divergence",
    "first_divergence": "execwrap.order.divergence",
    "ExecwrapError": "execwrap.errors",
    "MemoryBudgetError": "execwrap.errors",
    "OrderDivergenceError": "execwrap.errors",
    "ParamMismatchError": "execwrap.errors",
    "PlanError": "execwrap.errors",
    "RankFailure": "execwrap.errors",
    "ParamExecOrderWrapPolicy": "execwrap.fsdp.fsdp1",
    "apply_fully_shard": "execwrap.fsdp.fsdp2",
    "prefetch_schedule": "execwrap.plan.prefetch",
    "build_order_graph": "execwrap.order.graph",
    "order_subgraph": "execwrap.order.graph",
    "DriftEvent": "execwrap.order.monitor",
    "OrderMonitor": "execwrap.order.monitor",
    "min_contiguous_groups": "execwrap.planning.bucketing",
    "compare_plans": "execwrap.plan.compare",
    "WrapPlan": "execwrap.plan.wrap_plan",
    "PlanStats": "execwrap.plan.stats",
    "TimelineStep": "execwrap.plan.stats",
    "plan_wrap": "execwrap.planning.planner",
    "policy_units": "execwrap.planning.planner",
    "WrapUnit": "execwrap.plan.unit",
    "check_order_across_ranks": "execwrap.fsdp.ranks",
    "order_fingerprint": "execwrap.fsdp.ranks",
    "write_report": "execwrap.report.writer",
    # issue 11: cost model and step simulator
    "CostModel": "execwrap.cost",
    "MemoryBreakdown": "execwrap.simulate",
    "StepEstimate": "execwrap.simulate",
    "UnitCompute": "execwrap.simulate",
    "simulate_step": "execwrap.simulate",
    "unit_compute": "execwrap.simulate",
    # issue 36: checkpoints across plans
    "load_checkpoint": "execwrap.fsdp.restart",
    "restart_fully_shard": "execwrap.fsdp.restart",
    "save_checkpoint": "execwrap.fsdp.restart",
    "load_plan": "execwrap.plan.pinned",
    "plan_changes": "execwrap.plan.pinned",
    "save_plan": "execwrap.plan.pinned",
    # issue 11: the auto-planner's record (plan_wrap(..., bucket_numel="auto").search)
    "PlanSearch": "execwrap.plan.search_record",
    # issue 31: the training step applied (checkpointing, gradient accumulation)
    "CHECKPOINT_MODES": "execwrap.fsdp.checkpointing",
    "apply_checkpointing": "execwrap.fsdp.checkpointing",
    "selective_checkpoint_policy": "execwrap.fsdp.checkpointing",
    "GRADIENT_SYNCS": "execwrap.fsdp.accumulation",
    "accumulate_gradients": "execwrap.fsdp.accumulation",
    # issue 32: HSDP and 2-D meshes
    "MeshShape": "execwrap.util.mesh",
    "applied_mesh": "execwrap.fsdp.mesh",
    # issue 31: the training step as part of the plan, planned together
    "Precision": "execwrap.plan.training_step",
    "TrainingStep": "execwrap.plan.training_step",
    "MicroBatchFit": "execwrap.planning.micro_batch",
    "largest_micro_batch": "execwrap.planning.micro_batch",
}

__all__ = [
    "CHECKPOINT_MODES",
    "CostModel",
    "CustomPolicy",
    "Divergence",
    "DriftEvent",
    "ExecutionOrder",
    "ExecwrapError",
    "GRADIENT_SYNCS",
    "MemoryBreakdown",
    "MemoryBudgetError",
    "MeshShape",
    "MicroBatchFit",
    "ModuleWrapPolicy",
    "OrderDivergenceError",
    "ParamMismatchError",
    "OrderMonitor",
    "ParamExecOrderWrapPolicy",
    "PlanError",
    "PlanSearch",
    "PlanStats",
    "Precision",
    "RankFailure",
    "StepEstimate",
    "TimelineStep",
    "TracingConfig",
    "TracingError",
    "TrainingStep",
    "UnitCompute",
    "WrapPlan",
    "WrapUnit",
    "accumulate_gradients",
    "always_wrap_policy",
    "apply_checkpointing",
    "apply_fully_shard",
    "applied_mesh",
    "build_order_graph",
    "check_order_across_ranks",
    "compare_plans",
    "first_divergence",
    "lambda_auto_wrap_policy",
    "largest_micro_batch",
    "load_checkpoint",
    "load_plan",
    "min_contiguous_groups",
    "order_fingerprint",
    "order_subgraph",
    "plan_changes",
    "plan_wrap",
    "policy_units",
    "prefetch_schedule",
    "restart_fully_shard",
    "save_checkpoint",
    "save_plan",
    "selective_checkpoint_policy",
    "simulate_step",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    "unit_compute",
    "write_report",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
