"""execwrap.sizing: clusters, precisions, the largest micro-batch, size_job, recipes.

The model is the demo GPT on the meta device, sized for 8x H100 (the preset); the
largest micro-batch is the joint planner's own answer (execwrap.largest_micro_batch).
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from execwrap import Precision, TrainingStep, largest_micro_batch, simulate_step
from execwrap.demo_models import GPT
from execwrap.sizing import (
    RECIPE_FRAMEWORKS,
    FitResult,
    cluster_of,
    largest_fitting,
    module_target,
    precision_of,
    recipe,
    render_fit_page,
    size_job,
    summary_rows,
)
from tracing import record_execution_order

BUDGET = 200_000_000
SEQ = 64


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    with torch.device("meta"):
        return GPT()


@pytest.fixture(scope="module")
def result(model: torch.nn.Module) -> FitResult:
    return size_job(module_target(model), sequence_length=SEQ, micro_batch=4, memory_budget=BUDGET)


def test_clusters() -> None:
    c = cluster_of("h100-nvlink-8")
    assert (c.world_size, c.nodes, c.cost_model.world_size) == (8, 1, 8)
    assert c.description == "8 GPUs: 8x H100 SXM in one node, NVLink/NVSwitch"
    ib = cluster_of("h100-ib-400g", nodes=4)
    assert (ib.world_size, ib.cost_model.world_size) == (32, 32)


@pytest.mark.parametrize(
    ("cluster", "nodes", "message"),
    [
        ("h100-nvlink-8", 2, r"cluster 'h100-nvlink-8' is one node of 8 GPUs \(NVLink\); for 2 nodes use an InfiniBand preset such as 'h100-ib-400g'"),
        ("h100-ib-400g", 1, r"cluster 'h100-ib-400g' describes two or more nodes over InfiniBand; pass --nodes 2"),
        ("no-such-gpu", 1, r"cluster 'no-such-gpu' is neither a preset \(a100-ib-200g, a100-nvlink-8, b200-ib-400g, b200-ib-800g, h100-ib-400g, h100-nvlink-8, h100-roce-400g, h200-ib-400g\) nor a cost model file"),
        ("h100-nvlink-8", 0, r"nodes must be an int >= 1 \(nodes\), got 0"),
    ],
)  # fmt: skip
def test_bad_clusters(cluster: str, nodes: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cluster_of(cluster, nodes)


def test_calibrated_cluster_is_the_ranks_it_was_measured_on(tmp_path) -> None:
    path = tmp_path / "cost.json"
    cluster_of("h100-nvlink-8").cost_model.save(path)
    c = cluster_of(path)
    assert (c.world_size, c.description) == (8, "8 ranks: calibrated (cuda, nccl)")
    with pytest.raises(
        ValueError, match=r"is a calibrated cost model of 8 ranks as measured; pass --nodes 1"
    ):
        cluster_of(path, nodes=2)


def test_precisions() -> None:
    assert precision_of("bf16")[1] == Precision(param_dtype="bfloat16", reduce_dtype="float32")
    assert precision_of("bf16-reduce")[1] == Precision(
        param_dtype="bfloat16", reduce_dtype="bfloat16"
    )
    assert precision_of("fp32")[1] == Precision()
    with pytest.raises(
        ValueError,
        match=r"unknown precision 'fp8'; choose one of \['bf16', 'bf16-reduce', 'fp32'\]",
    ):
        precision_of("fp8")


def test_largest_fitting_tries_the_line_then_bisects() -> None:
    assert largest_fitting(lambda b: 10 * b, 55) == (5, ((1, 10), (2, 20), (5, 50), (6, 60)))
    assert largest_fitting(lambda b: 10 * b, 5) == (0, ((1, 10),))
    assert largest_fitting(lambda b: 10 * b, 15) == (1, ((1, 10), (2, 20)))
    assert largest_fitting(lambda b: 10 * b, 10**6, max_micro_batch=8) == (
        8,
        ((1, 10), (2, 20), (8, 80)),
    )
    size, tried = largest_fitting(lambda b: 10 * b + b * b, 200)
    assert (size, [b for b, _ in tried]) == (10, [1, 2, 15, 8, 11, 9, 10])


def test_size_job(result: FitResult, model: torch.nn.Module) -> None:
    assert (result.fits, result.micro_batch, result.sequence_length) == (True, 4, SEQ)
    assert (result.precision, result.memory_budget, result.parameters) == ("bf16", BUDGET, 220_544)
    assert result.plan is not None and result.plan.search is not None
    assert result.plan.search.best.label == "root + 1 group of 4 units, prefetch 0, no reshard"
    assert result.peak_memory_bytes == 3_672_388
    assert result.tokens_per_s_per_gpu == 4 * SEQ / result.step_time_s
    assert result.memory is not None and result.memory.total == result.peak_memory_bytes


def test_largest_micro_batch_is_the_joint_planners(
    result: FitResult, model: torch.nn.Module
) -> None:
    """The least-memory shortcut gives execwrap.largest_micro_batch's answer."""
    cm = result.cluster.cost_model
    step = TrainingStep(precision=precision_of("bf16")[1])

    def capture(b: int):
        ids = torch.zeros(b, SEQ, dtype=torch.long, device="meta")
        return record_execution_order(model, ids, timing=cm.compute, param_dtype=torch.bfloat16)

    joint = largest_micro_batch(
        model, capture, module_target(model).init_policy, cost_model=cm,
        memory_budget=BUDGET, world_size=8, training=step,
    )  # fmt: skip
    assert result.largest_micro_batch == joint.micro_batch == 860


