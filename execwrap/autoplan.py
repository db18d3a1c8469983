"""The auto-planner: FSDP2 groups, prefetch depth and ``reshard_after_forward``.

``plan_wrap(model, order, init_policy, bucket_numel="auto", cost_model=cm,
world_size=W, memory_budget=B)`` plans the init policy's units as usual,
then :func:`search_plan` picks the plan with the least predicted step time
(:func:`execwrap.simulate.simulate_step`) whose predicted peak memory per rank
stays within ``B`` bytes.

Search space:

* Groupings: the policy's atomic units in execution order; the root, units
  never called and units without parameters stay alone (as in
  :mod:`execwrap.bucketing`), the others (the *mergeable* units) may be cut
  into consecutive groups wherever FSDP2 allows one group (no module nested
  in another, one trainable dtype: :func:`execwrap.bucketing.can_group`).
* Prefetch depth ``p`` in :data:`PREFETCH_DEPTHS` (``apply_fully_shard``'s
  explicit prefetch lists; ``0`` keeps FSDP2's implicit prefetching).
* ``reshard_after_forward`` per group.

Search:

1. Small instances (at most :data:`EXHAUSTIVE_LIMIT` simulations in all):
   every grouping with every prefetch depth and every reshard vector is
   simulated. The result is the exact optimum of the simulator.
2. Otherwise, groupings come from an exact dynamic program
   (:func:`execwrap.partition.best_partition`) over a step time that
   decomposes by group: a group's compute plus the communication its own
   compute does not hide (``overlap`` times its compute, forward only with
   explicit prefetch), with the collective times of
   :func:`execwrap.simulate.group_comm_times`. When the cost model's
   ``overlap`` is 0 nothing is hidden and this is the simulator's step time
   up to a constant, so the DP's grouping is the simulator's optimum. Peak
   memory does not decompose (it depends on which groups are unsharded
   together), so the DP runs under caps on a group's unsharded bytes: the
   largest window of ``k`` consecutive mergeable units, ``k`` in 1, 2, 3, 4,
   6, 8, 12, ... up to all of them; a cap allowing more than
   :data:`DP_MAX_GROUP` units per group uses the greedy fewest-groups cut
   under that cap instead (:func:`execwrap.bucketing.min_contiguous_groups`'s
   scan). Each distinct grouping is then simulated at every prefetch depth
   with resharding everywhere; for the :data:`REFINE_TOP` best,
   ``reshard_after_forward=False`` is tried on the last ``k`` groups in
   forward order (``k`` = 1, 2, 4, ..., all): the last group's backward
   all-gather is the one no compute hides, and at the start of backward
   (the usual peak) every group kept unsharded counts, wherever it sits.
3. Choice: the least predicted step time among candidates within the
   budget; ties go to the lower peak, then fewer groups, then the earlier
   candidate. Nothing is random: the same inputs give the same plan.
4. No candidate fits: :class:`~execwrap.errors.PlanError` names the smallest
   peak any candidate reaches (per-unit groups, prefetch 0, resharding
   everywhere is always among them) and what dominates it.

Every simulated candidate is kept in ``plan.search`` (the report's
candidates chart).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from execwrap.errors import PlanError
from execwrap.partition import best_partition
from execwrap.plan import WrapPlan
from execwrap.plan_search import Candidate, CandidateKind, PlanSearch
from tracing.checks import check_int, is_int

if TYPE_CHECKING:
    from execwrap.cost import CostModel
    from execwrap.search_space import SearchSpace
    from execwrap.simulate import StepEstimate

__all__ = [
    "DP_MAX_GROUP",
    "EXHAUSTIVE_LIMIT",
    "PREFETCH_DEPTHS",
    "REFINE_TOP",
    "check_auto_options",
    "check_memory_budget",
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


def check_memory_budget(memory_budget: Any, where: str) -> int | None:
    """``memory_budget`` (bytes per rank, or ``None``), checked.

    Raises:
        TypeError: not an int (or a bool) or ``None``.
        ValueError: zero or negative.
    """
    if memory_budget is None:
        return None
    if not is_int(memory_budget):
        raise TypeError(
            f"{where}: memory_budget must be a number of bytes per rank (int) or None, got "
            f"{type(memory_budget).__name__} {memory_budget!r}"
        )
    if memory_budget <= 0:
        raise ValueError(
            f"{where}: memory_budget must be > 0 bytes per rank, got {memory_budget!r}; pass "
            "None for no limit"
        )
    return int(memory_budget)


def check_auto_options(
    where: str,
    bucket_numel: Any,
    cost_model: Any,
    world_size: Any,
    memory_budget: Any,
) -> None:
    """Check the auto-planner's keywords of ``plan_wrap`` / ``ParamExecOrderWrapPolicy``.

    Raises:
        ValueError: ``bucket_numel="auto"`` without a cost model; a cost
            model, world size or budget without ``bucket_numel="auto"``; a
            world size or budget that is not positive.
        TypeError: a world size or budget that is not an int.
    """
    check_memory_budget(memory_budget, where)
    if world_size is not None:
        check_int(world_size, f"{where}: world_size", minimum=1, unit="ranks")
    if bucket_numel == "auto":
        if cost_model is None:
            raise ValueError(
                f'{where}: bucket_numel="auto" needs cost_model= (execwrap.cost.CostModel: '
                'CostModel.calibrate() on the live process group, or CostModel.preset("...")) '
                "to predict step times"
            )
        return
    given = [
        name
        for name, value in (
            ("cost_model", cost_model),
            ("world_size", world_size),
            ("memory_budget", memory_budget),
        )
        if value is not None
    ]
    if given:
        raise ValueError(
            f'{where}: {", ".join(given)} only apply with bucket_numel="auto" (got '
            f"bucket_numel={bucket_numel!r}); to predict a fixed plan's step call "
            "execwrap.simulate_step(plan, cost_model, world_size=...)"
        )


def search_plan(
    plan: WrapPlan,
    cost_model: CostModel,
    *,
    world_size: int | None = None,
    memory_budget: int | None = None,
    trainable_dtypes: dict[str, frozenset[str]] | None = None,
    optimizer: str = "adamw",
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
) -> WrapPlan:
    """The best plan over groupings of ``plan``'s atomic units, prefetch and resharding.

    The search is described in :mod:`execwrap.autoplan`.

    Args:
        plan: the atomic plan (``plan_wrap`` without buckets) of the model.
        cost_model: the :class:`execwrap.cost.CostModel` to predict with.
        world_size: ranks (default ``cost_model.world_size``).
        memory_budget: peak memory per rank, bytes (``None``: no limit).
        trainable_dtypes: module FQN -> dtypes of its unit's trainable
            parameters (default: read from ``plan.order.params``).
        optimizer: the optimizer whose state the memory model counts.
        exhaustive_limit: enumerate everything up to this many simulations.

    Returns:
        A new :class:`WrapPlan` with the chosen ``units``, ``prefetch``,
        ``reshard_after_forward``, ``estimate`` and ``search``; ``plan`` is
        not changed.

    Raises:
        ValueError: the cost model is for another world size or device type
            (``CostModel.check_compatible``), or a bad budget.
        PlanError: no candidate's peak is within ``memory_budget`` (the
            message names the smallest peak reached and what dominates it).

    Example:
        >>> best = search_plan(plan, CostModel.preset("h100-nvlink-8"))  # doctest: +SKIP
        >>> best.prefetch, best.search.best.label  # doctest: +SKIP
        (1, '2 units/group, prefetch 1')
    """
    from execwrap.search_space import SearchSpace  # the simulator loads only when planning "auto"

    started = time.perf_counter()
    budget = check_memory_budget(memory_budget, "plan_wrap")
    space = SearchSpace.build(
        plan,
        cost_model,
        world_size=world_size,
        trainable_dtypes=trainable_dtypes,
        optimizer=optimizer,
    )
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
    """Step 2 of the module docstring: DP groupings, prefetch, then reshard."""
    groupings = _dp_groupings(space)
    logger.debug("auto-plan: %d distinct grouping(s) from the DP", len(groupings))
    best_per_grouping: list[tuple[tuple[float, int], tuple[tuple[int, int], ...], int]] = []
    for groups in groupings:
        flags = (True,) * len(groups)
        results = [(evaluated.add(groups, p, flags, "searched"), p) for p in PREFETCH_DEPTHS]
        fitting = [(c.step_time_s, p) for c, p in results if c.fits]
        ranked = fitting or [(c.peak_memory_bytes * 1.0, p) for c, p in results]
        score, p_best = min(ranked)
        best_per_grouping.append(((0 if fitting else 1, score), groups, p_best))  # type: ignore[arg-type]
    best_per_grouping.sort(key=lambda t: t[0])
    for _, groups, p in best_per_grouping[:REFINE_TOP]:
        n = len(groups)
        for k in _last_k_values(n):
            flags = tuple(i < n - k for i in range(n))
            for depth in sorted({p, *PREFETCH_DEPTHS} if k == n else {p}):
                evaluated.add(groups, depth, flags, "searched")


def _dp_groupings(space: SearchSpace) -> list[tuple[tuple[int, int], ...]]:
    """Distinct groupings: the DP under each cap and prefetch depth, and the
    uniform k-unit groupings; in the order first found."""
    found: dict[tuple[tuple[int, int], ...], None] = {}
    for k, cap in space.window_caps():
        found.setdefault(space.greedy_groups(cap), None)
        if space.longest_group(cap) > DP_MAX_GROUP:
            continue
        reach = space.capped_reach(cap)
        for p in PREFETCH_DEPTHS:
            _, groups = best_partition(reach, lambda i, j, p=p: space.group_cost(i, j, p))
            found.setdefault(tuple(groups), None)
        logger.debug("auto-plan: cap %d unit(s) = %d bytes done", k, cap)
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
            label=label or _label(groups, prefetch, flags),
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


def _label(groups: Sequence[tuple[int, int]], prefetch: int, flags: Sequence[bool]) -> str:
    sizes = {j - i for i, j in groups}
    shape = f"{sizes.pop()} units/group" if len(sizes) == 1 else f"{len(groups)} groups"
    kept = sum(1 for f in flags if not f)
    if kept == 0:
        reshard = ""
    elif kept == len(flags):
        reshard = ", no reshard"
    else:
        reshard = f", no reshard: last {kept}"
    return f"{shape}, prefetch {prefetch}{reshard}"


def _choose(
    space: SearchSpace, evaluated: _Evaluations, budget: int | None, seconds: float
) -> WrapPlan:
    """Step 3 and 4: the best fitting candidate as a plan, or :class:`PlanError`."""
    cands = evaluated.candidates
    fitting = [i for i, c in enumerate(cands) if c.fits]
    if not fitting:
        raise PlanError(_nothing_fits_message(space, evaluated, budget))
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


def _nothing_fits_message(space: SearchSpace, evaluated: _Evaluations, budget: int | None) -> str:
    cands = evaluated.candidates
    smallest = min(range(len(cands)), key=lambda i: (cands[i].peak_memory_bytes, i))
    estimate = evaluated.estimates[smallest]
    part, nbytes = space.dominant_part(estimate)
    return (
        f"no plan fits the memory budget of {_gib(budget or 0)} per rank: the smallest peak any "
        f"candidate reaches is {_gib(cands[smallest].peak_memory_bytes)} "
        f"({cands[smallest].label}; {len(cands)} candidate(s) simulated for "
        f"{space.world_size} rank(s)), dominated by {part} ({_gib(nbytes)}); "
        f"{space.dominant_hint(part)}"
    )


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB ({nbytes} bytes)"
