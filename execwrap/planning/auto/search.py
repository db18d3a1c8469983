"""The auto-planner: FSDP2 groups, prefetch, resharding and the training step, chosen together.

``plan_wrap(model, order, init_policy, bucket_numel="auto", cost_model=cm,
world_size=W, memory_budget=B, training=TrainingStep(precision=..., micro_batches=N))``
plans the init policy's units as usual, then :func:`search_plan` picks the plan with
the least predicted time per optimizer step (:func:`execwrap.simulate.simulate_step`
of the training step asked for: its precision and micro-batch count are the user's)
whose predicted peak memory per rank stays within ``B`` bytes.

Search space:

* Groupings: the policy's atomic units in execution order; the root, units
  never called and units without parameters stay alone (as in
  :mod:`execwrap.planning.bucketing`), the others (the *mergeable* units) may be cut
  into consecutive groups wherever FSDP2 allows one group (no module nested
  in another, one trainable dtype: :func:`execwrap.planning.bucketing.can_group`).
* Prefetch depth ``p`` in :data:`PREFETCH_DEPTHS` (``apply_fully_shard``'s
  explicit prefetch lists; ``0`` keeps FSDP2's implicit prefetching).
* ``reshard_after_forward`` per group.
* Activation checkpointing per group (``"none"``, ``"selective"``, ``"full"``; groups
  inside another non-root unit are not checkpointed), when the capture says what each
  mode keeps (:mod:`execwrap.planning.auto.checkpoint_fill`).
* Per plan: CPU offload (only where the cost model's device has host memory to offload
  to and the host link's rates), and the accumulation mode of ``N > 1`` micro-batches:
  a reduce-scatter after every micro-batch or only after the last, resharding after
  each backward or not (:data:`~execwrap.planning.auto.variants.ACCUMULATION_MODES`). ``choose=`` limits which of
  checkpointing, offload and accumulation are searched.

Search:

1. Small instances (at most :data:`EXHAUSTIVE_LIMIT` simulations in all):
   every grouping with every prefetch depth and every reshard vector is
   simulated. The result is the exact optimum of the simulator over these.
2. Otherwise, groupings come from an exact dynamic program
   (:func:`execwrap.planning.auto.partition.best_labelled_partition`) over a step time
   that decomposes by group: a group's compute (with its checkpointing's recomputation
   in backward) plus the communication its own compute does not hide (``overlap``
   times its compute; forward only with explicit prefetch), each group charged what
   the simulator charges it
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
   resharding after forward and not; on GPUs (where a recomputation hides
   communication, so checkpointing changes which grouping is best) also at prefetch
   1, resharding, with each group's checkpointing mode as a label priced at
   ``time + price * bytes kept``, for the price per byte at which the median unit
   switches to selective and to full checkpointing (a Lagrangian relaxation of the
   budget: exact for that price).
   Every distinct grouping is simulated at prefetch 1, resharding everywhere and
   nowhere; the :data:`REFINE_TOP` best then at every prefetch depth, and with
   ``reshard_after_forward=False`` on the last ``k`` groups only (``k`` = 1, 2,
   4, ...): the last group's backward all-gather is the one no compute hides, and
   at the start of backward (the usual peak) every group kept unsharded counts,
   wherever it sits.
3. Checkpointing: each configuration is simulated without checkpointing; those over
   the budget, fastest first, with the cheapest checkpointing that frees the excess,
   refined by the simulator (:meth:`execwrap.planning.auto.evaluations.Evaluations.fill`),
   until one without checkpointing is no faster than the fastest that fits.
4. Step variants: the search above runs for FSDP2's default step (no offload, a
   reduce-scatter per micro-batch); the :data:`~execwrap.planning.auto.variants.VARIANT_TOP` best configurations are
   then simulated under each other accumulation mode, and, where offload may be
   chosen and the budget binds (a faster candidate did not fit, or the best one
   checkpoints), with CPU offload: offload frees device memory but only adds time.
5. Choice: the least predicted step time among candidates within the
   budget; ties go to the lower peak, then fewer groups, then the earlier
   candidate. Nothing is random: the same inputs give the same plan.
6. No candidate fits: :class:`~execwrap.errors.MemoryBudgetError` names the smallest
   peak any candidate reaches (per-unit groups at each prefetch depth, resharding
   everywhere, with full checkpointing of every unit that may be checkpointed and
   offload where chosen, are always among them) and what dominates it
   (:mod:`execwrap.planning.auto.messages`).

Every simulated candidate is kept in ``plan.search`` (the report's
candidates chart); the plan's ``training`` is the step chosen.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from execwrap.plan.search_record import PlanSearch
from execwrap.plan.training_step import TrainingStep
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.auto.evaluations import Evaluations, rank_key
from execwrap.planning.auto.messages import cost_model_line, nothing_fits
from execwrap.planning.auto.options import AutoOptions, check_auto_options
from execwrap.planning.auto.partition import best_labelled_partition
from execwrap.planning.auto.variants import (
    fastest_fit,
    other_variants,
)
from execwrap.util.gc_pause import gc_paused

if TYPE_CHECKING:
    from execwrap.cost import CostModel
    from execwrap.planning.auto.space import Grouping, SearchSpace
    from execwrap.simulate import UnitCompute

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
    training: TrainingStep | None = None,
    choose: tuple[str, ...] | None = None,
) -> WrapPlan:
    """The best plan over groupings of ``plan``'s atomic units, prefetch, resharding and
    the training step's checkpointing, offload and accumulation.

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
        training: the step to plan for (its precision and micro-batch count are kept;
            default: float32, one micro-batch).
        choose: what of the step the planner chooses (default: all of
            :data:`~execwrap.planning.auto.options.STEP_CHOICES`).

    Returns:
        A new :class:`WrapPlan` with the chosen ``units``, ``prefetch``,
        ``reshard_after_forward``, ``training``, ``estimate`` and ``search``; ``plan``
        is not changed.

    Raises:
        ValueError: the cost model is for another world size or device type
            (``CostModel.check_compatible``), a bad budget, a step the cost model
            or the capture cannot price (another compute dtype than the capture's,
            offload on a CPU device: :func:`execwrap.simulate.training.check_priceable`).
        MemoryBudgetError: (a ``PlanError``) no candidate's peak is within
            ``memory_budget`` (the message names the smallest peak reached and
            what dominates it; ``part`` is that part's field).

    Example:
        >>> best = search_plan(plan, CostModel.preset("h100-nvlink-8"))  # doctest: +SKIP
        >>> best.prefetch, best.search.best.label  # doctest: +SKIP
        (1, 'root + 4 groups of 2 units, prefetch 1')
    """
    options = check_auto_options(
        "search_plan",
        "auto",
        cost_model,
        world_size,
        memory_budget,
        optimizer=optimizer,
        training=training,
        choose=choose,
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
            model's (known only here, from ``compute``); a step the cost model or the
            capture cannot price.
        MemoryBudgetError: no candidate fits ``options.memory_budget``.
    """
    with gc_paused():  # the simulator's garbage has almost no cycles (execwrap.util.gc_pause)
        return _search(plan, options, trainable_dtypes, compute, exhaustive_limit)


def _search(
    plan: WrapPlan,
    options: AutoOptions,
    trainable_dtypes: dict[str, frozenset[str]] | None,
    compute: UnitCompute | None,
    exhaustive_limit: int,
) -> WrapPlan:
    """:func:`search_checked`'s work."""
    from execwrap.planning.auto.space import SearchSpace  # the simulator loads only here
    from execwrap.simulate.training import check_priceable

    started = time.perf_counter()
    step = options.training
    check_priceable(plan, options.cost_model, step, given_compute=compute is not None)
    space = SearchSpace.build(
        plan,
        options.cost_model,
        world_size=options.world_size,
        trainable_dtypes=trainable_dtypes,
        optimizer=options.optimizer,
        compute=compute,
        step=step,
        search_checkpointing="checkpointing" in options.choose,
    )
    budget = options.memory_budget
    evaluated = Evaluations(space, budget)
    if 3 * space.count_reshard_groupings() <= exhaustive_limit:
        logger.debug("auto-plan: exhaustive search over %d mergeable unit(s)", space.size)
        for groups in space.all_groupings():
            for flags in _all_flags(len(groups)):
                for p in PREFETCH_DEPTHS:
                    evaluated.add(groups, p, flags, "searched")
    else:
        _heuristic_search(space, evaluated)
    _add_baselines(space, evaluated)
    evaluated.fill()
    other_variants(space, evaluated, options)
    return _choose(space, evaluated, budget, time.perf_counter() - started)


# ------------------------------------------------------------------ the search
def _heuristic_search(space: SearchSpace, evaluated: Evaluations) -> None:
    """Step 2 of the module docstring: DP groupings, then prefetch and reshard."""
    groupings = _dp_groupings(space)
    logger.debug("auto-plan: %d distinct grouping(s) from the DP", len(groupings))
    for groups in groupings:
        n = len(groups)
        for flags in ((True,) * n, (False,) * n):
            evaluated.add(groups, 1, flags, "searched")
    evaluated.fill()
    ranked: list[tuple[tuple[int, float], int]] = []
    for g, groups in enumerate(groupings):
        n = len(groups)
        keys = [rank_key(evaluated.best_of(groups, 1, f)) for f in ((True,) * n, (False,) * n)]
        ranked.append((min(keys), g))
    ranked.sort()
    for _, g in ranked[:REFINE_TOP]:
        groups = groupings[g]
        n = len(groups)
        for p in PREFETCH_DEPTHS:
            for flags in ((True,) * n, (False,) * n):
                evaluated.add(groups, p, flags, "searched")
        evaluated.fill()
        best_p = min(
            PREFETCH_DEPTHS,
            key=lambda p: rank_key(evaluated.best_of(groups, p, (True,) * n)),
        )
        for k in _last_k_values(n)[:-1]:  # k = n (no reshard at all) was simulated above
            evaluated.add(groups, best_p, tuple(i < n - k for i in range(n)), "searched")


def _dp_groupings(space: SearchSpace) -> list[Grouping]:
    """Distinct groupings: the greedy fewest-groups cut and the DP under each cap,
    for every prefetch depth, resharding after forward or not, and (resharding) with
    each group's checkpointing mode priced in; in the order first found."""
    found: dict[Grouping, None] = {}
    cp = space.checkpointing
    prices = [0.0]
    if cp is not None and cp.searched and not space.cost_model.synchronous_collectives:
        # on CPU nothing overlaps: a group's recomputation adds to its time whatever the
        # grouping, and the priced DP finds the unpriced one's groupings again
        prices += [1.0001 * cp.median_price(m) for m in cp.modes[1:]]
    for k, cap in space.window_caps():
        found.setdefault(space.greedy_groups(cap), None)
        if space.longest_group(cap) > DP_MAX_GROUP:
            continue
        reach = space.capped_reach(cap)
        for reshard in (True, False):
            for p in space.distinct_prefetch_costs():
                found.setdefault(_dp(space, reach, p, reshard, 0.0), None)
        for price in prices[1:]:  # checkpointing priced in, resharding, explicit prefetch
            found.setdefault(_dp(space, reach, 1, True, price), None)
        logger.debug("auto-plan: cap of %d unit(s) (%d bytes) searched", k, cap)
    return list(found)


def _dp(space: SearchSpace, reach: list[int], p: int, reshard: bool, price: float) -> Grouping:
    """The DP's grouping at prefetch ``p``, with each group's checkpointing mode a label
    priced at ``price`` seconds per byte it keeps (``0``: no checkpointing)."""
    cp = space.checkpointing
    if price == 0.0 or cp is None:
        labels: tuple[str, ...] = ("none",)
    else:
        labels = cp.modes

    def cost(i: int, j: int, mode: object) -> float:
        m = str(mode)
        if m != "none" and (cp is None or not cp.may_checkpoint(i, j)):
            return math.inf
        seconds = space.group_cost(i, j, p, reshard=reshard, mode=m)
        return seconds + price * cp.kept(i, j, m) if cp is not None and price else seconds

    _, groups, _ = best_labelled_partition(reach, cost, labels)
    return tuple(groups)


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


def _add_baselines(space: SearchSpace, evaluated: Evaluations) -> None:
    """Per-unit groups at each prefetch depth (prefetch 0 is the least memory a
    plan can need), the fewest groups, all resharding; with checkpointing, full
    checkpointing of every unit at prefetch 0 (the least memory) and 1 (the usual
    fallback)."""
    m = space.size
    per_unit = tuple((i, i + 1) for i in range(m))
    for p in PREFETCH_DEPTHS:
        evaluated.add(per_unit, p, (True,) * m, "baseline", label=f"per-unit, prefetch {p}")
    fewest = space.greedy_groups(math.inf)
    evaluated.add(fewest, 1, (True,) * len(fewest), "baseline", label="fewest groups, prefetch 1")
    cp = space.checkpointing
    if cp is not None and cp.searched:
        full = tuple("full" if cp.may_checkpoint(i, j) else "none" for i, j in per_unit)
        for p in (0, 1):
            label = f"per-unit, prefetch {p}, full checkpointing"
            evaluated.add(per_unit, p, (True,) * m, "baseline", label=label, modes=full)


def _choose(
    space: SearchSpace, evaluated: Evaluations, budget: int | None, seconds: float
) -> WrapPlan:
    """Step 5 and 6: the best fitting candidate as a plan, or :class:`MemoryBudgetError`."""
    cands = evaluated.candidates
    best = fastest_fit(evaluated)
    if best is None:
        smallest = min(range(len(cands)), key=lambda i: (cands[i].peak_memory_bytes, i))
        cp = space.checkpointing
        _, groups, _, _, modes = evaluated.keys[smallest]
        all_full = (
            cp is not None
            and cp.searched
            and all(
                m == "full" or not cp.may_checkpoint(i, j)
                for (i, j), m in zip(groups, modes, strict=True)
            )
        )
        raise nothing_fits(cands, evaluated.estimates, budget, space.world_size, all_full)
    _, groups, prefetch, flags, modes = evaluated.keys[best]
    plan = space.plan_for(groups)
    search = PlanSearch(
        candidates=tuple(cands),
        chosen=best,
        memory_budget=budget,
        world_size=space.world_size,
        cost_model=cost_model_line(space.cost_model),
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
    training = space.step_for(groups, modes, evaluated.steps[best])
    # the candidates were simulated without timelines; the chosen one again with them
    # (the simulator is deterministic: every other number is the same)
    estimate = space.simulate(groups, prefetch, flags, modes, evaluated.steps[best], detail=True)
    return dataclasses.replace(
        plan,
        prefetch=prefetch,
        reshard_after_forward=space.unit_flags(plan, groups, flags),
        estimate=estimate,
        search=search,
        training=training.for_plan(plan),
    )
