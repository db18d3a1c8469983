"""Wrap plans: FSDP units in execution order (STUB: data model fixed, logic being written)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn

from tracing.order import ExecutionOrder

__all__ = ["PlanStats", "WrapPlan", "WrapUnit", "compare_plans", "plan_wrap"]


@dataclass(frozen=True)
class WrapUnit:
    """One FSDP unit (FSDP1) or one ``fully_shard`` group (FSDP2).

    Attributes:
        module_fqns: the module(s) of the unit: one module, or several for a
            merged FSDP2 group (``fully_shard([m1, m2])``), in execution order.
        param_fqns: canonical FQNs of the parameters this unit manages (its
            modules' parameters not managed by a nested unit), in forward order.
        numel: elements over ``param_fqns``.
        bytes: bytes over ``param_fqns`` (numel times each dtype's size).
        first_use: index in ``order.module_forward_order`` of the unit's first
            call (``None`` if never called in forward).
        last_use: index of the unit's last call (``None`` if never called).
    """

    module_fqns: tuple[str, ...]
    param_fqns: tuple[str, ...]
    numel: int
    bytes: int
    first_use: int | None
    last_use: int | None


@dataclass(frozen=True)
class PlanStats:
    """Predicted cost of a plan for one training step (see :meth:`WrapPlan.stats`)."""

    num_units: int
    all_gathers_per_step: int
    all_gathers_per_step_no_reshard: int
    reduce_scatters_per_step: int
    bytes_per_all_gather: tuple[int, ...]
    largest_unit_bytes: int
    peak_unsharded_bytes: int
    prefetch: int


@dataclass
class WrapPlan:
    """Units in execution order, with notes and the order they came from."""

    units: list[WrapUnit]
    order: ExecutionOrder
    atomic_units: list[WrapUnit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bucket_numel: int | None = None
    policy_name: str = ""

    @property
    def groups(self) -> list[list[str]]:
        return [list(u.module_fqns) for u in self.units]

    def stats(self, prefetch: int = 1) -> PlanStats:
        raise NotImplementedError


def plan_wrap(model: nn.Module, order: ExecutionOrder, init_policy: Any = None, **kwargs: Any) -> WrapPlan:
    raise NotImplementedError


def compare_plans(plans: dict[str, WrapPlan], *, prefetch: int = 1) -> list[dict[str, Any]]:
    raise NotImplementedError
