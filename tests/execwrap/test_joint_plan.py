"""The joint auto-planner: the training step chosen with the groups, carried by the plan.

A small Llama on the meta device, priced on the ``h100-nvlink-8`` preset (GPU rates, so
checkpointing and offload are choices the planner can make), at a sequence long enough
that the activations dominate. Exact values where the figures are the simulator's.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap import (
    CostModel,
    MemoryBudgetError,
    Precision,
    TrainingStep,
    WrapPlan,
    largest_micro_batch,
    plan_wrap,
    simulate_step,
)
from execwrap.demo_models import Llama, LlamaBlock, LlamaConfig
from execwrap.planning.micro_batch import scaled_order
from tracing import record_execution_order

SEQ = 1024
POLICY = ModuleWrapPolicy({LlamaBlock})


@pytest.fixture(scope="module")
def llama():
    cm = CostModel.preset("h100-nvlink-8")
    with torch.device("meta"):
        model = Llama(LlamaConfig(dim=128, n_heads=4, n_layers=3, mlp_hidden=344, vocab_size=512))

    def capture(batch: int):
        tokens = torch.zeros(batch, SEQ, dtype=torch.long, device="meta")
        return record_execution_order(model, tokens, timing=cm.compute)

    order = capture(1)
    per_block = plan_wrap(model, order, POLICY)
    peaks = {
        mode: int(
            simulate_step(
                per_block, cm, world_size=8, training=TrainingStep(checkpointing=mode)
            ).peak_memory_bytes
        )
        for mode in ("none", "full")
    }
    return model, capture, order, cm, peaks


def _budget(peaks: dict[str, int]) -> int:
    """40% of the way from per-block with full checkpointing to per-block without."""
    return int(peaks["full"] + 0.4 * (peaks["none"] - peaks["full"]))


def test_the_joint_plan_checkpoints_to_fit_where_per_block_does_not(llama) -> None:
    model, _, order, cm, peaks = llama
    budget = _budget(peaks)
    assert peaks["none"] > budget
    plan = plan_wrap(model, order, POLICY, bucket_numel="auto", cost_model=cm, memory_budget=budget)
    assert plan.estimate is not None and plan.search is not None and plan.training is not None
    assert plan.estimate.peak_memory_bytes <= budget
    modes = plan.checkpoint_modes()
    assert modes[plan.root_index] == "none" and set(modes) - {"none"}
    # the plan's step is what it was predicted with
    # (every field: the search simulates its candidates without timelines and the chosen
    # one again with them)
    again = simulate_step(plan, cm, world_size=8)
    assert again == plan.estimate
    assert len(plan.estimate.timeline) > 0
    assert len(plan.estimate.memory_timeline) > 1
    # faster than the usual fallback, full checkpointing of every block, which also fits
    full = plan_wrap(model, order, POLICY, training=TrainingStep(checkpointing="full"))
    fallback = simulate_step(full, cm, world_size=8)
    assert fallback.peak_memory_bytes <= budget
    assert plan.estimate.step_time_s < fallback.step_time_s


def test_the_plans_training_step_round_trips(llama, tmp_path) -> None:
    model, _, order, cm, peaks = llama
    step = TrainingStep(
        precision=Precision(param_dtype="float32", reduce_dtype="float32"), micro_batches=4
    )
    plan = plan_wrap(
        model,
        order,
        POLICY,
        bucket_numel="auto",
        cost_model=cm,
        memory_budget=_budget(peaks),
        training=step,
    )
    assert plan.training is not None
    assert plan.training.micro_batches == 4
    assert plan.training.precision == step.precision
    data = json.loads(json.dumps(plan.to_dict()))
    back = WrapPlan.from_dict(data, order)
    assert back.training == plan.training
    assert back.checkpoint_modes() == plan.checkpoint_modes()
    assert TrainingStep.from_dict(plan.training.to_dict()) == plan.training
    assert plan.training.describe() in str(plan)  # the summary names the step


def test_a_fixed_plan_carries_the_step_it_is_given(llama) -> None:
    model, _, order, _, _ = llama
    plan = plan_wrap(model, order, POLICY, training=TrainingStep(checkpointing="full"))
    blocks = [u.module_fqns[0] for u in plan.units if u.module_fqns[0] != ""]
    assert plan.training == TrainingStep(unit_checkpointing={b: "full" for b in blocks})


def test_choose_limits_what_the_planner_chooses(llama) -> None:
    model, _, order, cm, peaks = llama
    plan = plan_wrap(
        model,
        order,
        POLICY,
        bucket_numel="auto",
        cost_model=cm,
        memory_budget=peaks["none"] * 2,
        training=TrainingStep(micro_batches=2),
        choose=(),
    )
    assert plan.training == TrainingStep(micro_batches=2)
    with pytest.raises(ValueError, match="choose"):
        plan_wrap(model, order, POLICY, bucket_numel="auto", cost_model=cm, choose=("precision",))


@pytest.mark.parametrize(
    ("step", "kept"),
    [
        (TrainingStep(checkpointing="full"), ("offload", "accumulation")),
        (TrainingStep(offload="cpu"), ("checkpointing", "accumulation")),
        (TrainingStep(micro_batches=2, gradient_sync="last"), ("checkpointing", "offload")),
    ],
)
def test_a_setting_training_fixes_is_kept_without_choose(llama, step, kept) -> None:
    """``choose=`` left out: the planner chooses what ``training`` leaves at its default and
    keeps what it fixes; an explicit ``choose=`` naming a fixed setting is refused with the
    ``choose=`` that keeps it."""
    model, _, order, cm, peaks = llama
    args = (model, order, POLICY)
    kw = dict(bucket_numel="auto", cost_model=cm, memory_budget=peaks["none"] * 2, training=step)
    plan = plan_wrap(*args, **kw)  # type: ignore[arg-type]
    assert plan.training is not None
    if step.checkpointing == "full":
        assert plan.checkpoint_modes()[1:] == ("full",) * (len(plan.groups) - 1)
    assert (plan.training.offload, plan.training.gradient_sync) == (
        step.offload,
        step.gradient_sync,
    )
    fixed = next(n for n in ("checkpointing", "offload", "accumulation") if n not in kept)
    with pytest.raises(ValueError) as info:
        plan_wrap(*args, **kw, choose=("checkpointing", "offload", "accumulation"))  # type: ignore[arg-type]
    assert str(info.value) == (
        f"plan_wrap: training fixes {fixed} but choose=('checkpointing', 'offload', "
        f"'accumulation') leaves it to the planner: pass choose={kept!r} (or leave choose= "
        "out: it defaults to ('checkpointing', 'offload', 'accumulation') less what training "
        "fixes) to keep training's setting, or leave it at the default in training for the "
        "planner to choose"
    )


def test_a_budget_nothing_meets_names_one_micro_batchs_activations(llama) -> None:
    model, _, order, cm, peaks = llama
    with pytest.raises(MemoryBudgetError) as info:
        plan_wrap(
            model,
            order,
            POLICY,
            bucket_numel="auto",
            cost_model=cm,
            memory_budget=peaks["full"] // 2,
        )
    assert str(info.value) == (
        "no plan fits the memory budget of 10.17 MiB (10663652 bytes) per rank: the smallest "
        "peak any candidate reaches is 19.21 MiB (20141064 bytes) (per-unit, prefetch 0, full "
        "checkpointing; CPU offload; 59 candidate(s) simulated for 8 rank(s)), dominated by "
        "activations of one micro-batch (10.91 MiB (11436032 bytes)) even with full "
        "checkpointing of every unit; to fit, raise the budget, or lower the sequence length "
        "or the micro-batch"
    )
    assert info.value.part == "activations"


def test_scaled_order_is_exact_for_activations(llama) -> None:
    _, capture, one, _, _ = llama
    two, three = capture(2), capture(3)
    scaled = scaled_order(one, two, 3)
    assert scaled.saved_activation_bytes == three.saved_activation_bytes
    assert scaled.input_activation_bytes == three.input_activation_bytes
    with pytest.raises(
        ValueError, match=r"^scaled_order: size must be an int >= 1 \(sequences\), got 0$"
    ):
        scaled_order(one, two, 0)


def test_largest_micro_batch(llama) -> None:
    model, capture, _, cm, peaks = llama
    budget = peaks["none"] * 3
    fit = largest_micro_batch(model, capture, POLICY, cost_model=cm, memory_budget=budget)
    # doubling from 1 until 8 does not fit, then bisection between 4 and 8
    assert fit.tried == (
        (1, 44094280),
        (2, 81564488),
        (4, 114196296),
        (8, None),
        (6, 105311048),
        (7, 122022728),
    )
    assert fit.micro_batch == 7
    assert fit.plan.estimate is not None
    assert fit.plan.estimate.peak_memory_bytes == 122022728 <= budget
    assert fit.plan.checkpoint_modes().count("full") == 2  # checkpointing makes 7 fit
    with pytest.raises(ValueError, match="largest_micro_batch: max_micro_batch"):
        largest_micro_batch(
            model, capture, POLICY, cost_model=cm, memory_budget=budget, max_micro_batch=0
        )
    with pytest.raises(MemoryBudgetError):
        largest_micro_batch(model, capture, POLICY, cost_model=cm, memory_budget=1)
