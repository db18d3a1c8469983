"""The auto-planner: plan_wrap(bucket_numel="auto"), search_plan, its record and its refusals.

Exact values throughout: a case computed by hand (three layers on CPU, where
FSDP2's collectives block the training thread), the planner against a brute
force over every grouping x prefetch x reshard vector, the smallest peak in
the PlanError, the JSON round trip, determinism across hash seeds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.nn as nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap import MemoryBudgetError, PlanError, WrapPlan, plan_wrap
from execwrap.plan.search_record import PlanSearch
from execwrap.planning.auto.partition import best_partition
from execwrap.planning.auto.search import search_plan
from execwrap.planning.auto.space import SearchSpace
from execwrap.util.formatting import format_bytes
from tests.execwrap.autoplan_cases import (
    atomic_plan,
    brute_force,
    cost_model,
    unit_compute,
)
from tracing import trace_execution_order

REPO = Path(__file__).resolve().parents[2]

FORWARD = (0.01, 0.02, 0.03)
BACKWARD = (0.02, 0.04, 0.06)
ACTS = (100, 100, 100)


def _three() -> tuple[WrapPlan, object, object]:
    return atomic_plan([16, 16, 16, 16]), cost_model(), unit_compute(FORWARD, BACKWARD, ACTS)


# ------------------------------------------------------------------ by hand
@pytest.mark.parametrize("exhaustive_limit", [400, 0], ids=["exhaustive", "dynamic-program"])
def test_three_layers_by_hand(exhaustive_limit: int) -> None:
    """No budget, CPU: one group of all three layers, not resharded, is fastest:
    one all-gather (fixed cost, copy-in of the 1536-byte shard, 1 ms, copy-out
    of 3072 bytes) and one reduce-scatter (fixed cost, copy-in, 1 ms) besides
    the compute; prefetch changes nothing on CPU, so the tie goes to the lower
    peak, then to the first simulated (prefetch 1 or the exhaustive order)."""
    plan, cm, compute = _three()
    best = search_plan(plan, cm, compute=compute, exhaustive_limit=exhaustive_limit)
    copy = 1 / 1.024e6  # seconds per byte
    expected = (
        sum(FORWARD)
        + sum(BACKWARD)
        + (1e-4 + 1536 * copy + 1e-3 + 3072 * copy)
        + (1e-4 + 3072 * copy + 1e-3)
    )
    assert best.groups == [[""], ["0", "1", "2"]]
    assert best.reshard_after_forward == (False, False)
    assert best.estimate.step_time_s == pytest.approx(expected, rel=1e-12)
    assert best.estimate.step_time_s == pytest.approx(0.1897, rel=1e-12)
    assert (
        best.search.best.label == f"root + 1 group of 3 units, prefetch {best.prefetch}, no reshard"
    )
    assert best.bucket_numel is None and best.atomic_units == plan.units


def test_three_layers_agree_with_brute_force_under_budgets() -> None:
    plan, cm, compute = _three()
    outcomes = brute_force(plan, cm, compute)
    peaks = sorted({o.estimate.peak_memory_bytes for o in outcomes})
    for budget in peaks:
        fitting = [o for o in outcomes if o.estimate.peak_memory_bytes <= budget]
        best_time = min(o.estimate.step_time_s for o in fitting)
        got = search_plan(plan, cm, compute=compute, memory_budget=budget)
        assert got.estimate.peak_memory_bytes <= budget
        assert got.estimate.step_time_s == pytest.approx(best_time, rel=1e-12), budget
        assert got.search.memory_budget == budget


def test_impossible_budget_names_the_smallest_peak() -> None:
    plan, cm, compute = _three()
    smallest = min(o.estimate.peak_memory_bytes for o in brute_force(plan, cm, compute))
    with pytest.raises(PlanError) as info:
        search_plan(plan, cm, compute=compute, memory_budget=smallest - 1)
    message = str(info.value)
    assert message.startswith(
        f"no plan fits the memory budget of {format_bytes(smallest - 1)} ({smallest - 1} bytes) "
        f"per rank: the smallest peak any candidate reaches is {format_bytes(smallest)} "
        f"({smallest} bytes) (per-unit, prefetch 0;"
    )
    assert "simulated for 2 rank(s)), dominated by " in message
    assert "to fit, raise the budget" in message


def test_dominant_part_is_the_largest_of_the_breakdown() -> None:
    plan, cm, _ = _three()
    compute = unit_compute(FORWARD, BACKWARD, (10**6, 10**6, 10**6))
    with pytest.raises(
        PlanError,
        match=r"dominated by activations \(2\.86 MiB \(3000000 bytes\)\); "
        r"to fit, raise the budget, or use a smaller batch",
    ) as info:
        search_plan(plan, cm, compute=compute, memory_budget=1000)
    # the parts a caller words its own remedy from (the command line does)
    assert isinstance(info.value, MemoryBudgetError) and info.value.part == "activations"
    assert str(info.value) == (
        f"{info.value.finding}; to fit, raise the budget, or use a smaller batch or sequence, "
        "or activation checkpointing"
    )
    assert info.value.finding.endswith("dominated by activations (2.86 MiB (3000000 bytes))")


# ------------------------------------------------------------------ plan_wrap keywords
def _model_and_order() -> tuple[nn.Module, object]:
    model = nn.Sequential(*[nn.Linear(16, 16, bias=False) for _ in range(3)])
    return model, trace_execution_order(model)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(bucket_numel="auto"), ValueError, r'bucket_numel="auto" needs cost_model='),
        (
            dict(bucket_numel="auto", cost_model=cost_model(), memory_budget=0),
            ValueError,
            r"plan_wrap: memory_budget must be > 0 bytes per rank, got 0; pass None to plan within the device's memory",
        ),
        (
            dict(bucket_numel="auto", cost_model=cost_model(), memory_budget=-5),
            ValueError,
            r"memory_budget must be > 0 bytes per rank, got -5",
        ),
        (
            dict(bucket_numel="auto", cost_model=cost_model(), memory_budget="40GiB"),
            TypeError,
            r"memory_budget must be a whole number of bytes per rank or None, got str '40GiB'",
        ),
        (
            dict(bucket_numel="auto", cost_model=cost_model(), world_size=0),
            ValueError,
            r"plan_wrap: world_size must be an int >= 1 \(ranks\), got 0",
        ),
        (
            dict(cost_model=cost_model()),
            ValueError,
            r'plan_wrap: cost_model only applies with bucket_numel="auto" \(got bucket_numel=None\)',
        ),
        (
            dict(bucket_numel=1000, memory_budget=10**9),
            ValueError,
            r'memory_budget only applies with bucket_numel="auto" \(got bucket_numel=1000\)',
        ),
        (
            dict(bucket_numel="auto", cost_model="cost.json"),
            TypeError,
            r"plan_wrap: cost_model must be an execwrap.CostModel, got str 'cost.json': load a "
            r"file with CostModel.load\(path\), or take a preset with CostModel.preset",
        ),
        (
            dict(bucket_numel="auto", cost_model=cost_model(), optimizer="lamb"),
            ValueError,
            r"plan_wrap: optimizer must be one of \['adam', 'adamw', 'none', 'sgd', "
            r"'sgd_momentum'\], got 'lamb'",
        ),
        (
            dict(optimizer="sgd"),
            ValueError,
            r'plan_wrap: optimizer only applies with bucket_numel="auto"',
        ),
        (
            dict(bucket_numel="Auto"),
            TypeError,
            r"bucket_numel must be a whole number >= 1 \(elements\), got str \'Auto\'; pass None "
            r"for no "
            r'bucketing, or "auto" for the auto-planner',
        ),
    ],
)
def test_plan_wrap_refuses_bad_auto_keywords(kwargs: dict, error: type, match: str) -> None:
    model, order = _model_and_order()
    with pytest.raises(error, match=match):
        plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}), **kwargs)


def test_cost_model_for_another_world_size_or_device_is_refused() -> None:
    plan, cm, compute = _three()
    with pytest.raises(
        ValueError, match=r"does not fit world size 4 \(this cost model is for 2 ranks\)"
    ):
        search_plan(plan, cm, compute=compute, world_size=4)
    on_gpu = unit_compute(FORWARD, BACKWARD, ACTS)
    on_gpu = type(on_gpu)(**{**on_gpu.__dict__, "device_type": "cuda"})
    with pytest.raises(ValueError, match=r"device type 'cuda' \(this cost model is for 'cpu'\)"):
        search_plan(plan, cm, compute=on_gpu)


def test_plan_wrap_auto_without_timing_plans_communication_only(caplog) -> None:
    model, order = _model_and_order()
    with caplog.at_level("WARNING", logger="execwrap.planning.auto.space"):
        plan = plan_wrap(
            model,
            order,
            ModuleWrapPolicy({nn.Linear}),
            bucket_numel="auto",
            cost_model=cost_model(),
        )
    assert "the order has no compute times" in caplog.text
    assert plan.groups == [[""], ["0", "1", "2"]]
    assert plan.reshard_after_forward == (False, False)
    assert plan.estimate.compute_time_s == plan.estimate.optimizer_time_s  # no model compute
    assert plan.search.cost_model == "test (cpu, gloo, 2 rank(s))"


# ------------------------------------------------------------------ the record
def test_plan_json_round_trip_keeps_the_auto_fields() -> None:
    plan, cm, compute = _three()
    best = search_plan(plan, cm, compute=compute, memory_budget=10**9)
    data = json.loads(json.dumps(best.to_dict()))
    assert data["schema_version"] == 3
    again = WrapPlan.from_dict(data, best.order)
    assert again.prefetch == best.prefetch
    assert again.reshard_after_forward == best.reshard_after_forward
    assert again.estimate == best.estimate
    assert again.search == best.search
    assert again.to_dict() == best.to_dict()


def test_version_1_plan_dicts_still_load() -> None:
    plan = atomic_plan([8, 8, 8])
    data = plan.to_dict()
    for key in ("prefetch", "reshard_after_forward", "estimate", "search"):
        del data[key]
    data["schema_version"] = 1
    old = WrapPlan.from_dict(data, plan.order)
    assert old.groups == plan.groups
    assert (old.prefetch, old.reshard_after_forward, old.estimate, old.search) == (None,) * 4
    with pytest.raises(
        ValueError,
        match=r"unsupported WrapPlan schema_version 4 \(this execwrap "
        r"reads 1, 2, 3\)",
    ):
        WrapPlan.from_dict({**data, "schema_version": 4}, plan.order)


def test_search_record_lists_baselines_and_the_chosen_candidate() -> None:
    plan, cm, compute = _three()
    best = search_plan(plan, cm, compute=compute)
    search = best.search
    assert isinstance(search, PlanSearch)
    assert sorted(c.label for c in search.baselines()) == [
        "fewest groups, prefetch 1",
        "per-unit, prefetch 0",
        "per-unit, prefetch 1",
        "per-unit, prefetch 2",
    ]
    chosen = search.best
    assert chosen.step_time_s == best.estimate.step_time_s
    assert chosen.peak_memory_bytes == best.estimate.peak_memory_bytes
    assert chosen.prefetch == best.prefetch
    assert all(c.fits for c in search.candidates)  # no budget
    times = [c.step_time_s for c in search.candidates]
    assert chosen.step_time_s == min(times)


def test_search_is_deterministic_across_hash_seeds() -> None:
    code = (
        "import json\n"
        "from tests.execwrap.autoplan_cases import atomic_plan, cost_model, unit_compute\n"
        "from execwrap.planning.auto.search import search_plan\n"
        "plan = atomic_plan([16, 32, 16, 32, 16, 8])\n"
        "c = unit_compute([0.01, 0.02, 0.01, 0.03, 0.01], [0.02] * 5, [100, 200, 300, 400, 500])\n"
        "for cm in (cost_model(), cost_model(device='cuda', overlap=0.6)):\n"
        "    if cm.device_type == 'cuda':\n"
        "        c = type(c)(**{**c.__dict__, 'device_type': ''})\n"
        "    best = search_plan(plan, cm, compute=c, memory_budget=10**9, exhaustive_limit=0)\n"
        "    d = best.to_dict(); d['search']['seconds'] = 0\n"
        "    print(json.dumps(d, sort_keys=True))\n"
    )
    outs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONHASHSEED=seed)
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1]
    assert outs[0].count("\n") == 2


# ------------------------------------------------------------------ the search space
def test_group_seconds_are_what_the_simulator_charges() -> None:
    """On CPU the step is serial, so the DP's per-group prices plus the fixed units'
    work add up to the simulated step time of every grouping (no reshard)."""
    plan, cm, compute = _three()
    space = SearchSpace.build(
        plan, cm, world_size=2, trainable_dtypes=None, optimizer="adamw", compute=compute
    )
    for outcome in brute_force(plan, cm, compute):
        if any(outcome.flags) or outcome.prefetch != 1:
            continue
        total = sum(space.group_cost(i, j, 1, reshard=False) for i, j in outcome.groups)
        assert outcome.estimate.step_time_s == pytest.approx(total, rel=1e-12)


def test_reach_follows_fsdp2_group_rules() -> None:
    """Under always_wrap_policy a module holding parameters may not join a group
    with a module nested in it."""

    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(nn.init.ones_(nn.Linear(4, 4).weight))
            self.inner = nn.Linear(4, 4)

        def forward(self, x):  # type: ignore[no-untyped-def]
            return self.inner(x @ self.w)

    model = nn.Sequential(nn.Linear(4, 4), Outer(), nn.Linear(4, 4))
    order = trace_execution_order(model)
    from torch.distributed.fsdp.wrap import always_wrap_policy

    plan = plan_wrap(model, order, always_wrap_policy)
    space = SearchSpace.build(
        plan, cost_model(), world_size=2, trainable_dtypes=None, optimizer="adamw"
    )
    labels = [plan.units[i].label for i in space.movable]
    assert labels == ["0", "1", "1.inner", "2"]
    assert space.reach == [2, 2, 4, 4]  # "1" and "1.inner" never share a group


def test_best_partition_small_cases() -> None:
    assert best_partition([], lambda i, j: 1.0) == (0.0, [])
    assert best_partition([1, 2], lambda i, j: 1.0) == (2.0, [(0, 1), (1, 2)])
    assert best_partition([2, 2], lambda i, j: 1.0) == (1.0, [(0, 2)])
    assert best_partition([2, 2], lambda i, j: float("inf")) == (float("inf"), [])
    with pytest.raises(ValueError, match=r"reach\[1\] = 1 is outside \(1, 2\]"):
        best_partition([2, 1], lambda i, j: 1.0)


# ------------------------------------------------------------------ the report
def test_report_shows_the_predicted_step_and_the_candidates(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from execwrap.report.cost_charts import LANES, candidates_figure, step_timeline_figure
    from execwrap.report.writer import write_report

    plan, cm, compute = _three()
    best = search_plan(plan, cm, compute=compute, memory_budget=10**9)
    paths = write_report(best, tmp_path / "r", formats=("json", "html"))
    data = json.loads(paths["json"].read_text())
    assert data["plan"]["estimate"] == best.estimate.to_dict()
    assert data["plan"]["search"] == best.search.to_dict()
    page = paths["html"].read_text()
    assert '<section id="predicted">' in page
    assert 'id="chart-step"' in page and 'id="chart-candidates"' in page
    assert "<th>Groups not resharded after forward</th><td>0+1+2</td>" in page
    assert f"<th>Memory budget</th><td>{format_bytes(10**9)}</td>" in page

    fig = step_timeline_figure(best.estimate)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [label for _, label, _ in LANES]
    bars = sum(len(c.get_paths()) for c in ax.collections)
    assert bars == len([e for e in best.estimate.timeline if e.end_s > e.start_s])

    fig = candidates_figure(best.search, extra={"always": (1.0, 2**20)})
    ax = fig.axes[0]
    drawn = sum(len(c.get_offsets()) for c in ax.collections)
    assert drawn == len(best.search.candidates) + 1
    assert [line.get_xdata()[0] for line in ax.lines] == [10**9 / 2**20]  # the budget, in MiB


def test_sizes_take_numpy_integers_and_whole_floats() -> None:
    """A budget or bucket size written as ``1e9`` or taken from NumPy plans as the int."""
    from execwrap import ParamExecOrderWrapPolicy

    np = pytest.importorskip("numpy")

    model, order = _model_and_order()
    linear = ModuleWrapPolicy({nn.Linear})
    budgeted = [
        plan_wrap(
            model, order, linear, bucket_numel="auto", cost_model=cost_model(), memory_budget=b
        )
        for b in (10**9, 1e9, np.int64(10**9))
    ]
    assert [p.groups for p in budgeted] == [[[""], ["0", "1", "2"]]] * 3
    bucketed = [
        plan_wrap(model, order, linear, bucket_numel=b) for b in (512, 512.0, np.int32(512))
    ]
    assert [p.groups for p in bucketed] == [[[""], ["0", "1"], ["2"]]] * 3
    policy = ParamExecOrderWrapPolicy(bucket_numel=1e3, order=order)
    assert (policy.bucket_numel, type(policy.bucket_numel)) == (1000, int)
    with pytest.raises(TypeError, match=r"memory_budget must be a whole number of bytes per"):
        plan_wrap(model, order, bucket_numel="auto", cost_model=cost_model(), memory_budget=1.5)
    with pytest.raises(TypeError, match=r"bucket_numel must be a whole number >= 1"):
        plan_wrap(model, order, bucket_numel=True)  # type: ignore[arg-type]


def test_world_size_takes_numpy_integers() -> None:
    """A world size from NumPy plans, simulates and is saved as the int; a float is refused."""
    from execwrap import CostModel, ParamExecOrderWrapPolicy, simulate_step

    np = pytest.importorskip("numpy")

    model, order = _model_and_order()
    linear = ModuleWrapPolicy({nn.Linear})
    plan = plan_wrap(
        model, order, linear, bucket_numel="auto", cost_model=cost_model(), world_size=np.int64(2)
    )
    assert plan.groups == [[""], ["0", "1", "2"]]
    assert [type(plan.estimate.world_size), type(plan.search.world_size)] == [int, int]
    assert json.loads(json.dumps(plan.estimate.to_dict()))["world_size"] == 2
    policy = ParamExecOrderWrapPolicy(
        linear, bucket_numel="auto", cost_model=cost_model(), world_size=np.int32(2)
    )
    assert (policy.world_size, type(policy.world_size)) == (2, int)
    three, cm, compute = _three()
    estimate = simulate_step(three, cm, world_size=np.int64(2), compute=compute)
    assert (estimate.world_size, type(estimate.world_size)) == (2, int)
    assert estimate == simulate_step(three, cm, world_size=2, compute=compute)
    models = [
        CostModel.preset("h100-ib-400g", world_size=np.int64(32)),
        cost_model().replace(world_size=np.uint8(4)),
    ]
    assert [(m.world_size, type(m.world_size)) for m in models] == [(32, int), (4, int)]
    assert [json.loads(json.dumps(m.to_dict()))["world_size"] for m in models] == [32, 4]
    with pytest.raises(
        TypeError, match=r"^plan_wrap: world_size must be an int >= 1 \(ranks\), got float 2\.0$"
    ):
        plan_wrap(model, order, bucket_numel="auto", cost_model=cost_model(), world_size=2.0)
    with pytest.raises(
        TypeError, match=r"^simulate_step: world_size must be an int >= 1 \(ranks\), got bool True$"
    ):
        simulate_step(three, cm, world_size=True, compute=compute)


def test_world_size_the_cost_model_is_not_for_is_refused_at_construction() -> None:
    """The policy (and plan_wrap) refuse it with CostModel.check_compatible's message
    before capturing anything, not when the plan is built."""
    from execwrap import ParamExecOrderWrapPolicy, TracingConfig

    cm = cost_model()  # for 2 ranks
    with pytest.raises(ValueError) as expected:
        cm.check_compatible(world_size=4, device_type=cm.device_type)
    assert str(expected.value) == (
        "cost model (test) does not fit world size 4 (this cost model is for 2 ranks): "
        "calibrate on the target's 4 ranks (`execwrap calibrate` under torchrun) or use a "
        "preset that describes them (CostModel.preset(name, world_size=4): the NVLink presets "
        "one node of 2-8 GPUs, h100-ib-400g 2 or more whole nodes of 8)"
    )
    linear = ModuleWrapPolicy({nn.Linear})
    with pytest.raises(ValueError) as info:
        ParamExecOrderWrapPolicy(
            linear, TracingConfig(), bucket_numel="auto", cost_model=cm, world_size=4
        )
    assert str(info.value) == str(expected.value)
    model, order = _model_and_order()
    with pytest.raises(ValueError) as info:
        plan_wrap(model, order, linear, bucket_numel="auto", cost_model=cm, world_size=4)
    assert str(info.value) == str(expected.value)
    policy = ParamExecOrderWrapPolicy(
        linear, TracingConfig(), bucket_numel="auto", cost_model=cm, world_size=2
    )
    assert policy.world_size == 2
    with pytest.raises(ValueError) as one:  # no preset describes one rank: none suggested
        cm.check_compatible(world_size=1, device_type=cm.device_type)
    assert str(one.value) == (
        "cost model (test) does not fit world size 1 (this cost model is for 2 ranks): "
        "calibrate on the target's 1 rank (`execwrap calibrate` under torchrun)"
    )


def test_policy_takes_the_auto_keywords() -> None:
    from execwrap import ParamExecOrderWrapPolicy, TracingConfig

    policy_cls = ParamExecOrderWrapPolicy
    linear = ModuleWrapPolicy({nn.Linear})
    with pytest.raises(ValueError, match=r'ParamExecOrderWrapPolicy: bucket_numel="auto" needs '):
        policy_cls(linear, TracingConfig(), bucket_numel="auto")
    with pytest.raises(ValueError, match=r"ParamExecOrderWrapPolicy: memory_budget must be > 0"):
        policy_cls(
            linear, TracingConfig(), bucket_numel="auto", cost_model=cost_model(), memory_budget=0
        )
    with pytest.raises(
        ValueError,
        match=r"bucket_numel must be a positive number of parameter "
        r'elements, "auto" or None; got -1',
    ):
        policy_cls(linear, TracingConfig(), bucket_numel=-1)
    model, _ = _model_and_order()
    policy = policy_cls(linear, TracingConfig(), bucket_numel="auto", cost_model=cost_model())
    plan = policy.build_plan(model)
    assert plan.groups == [[""], ["0", "1", "2"]] and plan.prefetch is not None
    nothing_to_capture = policy_cls(linear, bucket_numel="auto", cost_model=cost_model())
    with pytest.raises(
        ValueError,
        match=r"plans from the execution order before wrapping, but "
        r"there is none: pass order=, tracing_config= or example_inputs=",
    ):
        nothing_to_capture.build_plan(model)


def test_plan_wrap_auto_prices_the_optimizer_it_is_given() -> None:
    """AdamW keeps 2 states per parameter: 2 x 384 float32 elements (this rank's shard
    of three 16 x 16 layers at 2 ranks) = 3072 bytes; SGD none."""
    model, order = _model_and_order()
    kwargs = dict(bucket_numel="auto", cost_model=cost_model(), world_size=2)
    adamw = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}), **kwargs)
    sgd = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}), optimizer="sgd", **kwargs)
    assert adamw.estimate is not None and sgd.estimate is not None
    assert (adamw.estimate.memory.optimizer_state, sgd.estimate.memory.optimizer_state) == (
        3072,
        0,
    )


def test_simulate_step_defaults_to_the_auto_plans_own_choices() -> None:
    import torch

    from execwrap.simulate import simulate_step
    from tracing import record_execution_order

    model, _ = _model_and_order()
    order = record_execution_order(model, torch.randn(4, 16), timing=True)
    plan = plan_wrap(
        model, order, ModuleWrapPolicy({nn.Linear}), bucket_numel="auto", cost_model=cost_model()
    )
    assert plan.estimate is not None and plan.reshard_after_forward is not None
    again = simulate_step(plan, cost_model(), world_size=2)
    assert (again.prefetch, again.reshard_after_forward) == (
        plan.prefetch,
        plan.reshard_after_forward,
    )
    # the search adds the merged units' compute in another order: equal to rounding
    assert again.step_time_s == pytest.approx(plan.estimate.step_time_s, rel=1e-12)
    assert again.peak_memory_bytes == plan.estimate.peak_memory_bytes
