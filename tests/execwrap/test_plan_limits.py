"""Plans FSDP can build: shared modules, 0-dim parameters, and notes that say something.

The FSDP side of each case runs on 2 gloo ranks in
``tests/distributed/test_fsdp_builds.py``; here the plans and their notes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, always_wrap_policy

from execwrap import PlanError, WrapPlan, plan_wrap
from execwrap.fsdp.shardable import check_shardable, scalar_params
from execwrap.plan.unit import WrapUnit
from tests.execwrap.factories import ClipHead, Conv, GainBlock, SharedBlocks, SharedEmbed
from tracing import record_execution_order, trace_execution_order

SHARED_NOTE = (
    "Module 'conv1.embed' (Linear) is registered under 2 names ('conv1.embed' and "
    "'conv2.embed'), so it cannot be an FSDP unit: FSDP1 puts a unit's wrapper under the "
    "module's first name only, and a call through another name would run it with its "
    "parameters still sharded. Not wrapped; its own parameters (2 parameters, 72 elements) go "
    "to unit <root>, which encloses every name of it."
)


def test_shared_module_under_always_wrap():
    model = SharedEmbed()
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy)
    assert plan.policy_fqns == (
        "",
        "conv1",
        "conv1.embed",
        "conv1.proj",
        "conv2",
        "conv2.proj",
        "head",
    )
    assert plan.groups == [[""], ["conv1.proj"], ["conv2.proj"], ["head"]]
    assert plan.units[0].param_fqns == ("conv1.embed.weight", "conv1.embed.bias")
    assert plan.notes == [
        SHARED_NOTE,
        "Tied parameter 'conv1.embed.weight' (also 'conv2.embed.weight') is used by module "
        "'conv1.embed'; FSDP must never split a tied tensor and needs it unsharded at every use, "
        "so it goes to unit <root>, which encloses it: the policy's units 'conv1' and 'conv2' are "
        "not wrapped because of the tie; their other parameters (1 parameter, 8 elements) go to "
        "<root> too.",
        "Tied parameter 'conv1.embed.bias' (also 'conv2.embed.bias') is used by module "
        "'conv1.embed'; it stays in unit <root>, which encloses it.",
    ]


def test_units_enclosing_one_name_of_a_shared_module_are_dropped():
    model = SharedEmbed()
    order = record_execution_order(model, torch.randn(2, 8))
    plan = plan_wrap(model, order, ModuleWrapPolicy({Conv}))
    assert plan.policy_fqns == ("", "conv1", "conv2")
    assert plan.groups == [[""]]  # conv1 would flatten the shared weight away from conv2


def test_units_inside_a_shared_module_stay():
    model = SharedBlocks()
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy)
    assert plan.groups == [[""], ["layers.0.fc"], ["out"]]
    assert plan.units[0].param_fqns == ("layers.0.gain",)
    assert plan.notes[0] == (
        "Module 'layers.0' (GainBlock) is registered under 3 names ('layers.0', 'layers.1' and "
        "'layers.2'), so it cannot be an FSDP unit: FSDP1 puts a unit's wrapper under the "
        "module's first name only, and a call through another name would run it with its "
        "parameters still sharded. Not wrapped; its own parameters (1 parameter, 8 elements) go "
        "to unit <root>, which encloses every name of it; the units inside it stay "
        "('layers.0.fc')."
    )
    assert plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({GainBlock})).groups == [
        [""]
    ]


def test_check_rejects_plans_fsdp_cannot_build():
    model = SharedEmbed()
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy)
    embed = WrapUnit(("conv1.embed",), ("conv1.embed.weight", "conv1.embed.bias"), 72, 288, 2, 5)
    root = dataclasses.replace(plan.units[0], param_fqns=(), numel=0, bytes=0)
    shared_unit = WrapPlan(units=[root, embed, *plan.units[1:]], order=plan.order)
    with pytest.raises(
        PlanError,
        match=r"^plan unit conv1\.embed: module 'conv1\.embed' is registered under 2 names "
        r"\(conv1\.embed, conv2\.embed\); FSDP1 would wrap it under its first name only$",
    ):
        shared_unit.check(model)
    conv1 = WrapUnit(
        ("conv1",),
        ("conv1.embed.weight", "conv1.embed.bias", "conv1.proj.weight", "conv1.proj.bias"),
        144,
        576,
        1,
        3,
    )
    others = [u for u in plan.units[1:] if u.module_fqns != ("conv1.proj",)]
    one_name = WrapPlan(units=[root, conv1, *others], order=plan.order)
    with pytest.raises(
        PlanError,
        match=r"parameter 'conv1\.embed\.weight' \(tied with 'conv2\.embed\.weight'\) is in unit "
        r"conv1, but FSDP would give its name 'conv2\.embed\.weight' to unit <root>",
    ):
        one_name.check(model)


# ---------------------------------------------------------------- scalars
SCALAR_NOTE = (
    "Parameter 'logit_scale' is 0-dim (a scalar): FSDP1 and FSDP2 refuse to shard scalar "
    'parameters (torch: "Change logit_scale to a 1D tensor with numel equal to 1."), so '
    "apply_fully_shard and ParamExecOrderWrapPolicy refuse this model before wrapping anything. "
    "Make each a 1-D parameter of one element, or keep it unsharded on every rank: FSDP2 "
    "fully_shard(..., ignored_params={...}), FSDP1 FSDP(..., ignored_states=[...])."
)


def test_scalar_parameter_note_and_check():
    model = ClipHead()
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy)
    assert plan.notes == [SCALAR_NOTE]
    ignored = plan_wrap(
        model, trace_execution_order(model), always_wrap_policy, ignored_modules=["fc"]
    )
    assert ignored.notes[-1] == SCALAR_NOTE  # the root's own parameter is not ignored
    assert scalar_params(model) == ["logit_scale"]
    assert scalar_params(model, [model.logit_scale]) == []
    check_shardable(model, ignored_params=[model.logit_scale])  # nothing to refuse
    with pytest.raises(ValueError, match=r"^apply_fully_shard: ClipHead has 1 0-dim \(scalar\)"):
        check_shardable(model)


def test_apply_fully_shard_refuses_before_wrapping():
    from torch.distributed.fsdp import FSDPModule

    from execwrap import apply_fully_shard

    model = ClipHead()
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy)
    with pytest.raises(ValueError, match="nothing has been wrapped"):
        apply_fully_shard(model, plan)  # no process group needed: refused first
    assert type(model) is ClipHead
    assert not any(isinstance(m, FSDPModule) for m in model.modules())


# ----------------------------------------------------------- quiet notes
class _PeftLoraLinear(nn.Module):
    """The module layout of a PEFT LoRA layer: base, dropout and adapters in
    ``ModuleDict``s, and the empty ``ParameterDict``/``ModuleDict`` of the other
    adapter kinds."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.base_layer = nn.Linear(d, d)
        self.lora_dropout = nn.ModuleDict({"default": nn.Dropout(0.1)})
        self.lora_A = nn.ModuleDict({"default": nn.Linear(d, 2, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(2, d, bias=False)})
        self.lora_embedding_A = nn.ParameterDict()
        self.lora_embedding_B = nn.ParameterDict()
        self.lora_magnitude_vector = nn.ModuleDict()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lora_A["default"](self.lora_dropout["default"](x))
        return self.base_layer(x) + self.lora_B["default"](h)


class _LoraPair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = _PeftLoraLinear(8)
        self.v = _PeftLoraLinear(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q(x) + self.v(x)


@pytest.mark.parametrize("method", ["symbolic", "runtime"])
def test_modules_without_parameters_share_one_note(method):
    model = _LoraPair()
    if method == "symbolic":
        order = trace_execution_order(model)
    else:
        order = record_execution_order(model, torch.randn(2, 8))
    plan = plan_wrap(model, order, always_wrap_policy)
    assert not any("0 parameters" in n for n in plan.notes)
    folded = [n for n in plan.notes if "hold no parameters" in n]
    assert folded == [
        "8 policy units hold no parameters and are not wrapped (nothing to shard; the forward "
        "of each never runs, or it is registered under two parents): 4 ModuleDict, 4 "
        "ParameterDict: 'q.lora_dropout', 'q.lora_embedding_A', 'q.lora_embedding_B', "
        "'q.lora_magnitude_vector', ... (4 more)."
    ]
    assert len(plan.notes) == 5  # and one note each for the 4 adapter containers
