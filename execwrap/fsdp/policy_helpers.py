"""Helpers of :class:`execwrap.ParamExecOrderWrapPolicy`: an order without calls, FSDP1's
targets of a plan, and the policy's short ``repr`` of large fields."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch.nn as nn

from execwrap.plan.wrap_plan import WrapPlan
from tracing.order import ExecutionOrder, param_infos, shared_param_map

__all__ = ["empty_order", "fsdp1_targets", "resolve_modules", "short_repr"]


def empty_order(model: nn.Module) -> ExecutionOrder:
    """An order with the model's parameters and modules but no calls."""
    _, shared = shared_param_map(model)
    return ExecutionOrder(
        method="runtime",
        params=param_infos(model),
        shared_params=shared,
        module_classes={fqn: type(m).__name__ for fqn, m in model.named_modules()},
    )


def fsdp1_targets(plan: WrapPlan) -> list[str | nn.Module]:
    fsdp1_modules = getattr(plan, "fsdp1_modules", None)
    if callable(fsdp1_modules):
        return list(fsdp1_modules())
    # Plans without the FSDP1 view: every module of every unit.
    return [fqn for unit in plan.units for fqn in unit.module_fqns]


def resolve_modules(root: nn.Module, targets: Iterable[str | nn.Module]) -> list[nn.Module]:
    modules: list[nn.Module] = []
    for target in targets:
        if isinstance(target, nn.Module):
            modules.append(target)
            continue
        try:
            modules.append(root.get_submodule(target))
        except AttributeError as e:
            raise ValueError(
                f"The wrap plan names module {target!r}, which the model "
                f"({type(root).__name__}) does not have; was the plan or order made for "
                "another model? Capture the order again for this model."
            ) from e
    return modules


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
