"""Wrap plans: units from the policy, corrections from the order, bucketing, cost."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.fsdp.wrap import (
    CustomPolicy,
    ModuleWrapPolicy,
    always_wrap_policy,
    size_based_auto_wrap_policy,
)

from execwrap.demo_models import (
    GPT,
    Block,
    GPTConfig,
    Llama,
    LlamaBlock,
    LlamaConfig,
    build_demo_model,
)
from execwrap.errors import PlanError
from execwrap.plan.compare import compare_plans
from execwrap.plan.stats import PlanStats, TimelineStep
from execwrap.plan.unit import WrapUnit
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.bucketing import min_contiguous_groups
from execwrap.planning.planner import plan_wrap, policy_units
from tracing import record_execution_order, trace_execution_order
from tracing.order import ExecutionOrder, ParamInfo, ParamUse, param_infos, shared_param_map


# ------------------------------------------------------------------ models
class LayerOrder(nn.Module):
    """Defined layer0, layer1, layer2; runs layer0 -> layer2 -> layer1."""

    def __init__(self) -> None:
        super().__init__()
        self.layer0 = nn.Linear(4, 8)  # 40 elements
        self.layer1 = nn.Linear(16, 4)  # 68 elements
        self.layer2 = nn.Linear(8, 16)  # 144 elements

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer1(self.layer2(self.layer0(x)))


def layer_order() -> ExecutionOrder:
    """What capture gives for LayerOrder, written out by hand."""
    model = LayerOrder()
    return ExecutionOrder(
        module_forward_order=["", "layer0", "layer2", "layer1"],
        param_forward_order=[
            "layer0.weight",
            "layer0.bias",
            "layer2.weight",
            "layer2.bias",
            "layer1.weight",
            "layer1.bias",
        ],
        param_uses=[
            ParamUse("layer0", 1, ("layer0.weight", "layer0.bias")),
            ParamUse("layer2", 2, ("layer2.weight", "layer2.bias")),
            ParamUse("layer1", 3, ("layer1.weight", "layer1.bias")),
        ],
        params=param_infos(model),
        module_classes={f: type(m).__name__ for f, m in model.named_modules()},
        method="symbolic",
    )


def unit(
    mods: tuple[str, ...], params: tuple[str, ...], numel: int, first: int | None, last: int | None
) -> WrapUnit:
    return WrapUnit(mods, params, numel, 4 * numel, first, last)


# ---------------------------------------------------------- units and order
def test_layer_order_units_follow_execution_not_definition() -> None:
    plan = plan_wrap(LayerOrder(), layer_order())
    assert plan.units == [
        unit(("",), (), 0, 0, 3),  # the root is active until the last call of forward
        unit(("layer0",), ("layer0.weight", "layer0.bias"), 40, 1, 1),
        unit(("layer2",), ("layer2.weight", "layer2.bias"), 144, 2, 2),
        unit(("layer1",), ("layer1.weight", "layer1.bias"), 68, 3, 3),
    ]
    assert plan.atomic_units == plan.units
    assert plan.notes == []
    assert plan.policy_name == "always_wrap_policy"
    assert plan.policy_fqns == ("", "layer0", "layer1", "layer2")  # definition order
    assert plan.fsdp1_modules() == ["", "layer0", "layer2", "layer1"]


def test_layer_order_from_symbolic_capture_matches_hand_written() -> None:
    model = LayerOrder()
    captured = trace_execution_order(model)
    assert plan_wrap(model, captured).units == plan_wrap(model, layer_order()).units


def test_layer_order_stats_and_timeline() -> None:
    plan = plan_wrap(LayerOrder(), layer_order())
    assert plan.stats(prefetch=1) == PlanStats(
        num_units=4,
        all_gathers_per_step=6,  # root has no parameters; 3 units x (forward + backward)
        all_gathers_per_step_no_reshard=3,
        reduce_scatters_per_step=3,
        bytes_per_all_gather=(0, 160, 576, 272),
        largest_unit_bytes=576,
        peak_unsharded_bytes=848,  # layer2 running + layer1 prefetched
        prefetch=1,
        total_bytes=1008,
        peak_unsharded_bytes_no_reshard=1008,
    )
    assert plan.stats(prefetch=0).peak_unsharded_bytes == 576
    assert plan.stats(prefetch=2).peak_unsharded_bytes == 1008
    assert plan.unsharded_timeline(1) == [
        TimelineStep(0, "forward", "<root>", 160),
        TimelineStep(1, "forward", "layer0", 736),
        TimelineStep(2, "forward", "layer2", 848),
        TimelineStep(3, "forward", "layer1", 272),
        TimelineStep(4, "backward", "layer1", 848),
        TimelineStep(5, "backward", "layer2", 736),
        TimelineStep(6, "backward", "layer0", 160),
        TimelineStep(7, "backward", "<root>", 0),
    ]
    assert [s.unsharded_bytes for s in plan.unsharded_timeline(0, reshard_after_forward=False)] == [
        0, 160, 736, 1008, 1008, 736, 160, 0,
    ]  # fmt: skip
    # one flag per unit (an auto plan's per-group choice): layer2 (576 B) stays
    # unsharded from its forward to its backward, the others reshard
    keep_layer2 = [True, True, False, True]  # <root>, layer0, layer2, layer1
    assert [s.unsharded_bytes for s in plan.unsharded_timeline(0, reshard_after_forward=keep_layer2)] == [
        0, 160, 576, 576 + 272, 272 + 576, 576, 160, 0,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="reshard_after_forward has 2 flags for 4 units"):
        plan.unsharded_timeline(0, reshard_after_forward=[True, False])
    with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
        plan.stats(prefetch=-1)


def test_gpt_tied_embedding_under_module_wrap_policy() -> None:
    model = GPT(GPTConfig(n_blocks=2))
    plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))
    assert plan.groups == [[""], ["blocks.0"], ["blocks.1"]]
    root = plan.units[0]
    # tied wte.weight / lm_head.weight ends in the root unit, in forward order
    assert root.param_fqns == ("wte.weight", "wpe", "ln_f.weight", "ln_f.bias")
    assert root.numel == 256 * 64 + 64 * 64 + 2 * 64
    assert [u.numel for u in plan.units[1:]] == [49984, 49984]
    assert plan.notes == [
        "Tied parameter 'wte.weight' (also 'lm_head.weight') is used by modules 'wte' and "
        "'lm_head'; it stays in unit <root>, which encloses both."
    ]
    # calls: 0 <root>, 1 wte, 2-10 blocks.0 and its 8 submodules, 11-19 blocks.1,
    # 20 ln_f, 21 lm_head
    assert [(u.first_use, u.last_use) for u in plan.units] == [(0, 21), (2, 10), (11, 19)]
    bucketed = plan_wrap(model, plan.order, ModuleWrapPolicy({Block}), bucket_numel=10**6)
    assert [(u.label, u.first_use, u.last_use) for u in bucketed.units] == [
        ("<root>", 0, 21),
        ("blocks.0+blocks.1", 2, 19),
    ]
    assert plan.policy_name == "ModuleWrapPolicy({Block})"
    assert plan.stats(1).all_gathers_per_step == 5


def test_gpt_always_wrap_moves_tied_weight_to_root_and_drops_container() -> None:
    model = GPT(GPTConfig(n_blocks=1))
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy)
    assert set(plan.policy_fqns) >= {"wte", "lm_head", "blocks"}
    assert plan.groups == [
        [""],
        ["blocks.0"],
        ["blocks.0.ln1"],
        ["blocks.0.attn"],
        ["blocks.0.attn.qkv"],
        ["blocks.0.attn.proj"],
        ["blocks.0.ln2"],
        ["blocks.0.mlp"],
        ["blocks.0.mlp.fc"],
        ["blocks.0.mlp.proj"],
        ["ln_f"],
    ]
    assert plan.units[0].param_fqns == ("wte.weight", "wpe")
    assert len(plan.notes) == 2
    assert plan.notes[0].startswith("Module 'blocks' (ModuleList) never runs its own forward")
    assert plan.notes[0].endswith("'blocks.0.mlp.fc', ... (1 more)).")  # no parameters of its own
    assert plan.notes[1] == (
        "Tied parameter 'wte.weight' (also 'lm_head.weight') is used by modules 'wte' and "
        "'lm_head'; FSDP must never split a tied tensor and needs it unsharded at every use, "
        "so it goes to unit <root>, which encloses both: the policy's units 'wte' and "
        "'lm_head' are not wrapped because of the tie."
    )


class Mixed(nn.Module):
    """MHA (out_proj never called), a functional use of another unit's weight,
    and a dead module."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.attn = nn.MultiheadAttention(8, 2)
        self.embed = nn.Linear(8, 8)
        self.head = nn.Linear(8, 8)
        self.unused = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(self.inp(x))
        x = self.attn(x, x, x)[0]
        return self.head(x) + F.linear(x, self.embed.weight)


