"""Device memory (:mod:`execwrap.cost.device_memory`): every preset knows its GPU's
memory, a calibrated model its device's; without a budget the auto-planner plans
within the device's memory minus a reserve and says so; a predicted peak over the
device's memory is named with its overshoot wherever a plan is predicted."""

from __future__ import annotations

import logging

import psutil
import pytest
import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap import CostModel, MemoryBudgetError, plan_wrap, simulate_step
from execwrap.cost.calibrate import measure_device_memory
from execwrap.cost.device_memory import default_memory_budget, memory_reserve
from execwrap.demo_models import Block, Llama, LlamaBlock, LlamaConfig, build_demo_model
from tracing import record_execution_order

GIB = 2**30


@pytest.mark.parametrize(
    ("preset", "nbytes"),
    [
        ("h100-nvlink-8", 80 * 10**9),  # the datasheet's "80 GB" of an H100 SXM5
        ("h100-ib-400g", 80 * 10**9),
        ("a100-nvlink-8", 80 * 10**9),  # of an A100 SXM4 80GB
    ],
)
def test_every_preset_knows_its_gpus_memory(preset: str, nbytes: int) -> None:
    cm = CostModel.preset(preset)
    assert cm.device_memory_bytes == nbytes
    assert CostModel.from_dict(cm.to_dict()).device_memory_bytes == nbytes


def test_the_reserve_and_the_default_budget() -> None:
    h100 = CostModel.preset("h100-nvlink-8")
    assert memory_reserve(h100) == (GIB, 384 * 2**20, 8 * 10**9)
    assert default_memory_budget(h100) == (
        70_523_604_992,
        "No memory_budget given: planned within 65.68 GiB per rank, the device's 74.51 GiB "
        "(preset h100-nvlink-8) minus a reserve of 8.83 GiB (CUDA runtime 1.00 GiB, NCCL "
        "buffers 384.00 MiB, allocator fragmentation 10% (7.45 GiB)); pass memory_budget= "
        "(--memory-budget) to plan within another figure.",
    )
    a100 = CostModel.preset("a100-nvlink-8")
    assert memory_reserve(a100) == (GIB, 192 * 2**20, 8 * 10**9)
    cpu = h100.replace(device_type="cpu", compute=h100.compute.__class__("cpu", 1e9, 1e9))
    cpu = cpu.replace(device_memory_bytes=8 * GIB, source="calibrated on 2 gloo ranks")
    assert memory_reserve(cpu) == (512 * 2**20, 0, 858_993_459)
    unknown = h100.replace(device_memory_bytes=None)  # a model saved before the field
    assert memory_reserve(unknown) is None and default_memory_budget(unknown) is None


def test_older_cost_model_files_load_without_device_memory() -> None:
    data = CostModel.preset("h100-nvlink-8").to_dict()
    del data["device_memory_bytes"]
    assert CostModel.from_dict(data).device_memory_bytes is None
    with pytest.raises(ValueError) as info:
        CostModel.from_dict({**data, "device_memory_bytes": -5}, source="cost.json")
    assert str(info.value) == (
        "cost.json: malformed cost model: field device_memory_bytes: expected an int >= 1 "
        "(bytes), got int -5"
    )


def test_a_calibrated_cpu_model_gets_the_hosts_memory_per_rank(monkeypatch) -> None:
    total = psutil.virtual_memory().total
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert measure_device_memory(torch.device("cpu"), 2) == total // 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun: 4 ranks on this host
    assert measure_device_memory(torch.device("cpu"), 8) == total // 4


@pytest.fixture(scope="module")
def llama_70b():
    cm = CostModel.preset("h100-nvlink-8")
    with torch.device("meta"):
        model = Llama(
            LlamaConfig(dim=8192, n_heads=64, n_layers=80, mlp_hidden=28672, vocab_size=128256)
        ).to(torch.bfloat16)
        tokens = torch.zeros(1, 256, dtype=torch.long)
    return model, record_execution_order(model, tokens, timing=cm.compute), cm


