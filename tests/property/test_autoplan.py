"""The auto-planner against brute force on small random instances (hypothesis).

Instances (:mod:`tests.execwrap.autoplan_cases`): chains of 1 to 4 bias-free
``Linear`` layers of random widths, random compute and activation bytes per
layer, a random one-segment cost model (CPU, where collectives block the
training thread and wait for the slowest rank, or CUDA with a random
overlap), and no budget or one between
the smallest and the largest peak of the brute force. The brute force
simulates every grouping x prefetch 0-2 x every reshard vector.

* :func:`best_partition` equals the minimum over every cut (any costs);
* small instances (exhaustive search): the plan's predicted step time is the
  least of every candidate within the budget, and with none there the
  PlanError names the smallest peak of all;
* the dynamic-program path on CPU without a budget (where the step time
  decomposes by group: without the wait for the slowest rank, which depends
  on the compute before each collective) finds the brute-force optimum too;
* with a budget, on any device, the dynamic-program path's plan fits it and
  is never slower than the fastest per-unit plan that fits.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from execwrap import PlanError
from execwrap.planning.auto.partition import best_partition, partition_cost
from execwrap.planning.auto.search import search_plan
from tests.execwrap.autoplan_cases import (
    atomic_plan,
    brute_force,
    cost_model,
    groupings,
    unit_compute,
)

_WIDTHS = st.sampled_from([4, 8, 16, 32])


@st.composite
def instances(  # type: ignore[no-untyped-def]
    draw: st.DrawFn, max_layers: int = 5, device: str | None = None, jitter: bool = True
):
    n = draw(st.integers(1, max_layers))
    widths = draw(st.lists(_WIDTHS, min_size=n + 1, max_size=n + 1))
    seconds = st.floats(0.0, 0.01, allow_nan=False)
    forward = draw(st.lists(seconds, min_size=n, max_size=n))
    backward = draw(st.lists(seconds, min_size=n, max_size=n))
    acts = draw(st.lists(st.integers(0, 20_000), min_size=n, max_size=n))
    dev = device or draw(st.sampled_from(["cpu", "cuda"]))
    cm = cost_model(
        latency=draw(st.floats(1e-5, 1e-2)),
        per_byte=draw(st.floats(0.0, 1e-6)),
        overhead=draw(st.floats(0.0, 1e-3)),
        param_overhead=draw(st.floats(0.0, 1e-4)),
        overlap=draw(st.floats(0.0, 1.0)) if dev == "cuda" else 0.0,
        device=dev,
        copy_bytes_per_s=draw(st.floats(1e6, 1e10)),
        sync_jitter=draw(st.floats(0.0, 0.05)) if jitter and dev == "cpu" else 0.0,
    )
    budget_at = draw(st.none() | st.floats(-0.1, 1.0))
    return atomic_plan(widths), cm, unit_compute(forward, backward, acts), budget_at


def _budget(outcomes, budget_at):  # type: ignore[no-untyped-def]
    if budget_at is None:
        return None
    peaks = [o.estimate.peak_memory_bytes for o in outcomes]
    lo, hi = min(peaks), max(peaks)
    return max(1, int(lo + budget_at * (hi - lo)))


@given(
    n=st.integers(0, 7),
    data=st.data(),
)
def test_best_partition_is_the_least_of_every_cut(n: int, data: st.DataObject) -> None:
    reach = []
    for i in range(n):
        low = max(reach[-1] if reach else 1, i + 1)
        reach.append(data.draw(st.integers(low, n)))
    table = {
        (i, j): data.draw(st.floats(0.0, 10.0) | st.just(math.inf))
        for i in range(n)
        for j in range(i + 1, n + 1)
    }

    def cost(i: int, j: int) -> float:
        return table[(i, j)]

    allowed = [g for g in groupings(n) if all(j <= reach[i] for i, j in g)]
    best = min((partition_cost(g, cost) for g in allowed), default=math.inf)
    total, groups = best_partition(reach, cost)
    if math.isinf(best):
        assert (total, groups) == (math.inf, [])
    else:
        assert total == pytest.approx(best, rel=1e-9, abs=1e-12)
        assert partition_cost(groups, cost) == pytest.approx(total, rel=1e-9, abs=1e-12)
        assert all(j <= reach[i] for i, j in groups)


@given(instances(max_layers=4))
def test_exhaustive_search_is_the_optimum(instance) -> None:  # type: ignore[no-untyped-def]
    plan, cm, compute, budget_at = instance
    outcomes = brute_force(plan, cm, compute)
    budget = _budget(outcomes, budget_at)
    note(f"budget {budget}")
    fitting = [o for o in outcomes if budget is None or o.estimate.peak_memory_bytes <= budget]
    if not fitting:
        smallest = min(o.estimate.peak_memory_bytes for o in outcomes)
        with pytest.raises(
            PlanError, match=f"the smallest peak any candidate reaches is .* \\({smallest} bytes\\)"
        ):
            search_plan(plan, cm, compute=compute, memory_budget=budget)
        return
    best = search_plan(plan, cm, compute=compute, memory_budget=budget)
    assert best.estimate.step_time_s == pytest.approx(
        min(o.estimate.step_time_s for o in fitting), rel=1e-12
    )
    assert budget is None or best.estimate.peak_memory_bytes <= budget


@given(instances(max_layers=4, device="cpu", jitter=False))
def test_dynamic_program_is_exact_on_cpu_without_budget(instance) -> None:  # type: ignore[no-untyped-def]
    plan, cm, compute, _ = instance
    outcomes = brute_force(plan, cm, compute)
    best = search_plan(plan, cm, compute=compute, exhaustive_limit=0)
    assert best.estimate.step_time_s == pytest.approx(
        min(o.estimate.step_time_s for o in outcomes), rel=1e-12
    )


@given(instances(max_layers=4))
def test_dynamic_program_fits_the_budget_and_beats_per_unit(instance) -> None:  # type: ignore[no-untyped-def]
    plan, cm, compute, budget_at = instance
    outcomes = brute_force(plan, cm, compute)
    budget = _budget(outcomes, budget_at)
    n = len(plan.units) - 1
    per_unit = [
        o
        for o in outcomes
        if len(o.groups) == n
        and all(o.flags)
        and (budget is None or o.estimate.peak_memory_bytes <= budget)
    ]
    try:
        best = search_plan(plan, cm, compute=compute, memory_budget=budget, exhaustive_limit=0)
    except PlanError:
        assert not per_unit  # the per-unit plans are among the candidates
        return
    assert budget is None or best.estimate.peak_memory_bytes <= budget
    if per_unit:
        assert best.estimate.step_time_s <= min(o.estimate.step_time_s for o in per_unit) * (
            1 + 1e-12
        )