def test_uncalled_and_outside_uses() -> None:
    model = Mixed()
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy)
    assert plan.groups == [[""], ["inp"], ["attn"], ["head"]]
    by_label = {u.label: u for u in plan.units}
    assert by_label["attn"].param_fqns == (
        "attn.in_proj_weight",
        "attn.in_proj_bias",
        "attn.out_proj.weight",
        "attn.out_proj.bias",
    )
    assert by_label["<root>"].param_fqns == (
        "embed.weight",
        "embed.bias",
        "unused.weight",
        "unused.bias",
    )
    assert plan.notes == [
        "Module 'attn.out_proj' (NonDynamicallyQuantizableLinear) never runs its own forward "
        "(its parameters are used by 'attn'), so it cannot be an FSDP unit: its hooks would "
        "never fire. Its parameters (2 parameters, 72 elements) stay in unit 'attn'.",
        f"Module 'unused' (Linear) {_SYMBOLIC_UNCALLED} and its parameters are never used, so "
        "the plan does not make it an FSDP unit. Its parameters (2 parameters, 12 elements) "
        "stay in unit <root>.",
        "Parameter 'embed.weight' is used by modules 'embed' and <root>; <root> runs outside "
        "unit 'embed', where FSDP has resharded it, so it goes to unit <root>, which encloses "
        "both: the policy's unit 'embed' is not wrapped; its other parameters (1 parameter, "
        "8 elements) go to <root> too.",
    ]


