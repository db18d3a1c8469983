"""Tests for execwrap.simulate.training: the TrainingStep and Precision settings."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.nn as nn

from execwrap import ModuleWrapPolicy, plan_wrap
from execwrap.simulate import Precision, TrainingStep
from execwrap.simulate.training import dtype_itemsize, resolve_training
from tracing import trace_execution_order


def _plan() -> object:
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(5)))
    return plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({nn.Linear}))


def test_defaults_are_the_plain_step() -> None:
    step = TrainingStep()
    assert step.is_default and step.precision.is_default
    assert step.precision.compute_dtype == "float32"
    assert (step.offload, step.micro_batches, step.gradient_sync) == ("none", 1, "every")
    assert not TrainingStep(micro_batches=2).is_default


def test_precision_takes_names_or_torch_dtypes() -> None:
    p = Precision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert (p.param_dtype, p.reduce_dtype) == ("bfloat16", "float32")
    assert p.gather_dtype("float32") == "bfloat16"
    assert p.reduce_dtype_for("float32") == "float32"
    # FSDP2: reduce_dtype None reduces in param_dtype
    assert Precision(param_dtype="float16").reduce_dtype_for("float32") == "float16"
    assert Precision(autocast_dtype="bfloat16").compute_dtype == "bfloat16"
    assert Precision(autocast_dtype="bfloat16").gather_dtype("float32") == "float32"
    assert (dtype_itemsize("bfloat16"), dtype_itemsize("float32")) == (2, 4)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"param_dtype": "int8"},
            ValueError,
            "Precision.param_dtype must be None or one of ['float32', 'bfloat16', 'float16'] "
            "(a name or the torch.dtype), got 'int8'",
        ),
        (
            {"reduce_dtype": torch.float64},
            ValueError,
            "Precision.reduce_dtype must be None or one of ['float32', 'bfloat16', 'float16'] "
            "(a name or the torch.dtype), got torch.float64",
        ),
        (
            {"cast_forward_inputs": 1},
            TypeError,
            "Precision.cast_forward_inputs must be a bool, got 1",
        ),
    ],
)
def test_bad_precision_is_refused(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        Precision(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"checkpointing": "some"},
            "TrainingStep.checkpointing must be one of ['none', 'full', 'selective'], got 'some'",
        ),
        ({"offload": "gpu"}, "TrainingStep.offload must be one of ['none', 'cpu'], got 'gpu'"),
        (
            {"gradient_sync": "never"},
            "TrainingStep.gradient_sync must be one of ['every', 'last'], got 'never'",
        ),
        ({"micro_batches": 0}, "TrainingStep.micro_batches must be an int >= 1, got 0"),
        ({"checkpoint_every": True}, "TrainingStep.checkpoint_every must be an int >= 1, got True"),
        (
            {"unit_checkpointing": {"layers.0": "half"}},
            "TrainingStep.unit_checkpointing['layers.0'] must be one of ['none', 'full', "
            "'selective'], got 'half'",
        ),
    ],
)
def test_bad_training_step_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        TrainingStep(**kwargs)
    assert str(info.value) == message


def test_type_errors_name_the_field() -> None:
    with pytest.raises(TypeError) as info:
        TrainingStep(precision=torch.bfloat16)  # type: ignore[arg-type]
    assert str(info.value) == (
        'TrainingStep.precision must be a Precision (e.g. Precision(param_dtype="bfloat16", '
        "reduce_dtype=\"float32\")) or one of ['bf16', 'bf16-reduce', 'fp32'], got dtype"
    )
    with pytest.raises(TypeError, match="reshard_after_backward must be a bool, got 'no'"):
        TrainingStep(reshard_after_backward="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"keys must be unit indices \(int\) or module FQNs"):
        TrainingStep(unit_checkpointing={1.5: "full"})  # type: ignore[dict-item]


def test_precision_by_the_names_the_command_line_takes() -> None:
    bf16 = Precision(param_dtype="bfloat16", reduce_dtype="float32")
    step = TrainingStep(precision="bf16", micro_batches=2)  # type: ignore[arg-type]
    assert step.precision == bf16 and type(step.precision) is Precision
    assert step == TrainingStep(precision=bf16, micro_batches=2)
    assert hash(step) == hash(TrainingStep(precision=bf16, micro_batches=2))
    assert step.to_dict() == TrainingStep(precision=bf16, micro_batches=2).to_dict()
    assert TrainingStep.from_dict(step.to_dict()) == step
    assert TrainingStep(precision="bf16-reduce").precision == Precision(  # type: ignore[arg-type]
        param_dtype="bfloat16", reduce_dtype="bfloat16"
    )
    assert TrainingStep(precision="fp32") == TrainingStep()  # type: ignore[arg-type]
    with pytest.raises(ValueError) as info:
        TrainingStep(precision="bfloat16")  # type: ignore[arg-type]
    assert str(info.value) == (
        "TrainingStep.precision 'bfloat16' is not a precision name; choose one of ['bf16', "
        "'bf16-reduce', 'fp32'] or pass a Precision (e.g. Precision(param_dtype=\"bfloat16\", "
        'reduce_dtype="float32"))'
    )


def test_checkpoint_modes_per_unit() -> None:
    plan = _plan()
    assert [u.label for u in plan.units] == ["<root>", "0", "1", "2", "3", "4"]
    assert TrainingStep(checkpointing="full").checkpoint_modes(plan) == (
        "none",
        *("full",) * 5,
    )
    # torchtitan's per-layer option: every 2nd block, counted from 1
    every2 = TrainingStep(checkpointing="full", checkpoint_every=2).checkpoint_modes(plan)
    assert every2 == ("none", "none", "full", "none", "full", "none")
    mixed = TrainingStep(
        checkpointing="selective", unit_checkpointing={1: "none", "4": "full"}
    ).checkpoint_modes(plan)
    assert mixed == ("none", "none", "selective", "selective", "selective", "full")


def test_bridges_to_what_applies_the_step() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = Precision("bfloat16", "float32").fsdp_policy()
    assert policy == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    step = TrainingStep(
        checkpointing="selective", checkpoint_every=2, unit_checkpointing={5: "full"}
    )
    assert step.checkpoint_targets(_plan()) == {"1": "selective", "3": "selective", "4": "full"}


def test_units_inside_others_are_left_to_them() -> None:
    inner = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    model = nn.Sequential(inner, nn.Linear(4, 4))
    plan = plan_wrap(
        model, trace_execution_order(model), ModuleWrapPolicy({nn.Linear, nn.Sequential})
    )
    assert [u.label for u in plan.units] == ["<root>", "0", "0.0", "0.1", "1"]
    assert TrainingStep(checkpointing="full").checkpoint_modes(plan) == (
        "none",
        "full",
        "none",
        "none",
        "full",
    )


def test_checkpoint_modes_refuse_what_the_plan_does_not_have() -> None:
    plan = _plan()
    with pytest.raises(ValueError, match=r"unit index 6 is out of range: the plan has 6 units"):
        TrainingStep(unit_checkpointing={6: "full"}).checkpoint_modes(plan)
    with pytest.raises(ValueError, match=r"'blocks\.0' is no module of a plan unit; name a"):
        TrainingStep(unit_checkpointing={"blocks.0": "full"}).checkpoint_modes(plan)
    with pytest.raises(
        ValueError, match=r"the root unit '<root>' cannot be checkpointed \('full'\): it holds"
    ):
        TrainingStep(unit_checkpointing={"": "full"}).checkpoint_modes(plan)


def test_resolve_training_replaces_the_given_fields() -> None:
    base = TrainingStep(checkpointing="full", micro_batches=2)
    assert resolve_training(None) == TrainingStep()
    assert resolve_training(base) is base
    assert resolve_training(base, micro_batches=4) == dataclasses.replace(base, micro_batches=4)
    with pytest.raises(ValueError, match="TrainingStep.offload must be one of"):
        resolve_training(base, offload="disk")
    with pytest.raises(TypeError, match="training must be a TrainingStep, got dict"):
        resolve_training({})  # type: ignore[arg-type]
