"""execwrap: execution-order FSDP wrap planning.

Captures the order in which a model really uses its parameters (``tracing``),
plans FSDP units and size-capped buckets from it, applies the plan to FSDP1
and FSDP2, and writes reports.
"""

from torch.distributed.fsdp.wrap import (
    CustomPolicy,
    ModuleWrapPolicy,
    always_wrap_policy,
    enable_wrap,
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
    wrap,
)

from execwrap.errors import ExecwrapError, OrderDivergenceError, PlanError
from execwrap.fsdp2 import apply_fully_shard, prefetch_schedule
from execwrap.graph import Divergence, build_order_graph, first_divergence, order_subgraph
from execwrap.monitor import DriftEvent, OrderMonitor
from execwrap.plan import (
    PlanStats,
    TimelineStep,
    WrapPlan,
    WrapUnit,
    compare_plans,
    min_contiguous_groups,
    plan_wrap,
    policy_units,
)
from execwrap.policy import ParamExecOrderWrapPolicy
from execwrap.ranks import check_order_across_ranks, order_fingerprint
from execwrap.report import write_report
from tracing import ExecutionOrder, TracingConfig, TracingError

__all__ = [
    "CustomPolicy",
    "Divergence",
    "DriftEvent",
    "ExecutionOrder",
    "ExecwrapError",
    "ModuleWrapPolicy",
    "OrderDivergenceError",
    "OrderMonitor",
    "ParamExecOrderWrapPolicy",
    "PlanError",
    "PlanStats",
    "TimelineStep",
    "TracingConfig",
    "TracingError",
    "WrapPlan",
    "WrapUnit",
    "always_wrap_policy",
    "apply_fully_shard",
    "build_order_graph",
    "check_order_across_ranks",
    "compare_plans",
    "enable_wrap",
    "first_divergence",
    "lambda_auto_wrap_policy",
    "min_contiguous_groups",
    "order_fingerprint",
    "order_subgraph",
    "plan_wrap",
    "policy_units",
    "prefetch_schedule",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    "wrap",
    "write_report",
]