def test_dead_module_that_is_not_a_unit_is_noted() -> None:
    model = Mixed()
    plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({nn.MultiheadAttention}))
    assert plan.groups == [[""], ["attn"]]
    assert plan.notes == [
        f"Module 'unused' (Linear) {_SYMBOLIC_UNCALLED} and its parameters (2 parameters, "
        "12 elements) are never used; they stay in unit <root>."
    ]


class Frozen(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)
        self.a.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_mixed_requires_grad_and_ignored_modules() -> None:
    model = Frozen()
    order = trace_execution_order(model)
    plan = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}))
    assert plan.notes == [
        "Unit 'a' mixes requires_grad=True (1 parameter) and requires_grad=False (1 "
        "parameter: 'a.weight'): FSDP1 needs use_orig_params=True for it (FSDP2 accepts it); wrap the "
        "frozen parameters' modules separately to avoid it."
    ]
    plan = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}), ignored_modules=[model.a])
    assert plan.groups == [[""], ["b"]]
    assert plan.ignored_modules == ("a",)
    assert all("a.weight" not in u.param_fqns for u in plan.units)
    assert plan.notes == [
        "Ignored modules 'a': their parameters (2 parameters, 6 elements) are in no unit; "
        "FSDP leaves them unsharded on every rank."
    ]
    plan.check(model)


def test_container_with_own_params_gives_them_to_ancestor() -> None:
    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
            self.layers.register_parameter("scale", nn.Parameter(torch.ones(2)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x) * self.layers.scale
            return x

    model = Stack()
    plan = plan_wrap(model, trace_execution_order(model))
    assert plan.groups == [[""], ["layers.0"], ["layers.1"]]
    assert plan.units[0].param_fqns == ("layers.scale",)
    assert plan.notes == [
        "Module 'layers' (ModuleList) never runs its own forward (only modules inside it are "
        "called), so it cannot be an FSDP unit: its hooks would never fire. Not wrapped; the "
        "units inside it stay ('layers.0', 'layers.1'), and its own parameters (1 parameter, 2 "
        "elements) go to unit <root>."
    ]


def test_empty_order_uses_policy_alone_in_definition_order() -> None:
    model = LayerOrder()
    plan = plan_wrap(model, ExecutionOrder())
    assert plan.groups == [[""], ["layer0"], ["layer1"], ["layer2"]]
    assert all(u.first_use is None for u in plan.units)
    assert plan.notes[0].startswith("The order has no module calls")
    assert plan.stats(1).all_gathers_per_step == 6


# ------------------------------------------------------ policies as FSDP1
def _old_style_size_policy(module: nn.Module, recurse: bool, unwrapped_params: int) -> bool:
    """torch 1.12 signature: the third argument is named ``unwrapped_params``."""
    return recurse or unwrapped_params >= 30000


def test_policy_units_follow_recursive_wrap() -> None:
    model = GPT(GPTConfig(n_blocks=2))
    size = functools.partial(size_based_auto_wrap_policy, min_num_params=30000)
    # each MLP (33088) wraps; a block's remainder (16896) does not; the ModuleList
    # (remainder 33792) is excluded by size_based_auto_wrap_policy itself
    assert policy_units(model, size) == ["", "blocks.0.mlp", "blocks.1.mlp"]
    # the same rule with the torch 1.12 signature; it has no ModuleList exclusion
    assert policy_units(model, _old_style_size_policy) == [
        "",
        "blocks",
        "blocks.0.mlp",
        "blocks.1.mlp",
    ]
    assert policy_units(model, ModuleWrapPolicy({Block})) == ["", "blocks.0", "blocks.1"]
    assert policy_units(model, CustomPolicy(lambda m: m is model.ln_f)) == ["", "ln_f"]
    assert policy_units(model, None) == [""]
    small = functools.partial(size_based_auto_wrap_policy, min_num_params=10000)
    assert policy_units(model, small) == [
        "",
        "wte",
        "blocks.0.attn.qkv",
        "blocks.0.mlp.fc",
        "blocks.0.mlp.proj",
        "blocks.1.attn.qkv",
        "blocks.1.mlp.fc",
        "blocks.1.mlp.proj",
    ]  # lm_head's weight is wte's, already wrapped (FSDP1 agrees: see tests/distributed)
    always = policy_units(model, always_wrap_policy)
    assert always == [f for f, _ in model.named_modules()]
    with pytest.raises(TypeError, match="must accept the keywords"):
        policy_units(model, lambda module, recurse: True)
    with pytest.raises(TypeError, match="init_policy must be a policy callable"):
        policy_units(model, "always")


def test_shared_module_is_visited_once() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = self.a

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x))

    model = Shared()
    assert policy_units(model) == ["", "a"]
    plan = plan_wrap(model, trace_execution_order(model))
    # FSDP1 would set its wrapper as `a` only and `b` would run it sharded
    assert plan.groups == [[""]]
    assert plan.units[0].param_fqns == ("a.weight", "a.bias")
    assert plan.notes[0] == (
        "Module 'a' (Linear) is registered under 2 names ('a' and 'b'), so it cannot be an "
        "FSDP unit: FSDP1 puts a unit's wrapper under the module's first name only, and a call "
        "through another name would run it with its parameters still sharded. Not wrapped; its "
        "own parameters (2 parameters, 6 elements) go to unit <root>, which encloses every name "
        "of it."
    )


