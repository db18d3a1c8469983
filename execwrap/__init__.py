"""execwrap: execution-order FSDP wrap planning.

Captures the order in which a model really uses its parameters (``tracing``),
plans FSDP units and size-capped buckets from it, applies the plan to FSDP1
and FSDP2, and writes reports.
"""

from execwrap.errors import ExecwrapError, OrderDivergenceError, PlanError
from execwrap.monitor import DriftEvent, OrderMonitor
from execwrap.plan import PlanStats, WrapPlan, WrapUnit, compare_plans, plan_wrap
from tracing import ExecutionOrder, TracingConfig, TracingError

__all__ = [
    "DriftEvent",
    "ExecutionOrder",
    "ExecwrapError",
    "OrderDivergenceError",
    "OrderMonitor",
    "PlanError",
    "PlanStats",
    "TracingConfig",
    "TracingError",
    "WrapPlan",
    "WrapUnit",
    "compare_plans",
    "plan_wrap",
]
