"""Helpers of :class:`execwrap.ParamExecOrderWrapPolicy`: its checks of ``bucket_numel``
and of FSDP1's step kwargs, and its short ``repr`` of large fields (FSDP1's targets of a
plan: :mod:`execwrap.fsdp.fsdp1_targets`)."""

from __future__ import annotations

from typing import Any

from execwrap.fsdp.offload import check_offload
from execwrap.fsdp.precision import check_mixed_precision
from execwrap.plan.wrap_plan import WrapPlan
from tracing.checks import check_size
from tracing.order import ExecutionOrder

__all__ = [
    "check_bucket_numel",
    "check_step_kwargs",
    "short_repr",
]


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


def check_bucket_numel(value: Any) -> Any:
    """``ParamExecOrderWrapPolicy.bucket_numel`` checked: ``None``, ``"auto"``, or a
    positive number of elements kept as an ``int`` (a NumPy integer or a whole float
    such as ``1e8``).

    Raises:
        ValueError: anything else.
    """
    if value is None or (isinstance(value, str) and value == "auto"):
        return value
    try:
        return check_size(value, "bucket_numel")
    except (TypeError, ValueError) as e:
        raise ValueError(
            "ParamExecOrderWrapPolicy.bucket_numel must be a positive number of "
            f'parameter elements, "auto" or None; got {value!r}'
        ) from e


def check_step_kwargs(root_kwargs: dict[str, Any]) -> None:
    """FSDP1's ``mixed_precision`` and ``cpu_offload`` it would refuse later."""
    where = "ParamExecOrderWrapPolicy"
    check_mixed_precision(root_kwargs.get("mixed_precision"), api="FSDP", where=where)
    device_id = root_kwargs.get("device_id")
    check_offload(root_kwargs.get("cpu_offload"), device_id=device_id, api="FSDP", where=where)