# ---------------------------------------------------------------- buckets
def test_bucketing_llama_blocks() -> None:
    model = Llama(LlamaConfig(n_layers=4))
    order = trace_execution_order(model)
    block = 2 * 64 + 4 * 64 * 64 + 3 * 64 * 172
    assert block == 49536
    plan = plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock}), bucket_numel=2 * block)
    assert plan.groups == [[""], ["layers.0", "layers.1"], ["layers.2", "layers.3"]]
    assert [u.numel for u in plan.units] == [32832, 2 * block, 2 * block]
    assert [u.first_use for u in plan.units] == [0, 2, 26]  # 12 calls per block
    # a group is active until its last block's last nested call; the root until
    # the last call (52 calls: root, tok_embeddings, 4 x 12, norm, output)
    assert [u.last_use for u in plan.units] == [51, 25, 49]
    assert [(u.first_use, u.last_use) for u in plan.atomic_units] == [
        (0, 51), (2, 13), (14, 25), (26, 37), (38, 49),
    ]  # fmt: skip
    assert len(plan.atomic_units) == 5
    assert plan.stats(1).all_gathers_per_step == 5
    assert plan.fsdp1_modules() == ["", "layers.0", "layers.1", "layers.2", "layers.3"]
    assert plan.notes[-1] == (
        "FSDP1 wraps single modules: 2 of 3 FSDP2 groups have no module that holds exactly "
        "their units and runs its own forward, so fsdp1_modules() wraps their members "
        "separately: ['layers.0', 'layers.1']; ['layers.2', 'layers.3']."
    )
    three = plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock}), bucket_numel=3 * block)
    assert [len(g) for g in three.groups] == [1, 3, 1]
    alone = plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock}), bucket_numel=block - 1)
    assert alone.units == alone.atomic_units


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 2)  # 14
        self.b = nn.Linear(2, 6)  # 18

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class WithPair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 6)  # 30
        self.pair = Pair()
        self.post = nn.Linear(6, 4)  # 28

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.pair(self.pre(x)))


def test_bucket_realised_by_parent_under_fsdp1() -> None:
    model = WithPair()
    plan = plan_wrap(
        model, trace_execution_order(model), ModuleWrapPolicy({nn.Linear}), bucket_numel=32
    )
    assert plan.groups == [[""], ["pre"], ["pair.a", "pair.b"], ["post"]]
    assert plan.fsdp1_modules() == ["", "pre", "pair", "post"]
    assert plan.notes == []


def test_bucketing_never_nests_or_takes_the_root() -> None:
    model = WithPair()
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy, bucket_numel=10**6)
    # atomic: root, pre, pair, pair.a, pair.b, post. `pair` holds no parameter
    # of its own (it all-gathers nothing): it stays alone and does not
    # interrupt the group being filled.
    assert plan.groups == [[""], ["pre", "pair.a", "pair.b", "post"], ["pair"]]
    # the root holds no parameter either: only the group is all-gathered, in
    # forward and again in backward
    assert plan.stats().all_gathers_per_step == 2


class ScaledPair(Pair):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))


def test_bucketing_never_puts_a_unit_and_its_parameter_holding_parent_in_one_group() -> None:
    model = WithPair()
    model.pair = ScaledPair()
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy, bucket_numel=10**6)
    # `pair` now holds `scale`: it cannot share a group with its children
    assert plan.groups == [[""], ["pre", "pair"], ["pair.a", "pair.b", "post"]]


def test_bad_arguments() -> None:
    model, order = LayerOrder(), layer_order()
    with pytest.raises(
        ValueError, match=r"bucket_numel must be a whole number >= 1 \(elements\), got 0"
    ):
        plan_wrap(model, order, bucket_numel=0)
    with pytest.raises(TypeError, match="bucket_numel must be a whole number >= 1"):
        plan_wrap(model, order, bucket_numel=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="order must be an ExecutionOrder"):
        plan_wrap(model, ["", "layer0"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="calls module 'nope', which LayerOrder does not have"):
        plan_wrap(model, ExecutionOrder(module_forward_order=["", "nope"]))
    with pytest.raises(ValueError, match="not a submodule of the model"):
        plan_wrap(model, order, ignored_modules=[nn.Linear(1, 1)])
    with pytest.raises(TypeError, match="wrap it in a list"):
        plan_wrap(model, order, ignored_modules=model.layer0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not contain the root module"):
        plan_wrap(model, order, ignored_modules=[model])


def test_check_catches_broken_plans() -> None:
    model = LayerOrder()
    plan = plan_wrap(model, layer_order())
    broken = WrapPlan(units=plan.units[:-1], order=plan.order)
    with pytest.raises(PlanError, match="parameter 'layer1.weight' is in no unit"):
        broken.check(model)
    moved = WrapPlan(
        units=[
            plan.units[0],
            plan.units[1],
            unit(
                ("layer2",),
                ("layer2.weight", "layer2.bias", "layer1.weight", "layer1.bias"),
                212,
                2,
                2,
            ),
        ],
        order=plan.order,
    )
    with pytest.raises(PlanError, match="FSDP would give its name 'layer1.weight' to unit <root>"):
        moved.check(model)
    ghost = WrapPlan(units=[*plan.units, unit(("ghost",), (), 0, None, None)], order=plan.order)
    with pytest.raises(PlanError, match="module 'ghost' does not exist in the model"):
        ghost.check(model)


def test_to_dict_round_trip() -> None:
    model = Llama(LlamaConfig(n_layers=2))
    order = trace_execution_order(model)
    plan = plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock}), bucket_numel=10**6)
    data = json.loads(json.dumps(plan.to_dict()))
    assert data["stats"]["all_gathers_per_step"] == 3
    assert data["fsdp1_modules"] == ["", "layers.0", "layers.1"]
    back = WrapPlan.from_dict(data, order)
    assert back.units == plan.units
    assert back.atomic_units == plan.atomic_units
    assert back.notes == plan.notes
    assert back.stats(1) == plan.stats(1)
    with pytest.raises(ValueError, match="unsupported WrapPlan schema_version"):
        WrapPlan.from_dict({**data, "schema_version": 99}, order)


