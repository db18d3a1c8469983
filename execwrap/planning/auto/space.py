"""The auto-planner's search space: which atomic units may merge, and what a grouping costs.

A :class:`SearchSpace` is built once per :func:`~execwrap.planning.auto.search.search_plan`
call from the atomic plan: the *mergeable* units (not the root, called, with
parameters) in execution order, how far a group starting at each may reach
(FSDP2's rules: :func:`execwrap.planning.bucketing.can_group`), their bytes and their
compute from the capture (:func:`execwrap.simulate.unit_compute`). A grouping
is a tuple of ``(start, stop)`` intervals over the mergeable units; the space
turns it into a :class:`~execwrap.plan.wrap_plan.WrapPlan` (cached), simulates it, and
prices one group for the dynamic program (:meth:`SearchSpace.group_cost`).
Its per-unit helpers are in :mod:`execwrap.planning.auto.mergeable`.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from execwrap.plan.training_step import TrainingStep
from execwrap.plan.unit import enclosing_units
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.auto import mergeable
from execwrap.planning.auto.checkpoint_fill import GroupCheckpointing
from execwrap.planning.bucketing import merge_units
from execwrap.simulate import UnitCompute, unit_compute
from execwrap.simulate.compute import NO_COMPUTE_TIMES
from execwrap.simulate.facts import SimulationFacts
from execwrap.simulate.step import step_estimate

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from execwrap.cost import CostModel
    from execwrap.simulate import StepEstimate

__all__ = ["Grouping", "SearchSpace", "WINDOW_SIZES"]

#: A grouping of the mergeable units: ``(start, stop)`` intervals, in order.
Grouping = tuple[tuple[int, int], ...]

#: Group lengths (in mergeable units) whose largest window gives a DP cap.
WINDOW_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass
class SearchSpace:
    """The mergeable units of an atomic plan and the cost model to price them.

    Attributes:
        plan: the atomic plan (one module per unit).
        cost_model: the cost model.
        world_size: ranks.
        optimizer: the optimizer whose state counts in memory.
        compute: per-unit compute of ``plan`` (shared by every candidate).
        movable: indices into ``plan.units`` of the mergeable units, in order.
        reach: for each mergeable unit ``i``, the largest ``j`` such that
            mergeable units ``[i, j)`` may form one FSDP2 group.
        nbytes: unsharded parameter bytes per mergeable unit.
        grad_bytes: bytes of its trainable parameters (its gradients).
        forward_s: forward compute seconds per mergeable unit.
        backward_s: backward compute seconds per mergeable unit.
        tensors: parameter tensors per mergeable unit (the fixed cost of a
            collective grows with them: ``CostModel.collective_overhead``).
        grad_tensors: trainable parameter tensors per mergeable unit.
        copy_out_s: seconds of its all-gather copy-out
            (``CostModel.copy_out_time`` of its parameters: FSDP2 copies per
            parameter, so a group's copy-out is the sum of its units').
        step: the training step simulated (the user's precision and micro-batches;
            :meth:`simulate` takes another variant of it and each group's checkpointing).
        checkpointing: what each checkpointing mode of a group keeps and recomputes
            (:class:`~execwrap.planning.auto.checkpoint_fill.GroupCheckpointing`).
    """

    plan: WrapPlan
    cost_model: CostModel
    world_size: int
    optimizer: str
    compute: UnitCompute
    movable: list[int]
    reach: list[int]
    nbytes: list[int]
    grad_bytes: list[int]
    forward_s: list[float]
    backward_s: list[float]
    tensors: list[int] = field(default_factory=list)
    grad_tensors: list[int] = field(default_factory=list)
    copy_out_s: list[float] = field(default_factory=list)
    step: TrainingStep = field(default_factory=TrainingStep)
    checkpointing: GroupCheckpointing | None = None
    _prefix: list[list[float]] = field(default_factory=list, repr=False)
    _plans: dict[Grouping, tuple[WrapPlan, UnitCompute]] = field(default_factory=dict, repr=False)
    _seconds: dict[tuple[int, int, int, int], tuple[float, float]] = field(
        default_factory=dict, repr=False
    )
    _costs: dict[tuple[int, int, int, bool, str], float] = field(default_factory=dict, repr=False)
    _facts: SimulationFacts | None = field(default=None, repr=False)  # set by build

    @classmethod
    def build(
        cls,
        plan: WrapPlan,
        cost_model: CostModel,
        *,
        world_size: int | None,
        trainable_dtypes: dict[str, frozenset[str]] | None,
        optimizer: str,
        compute: UnitCompute | None = None,
        step: TrainingStep | None = None,
        search_checkpointing: bool = False,
    ) -> SearchSpace:
        """The search space of atomic ``plan`` (see the module docstring), for ``step``
        (default: float32, one micro-batch), with each group's checkpointing mode among
        those searched when ``search_checkpointing``.

        Raises:
            ValueError: ``cost_model`` is for another world size or device
                type than the one planned for.
        """
        ranks = cost_model.world_size if world_size is None else world_size
        compute = _atomic_compute(plan) if compute is None else compute
        if len(compute) != len(plan.units):
            raise ValueError(
                f"search_plan: compute has {len(compute)} entries, the plan has "
                f"{len(plan.units)} units"
            )
        device = compute.device_type or cost_model.device_type
        cost_model.check_compatible(world_size=ranks, device_type=device)
        units = plan.units
        movable = [
            i for i, u in enumerate(units) if not u.is_root and u.first_use is not None and u.numel
        ]
        dtypes = (
            trainable_dtypes if trainable_dtypes is not None else mergeable.trainable_dtypes(plan)
        )
        forward, backward = _unit_seconds(compute, plan, movable)
        facts = SimulationFacts(plan.order, ranks)  # one for the whole search
        padded = [mergeable.padded_unit_bytes(facts, units[i]) for i in movable]
        space = cls(
            plan=plan,
            cost_model=cost_model,
            world_size=ranks,
            optimizer=optimizer,
            compute=compute,
            movable=movable,
            reach=mergeable.group_reach([units[i] for i in movable], dtypes),
            nbytes=[b for b, _ in padded],
            grad_bytes=[g for _, g in padded],
            forward_s=forward,
            backward_s=backward,
            tensors=[len(units[i].param_fqns) for i in movable],
            grad_tensors=[mergeable.trainable_count(facts, units[i]) for i in movable],
            copy_out_s=[
                cost_model.copy_out_time(mergeable.param_padded_bytes(facts, units[i]))
                for i in movable
            ],
            step=step or TrainingStep(),
            checkpointing=GroupCheckpointing.build(
                compute,
                movable,
                _outermost(plan, movable),
                search_checkpointing,
                cost_model.checkpoint_overhead,
            ),
            _facts=facts,
        )
        space._prefix = [
            _prefix_sums(v)
            for v in (
                space.nbytes,
                space.grad_bytes,
                space.forward_s,
                space.backward_s,
                space.tensors,
                space.grad_tensors,
                space.copy_out_s,
            )
        ]
        return space

    @property
    def size(self) -> int:
        """Number of mergeable units."""
        return len(self.movable)

    # ------------------------------------------------------------ groupings
    def group_bytes(self, i: int, j: int) -> int:
        """Unsharded parameter bytes of mergeable units ``[i, j)``."""
        return int(self._prefix[0][j] - self._prefix[0][i])

    def window_caps(self) -> list[tuple[int, int]]:
        """``(k, cap)``: for each ``k`` in :data:`WINDOW_SIZES` below the number of
        mergeable units, and for all of them, the largest bytes of ``k``
        consecutive mergeable units; distinct caps only, ascending."""
        m = self.size
        out: list[tuple[int, int]] = []
        for k in [w for w in WINDOW_SIZES if w < m] + ([m] if m else []):
            cap = max(self.group_bytes(s, s + k) for s in range(m - k + 1))
            if not out or cap > out[-1][1]:
                out.append((k, cap))
        return out

    def capped_reach(self, cap: float) -> list[int]:
        """:attr:`reach` further limited to groups of at most ``cap`` bytes (a
        unit alone is always allowed); non-decreasing."""
        prefix = self._prefix[0]
        out: list[int] = []
        for i in range(self.size):
            j = bisect.bisect_right(prefix, prefix[i] + cap) - 1
            out.append(max(i + 1, min(self.reach[i], j)))
        return out

    def longest_group(self, cap: float) -> int:
        """Most mergeable units one group may hold under ``cap`` bytes."""
        return max((r - i for i, r in enumerate(self.capped_reach(cap))), default=0)

    def greedy_groups(self, cap: float) -> Grouping:
        """The fewest groups under ``cap`` bytes: extend each group while allowed."""
        reach = self.capped_reach(cap)
        groups: list[tuple[int, int]] = []
        i = 0
        while i < self.size:
            groups.append((i, reach[i]))
            i = reach[i]
        return tuple(groups)

    def count_reshard_groupings(self, limit: int = 10**6) -> int:
        """Sum over every allowed grouping of ``2 ** groups`` (each group may
        reshard or not), saturating just above ``limit``."""
        m = self.size
        count = [0] * (m + 1)
        count[0] = 1
        for i in range(m):
            if count[i]:
                for j in range(i + 1, self.reach[i] + 1):
                    count[j] = min(limit + 1, count[j] + 2 * count[i])
        return count[m]

    def all_groupings(self) -> Iterator[Grouping]:
        """Every allowed grouping, fewest cuts last (depth first from the left)."""

        def rest(i: int) -> Iterator[Grouping]:
            if i == self.size:
                yield ()
                return
            for j in range(self.reach[i], i, -1):
                for tail in rest(j):
                    yield ((i, j), *tail)

        yield from rest(0)

    # ----------------------------------------------------------- the DP cost
    def distinct_prefetch_costs(self) -> tuple[int, ...]:
        """Prefetch depths whose :meth:`group_cost` differ: the cost only tells
        "explicit prefetch or not" apart, and nothing on CPU or without overlap."""
        cm = self.cost_model
        return (1,) if cm.synchronous_collectives or cm.overlap == 0 else (0, 1)

    def group_seconds(
        self,
        nbytes: int,
        grad_bytes: int,
        tensors: int,
        grad_tensors: int,
        copy_out_s: float,
    ) -> tuple[float, float]:
        """Seconds the simulator charges one group of ``nbytes`` (padded) parameter
        bytes in ``tensors`` tensors, ``grad_bytes`` (padded) of them trainable in
        ``grad_tensors`` tensors, for its all-gather and its reduce-scatter, as
        :class:`execwrap.simulate.schedule.StepProgram`'s
        ``unshard``/``wait_for_unshard`` and ``post_backward`` charge them: the
        fixed cost of a collective (``CostModel.collective_overhead``), copy-in
        of the shard, the all-gather, the copy-out (``copy_out_s``: the sum of
        its parameters' ``CostModel.copy_out_time``); the fixed cost, the
        gradients' copy-in, the reduce-scatter (``0`` without trainable bytes).

        The sizes' part is cached by the four integers (groups of equal blocks
        share it, wherever they sit); ``copy_out_s``, a difference of prefix
        sums that rounds differently at each position, is added after."""
        key = (nbytes, grad_bytes, tensors, grad_tensors)
        cached = self._seconds.get(key)
        if cached is None:
            cm = self.cost_model
            all_gather = 0.0
            if nbytes > 0:
                all_gather = (
                    cm.collective_overhead(tensors)
                    + cm.copy_time(nbytes // self.world_size)
                    + cm.all_gather_time(nbytes)
                )
            reduce_scatter = 0.0
            if grad_bytes > 0:
                reduce_scatter = (
                    cm.collective_overhead(grad_tensors)
                    + cm.copy_time(grad_bytes)
                    + cm.reduce_scatter_time(grad_bytes)
                )
            cached = self._seconds[key] = (all_gather, reduce_scatter)
        all_gather, reduce_scatter = cached
        return (all_gather + copy_out_s if nbytes > 0 else 0.0), reduce_scatter

    def group_cost(
        self, i: int, j: int, prefetch: int, *, reshard: bool = True, mode: str = "none"
    ) -> float:
        """Seconds one group ``[i, j)`` adds to a step in the decomposable model of
        :mod:`execwrap.planning.auto.search`: its compute plus the communication its own
        compute does not hide (on CPU, where collectives block the training
        thread: none, but the waits for the slowest rank after its forward and
        backward, ``CostModel.sync_wait_time``); without ``reshard`` no backward
        all-gather; under checkpointing ``mode`` the recomputed forward runs in backward
        (and hides communication there). Cached per group and choices (the DP asks again
        under each cap)."""
        key = (i, j, prefetch, reshard, mode)
        cached = self._costs.get(key)
        if cached is None:
            cached = self._costs[key] = self._group_cost(i, j, prefetch, reshard, mode)
        return cached

    def _group_cost(self, i: int, j: int, prefetch: int, reshard: bool, mode: str) -> float:
        p_bytes, p_grads, p_fwd, p_bwd, p_tensors, p_grad_tensors, p_copy = self._prefix
        fwd = p_fwd[j] - p_fwd[i]
        bwd = p_bwd[j] - p_bwd[i]
        if mode != "none" and self.checkpointing is not None:
            bwd += self.checkpointing.recompute_s(i, j, mode)
        all_gather, reduce_scatter = self.group_seconds(
            int(p_bytes[j] - p_bytes[i]),
            int(p_grads[j] - p_grads[i]),
            int(p_tensors[j] - p_tensors[i]),
            int(p_grad_tensors[j] - p_grad_tensors[i]),
            p_copy[j] - p_copy[i],
        )
        cm = self.cost_model
        overlap = 0.0 if cm.synchronous_collectives else cm.overlap
        hidden_fwd = overlap * fwd if prefetch > 0 else 0.0
        exposed_fwd = max(0.0, all_gather - hidden_fwd)
        exposed_bwd = max(0.0, (all_gather if reshard else 0.0) + reduce_scatter - overlap * bwd)
        waits = (
            cm.sync_wait_time(fwd) + cm.sync_wait_time(bwd) if cm.synchronous_collectives else 0.0
        )
        return fwd + bwd + exposed_fwd + exposed_bwd + waits

    # ----------------------------------------------------- plans and estimates
    def plan_for(self, groups: Grouping) -> WrapPlan:
        """The plan of ``groups``: merged mergeable units plus the fixed ones, by
        first use (cached)."""
        return self._planned(groups)[0]

    def _planned(self, groups: Grouping) -> tuple[WrapPlan, UnitCompute]:
        """The plan of ``groups`` and its compute (the atomic units' summed)."""
        if groups not in self._plans:
            units = self.plan.units
            movable = set(self.movable)
            members = [[i] for i in range(len(units)) if i not in movable]
            members += [[self.movable[k] for k in range(i, j)] for i, j in groups]
            merged = [(merge_units([units[i] for i in m]), m) for m in members]
            merged.sort(key=lambda um: (um[0].first_use is None, um[0].first_use or 0))
            plan = dataclasses.replace(self.plan, units=[u for u, _ in merged], bucket_numel=None)
            self._plans[groups] = (plan, self.compute.merge([m for _, m in merged]))
        return self._plans[groups]

    def unit_flags(
        self, plan: WrapPlan, groups: Grouping, flags: tuple[bool, ...]
    ) -> tuple[bool, ...]:
        """``reshard_after_forward`` per unit of ``plan`` (the plan of ``groups``):
        the group's flag for merged groups, ``False`` for the root (FSDP2's
        default: the root never reshards after forward), ``True`` for the other
        fixed units (nothing to reshard)."""
        by_first = {
            self.plan.units[self.movable[i]].module_fqns[0]: f
            for (i, _), f in zip(groups, flags, strict=True)
        }
        return tuple(
            False if u.is_root else by_first.get(u.module_fqns[0], True) for u in plan.units
        )

    def simulate(
        self,
        groups: Grouping,
        prefetch: int,
        flags: tuple[bool, ...],
        modes: tuple[str, ...] | None = None,
        step: TrainingStep | None = None,
        *,
        detail: bool = False,
    ) -> StepEstimate:
        """The simulator's estimate of ``groups`` at ``prefetch`` with ``flags``, each
        group checkpointed as ``modes`` says (default: none), for ``step`` (default:
        :attr:`step`); without its timelines unless ``detail`` (a search keeps many
        estimates and shows one: :func:`~execwrap.simulate.step.step_estimate`)."""
        plan, compute = self._planned(groups)
        return step_estimate(
            plan,
            self.cost_model,
            world_size=self.world_size,
            prefetch=prefetch,
            reshard_after_forward=self.unit_flags(plan, groups, flags),
            optimizer=self.optimizer,
            compute=compute,
            facts=self._facts,
            training=self.step_for(groups, modes, step),
            detail=detail,
        )

    def step_for(
        self, groups: Grouping, modes: tuple[str, ...] | None, step: TrainingStep | None = None
    ) -> TrainingStep:
        """``step`` (default :attr:`step`) with each group of ``groups`` checkpointed as
        ``modes`` says, keyed by the group's first module FQN."""
        base = step or self.step
        if modes is None or all(m == "none" for m in modes):
            return base
        units = self.plan.units
        per_unit: dict[int | str, str] = {
            units[self.movable[i]].module_fqns[0]: m
            for (i, _), m in zip(groups, modes, strict=True)
            if m != "none"
        }
        return dataclasses.replace(base, unit_checkpointing=per_unit)


# ------------------------------------------------------------------ helpers
def _atomic_compute(plan: WrapPlan) -> UnitCompute:
    """Compute per atomic unit from the order's timing; without timing, none
    (one WARNING: the plan then weighs communication and memory only)."""
    if plan.order.has_timing:
        return unit_compute(plan)
    logger.warning(NO_COMPUTE_TIMES)
    return UnitCompute.zeros(len(plan.units))


def _outermost(plan: WrapPlan, movable: list[int]) -> list[bool]:
    """Per mergeable unit, whether no other non-root unit encloses it (the units
    checkpointing applies to)."""
    root = plan.root_index
    enclosing = enclosing_units(plan.units)
    return [not (enclosing[i] - {root}) for i in movable]


def _unit_seconds(
    compute: UnitCompute, plan: WrapPlan, movable: list[int]
) -> tuple[list[float], list[float]]:
    """Forward and backward compute seconds of each mergeable unit."""
    fwd = [float(compute.forward_s[i]) for i in movable]
    bwd = [float(compute.backward_s[i]) for i in movable]
    return fwd, bwd


def _prefix_sums(values: list[int] | list[float]) -> list[float]:
    out = [0.0]
    for v in values:
        out.append(out[-1] + v)
    return out
