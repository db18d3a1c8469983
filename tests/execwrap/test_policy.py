"""Single-process tests of ``ParamExecOrderWrapPolicy`` and the FSDP2 helpers."""

from __future__ import annotations

import functools
import gc
import weakref

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp import wrap as torch_wrap

import execwrap
from execwrap import (
    ExecutionOrder,
    ModuleWrapPolicy,
    ParamExecOrderWrapPolicy,
    TracingConfig,
    TracingError,
    always_wrap_policy,
    order_fingerprint,
    prefetch_schedule,
    size_based_auto_wrap_policy,
)
from execwrap.demo_models import GPT, Block, GPTConfig
from execwrap.fsdp.first_step import FirstStepRecording, record_first_step
from execwrap.fsdp.groups import post_order
from tests.distributed._policy_cases import L0L2L1, BranchModel, hook_census
from tracing import ParamInfo, ParamUse, trace_execution_order

SMALL = GPTConfig(vocab_size=32, max_seq_len=8, dim=16, n_heads=2, n_blocks=2)


def test_reexports_match_torch() -> None:
    for name in (
        "always_wrap_policy",
        "lambda_auto_wrap_policy",
        "transformer_auto_wrap_policy",
        "size_based_auto_wrap_policy",
        "ModuleWrapPolicy",
        "CustomPolicy",
    ):
        assert getattr(execwrap, name) is getattr(torch_wrap, name), name
        assert name in execwrap.__all__
    for name in ("enable_wrap", "wrap"):  # hand wrapping, which a plan replaces
        assert not hasattr(execwrap, name) and name not in execwrap.__all__, name
    for name in (
        "ParamExecOrderWrapPolicy",
        "TracingConfig",
        "apply_fully_shard",
        "check_order_across_ranks",
    ):
        assert name in execwrap.__all__


def test_policy_fields_and_validation() -> None:
    policy = ParamExecOrderWrapPolicy()
    assert isinstance(policy, torch_wrap._Policy)
    assert policy.init_policy is always_wrap_policy
    assert policy.tracing_config is None
    assert (policy.order, policy.plan, policy.recording) == (None, None, False)
    cfg = TracingConfig()
    positional = ParamExecOrderWrapPolicy(always_wrap_policy, cfg)
    assert positional.tracing_config is cfg
    assert ParamExecOrderWrapPolicy(example_inputs=torch.ones(2)).example_inputs[0].shape == (2,)
    with pytest.raises(TypeError, match="positional"):
        ParamExecOrderWrapPolicy(always_wrap_policy, cfg, 10)  # type: ignore[misc]
    with pytest.raises(ValueError, match="bucket_numel must be a positive"):
        ParamExecOrderWrapPolicy(bucket_numel=0)
    with pytest.raises(TypeError, match="tracing_config must be a tracing.TracingConfig"):
        ParamExecOrderWrapPolicy(always_wrap_policy, "fx")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="init_policy must be a callable"):
        ParamExecOrderWrapPolicy(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="order must be a tracing.ExecutionOrder"):
        ParamExecOrderWrapPolicy(order={"module_forward_order": []})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="example_kwargs must be a dict"):
        ParamExecOrderWrapPolicy(example_kwargs=[1])  # type: ignore[arg-type]


def test_repr_is_short() -> None:
    """The fields not at their defaults; a cost model, an order and a plan in one short line."""
    cm = execwrap.CostModel.preset("h100-nvlink-8")
    policy = ParamExecOrderWrapPolicy(bucket_numel="auto", cost_model=cm, world_size=8)
    assert repr(policy) == (
        "ParamExecOrderWrapPolicy(init_policy=always_wrap_policy, bucket_numel='auto', "
        "cost_model=CostModel(preset h100-nvlink-8, cuda, nccl, 8 ranks), world_size=8)"
    )
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    planned = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({nn.Linear}), order=trace_execution_order(model)
    )
    planned.build_plan(model)
    assert repr(planned) == (
        "ParamExecOrderWrapPolicy(init_policy=ModuleWrapPolicy({Linear}), "
        "order=ExecutionOrder(symbolic, 3 calls, 4 params), "
        "plan=WrapPlan(ModuleWrapPolicy({Linear}), 3 groups))"
    )