def test_compare_plans_rows() -> None:
    model = Llama(LlamaConfig(n_layers=4))
    order = trace_execution_order(model)
    plans = {
        "blocks": plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock})),
        "bucketed": plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock}), bucket_numel=99072),
    }
    rows = compare_plans(plans)
    assert [(r["name"], r["units"], r["all_gathers_per_step"]) for r in rows] == [
        ("blocks", 5, 9),
        ("bucketed", 3, 5),
    ]
    assert rows[1]["largest_unit_bytes"] == 4 * 99072
    assert rows[0]["peak_unsharded_bytes"] == 4 * (32832 + 2 * 49536)
    with pytest.raises(TypeError, match="'x' is a int, expected a WrapPlan"):
        compare_plans({"x": 1})  # type: ignore[dict-item]


# --------------------------------------------- greedy bucketing is optimal
def _partitions(n: int) -> list[list[tuple[int, int]]]:
    """Every split of range(n) into contiguous runs, as (start, end) pairs."""
    out = []
    for cuts in itertools.product([False, True], repeat=max(0, n - 1)):
        runs, start = [], 0
        for i, cut in enumerate(cuts, start=1):
            if cut:
                runs.append((start, i))
                start = i
        runs.append((start, n))
        out.append(runs)
    return out


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=20), min_size=0, max_size=9),
    cap=st.integers(min_value=1, max_value=40),
)
def test_min_contiguous_groups_is_optimal(sizes: list[int], cap: int) -> None:
    def ok(run: list[int]) -> bool:
        return len(run) == 1 or sum(run) <= cap

    best = min(
        (len(p) for p in _partitions(len(sizes)) if all(ok(sizes[a:b]) for a, b in p)),
        default=0,
    )
    assert min_contiguous_groups(sizes, cap) == (best if sizes else 0)


class Vec(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w.sum()


class Chain(nn.Module):
    def __init__(self, items: list[nn.Module]) -> None:
        super().__init__()
        self.items = nn.Sequential(*items)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.items(x)


def _build(spec: list[int | list[int]]) -> Chain:
    return Chain([Chain([Vec(n) for n in s]) if isinstance(s, list) else Vec(s) for s in spec])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.lists(
        st.one_of(st.integers(1, 12), st.lists(st.integers(1, 12), min_size=1, max_size=2)),
        min_size=1,
        max_size=4,
    ),
    cap=st.integers(min_value=1, max_value=30),
)
def test_plan_bucketing_has_fewest_groups(spec: list[int | list[int]], cap: int) -> None:
    model = _build(spec)
    plan = plan_wrap(model, trace_execution_order(model), always_wrap_policy, bucket_numel=cap)
    atomic = plan.atomic_units
    # every atomic unit is in exactly one group
    assert sorted(m for u in plan.units for m in u.module_fqns) == sorted(
        u.module_fqns[0] for u in atomic
    )
    # units without parameters all-gather nothing: they stay alone and never
    # interrupt a run; the others are cut into runs, in execution order
    empty = [u for u in atomic if u.numel == 0 and not u.is_root]
    held = [u for u in atomic if u.numel > 0 or u.is_root]
    assert [g for g in plan.units if g.numel == 0 and not g.is_root] == empty
    groups = [g for g in plan.units if g.numel > 0 or g.is_root]
    assert [m for g in groups for m in g.module_fqns] == [u.module_fqns[0] for u in held]

    def ok(run: list[WrapUnit]) -> bool:
        if len(run) == 1:
            return True
        fqns = [u.module_fqns[0] for u in run]
        nested = any(a != b and (b.startswith(a + ".") or a == "") for a in fqns for b in fqns)
        return not nested and sum(u.numel for u in run) <= cap

    for g in groups:
        members = [u for u in held if u.module_fqns[0] in g.module_fqns]
        assert ok(members)
    best = min(len(p) for p in _partitions(len(held)) if all(ok(held[a:b]) for a, b in p))
    assert len(groups) == best


