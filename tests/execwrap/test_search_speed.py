"""What keeps the joint search fast without changing what it finds: estimates without
timelines for the candidates, and the cyclic garbage collector paused while it runs."""

from __future__ import annotations

import dataclasses
import gc

import pytest
import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap import CostModel, TrainingStep, plan_wrap
from execwrap.demo_models import Llama, LlamaBlock, LlamaConfig
from execwrap.simulate.step import step_estimate
from execwrap.util.gc_pause import gc_paused
from tracing import record_execution_order


@pytest.fixture(scope="module")
def per_block():
    cm = CostModel.preset("h100-nvlink-8")
    with torch.device("meta"):
        model = Llama(LlamaConfig(dim=128, n_heads=4, n_layers=3, mlp_hidden=344, vocab_size=512))
        tokens = torch.zeros(1, 512, dtype=torch.long)
    order = record_execution_order(model, tokens, timing=cm.compute)
    return plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock})), cm


@pytest.mark.parametrize(
    "step",
    [
        TrainingStep(),
        TrainingStep(checkpointing="selective", micro_batches=3, gradient_sync="last"),
        TrainingStep(checkpointing="full", offload="cpu", micro_batches=2),
    ],
    ids=["default", "selective-last", "full-offload"],
)
def test_an_estimate_without_detail_differs_only_in_its_timelines(per_block, step) -> None:
    plan, cm = per_block
    full = step_estimate(plan, cm, world_size=8, training=step)
    bare = step_estimate(plan, cm, world_size=8, training=step, detail=False)
    assert len(full.timeline) > 0 and len(full.memory_timeline) > 1
    assert bare.timeline == () and bare.memory_timeline == ()
    assert bare == dataclasses.replace(full, timeline=(), memory_timeline=())


def test_gc_paused_disables_the_collector_and_restores_it() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the outer block enables it again
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="^boom$"), gc_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_gc_paused_leaves_a_collector_the_caller_disabled() -> None:
    gc.disable()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