def test_the_70b_auto_plan_without_a_budget_is_refused_on_80gb_h100s_without_offload(
    llama_70b,
) -> None:
    model, order, cm = llama_70b
    with pytest.raises(MemoryBudgetError) as info:
        plan_wrap(
            model,
            order,
            ModuleWrapPolicy({LlamaBlock}),
            bucket_numel="auto",
            cost_model=cm,
            choose=("checkpointing", "accumulation"),
        )
    assert info.value.finding == (
        "no plan fits the memory budget of 65.68 GiB (70523604992 bytes) per rank: the smallest "
        "peak any candidate reaches is 87.22 GiB (93655107588 bytes) (per-unit, prefetch 0, full "
        "checkpointing; 81 candidate(s) simulated for 8 rank(s)), dominated by optimizer state "
        "(37.23 GiB (39974473728 bytes)) (no memory_budget given: the device's memory minus a "
        "reserve)"
    )
    assert str(info.value).endswith(
        "No memory_budget given: planned within 65.68 GiB per rank, the device's 74.51 GiB "
        "(preset h100-nvlink-8) minus a reserve of 8.83 GiB (CUDA runtime 1.00 GiB, NCCL "
        "buffers 384.00 MiB, allocator fragmentation 10% (7.45 GiB)); pass memory_budget= "
        "(--memory-budget) to plan within another figure."
    )


def test_the_70b_joint_plan_fits_80gb_h100s_by_offloading(llama_70b) -> None:
    model, order, cm = llama_70b
    plan = plan_wrap(
        model, order, ModuleWrapPolicy({LlamaBlock}), bucket_numel="auto", cost_model=cm
    )
    assert plan.training is not None and plan.training.offload == "cpu"
    assert plan.estimate is not None and plan.search is not None
    assert plan.search.memory_budget == 70523604992
    assert plan.estimate.peak_memory_bytes <= plan.search.memory_budget


@pytest.fixture(scope="module")
def demo():
    model = build_demo_model(n_blocks=2)
    cm = CostModel.preset("h100-nvlink-8")
    tokens = torch.zeros(2, 16, dtype=torch.long)
    with torch.device("meta"):
        meta = build_demo_model(n_blocks=2)
    order = record_execution_order(meta, tokens.to("meta"), timing=cm.compute)
    return model, order, cm


def test_without_a_budget_the_plan_says_what_it_was_planned_within(demo) -> None:
    model, order, cm = demo
    plan = plan_wrap(model, order, ModuleWrapPolicy({Block}), bucket_numel="auto", cost_model=cm)
    assert plan.search is not None and plan.search.memory_budget == 70_523_604_992
    (note,) = [n for n in plan.notes if n.startswith("No memory_budget given")]
    assert note.startswith("No memory_budget given: planned within 65.68 GiB per rank, the")


def test_a_chosen_plan_over_the_devices_memory_warns_with_the_overshoot(demo, caplog) -> None:
    model, order, cm = demo
    small = cm.replace(device_memory_bytes=2**20)  # 1 MiB: every plan is over it
    with caplog.at_level(logging.WARNING, logger="execwrap"):
        plan = plan_wrap(
            model,
            order,
            ModuleWrapPolicy({Block}),
            bucket_numel="auto",
            cost_model=small,
            memory_budget=GIB,
        )
    assert plan.estimate is not None
    peak = int(plan.estimate.peak_memory_bytes)
    assert peak - 2**20 == 542_600  # the head's 16640 bytes of activations freed first
    over = (
        "The chosen plan's predicted peak of 1.52 MiB per rank is over the device's memory of "
        "1.00 MiB (preset h100-nvlink-8) by 529.88 KiB: this step would run out of memory"
    )
    assert caplog.messages == [f"plan_wrap: {over} (memory_budget is above it)"]
    assert [n for n in plan.notes if "over the device's memory" in n] == [over]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="execwrap"):
        estimate = simulate_step(plan, small, world_size=8)
    assert caplog.messages == [over.replace("The chosen plan", "simulate_step: the plan")]
    assert int(estimate.peak_memory_bytes) == peak


def test_the_calibrate_summary_names_the_device_memory() -> None:
    from execwrap.cli.calibrate import summary_rows

    rows = dict(summary_rows(CostModel.preset("h100-nvlink-8")))
    assert rows["device memory per rank"] == "74.51 GiB"
