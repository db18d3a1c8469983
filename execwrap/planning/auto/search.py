"""The auto-planner: FSDP2 groups, prefetch depth and ``reshard_after_forward``.

``plan_wrap(model, order, init_policy, bucket_numel="auto", cost_model=cm,
world_size=W, memory_budget=B)`` plans the init policy's units as usual,
then :func:`search_plan` picks the plan with the least predicted step time
(:func:`execwrap.simulate.simulate_step`) whose predicted peak memory per rank
stays within ``B`` bytes.

Search space:

* Groupings: the policy's atomic units in execution order; the root, units
  never called and units without parameters stay alone (as in
  :mod:`execwrap.planning.bucketing`), the others (the *mergeable* units) may be cut
  into consecutive groups wherever FSDP2 allows one group (no module nested
  in another, one trainable dtype: :func:`execwrap.planning.bucketing.can_group`).
* Prefetch depth ``p`` in :data:`PREFETCH_DEPTHS` (``apply_fully_shard``'s
  explicit prefetch lists; ``0`` keeps FSDP2's implicit prefetching).
* ``reshard_after_forward`` per group.

Search:

1. Small instances (at most :data:`EXHAUSTIVE_LIMIT` simulations in all):
   every grouping with every prefetch depth and every reshard vector is
   simulated. The result is the exact optimum of the simulator.
2. Otherwise, groupings come from an exact dynamic program
   (:func:`execwrap.planning.auto.partition.best_partition`) over a step time that
   decomposes by group: a group's compute plus the communication its own
   compute does not hide (``overlap`` times its compute; forward only with
   explicit prefetch), each group charged what the simulator charges it
   (:meth:`execwrap.planning.auto.space.SearchSpace.group_seconds`: fixed cost,
   copy-in, collective, copy-out; fixed cost, copy-in, reduce-scatter). On
   CPU FSDP2's collectives block the training thread, nothing overlaps and
   this *is* the simulator's step time up to a constant, so there the DP's
   grouping is the simulator's optimum (a test checks it against brute
   force). Peak memory does not decompose (it depends on which groups are
   unsharded together), so the DP runs under caps on a group's unsharded
   bytes: the largest window of ``k`` consecutive mergeable units, ``k`` in
   :data:`execwrap.planning.auto.space.WINDOW_SIZES` and all of them; a cap allowing
   more than :data:`DP_MAX_GROUP` units per group uses the greedy
   fewest-groups cut under it instead. The DP runs for each prefetch depth,
   resharding after forward and not. Every distinct grouping is simulated
   at prefetch 1, resharding everywhere and nowhere; the :data:`REFINE_TOP`
   best then at every prefetch depth, and with ``reshard_after_forward=False``
   on the last ``k`` groups only (``k`` = 1, 2, 4, ...): the last group's
   backward all-gather is the one no compute hides, and at the start of
   backward (the usual peak) every group kept unsharded counts, wherever it
   sits.
3. Choice: the least predicted step time among candidates within the
   budget; ties go to the lower peak, then fewer groups, then the earlier
   candidate. Nothing is random: the same inputs give the same plan.
4. No candidate fits: :class:`~execwrap.errors.MemoryBudgetError` names the smallest
   peak any candidate reaches (per-unit groups at each prefetch depth,
   resharding everywhere, are always among them) and what dominates it.

Every simulated candidate is kept in ``plan.search`` (the report's
candidates chart).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from execwrap.errors import MemoryBudgetError
from execwrap.plan.search_record import Candidate, CandidateKind, PlanSearch, candidate_label
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.auto.options import AutoOptions, check_auto_options
from execwrap.planning.auto.partition import best_partition
from execwrap.util.formatting import format_bytes

if TYPE_CHECKING:
    from execwrap.cost import CostModel
    from execwrap.planning.auto.space import Grouping, SearchSpace
    from execwrap.simulate import StepEstimate, UnitCompute

__all__ = [
    "DP_MAX_GROUP",
    "EXHAUSTIVE_LIMIT",
    "PREFETCH_DEPTHS",
    "REFINE_TOP",
    "search_checked",
    "search_plan",
]

logger = logging.getLogger(__name__)

#: Prefetch depths searched.
PREFETCH_DEPTHS = (0, 1, 2)
#: Largest number of simulations for which the search enumerates everything.
EXHAUSTIVE_LIMIT = 400
#: Longest group (in mergeable units) the dynamic program considers.
DP_MAX_GROUP = 64
#: Groupings (with their best prefetch depth) whose reshard choices are refined.
REFINE_TOP = 4


def search_plan(
    plan: WrapPlan,
    cost_model: CostModel,
    *,
    world_size: int | None = None,
    memory_budget: int | None = None,
    trainable_dtypes: dict[str, frozenset[str]] | None = None,
    optimizer: str = "adamw",
    compute: UnitCompute | None = None,
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
) -> WrapPlan:
    """The best plan over groupings of ``plan``'s atomic units, prefetch and resharding.

    The search is described in :mod:`execwrap.planning.auto.search`.

    Args:
        plan: the atomic plan (``plan_wrap`` without buckets) of the model.
        cost_model: the :class:`execwrap.cost.CostModel` to predict with.
        world_size: ranks (default ``cost_model.world_size``).
        memory_budget: peak memory per rank, bytes (``None``: no limit).
        trainable_dtypes: module FQN -> dtypes of its unit's trainable
            parameters (default: read from ``plan.order.params``).
        optimizer: the optimizer whose state the memory model counts
            (:data:`execwrap.simulate.OPTIMIZERS`).
        compute: per atomic unit of ``plan`` (in ``plan.units`` order), its
            compute (default: from ``plan.order``'s timing,
            :func:`execwrap.simulate.unit_compute`; without timing, none).
        exhaustive_limit: enumerate everything up to this many simulations.

    Returns:
        A new :class:`WrapPlan` with the chosen ``units``, ``prefetch``,
        ``reshard_after_forward``, ``estimate`` and ``search``; ``plan`` is
        not changed.

    Raises:
        ValueError: the cost model is for another world size or device type
            (``CostModel.check_compatible``), or a bad budget.
        MemoryBudgetError: (a ``PlanError``) no candidate's peak is within
            ``memory_budget`` (the message names the smallest peak reached and
            what dominates it; ``part`` is that part's field).

    Example:
        >>> best = search_plan(plan, CostModel.preset("h100-nvlink-8"))  # doctest: +SKIP
        >>> best.prefetch, best.search.best.label  # doctest: +SKIP
        (1, 'root + 4 groups of 2 units, prefetch 1')
    """
    options = check_auto_options(
        "search_plan", "auto", cost_model, world_size, memory_budget, optimizer=optimizer
    )
    assert options is not None  # bucket_numel="auto" with a cost model
    return search_checked(
        plan,
        options,
        trainable_dtypes=trainable_dtypes,
        compute=compute,
        exhaustive_limit=exhaustive_limit,
    )


def search_checked(
    plan: WrapPlan,
    options: AutoOptions,
    *,
    trainable_dtypes: dict[str, frozenset[str]] | None = None,
    compute: UnitCompute | None = None,
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
) -> WrapPlan:
    """:func:`search_plan` with its options already checked (by :func:`plan_wrap`'s entry).

    Raises:
        ValueError: the order's compute was measured on another device type than the cost
            model's (known only here, from ``compute``).
        MemoryBudgetError: no candidate fits ``options.memory_budget``.
    """
    from execwrap.planning.auto.space import SearchSpace  # the simulator loads only here

    started = time.perf_counter()
    space = SearchSpace.build(
        plan,
        options.cost_model,
        world_size=options.world_size,
        trainable_dtypes=trainable_dtypes,
        optimizer=options.optimizer,
        compute=compute,
    )
    budget = options.memory_budget
    evaluated = _Evaluations(space, budget)
    if 3 * space.count_reshard_groupings() <= exhaustive_limit:
        logger.debug("auto-plan: exhaustive search over %d mergeable unit(s)", space.size)
        for groups in space.all_groupings():
            for flags in _all_flags(len(groups)):
                for p in PREFETCH_DEPTHS:
                    evaluated.add(groups, p, flags, "searched")
    else:
        _heuristic_search(space, evaluated)
    _add_baselines(space, evaluated)
    return _choose(space, evaluated, budget, time.perf_counter() - started)


# ------------------------------------------------------------------ the search
def _heuristic_search(space: SearchSpace, evaluated: _Evaluations) -> None:
    """Step 2 of the module docstring: DP groupings, then prefetch and reshard."""
    groupings = _dp_groupings(space)
    logger.debug("auto-plan: %d distinct grouping(s) from the DP", len(groupings))
    ranked: list[tuple[tuple[int, float], int]] = []
    for g, groups in enumerate(groupings):
        n = len(groups)
        keys = []
        for flags in ((True,) * n, (False,) * n):
            c = evaluated.add(groups, 1, flags, "searched")
            keys.append(_rank_key(c))
        ranked.append((min(keys), g))
    ranked.sort()
    for _, g in ranked[:REFINE_TOP]:
        groups = groupings[g]
        n = len(groups)
        for p in PREFETCH_DEPTHS:
            for flags in ((True,) * n, (False,) * n):
                evaluated.add(groups, p, flags, "searched")
        best_p = min(
            PREFETCH_DEPTHS,
            key=lambda p: _rank_key(evaluated.get(groups, p, (True,) * n)),
        )
        for k in _last_k_values(n)[:-1]:  # k = n (no reshard at all) was simulated above
            evaluated.add(groups, best_p, tuple(i < n - k for i in range(n)), "searched")


def _rank_key(c: Candidate) -> tuple[int, float]:
    """Fitting candidates by step time, before the others by peak."""
    return (0, c.step_time_s) if c.fits else (1, float(c.peak_memory_bytes))


def _dp_groupings(space: SearchSpace) -> list[Grouping]:
    """Distinct groupings: the greedy fewest-groups cut and the DP under each cap,
    for every prefetch depth, resharding after forward or not; in the order
    first found."""
    found: dict[Grouping, None] = {}
    for k, cap in space.window_caps():
        found.setdefault(space.greedy_groups(cap), None)
        if space.longest_group(cap) > DP_MAX_GROUP:
            continue
        reach = space.capped_reach(cap)
        for reshard in (True, False):
            for p in space.distinct_prefetch_costs():

                def cost(i: int, j: int, p: int = p, reshard: bool = reshard) -> float:
                    return space.group_cost(i, j, p, reshard=reshard)

                _, groups = best_partition(reach, cost)
                found.setdefault(tuple(groups), None)
        logger.debug("auto-plan: cap of %d unit(s) (%d bytes) searched", k, cap)
    return list(found)


def _last_k_values(n: int) -> list[int]:
    """``1, 2, 4, ...`` below ``n``, then ``n`` (groups left unsharded after forward)."""
    values: list[int] = []
    k = 1
    while k < n:
        values.append(k)
        k *= 2
    return [*values, n] if n else []


def _all_flags(n: int) -> Iterator[tuple[bool, ...]]:
    """Every reshard vector of ``n`` groups, all-``True`` first."""
    for bits in range(2**n):
        yield tuple(not (bits >> (n - 1 - i)) & 1 for i in range(n))


def _add_baselines(space: SearchSpace, evaluated: _Evaluations) -> None:
    """Per-unit groups at each prefetch depth (prefetch 0 is the least memory a
    plan can need) and the fewest groups, all resharding."""
    m = space.size
    per_unit = tuple((i, i + 1) for i in range(m))
    for p in PREFETCH_DEPTHS:
        evaluated.add(per_unit, p, (True,) * m, "baseline", label=f"per-unit, prefetch {p}")
    fewest = space.greedy_groups(math.inf)
    evaluated.add(fewest, 1, (True,) * len(fewest), "baseline", label="fewest groups, prefetch 1")


# ------------------------------------------------------------ bookkeeping
class _Evaluations:
    """Simulated candidates, each once, in the order first asked for."""

    def __init__(self, space: SearchSpace, budget: int | None) -> None:
        self.space = space
        self.budget = budget
        self.candidates: list[Candidate] = []
        self.estimates: list[StepEstimate] = []
        self.keys: list[tuple[tuple[tuple[int, int], ...], int, tuple[bool, ...]]] = []
        self._index: dict[tuple[tuple[tuple[int, int], ...], int, tuple[bool, ...]], int] = {}

    def get(self, groups: Grouping, prefetch: int, flags: tuple[bool, ...]) -> Candidate:
        """The candidate already simulated for these choices."""
        return self.candidates[self._index[(groups, prefetch, flags)]]

    def add(
        self,
        groups: tuple[tuple[int, int], ...],
        prefetch: int,
        flags: tuple[bool, ...],
        kind: CandidateKind,
        *,
        label: str | None = None,
    ) -> Candidate:
        """Simulate (once) and record; a baseline's label and kind win over a
        searched duplicate's."""
        key = (groups, prefetch, flags)
        if key in self._index:
            i = self._index[key]
            if kind == "baseline" and label is not None:
                self.candidates[i] = dataclasses.replace(self.candidates[i], kind=kind, label=label)
            return self.candidates[i]
        estimate = self.space.simulate(groups, prefetch, flags)
        peak = int(estimate.peak_memory_bytes)
        candidate = Candidate(
            label=label or candidate_label([j - i for i, j in groups], prefetch, flags),
            kind=kind,
            group_sizes=tuple(j - i for i, j in groups),
            prefetch=prefetch,
            reshard_after_forward=flags,
            step_time_s=float(estimate.step_time_s),
            peak_memory_bytes=peak,
            fits=self.budget is None or peak <= self.budget,
        )
        self._index[key] = len(self.candidates)
        self.candidates.append(candidate)
        self.estimates.append(estimate)
        self.keys.append(key)
        return candidate


def _choose(
    space: SearchSpace, evaluated: _Evaluations, budget: int | None, seconds: float
) -> WrapPlan:
    """Step 3 and 4: the best fitting candidate as a plan, or :class:`MemoryBudgetError`."""
    cands = evaluated.candidates
    fitting = [i for i, c in enumerate(cands) if c.fits]
    if not fitting:
        raise _nothing_fits(space, evaluated, budget)
    best = min(
        fitting,
        key=lambda i: (cands[i].step_time_s, cands[i].peak_memory_bytes, cands[i].num_groups, i),
    )
    groups, prefetch, flags = evaluated.keys[best]
    plan = space.plan_for(groups)
    search = PlanSearch(
        candidates=tuple(cands),
        chosen=best,
        memory_budget=budget,
        world_size=space.world_size,
        cost_model=space.cost_model_line(),
        seconds=seconds,
    )
    logger.info(
        "auto-plan: %s (predicted step %.4g s, peak %d bytes) out of %d candidate(s) in %.2f s",
        cands[best].label,
        cands[best].step_time_s,
        cands[best].peak_memory_bytes,
        len(cands),
        seconds,
    )
    return dataclasses.replace(
        plan,
        prefetch=prefetch,
        reshard_after_forward=space.unit_flags(plan, groups, flags),
        estimate=evaluated.estimates[best],
        search=search,
    )


def _nothing_fits(
    space: SearchSpace, evaluated: _Evaluations, budget: int | None
) -> MemoryBudgetError:
    cands = evaluated.candidates
    smallest = min(range(len(cands)), key=lambda i: (cands[i].peak_memory_bytes, i))
    estimate = evaluated.estimates[smallest]
    part, nbytes = space.dominant_part(estimate)
    parts = {k: v for k, v in estimate.memory.to_dict().items() if k != "total"}
    finding = (
        f"no plan fits the memory budget of {_bytes_text(budget or 0)} per rank: the smallest peak any "
        f"candidate reaches is {_bytes_text(cands[smallest].peak_memory_bytes)} "
        f"({cands[smallest].label}; {len(cands)} candidate(s) simulated for "
        f"{space.world_size} rank(s)), dominated by {part} ({_bytes_text(nbytes)})"
    )
    key = max(parts, key=lambda k: (parts[k], k))  # the field dominant_part named
    return MemoryBudgetError(f"{finding}; {space.dominant_hint(part)}", part=key, finding=finding)


def _bytes_text(nbytes: int) -> str:
    return f"{format_bytes(nbytes)} ({nbytes} bytes)"