def test_run_policy_returns_shallow_copies_for_plan_units() -> None:
    model = L0L2L1()
    policy = ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig())
    root_kwargs = {"sync_module_states": True, "use_orig_params": True, "mixed_precision": None}
    targets = policy._run_policy(model, set(), root_kwargs)
    names = {id(m): n for n, m in model.named_modules()}
    assert [names[id(m)] for m in targets] == [
        "",
        "layer0",
        "layer2",
        "layer2.0",
        "layer2.1",
        "layer2.2",
        "layer1",
    ]
    assert all(kw == root_kwargs and kw is not root_kwargs for kw in targets.values())
    assert len({id(kw) for kw in targets.values()}) == len(targets)
    assert policy.order is not None and policy.order.method == "symbolic"
    assert policy.plan is not None and policy.recording is False


def test_run_policy_skips_ignored_modules_and_sets_forward_prefetch() -> None:
    model = GPT(SMALL)
    policy = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({Block}), TracingConfig(), forward_prefetch=True
    )
    ignored = {model.blocks[1], *model.blocks[1].modules()}
    targets = policy._run_policy(model, ignored, {"forward_prefetch": False})
    names = {id(m): n for n, m in model.named_modules()}
    assert [names[id(m)] for m in targets] == ["", "blocks.0"]
    assert all(kw["forward_prefetch"] is True for kw in targets.values())
    assert any("blocks.1" in note for note in policy.plan.notes)


def test_saved_order_is_reused_and_size_policy_works() -> None:
    model = GPT(SMALL)
    traced = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}), TracingConfig())
    traced.build_plan(model)
    saved = ExecutionOrder.from_dict(traced.order.to_dict())
    policy = ParamExecOrderWrapPolicy(
        functools.partial(size_based_auto_wrap_policy, min_num_params=3000), order=saved
    )
    plan = policy.build_plan(model)
    assert policy.order is saved
    assert plan.groups == [[""], ["blocks.0"], ["blocks.1"]]


def test_untraceable_without_inputs_raises_tracing_error() -> None:
    policy = ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig())
    with pytest.raises(TracingError):
        policy.build_plan(BranchModel())


def test_no_order_plans_from_init_policy_alone() -> None:
    policy = ParamExecOrderWrapPolicy(always_wrap_policy)
    plan = policy.build_plan(BranchModel())
    assert policy.order is None
    assert plan.groups == [[""], ["inp"], ["pos"], ["neg"], ["out"]]


