"""FSDP1 and a plan whose training step chose CPU offload (``plan.training.offload``):
``fsdp1_step``, which ``ParamExecOrderWrapPolicy`` runs inside ``FullyShardedDataParallel``
before anything is wrapped, refuses it on a CPU device naming the plan (as
``apply_fully_shard`` does for FSDP2), and applies the plan without offload when
``cpu_offload=CPUOffload(offload_params=False)`` is given. The same through a real FSDP1
wrap on 2 ranks: ``tests/distributed/test_training_step.py``."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from torch.distributed.fsdp import CPUOffload

from execwrap import ModuleWrapPolicy, TracingConfig, TrainingStep, plan_wrap
from execwrap.demo_models import Llama, LlamaBlock, LlamaConfig
from execwrap.fsdp.plan_step import fsdp1_step
from tracing import capture_execution_order

CPU = torch.device("cpu")
NO_ACCELERATOR = "" if torch.accelerator.is_available() else " (torch.accelerator.is_available() is False)"  # fmt: skip


@pytest.fixture(scope="module")
def model_and_plan():  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=32, dim=16, n_heads=2, n_layers=2, mlp_hidden=24))
    order = capture_execution_order(model, tracing_config=TracingConfig())
    plan = plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock}))
    return model, dataclasses.replace(plan, training=TrainingStep(offload="cpu"))


def test_the_plans_offload_on_a_cpu_device_is_refused_naming_the_plan(model_and_plan) -> None:
    model, plan = model_and_plan
    with pytest.raises(ValueError) as refused:
        fsdp1_step(model, plan, {"device_id": CPU, "cpu_offload": None}, None, 1)
    assert str(refused.value) == (
        "ParamExecOrderWrapPolicy: the plan's training step chose CPU offload "
        "(plan.training.offload='cpu'), which keeps the sharded parameters, gradients and "
        "optimizer state in host memory and copies them to an accelerator for each all-gather, "
        f"but the device is the CPU{NO_ACCELERATOR}: the parameters already live in host "
        "memory and there is no accelerator to copy them to (torch would fail later with "
        '"Cannot access accelerator device when none is available."); nothing has been '
        "wrapped. Pass FullyShardedDataParallel(..., cpu_offload=CPUOffload("
        "offload_params=False)) to apply the plan without offload, or plan again with a cost "
        "model of this device (CostModel.calibrate() on it)"
    )


def test_no_offload_given_on_a_cpu_device_applies_the_plan_without_it(
    model_and_plan, caplog
) -> None:
    model, plan = model_and_plan
    kwargs = {"device_id": CPU, "cpu_offload": CPUOffload(offload_params=False)}
    with caplog.at_level(logging.INFO, logger="execwrap.fsdp.plan_step"):
        assert fsdp1_step(model, plan, kwargs, None, 1) == (None, 1)
    assert caplog.messages == [
        "ParamExecOrderWrapPolicy: cpu_offload=CPUOffload(offload_params=False) given on a CPU "
        "device: the plan is applied without its training step's CPU offload "
        "(plan.training.offload='cpu'), which needs an accelerator to copy to; plan.estimate "
        "and the memory budget it was planned under describe the step with offload"
    ]


def test_on_an_accelerator_fsdp1_must_be_given_the_plans_offload(model_and_plan) -> None:
    model, plan = model_and_plan
    with pytest.raises(ValueError) as refused:
        fsdp1_step(model, plan, {"device_id": torch.device("cuda", 0)}, None, 1)
    assert str(refused.value) == (
        "ParamExecOrderWrapPolicy: the plan's training step offloads to the CPU, but FSDP got "
        "no cpu_offload, and FSDP1 takes the root's offload from its own argument: pass "
        "FullyShardedDataParallel(..., cpu_offload=CPUOffload(offload_params=True)); nothing "
        "has been wrapped"
    )