def test_alias_order_from_hand_built_uses() -> None:
    """Tied parameter used from two units, given by hand (no capture)."""

    class TiedNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.mid = nn.Linear(4, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

    model = TiedNet()
    _, shared = shared_param_map(model)
    order = ExecutionOrder(
        module_forward_order=["", "emb", "mid", "head"],
        param_uses=[
            ParamUse("emb", 1, ("emb.weight",)),
            ParamUse("mid", 2, ("mid.weight", "mid.bias")),
            ParamUse("head", 3, ("emb.weight",)),
        ],
        shared_params=shared,
        params=param_infos(model),
    )
    plan = plan_wrap(model, order, ModuleWrapPolicy({nn.Embedding, nn.Linear}))
    assert plan.groups == [[""], ["mid"]]
    assert plan.units[0].param_fqns == ("emb.weight",)
    assert plan.notes == [
        "Tied parameter 'emb.weight' (also 'head.weight') is used by modules 'emb' and 'head'; "
        "FSDP must never split a tied tensor and needs it unsharded at every use, so it goes to "
        "unit <root>, which encloses both: the policy's units 'emb' and 'head' are not wrapped "
        "because of the tie."
    ]
    assert [(u.first_use, u.last_use) for u in plan.units] == [(0, 3), (2, 2)]


# ------------------------------------------------------------ stale orders
def test_stale_order_is_rejected() -> None:
    order = trace_execution_order(build_demo_model(n_blocks=4))
    fix = (
        r"the order was captured from a different model \(or before the model changed\): "
        r"capture it again, e\.g\. tracing\.capture_execution_order\(model, \.\.\.\)$"
    )
    with pytest.raises(ValueError) as info:
        plan_wrap(build_demo_model(n_blocks=6), order, ModuleWrapPolicy({Block}))
    assert str(info.value) == (
        "plan_wrap: the order's parameters do not match those of GPT: 24 parameters differ (in "
        "the model but not in the order: 'blocks.4.ln1.weight', 'blocks.4.ln1.bias', "
        "'blocks.4.attn.qkv.weight', ... (21 more)); the order was captured from a different "
        "model (or before the model changed): capture it again, e.g. "
        "tracing.capture_execution_order(model, ...)"
    )
    # the converse (the order has blocks the model lacks) says the same
    with pytest.raises(ValueError, match=r"24 parameters differ \(in the order but not in the "):
        plan_wrap(build_demo_model(n_blocks=2), order, ModuleWrapPolicy({Block}))
    # same names, other sizes
    wide = LayerOrder()
    wide.layer1 = nn.Linear(16, 5)
    with pytest.raises(ValueError, match=fix) as info:
        plan_wrap(wide, layer_order())
    assert "2 parameters differ (of another size: 'layer1.weight' ((4, 16) in the order, " in str(
        info.value
    )
    assert "(5, 16) in the model), 'layer1.bias' ((4,) in the order, (5,) in the model))" in str(
        info.value
    )


def test_order_params_checked_only_when_recorded() -> None:
    model = LayerOrder()
    bare = layer_order()
    bare.params = {}  # built by hand: nothing to check
    assert plan_wrap(model, bare).groups == plan_wrap(model, layer_order()).groups
    # a hand-written ParamInfo without a shape is checked by numel only
    infos = {fqn: ParamInfo(p.numel(), "float32", True) for fqn, p in model.named_parameters()}
    assert plan_wrap(model, ExecutionOrder(params=infos)).groups == [
        [""], ["layer0"], ["layer1"], ["layer2"],
    ]  # fmt: skip
    infos["layer0.bias"] = ParamInfo(9, "float32", True)
    with pytest.raises(
        ValueError,
        match=r"1 parameter differs \(of another size: 'layer0\.bias' "
        r"\(9 elements in the order, \(8,\) in the model\)\)",
    ):
        plan_wrap(model, ExecutionOrder(params=infos))


# -------------------------------------------------------------- use spans
def test_unit_span_covers_nested_calls_and_parameter_uses() -> None:
    model = WithPair()
    plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Pair}))
    # calls: 0 <root>, 1 pre, 2 pair, 3 pair.a, 4 pair.b, 5 post
    assert [(u.label, u.first_use, u.last_use) for u in plan.units] == [
        ("<root>", 0, 5),
        ("pair", 2, 4),
    ]
    # a use of a unit's parameter extends its span (here written by hand)
    pair = LayerOrder()
    order = layer_order()
    order.param_uses.append(ParamUse("layer0", 3, ("layer0.weight",)))
    plan = plan_wrap(pair, order)
    assert [(u.label, u.first_use, u.last_use) for u in plan.units] == [
        ("<root>", 0, 3),
        ("layer0", 1, 3),
        ("layer2", 2, 2),
        ("layer1", 3, 3),
    ]
    assert [(u.first_use, u.last_use) for u in plan_wrap(pair, ExecutionOrder()).units] == [
        (None, None)
    ] * 4


# ------------------------------------------------------- runtime notes
class Branch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)
        self.c = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.c(self.a(x))
        return self.c(self.b(x))


