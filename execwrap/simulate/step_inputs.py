"""The checked inputs of :func:`~execwrap.simulate.step.simulate_step`.

Each keyword of ``simulate_step`` that may be left out or given in several forms
becomes one checked value here: the cost model one shard group of a mesh sees
(:func:`cost_model_for_mesh`), the per-unit compute (:func:`checked_compute`), the
order's facts (:func:`checked_facts`), the prefetch depth and resharding an auto
plan chose (:func:`own_choices`) and one ``reshard_after_forward`` flag per unit
(:func:`reshard_flags`). Errors start with ``simulate_step:``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from execwrap.cost.model import CostModel
from execwrap.simulate.compute import UnitCompute, unit_compute
from execwrap.simulate.facts import SimulationFacts
from execwrap.util.mesh import MeshShape

if TYPE_CHECKING:
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = [
    "checked_compute",
    "checked_facts",
    "cost_model_for_mesh",
    "own_choices",
    "reshard_flags",
]


def cost_model_for_mesh(
    plan: WrapPlan, cost_model: CostModel, world_size: int, mesh: Any
) -> tuple[CostModel, int]:
    """The cost model one shard group of ``mesh`` sees (default: ``plan.mesh``, unless
    the model is already for a mesh), and its ranks."""
    mesh = plan.mesh if mesh is None and cost_model.mesh is None else mesh
    if mesh is None:
        return cost_model, world_size
    resolved = cost_model.for_mesh(MeshShape.of(mesh, world_size=world_size, where="simulate_step"))
    return resolved, resolved.world_size


def checked_compute(
    plan: WrapPlan, cost_model: CostModel, compute: UnitCompute | None
) -> UnitCompute:
    """``compute`` (default: from the plan's order), checked against the plan and the device."""
    n = len(plan.units)
    compute = unit_compute(plan) if compute is None else compute
    if len(compute) != n:
        raise ValueError(f"simulate_step: compute has {len(compute)} units, the plan has {n}")
    if compute.device_type and compute.device_type != cost_model.device_type:
        raise ValueError(
            f"simulate_step: the compute times are for device type {compute.device_type!r} but the "
            f"cost model is for {cost_model.device_type!r}; capture the timing on the target device "
            "or estimate it (record_execution_order on the meta device with "
            "timing=cost_model.compute)"
        )
    return compute


def checked_facts(
    plan: WrapPlan, world_size: int, facts: SimulationFacts | None
) -> SimulationFacts:
    """``facts`` (default: built for the plan's order), checked against it and ``world_size``."""
    if facts is None:
        return SimulationFacts(plan.order, world_size)
    if facts.order is not plan.order or facts.world_size != world_size:
        raise ValueError(
            f"simulate_step: facts are for another order or world size ({facts.world_size} "
            f"rank(s)) than the plan's order at {world_size} rank(s)"
        )
    return facts


def own_choices(
    plan: WrapPlan, prefetch: int | None, reshard: bool | Sequence[bool] | None
) -> tuple[int, bool | Sequence[bool] | None]:
    """``prefetch`` and ``reshard``, each ``None`` replaced by the plan's own choice
    (an auto plan's), else by 1 and ``None`` (FSDP2's default)."""
    if prefetch is None:
        prefetch = 1 if plan.prefetch is None else plan.prefetch
    if reshard is None and plan.reshard_after_forward is not None:
        reshard = list(plan.reshard_after_forward)
    return prefetch, reshard


def reshard_flags(plan: WrapPlan, value: bool | Sequence[bool] | None) -> list[bool]:
    """``reshard_after_forward`` as one flag per plan unit (``None``: FSDP2's default)."""
    n = len(plan.units)
    if value is None:  # FSDP2's default: the root keeps its parameters after forward
        root = plan.root_index
        return [i != root for i in range(n)]
    if isinstance(value, bool):
        return [value] * n
    flags = list(value)
    if len(flags) != n or not all(isinstance(f, bool) for f in flags):
        raise ValueError(
            f"simulate_step: reshard_after_forward must be None, a bool or one bool per plan unit "
            f"({n}), got {value!r}"
        )
    return flags