def test_a_fitting_micro_batch_is_at_most_the_largest(model: torch.nn.Module, monkeypatch) -> None:
    """The invariant size_job checks: a searched plan that fits micro-batch m means a
    largest micro-batch >= m (tests/integrations/test_fit.py pins it on the 8B Llama,
    where the root's resharding once broke it). Least-memory peaks over every budget
    would break it, and size_job refuses to answer."""
    import execwrap.sizing.job as job

    monkeypatch.setattr(job, "least_memory_peak", lambda *args, **kwargs: 10 * BUDGET)
    with pytest.raises(
        AssertionError,
        match=r"size_job: the planner fits micro-batch 4 but the least-memory plans give a "
        r"largest micro-batch of 0 \(tried \(\(1, 2000000000\),\)\)",
    ):
        size_job(module_target(model), sequence_length=SEQ, micro_batch=4, memory_budget=BUDGET)


def test_nothing_fits(model: torch.nn.Module) -> None:
    r = size_job(module_target(model), sequence_length=SEQ, micro_batch=1, memory_budget=100_000)
    assert (r.fits, r.plan, r.largest_micro_batch, r.tried) == (False, None, 0, ((1, 847_492),))
    assert r.reason is not None and r.reason.startswith(
        "no plan fits the memory budget of 97.66 KiB (100000 bytes) per rank: the smallest "
        "peak any candidate reaches is 827.63 KiB (847492 bytes)"
    )  # the least-memory peak of micro-batch 1 above
    assert ("fits", "no: no plan within 97.66 KiB per GPU") in summary_rows(r)
    with pytest.raises(
        ValueError, match=r"no plan fits, so there is no recipe: try --micro-batch 1"
    ):
        recipe(r, "fsdp2")


def test_json_and_page(result: FitResult) -> None:
    data = json.loads(json.dumps(result.to_dict()))
    assert (data["kind"], data["fits"], data["largest_micro_batch"]) == ("execwrap-fit", True, 860)
    assert data["plan"]["groups"] == [[""], ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]]
    assert data["memory"]["total"] == 3_672_388
    page = render_fit_page(result)
    assert "Memory per GPU at the peak" in page and "execwrap.apply_fully_shard(model, plan" in page


def test_recipes(result: FitResult) -> None:
    for name in RECIPE_FRAMEWORKS:
        compile(recipe(result, name), name, "exec")  # each is valid Python
    text = recipe(result, "fsdp2", plan_path="out/plan.json", steps=3)
    assert "SEQUENCE_LENGTH, MICRO_BATCH, STEPS = 64, 4, 3" in text
    assert "PLAN = 'out/plan.json'  # written by: execwrap fit ... --out out" in text
    with pytest.raises(
        ValueError, match=r"unknown framework 'deepspeed'; choose one of \['fsdp2', "
    ):
        recipe(result, "deepspeed")


def test_cli_fit_of_a_factory(capsys) -> None:
    """``execwrap fit PKG.MODULE:FACTORY``: the model built on the meta device."""
    from execwrap.cli import main

    argv = ["fit", "execwrap.demo_models:GPT", "--sequence-length", "64", "--micro-batch", "4"]
    assert main([*argv, "--memory-budget", "200000000", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["model"], data["fits"], data["largest_micro_batch"]) == (
        "GPT (execwrap.demo_models:GPT)",
        True,
        860,
    )
    assert data["source"] == {"kind": "factory", "factory": "execwrap.demo_models:GPT"}


def test_a_given_plan_is_priced_for_the_asked_step(
    result: FitResult, model: torch.nn.Module
) -> None:
    """The plan made for micro-batch 4, given for micro-batch 1: its groups, prefetch,
    resharding and step, priced on micro-batch 1's order, not on the order it was made
    from."""
    planned = result.plan
    assert planned is not None and planned.estimate is not None
    again = size_job(
        module_target(model), sequence_length=SEQ, micro_batch=1, memory_budget=BUDGET,
        plan=planned,
    )  # fmt: skip
    assert again.given_plan and again.plan is not None and again.plan.estimate is not None
    assert again.plan.groups == planned.groups and planned.order is not again.plan.order
    assert again.peak_memory_bytes < planned.estimate.peak_memory_bytes
    assert again.tokens_per_s_per_gpu == 1 * SEQ / again.step_time_s
    fresh = size_job(module_target(model), sequence_length=SEQ, micro_batch=1, memory_budget=BUDGET)
    assert fresh.plan is not None
    ordered = copy.copy(planned)
    ordered.order = fresh.plan.order  # the same capture of micro-batch 1
    cm = result.cluster.cost_model
    expected = simulate_step(ordered, cm, world_size=8, training=planned.training)
    assert again.peak_memory_bytes == expected.peak_memory_bytes
    assert again.step_time_s == expected.step_time_s


def test_parameter_count_reads_at_every_size() -> None:
    """A tiny model is not "0.00 B parameters"."""
    from execwrap.sizing.summary import parameter_count

    assert [parameter_count(n) for n in (8_030_261_248, 124_439_808, 26_784, 512)] == [
        "8.03 B",
        "124.44 M",
        "26.78 k",
        "512",
    ]