_RUNTIME_UNCALLED = (
    "is never called with the example inputs (runtime capture sees one forward: another input "
    "may take another branch; execwrap.OrderMonitor warns if it does)"
)
_SYMBOLIC_UNCALLED = (
    "is never called in the traced forward (fx traces one path: an argument not given as an "
    "input is fixed at its default, so another input may take another branch; "
    "execwrap.OrderMonitor warns if it does)"
)


def test_runtime_capture_does_not_call_a_skipped_branch_dead_code() -> None:
    model = Branch()
    runtime = record_execution_order(model, torch.ones(1, 2))
    assert runtime.method == "runtime"
    assert runtime.module_forward_order == ["", "a", "c"]
    plan = plan_wrap(model, runtime)
    assert plan.groups == [[""], ["a"], ["c"]]
    assert plan.notes == [
        f"Module 'b' (Linear) {_RUNTIME_UNCALLED} and its parameters are never used, so the "
        "plan does not make it an FSDP unit. Its parameters (2 parameters, 6 elements) stay in "
        "unit <root>."
    ]
    assert plan_wrap(model, runtime, None).notes == [
        f"Module 'b' (Linear) {_RUNTIME_UNCALLED} and its parameters (2 parameters, 6 elements) "
        "are never used; they stay in unit <root>."
    ]
    # a symbolic trace follows one path too (arguments not passed are fixed at their
    # defaults): the module is not called dead code either
    symbolic = dataclasses.replace(runtime, method="symbolic")
    assert plan_wrap(model, symbolic).notes == [
        f"Module 'b' (Linear) {_SYMBOLIC_UNCALLED} and its parameters are never used, so the "
        "plan does not make it an FSDP unit. Its parameters (2 parameters, 6 elements) stay in "
        "unit <root>."
    ]
    assert plan_wrap(model, symbolic, None).notes == [
        f"Module 'b' (Linear) {_SYMBOLIC_UNCALLED} and its parameters (2 parameters, 6 elements) "
        "are never used; they stay in unit <root>."
    ]


# ------------------------------------------------- containers and ties
class TiedList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(4)])  # 272 elements each
        self.layers[3].weight = self.layers[0].weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_tie_inside_a_container_names_the_unwrapped_units() -> None:
    model = TiedList()
    plan = plan_wrap(model, trace_execution_order(model))
    assert plan.groups == [[""], ["layers.1"], ["layers.2"]]
    assert plan.units[0].param_fqns == ("layers.0.weight", "layers.0.bias", "layers.3.bias")
    assert plan.notes == [
        # the ModuleList holds no parameter itself: no "its own parameters" clause
        "Module 'layers' (ModuleList) never runs its own forward (only modules inside it are "
        "called), so it cannot be an FSDP unit: its hooks would never fire. Not wrapped; the "
        "units inside it stay ('layers.1', 'layers.2').",
        "Tied parameter 'layers.0.weight' (also 'layers.3.weight') is used by modules "
        "'layers.0' and 'layers.3'; FSDP must never split a tied tensor and needs it unsharded "
        "at every use, so it goes to unit <root>, which encloses both: the policy's units "
        "'layers.0' and 'layers.3' are not wrapped because of the tie; their other parameters "
        "(2 parameters, 32 elements) go to <root> too.",
    ]


# ------------------------------------------------------- ignored modules
def test_ignored_modules_by_fqn() -> None:
    model = Frozen()
    order = trace_execution_order(model)
    by_name = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}), ignored_modules=["a"])
    by_module = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}), ignored_modules=[model.a])
    assert by_name.units == by_module.units and by_name.notes == by_module.notes
    assert by_name.ignored_modules == ("a",)
    assert policy_units(model, ModuleWrapPolicy({nn.Linear}), ignored_modules=("b",)) == ["", "a"]
    gpt = GPT(GPTConfig(n_blocks=2))
    plan = plan_wrap(
        gpt, trace_execution_order(gpt), ModuleWrapPolicy({Block}), ignored_modules=["blocks.1"]
    )
    assert plan.groups == [[""], ["blocks.0"]]
    assert plan.ignored_modules == ("blocks.1",)


def test_ignored_modules_bad_values() -> None:
    model, order = LayerOrder(), layer_order()
    with pytest.raises(TypeError) as info:
        plan_wrap(model, order, ignored_modules="layer0")  # type: ignore[arg-type]
    assert str(info.value) == (
        "ignored_modules must be an iterable of nn.Module or module FQN str (e.g. "
        "[model.lm_head] or ['lm_head']), got a single str 'layer0'; wrap it in a list"
    )
    with pytest.raises(TypeError, match=r"got a single Linear; wrap it in a list$"):
        plan_wrap(model, order, ignored_modules=model.layer0)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as info:
        plan_wrap(model, order, ignored_modules=["layer3"])
    assert str(info.value) == (
        "ignored_modules names module 'layer3', which the model (LayerOrder) does not have; "
        "closest existing names: 'layer2', 'layer1', 'layer0'"
    )
    with pytest.raises(ValueError, match="must not contain the root module"):
        plan_wrap(model, order, ignored_modules=[""])
    with pytest.raises(TypeError, match=r"nn\.Module objects or module FQN strings, got int: 3$"):
        plan_wrap(model, order, ignored_modules=[3])  # type: ignore[list-item]