class _Wrapper(nn.Module):
    """Stands in for FSDP1's root wrapper (the module it wraps is ``_fsdp_wrapped_module``)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self._fsdp_wrapped_module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fsdp_wrapped_module(x)


def test_first_step_recording_removes_itself() -> None:
    inner = BranchModel()
    model = _Wrapper(inner)
    clean = hook_census(model)
    got: list[ExecutionOrder] = []
    rec = FirstStepRecording(inner, got.append, start_now=False)
    assert hook_census(model)["global"] == clean["global"] + 1
    inner(torch.ones(2, 8))  # the inner module alone does not start it
    assert rec.active and got == []
    model(torch.ones(2, 8)).sum().backward()
    assert [o.module_forward_order for o in got] == [["", "inp", "pos", "out"]]
    assert got[0].param_backward_order[:2] == ["out.bias", "out.weight"]
    assert not rec.active
    assert hook_census(model) == clean
    model(-torch.ones(2, 8)).sum().backward()  # not recorded
    assert len(got) == 1


def test_first_step_recording_survives_a_failing_forward() -> None:
    model = BranchModel()
    clean = hook_census(model)
    got: list[ExecutionOrder] = []
    FirstStepRecording(model, got.append, start_now=True)
    with pytest.raises(RuntimeError):
        model(torch.ones(2, 3))  # wrong shape
    assert got == []
    with torch.no_grad():
        model(-torch.ones(2, 8))  # inference: ends after forward
    assert [o.module_forward_order for o in got] == [["", "inp", "neg", "out"]]
    assert hook_census(model) == clean


def test_record_first_step_fills_the_policy_and_replaces_an_earlier_recording() -> None:
    model = BranchModel()
    clean = hook_census(model)
    policy = ParamExecOrderWrapPolicy(always_wrap_policy)
    policy.build_plan(model)
    got: list[ExecutionOrder] = []
    record_first_step(policy, model, on_recorded=got.append, start_now=True)
    once = hook_census(model)
    record_first_step(policy, model, on_recorded=got.append, start_now=True)
    assert hook_census(model) == once  # the first recording was removed
    assert policy.recording and policy.order is None
    model(torch.ones(2, 8)).sum().backward()
    assert policy.order is not None and got == [policy.order]
    assert policy.order.module_forward_order == ["", "inp", "pos", "out"]
    assert policy.plan is not None and policy.plan.groups[:3] == [[""], ["inp"], ["pos"]]
    assert not policy.recording
    assert hook_census(model) == clean


def test_record_first_step_does_not_keep_the_policy_alive() -> None:
    model = BranchModel()
    policy = ParamExecOrderWrapPolicy(always_wrap_policy)
    got: list[ExecutionOrder] = []
    record_first_step(policy, model, on_recorded=got.append, start_now=True)
    ref = weakref.ref(policy)
    del policy
    gc.collect()
    assert ref() is None
    model(torch.ones(2, 8)).sum().backward()  # the model's hooks still record
    assert [o.module_forward_order for o in got] == [["", "inp", "pos", "out"]]


def test_prefetch_schedule_follows_gradient_order() -> None:
    order = ExecutionOrder(
        module_forward_order=["", "a", "b", "c"],
        param_backward_order=["b.w", "c.w", "a.w"],  # b's gradient first
    )
    groups = [[""], ["a"], ["b"], ["c"], ["unused"]]
    params = [["root.w"], ["a.w"], ["b.w"], ["c.w"], ["unused.w"]]
    fwd, bwd = prefetch_schedule(groups, order, param_fqns=params, prefetch=2)
    assert fwd == {0: [1, 2], 1: [2, 3], 2: [3], 3: []}
    assert bwd == {0: [2, 3], 2: [3, 1], 3: [1], 1: []}
    # Without gradient positions for every group: reverse forward order.
    fwd, bwd = prefetch_schedule(groups, order, prefetch=1)
    assert bwd == {0: [3], 3: [2], 2: [1], 1: []}


def test_prefetch_schedule_skips_frozen_leading_groups_in_backward() -> None:
    # a is frozen and runs before any trainable parameter: autograd never
    # reaches it, so nothing prefetches it in backward.
    order = ExecutionOrder(
        module_forward_order=["", "a", "b", "c"],
        param_uses=[
            ParamUse("a", 1, ("a.w",)),
            ParamUse("b", 2, ("b.w",)),
            ParamUse("c", 3, ("c.w",)),
        ],
        params={
            "a.w": ParamInfo(4, "float32", False),
            "b.w": ParamInfo(4, "float32", True),
            "c.w": ParamInfo(4, "float32", True),
        },
    )
    groups = [[""], ["a"], ["b"], ["c"]]
    params = [[], ["a.w"], ["b.w"], ["c.w"]]
    fwd, bwd = prefetch_schedule(groups, order, param_fqns=params, prefetch=1)
    assert fwd == {0: [1], 1: [2], 2: [3], 3: []}
    assert bwd == {0: [3], 3: [2], 2: []}


def test_post_order_puts_nested_groups_first() -> None:
    model = GPT(SMALL)
    groups = [
        ["blocks.0.ln2", "blocks.0.mlp"],
        ["blocks.0.mlp.fc", "blocks.0.mlp.proj", "blocks.1"],
        ["blocks.1.ln1"],
    ]
    assert post_order(model, groups) == [groups[2], groups[1], groups[0]]
    with pytest.raises(ValueError, match="enclose each other"):
        post_order(model, [["blocks.0", "blocks.1.ln1"], ["blocks.1", "blocks.0.ln1"]])


def test_order_fingerprint_ignores_metadata() -> None:
    a = ExecutionOrder(module_forward_order=["", "x"], method="symbolic")
    b = ExecutionOrder(module_forward_order=["", "x"], method="runtime", torch_version="0")
    c = ExecutionOrder(module_forward_order=["", "y"])
    assert order_fingerprint(a) == order_fingerprint(b) != order_fingerprint(c)
    assert len(order_fingerprint(a)) == 64


def test_apply_fully_shard_validates_arguments() -> None:
    from execwrap import apply_fully_shard

    with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
        apply_fully_shard(nn.Linear(2, 2), ParamExecOrderWrapPolicy(), prefetch=-1)
    with pytest.raises(TypeError, match="must be a ParamExecOrderWrapPolicy or a WrapPlan"):
        apply_fully_shard(nn.Linear(2, 2), always_wrap_policy)  # type: ignore[arg-type]
