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

    from execwrap.bucketing import min_contiguous_groups
    from execwrap.checkpoint import load_checkpoint, restart_fully_shard, save_checkpoint
    from execwrap.compare import compare_plans
    from execwrap.cost import CostModel
    from execwrap.divergence import Divergence, first_divergence
    from execwrap.errors import (
        ExecwrapError,
        MemoryBudgetError,
        OrderDivergenceError,
        ParamMismatchError,
        PlanError,
        RankFailure,
    )
    from execwrap.fsdp1 import ParamExecOrderWrapPolicy
    from execwrap.fsdp2 import apply_fully_shard
    from execwrap.graph import build_order_graph, order_subgraph
    from execwrap.monitor import DriftEvent, OrderMonitor
    from execwrap.plan import WrapPlan
    from execwrap.plan_search import PlanSearch
    from execwrap.plan_stats import PlanStats, TimelineStep
    from execwrap.planner import plan_wrap, policy_units
    from execwrap.prefetch import prefetch_schedule
    from execwrap.ranks import check_order_across_ranks, order_fingerprint
    from execwrap.report.writer import write_report
    from execwrap.simulate import (
        MemoryBreakdown,
        StepEstimate,
        UnitCompute,
        simulate_step,
        unit_compute,
    )
    from execwrap.unit import WrapUnit
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
    "Divergence": "execwrap.divergence",
    "first_divergence": "execwrap.divergence",
    "ExecwrapError": "execwrap.errors",
    "MemoryBudgetError": "execwrap.errors",
    "OrderDivergenceError": "execwrap.errors",
    "ParamMismatchError": "execwrap.errors",
    "PlanError": "execwrap.errors",
    "RankFailure": "execwrap.errors",
    "ParamExecOrderWrapPolicy": "execwrap.fsdp1",
    "apply_fully_shard": "execwrap.fsdp2",
    "prefetch_schedule": "execwrap.prefetch",
    "build_order_graph": "execwrap.graph",
    "order_subgraph": "execwrap.graph",
    "DriftEvent": "execwrap.monitor",
    "OrderMonitor": "execwrap.monitor",
    "min_contiguous_groups": "execwrap.bucketing",
    "compare_plans": "execwrap.compare",
    "WrapPlan": "execwrap.plan",
    "PlanStats": "execwrap.plan_stats",
    "TimelineStep": "execwrap.plan_stats",
    "plan_wrap": "execwrap.planner",
    "policy_units": "execwrap.planner",
    "WrapUnit": "execwrap.unit",
    "check_order_across_ranks": "execwrap.ranks",
    "order_fingerprint": "execwrap.ranks",
    "write_report": "execwrap.report.writer",
    # issue 11: cost model and step simulator
    "CostModel": "execwrap.cost",
    "MemoryBreakdown": "execwrap.simulate",
    "StepEstimate": "execwrap.simulate",
    "UnitCompute": "execwrap.simulate",
    "simulate_step": "execwrap.simulate",
    "unit_compute": "execwrap.simulate",
    # issue 36: checkpoints across plans
    "load_checkpoint": "execwrap.checkpoint",
    "restart_fully_shard": "execwrap.checkpoint",
    "save_checkpoint": "execwrap.checkpoint",
    # issue 11: the auto-planner's record (plan_wrap(..., bucket_numel="auto").search)
    "PlanSearch": "execwrap.plan_search",
}

__all__ = [
    "CostModel",
    "CustomPolicy",
    "Divergence",
    "DriftEvent",
    "ExecutionOrder",
    "ExecwrapError",
    "MemoryBreakdown",
    "MemoryBudgetError",
    "ModuleWrapPolicy",
    "OrderDivergenceError",
    "ParamMismatchError",
    "OrderMonitor",
    "ParamExecOrderWrapPolicy",
    "PlanError",
    "PlanSearch",
    "PlanStats",
    "RankFailure",
    "StepEstimate",
    "TimelineStep",
    "TracingConfig",
    "TracingError",
    "UnitCompute",
    "WrapPlan",
    "WrapUnit",
    "always_wrap_policy",
    "apply_fully_shard",
    "build_order_graph",
    "check_order_across_ranks",
    "compare_plans",
    "first_divergence",
    "lambda_auto_wrap_policy",
    "load_checkpoint",
    "min_contiguous_groups",
    "order_fingerprint",
    "order_subgraph",
    "plan_wrap",
    "policy_units",
    "prefetch_schedule",
    "restart_fully_shard",
    "save_checkpoint",
    "simulate_step",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    "unit_compute",
    "write_report",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