# ------------------------------------------------------- frozen prefix
class FrozenFirst(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)  # 6 elements, 24 bytes
        self.b = nn.Linear(2, 2)
        self.a.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def test_frozen_units_before_the_first_trainable_use_skip_backward() -> None:
    model = FrozenFirst()
    plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({nn.Linear}))
    assert plan.groups == [[""], ["a"], ["b"]]
    # a runs (call 1) before b.weight, the first trainable parameter, is used
    # (call 2): its output needs no grad, so backward never reaches it
    assert plan.runs_backward() == [True, False, True]
    assert plan.stats(1) == PlanStats(
        num_units=3,
        all_gathers_per_step=3,  # a forward; b forward + backward (4 if a ran backward)
        all_gathers_per_step_no_reshard=2,
        reduce_scatters_per_step=1,  # b only: a has no trainable parameter
        bytes_per_all_gather=(0, 24, 24),
        largest_unit_bytes=24,
        peak_unsharded_bytes=48,  # a running, b prefetched
        prefetch=1,
        total_bytes=48,
        peak_unsharded_bytes_no_reshard=48,
    )
    # backward: b does not prefetch a, and a's step unshards nothing
    assert [s.unsharded_bytes for s in plan.unsharded_timeline(1)] == [24, 48, 24, 24, 0, 0]
    # without reshard after forward a stays unsharded (its post-backward never runs)
    assert [s.unsharded_bytes for s in plan.unsharded_timeline(1, reshard_after_forward=False)] == [
        24, 48, 48, 48, 24, 24,
    ]  # fmt: skip
    # with b frozen instead, a's output needs grad and both run backward
    model = FrozenFirst()
    model.a.requires_grad_(True)
    model.b.requires_grad_(False)
    plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({nn.Linear}))
    assert plan.runs_backward() == [True, True, True]
    assert plan.stats(1).all_gathers_per_step == 4
    assert plan.stats(1).reduce_scatters_per_step == 1


def test_without_calls_containers_without_forward_are_not_units() -> None:
    """Nothing captured yet (units from the policy alone): a ModuleList cannot
    be a unit (FSDP2 refuses it, FSDP1 hooks on it never fire)."""
    model = GPT(GPTConfig(n_blocks=2))
    _, shared = shared_param_map(model)
    empty = ExecutionOrder(method="runtime", params=param_infos(model), shared_params=shared)
    plan = plan_wrap(model, empty, always_wrap_policy)
    fqns = [m for u in plan.units for m in u.module_fqns]
    assert "blocks" not in fqns
    # wte/lm_head share the tied weight: without an order it goes to the root
    assert fqns[:3] == ["", "blocks.0", "blocks.0.ln1"]
    assert fqns[-1] == "ln_f"
    assert len(fqns) == 1 + 2 * 9 + 1  # root, 9 modules per block, ln_f
    assert plan.notes[0].startswith("The order has no module calls")
    assert plan.notes[1].startswith(
        "Module 'blocks' (ModuleList) does not implement forward, so it cannot be an FSDP unit: "
        "its hooks would never fire. Not wrapped; the units inside it stay ('blocks.0', "
    )


# ------------------------------------------------------------ import cost
REPO = Path(__file__).resolve().parents[2]

#: Prints the torch modules loaded by ``import execwrap``, then the FSDP
#: modules loaded by planning with the default policy.
_PLAN_WITHOUT_FSDP = """
import sys
import execwrap
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
import torch.nn as nn
import execwrap.planning.planner
from tracing import trace_execution_order
model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
plan = execwrap.plan_wrap(model, trace_execution_order(model), bucket_numel=100)
plan.check(model)
execwrap.compare_plans({"plan": plan, "policy": execwrap.plan_wrap(model, plan.order)})
print(plan.policy_name, plan.groups)
print(sorted(m for m in sys.modules if m.startswith("torch.distributed.fsdp")))
"""


def test_planning_with_the_default_policy_imports_no_fsdp() -> None:
    """``import execwrap`` loads no torch; planning with a policy callable
    (the default, our own always_wrap_policy) loads no torch.distributed.fsdp."""
    proc = subprocess.run(
        [sys.executable, "-c", _PLAN_WITHOUT_FSDP],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "[]",
        "always_wrap_policy [[''], ['0', '2'], ['1']]",
        "[]",
    ]


def test_a_policy_that_chooses_only_the_root_is_noted_and_logged(caplog) -> None:
    model = GPT(GPTConfig(n_blocks=2))
    with caplog.at_level("WARNING", logger="execwrap.planning.planner"):
        plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({nn.GRU}))
    note = (
        "The policy ModuleWrapPolicy({GRU}) chose no module of GPT but the root, so the plan is "
        "one FSDP unit holding every parameter: nothing is gathered per block, and no all-gather "
        "overlaps compute. Check the policy's module classes (do they occur in this model?) or "
        "its size threshold."
    )
    assert plan.groups == [[""]]
    assert plan.notes[0] == note
    assert [r.getMessage() for r in caplog.records] == [f"plan_wrap: {note}"]
    # init_policy=None asks for the root alone: nothing to say
    assert not any("chose no module" in n for n in plan_wrap(model, plan.order, None).notes)
