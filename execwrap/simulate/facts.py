"""SimulationFacts: what simulating a plan reads of its order, computed once per order and world size.

:func:`execwrap.simulate.simulate_step` reads the same facts of a plan's
:class:`~tracing.ExecutionOrder` for every plan of that order: the use spans
and the first trainable use (which units run backward, the prefetch
schedule), and each parameter's bytes once FSDP2 pads it for the world size.
It builds them for each call unless given a :class:`SimulationFacts`; the
auto-planner (:class:`execwrap.planning.auto.space.SearchSpace`) keeps one for its
whole search, and the facts keep, per plan simulated with them, what every
simulation of that plan reads whatever its prefetch depth and resharding
(:class:`PlanFacts`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from execwrap.plan.prefetch import prefetch_schedule
from execwrap.plan.spans import OrderFacts
from execwrap.plan.unit import enclosing_units
from execwrap.simulate.unit_spec import UnitSpec
from tracing.order import ExecutionOrder

if TYPE_CHECKING:
    from execwrap.plan.training_step import Precision
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = ["PlanFacts", "SimulationFacts", "padded_bytes", "prefetch_lists"]


def padded_bytes(shape: Sequence[int], numel: int, nbytes: int, world_size: int) -> int:
    """Bytes of one parameter after FSDP2 pads dim 0 to a multiple of ``world_size``.

    >>> padded_bytes((10, 4), 40, 160, 4)
    192
    """
    if numel <= 0:
        return 0
    itemsize = nbytes // numel
    dim0 = shape[0] if shape else 1
    rest = numel // dim0 if dim0 else 0
    return math.ceil(dim0 / world_size) * world_size * rest * itemsize


def prefetch_lists(
    units: Sequence[tuple[Sequence[str], Sequence[str]]],
    order: ExecutionOrder,
    prefetch: int,
    *,
    facts: OrderFacts | None = None,
) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Explicit forward and backward prefetch targets per unit, as ``apply_fully_shard`` sets them.

    Args:
        units: ``(module_fqns, param_fqns)`` per plan unit.
        order: the plan's order.
        prefetch: depth (``0``: no explicit lists).
        facts: ``OrderFacts(order)``, kept by the caller (default: computed).

    Returns:
        ``(forward, backward)``: unit index -> the units it prefetches.
    """
    if prefetch <= 0:
        return {}, {}
    groups = [modules for modules, _ in units]
    params = [p for _, p in units]
    return prefetch_schedule(groups, order, param_fqns=params, prefetch=prefetch, facts=facts)


class SimulationFacts(OrderFacts):
    """:class:`~execwrap.plan.spans.OrderFacts` of ``order`` plus its parameters at ``world_size``.

    Like the order facts, these assume the order does not change while in
    use, nor any plan simulated with them (:meth:`plan` keeps its facts).

    Attributes:
        order: the execution order.
        world_size: ranks (the shard factor).
    """

    def __init__(self, order: ExecutionOrder, world_size: int) -> None:
        super().__init__(order)
        self.world_size = world_size
        self._plans: dict[int, tuple[WrapPlan, PlanFacts]] = {}

    def plan(self, plan: WrapPlan) -> PlanFacts:
        """The :class:`PlanFacts` of ``plan`` (a plan of :attr:`order`), kept per plan."""
        kept = self._plans.get(id(plan))
        if kept is None or kept[0] is not plan:
            kept = self._plans[id(plan)] = (plan, PlanFacts.build(plan, self))
        return kept[1]

    @cached_property
    def padded(self) -> dict[str, int]:
        """Canonical parameter FQN -> its bytes padded as FSDP2 pads (:func:`padded_bytes`)."""
        ws = self.world_size
        return {
            fqn: padded_bytes(info.shape, info.numel, info.bytes, ws)
            for fqn, info in self.order.params.items()
        }

    @cached_property
    def trainable(self) -> dict[str, bool]:
        """Canonical parameter FQN -> its ``requires_grad``."""
        return {fqn: info.requires_grad for fqn, info in self.order.params.items()}

    def param_padded(self, fqn: str) -> int:
        """Padded bytes of parameter ``fqn`` (``0`` if the order does not know it)."""
        return self.padded.get(fqn, 0)

    def requires_grad(self, fqn: str) -> bool:
        """Whether ``fqn`` is trainable (``True`` if the order does not know it)."""
        return self.trainable.get(fqn, True)


