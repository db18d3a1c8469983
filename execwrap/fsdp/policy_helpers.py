"""Helpers of :class:`execwrap.ParamExecOrderWrapPolicy`: its short ``repr`` of large
fields (FSDP1's targets of a plan are in :mod:`execwrap.fsdp.fsdp1_targets`)."""

from __future__ import annotations

from typing import Any

from execwrap.plan.wrap_plan import WrapPlan
from tracing.order import ExecutionOrder

__all__ = ["short_repr"]


def short_repr(value: Any) -> str:
    """``repr(value)``, but one short line for a cost model, an order or a plan."""
    from execwrap.cost import CostModel

    if isinstance(value, CostModel):
        origin = value.source.split(";")[0].split(":")[0].strip() or "unnamed"
        origin = origin if len(origin) <= 60 else origin[:59] + "…"
        return (
            f"CostModel({origin}, {value.device_type}, {value.backend}, {value.world_size} ranks)"
        )
    if isinstance(value, ExecutionOrder):
        calls, params = len(value.module_forward_order), len(value.params)
        return f"ExecutionOrder({value.method}, {calls} calls, {params} params)"
    if isinstance(value, WrapPlan):
        return f"WrapPlan({value.policy_name}, {len(value.units)} groups)"
    return repr(value)