@dataclass
class PlanFacts:
    """What simulating one plan reads of it, whatever its prefetch and resharding.

    Attributes:
        specs: one :class:`~execwrap.simulate.unit_spec.UnitSpec` per plan unit,
            each resharding after forward (the simulation sets its own flags).
        forward_order: units that run forward, in plan order, root first.
        trainable_shards: bytes of each trainable parameter's shard on one
            rank (padded dim 0 / world size), unit by unit.
        prefetch: prefetch depth -> the explicit ``(forward, backward)``
            prefetch lists (filled as asked for).
        sized: ``(precision, world size)`` -> :attr:`specs` sized under that precision
            (filled as asked for).
    """

    specs: list[UnitSpec]
    forward_order: list[int]
    trainable_shards: list[int]
    prefetch: dict[int, tuple[dict[int, list[int]], dict[int, list[int]]]] = field(
        default_factory=dict
    )
    sized: dict[tuple[Precision, int], list[UnitSpec]] = field(default_factory=dict)

    @classmethod
    def build(cls, plan: WrapPlan, facts: SimulationFacts) -> PlanFacts:
        """The facts of ``plan`` (a plan of ``facts.order``)."""
        root = plan.root_index
        world_size = facts.world_size
        return cls(
            specs=_unit_specs(plan, facts),
            forward_order=[root]
            + [i for i, u in enumerate(plan.units) if u.first_use is not None and i != root],
            trainable_shards=[
                facts.param_padded(p) // world_size
                for u in plan.units
                for p in u.param_fqns
                if facts.requires_grad(p)
            ],
        )

    def unit_specs(
        self, reshard: Sequence[bool], precision: Precision | None = None, world_size: int = 1
    ) -> list[UnitSpec]:
        """:attr:`specs` with ``reshard`` per unit, sized under ``precision``
        (:meth:`UnitSpec.with_precision` for ``world_size`` ranks, kept per precision)."""
        specs = self.specs
        if precision is not None:
            key = (precision, world_size)
            sized = self.sized.get(key)
            if sized is None:
                sized = self.sized[key] = [s.with_precision(precision, world_size) for s in specs]
            specs = sized
        return [
            s if s.reshard == r else dataclasses.replace(s, reshard=r)
            for s, r in zip(specs, reshard, strict=True)
        ]

    def prefetch_lists(
        self, plan: WrapPlan, facts: SimulationFacts, prefetch: int
    ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """The explicit prefetch lists of ``plan`` at depth ``prefetch``
        (:func:`prefetch_lists`), kept per depth;
        the caller must not change them."""
        lists = self.prefetch.get(prefetch)
        if lists is None:
            lists = self.prefetch[prefetch] = prefetch_lists(
                [(u.module_fqns, u.param_fqns) for u in plan.units],
                plan.order,
                prefetch,
                facts=facts,
            )
        return lists


def _unit_specs(plan: WrapPlan, facts: SimulationFacts) -> list[UnitSpec]:
    runs_bwd = facts.runs_backward([(u.module_fqns, u.param_fqns) for u in plan.units])
    enclosing = enclosing_units(plan.units)
    padded, requires_grad = facts.param_padded, facts.requires_grad
    params = facts.order.params
    specs = []
    for i, u in enumerate(plan.units):
        param_bytes = tuple(padded(p) for p in u.param_fqns)
        specs.append(
            UnitSpec(
                label=u.label,
                nbytes=sum(param_bytes),
                grad_bytes=sum(padded(p) for p in u.param_fqns if requires_grad(p)),
                runs_forward=u.first_use is not None,
                runs_backward=runs_bwd[i] and (u.first_use is not None or u.is_root),
                reshard=True,
                enclosing=frozenset(enclosing[i]),
                tensors=len(u.param_fqns),
                grad_tensors=sum(1 for p in u.param_fqns if requires_grad(p)),
                param_bytes=param_bytes,
                param_dtypes=tuple(
                    params[p].dtype if p in params else "float32" for p in u.param_fqns
                ),
                trainable=tuple(requires_grad(p) for p in u.param_fqns),
            )
        )
    return specs
