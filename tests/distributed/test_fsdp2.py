"""FSDP2 (``fully_shard``) through ``apply_fully_shard`` on 2 gloo ranks.

One spawn runs every case: parity with the unwrapped model on three models,
order recording during step 1, and bucketed groups (all-gathers counted per
step by wrapping FSDP2's all-gather, prefetch lists read back from the FSDP
states).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard import _fsdp_param_group

from execwrap import (
    ModuleWrapPolicy,
    ParamExecOrderWrapPolicy,
    TracingConfig,
    always_wrap_policy,
    apply_fully_shard,
    plan_wrap,
)
from execwrap.demo_models import Block
from tests._dist import run_ranks
from tests.distributed._policy_cases import (
    branch_case,
    dtensor_full_grads,
    gpt_case,
    hook_census,
    l0l2l1_case,
    run_parity,
)
from tracing.fqn import display


def _prefetch_lists(model: nn.Module) -> dict[str, dict[str, list[list[str]]]]:
    """Group label -> forward/backward prefetch targets, read from the FSDP states."""
    names = {id(m): n for n, m in model.named_modules()}
    states = {}
    for m in model.modules():
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()
            states[id(state)] = state

    def label(state: Any) -> str:
        return "+".join(display(names[id(m)]) for m in state._modules)

    return {
        label(s): {
            "forward": [label(t) for t in s._states_to_forward_prefetch],
            "backward": [label(t) for t in s._states_to_backward_prefetch],
        }
        for s in states.values()
    }


class _AllGatherCounter:
    """Counts FSDP2 all-gathers (one ``foreach_all_gather`` per group unshard)."""

    def __init__(self) -> None:
        self.count = 0
        self._orig = _fsdp_param_group.foreach_all_gather

    def __enter__(self) -> _AllGatherCounter:
        @functools.wraps(self._orig)
        def counting(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return self._orig(*args, **kwargs)

        _fsdp_param_group.foreach_all_gather = counting
        return self

    def __exit__(self, *exc: object) -> None:
        _fsdp_param_group.foreach_all_gather = self._orig


def _shard(policy: ParamExecOrderWrapPolicy, mesh: DeviceMesh, **kwargs: Any):
    def wrap(model: nn.Module) -> nn.Module:
        apply_fully_shard(model, policy, mesh=mesh, **kwargs)
        return model

    return wrap


def _fsdp2_worker(rank: int, world_size: int) -> dict[str, Any]:
    # FSDP2 warns that grouped modules return views (LayerNorm, chunked qkv);
    # nothing here modifies them in place, and the parity checks prove it.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    mesh = init_device_mesh("cpu", (world_size,))
    out: dict[str, Any] = {}

    # 1. layer0 -> layer2 -> layer1.
    policy = ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig())
    res = run_parity(rank, world_size, l0l2l1_case(), _shard(policy, mesh), dtensor_full_grads)
    out["l0l2l1"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        "groups": policy.plan.groups,
        "prefetch": _prefetch_lists(res["wrapped"]),
    }

    # 2. GPT with tied embedding/output; bucketed blocks.
    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}), TracingConfig())
    res = run_parity(rank, world_size, gpt_case(), _shard(policy, mesh), dtensor_full_grads)
    out["gpt"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        "groups": policy.plan.groups,
    }

    # 3. Data-dependent branch: falls back to example inputs.
    case = branch_case()
    policy = ParamExecOrderWrapPolicy(
        always_wrap_policy, TracingConfig(), example_inputs=case.example(rank, world_size)
    )
    res = run_parity(rank, world_size, case, _shard(policy, mesh), dtensor_full_grads)
    out["branch_fallback"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        "groups": policy.plan.groups,
        "method": policy.order.method,
    }

    # 4. Data-dependent branch, nothing to capture: recorded during step 1,
    #    prefetching set after it, no recording hooks left.
    policy = ParamExecOrderWrapPolicy(always_wrap_policy)
    # The same groups applied from a plan (no policy, so nothing records).
    twin = case.model()
    apply_fully_shard(
        twin, ParamExecOrderWrapPolicy(always_wrap_policy).build_plan(twin), mesh=mesh
    )
    seen: dict[str, Any] = {}

    def wrap(model: nn.Module) -> nn.Module:
        apply_fully_shard(model, policy, mesh=mesh)
        seen["prefetch_before"] = _prefetch_lists(model)
        seen["recording_before"] = policy.recording
        return model

    def after_step(step: int, model: nn.Module) -> None:
        if step == 0:
            seen["order"] = list(policy.order.module_forward_order)
            seen["recording_after"] = policy.recording
            seen["prefetch_after"] = _prefetch_lists(model)
            seen["census"] = hook_census(model)

    res = run_parity(rank, world_size, case, wrap, dtensor_full_grads, after_step)
    x, y = case.make_batch(0)
    case.loss(twin(x.chunk(world_size)[rank]), y.chunk(world_size)[rank]).backward()
    out["branch_recorded"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        **seen,
        "census_equal_to_plain": seen["census"] == hook_census(twin),
        "groups": policy.plan.groups,
    }

    # 5. Bucketing: groups as planned, all-gathers per step counted, prefetch = order.
    policy = ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig(), bucket_numel=3000)
    counts: list[int] = []
    counter = _AllGatherCounter()

    def count_wrap(model: nn.Module) -> nn.Module:
        apply_fully_shard(model, policy, mesh=mesh)
        counter.__enter__()
        return model

    def count_step(step: int, model: nn.Module) -> None:
        counts.append(counter.count)
        counter.count = 0

    try:
        res = run_parity(rank, world_size, gpt_case(), count_wrap, dtensor_full_grads, count_step)
    finally:
        counter.__exit__()
    stats = policy.plan.stats()
    unbucketed = plan_wrap(gpt_case().model(), policy.order, always_wrap_policy).stats()
    out["bucketed"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        "groups": policy.plan.groups,
        "group_numel": [u.numel for u in policy.plan.units],
        "atomic_units": len(policy.plan.atomic_units),
        "all_gathers_per_step": counts,
        "predicted": stats.all_gathers_per_step,
        "predicted_unbucketed": unbucketed.all_gathers_per_step,
        "prefetch": _prefetch_lists(res["wrapped"]),
        "backward_unit_order": [
            policy.plan.units[i].label for i in policy.plan.backward_unit_order()
        ],
    }
    return out


def test_fsdp2_policy_parity_recording_and_buckets() -> None:
    r0, r1 = run_ranks(_fsdp2_worker, world_size=2, timeout_s=120)
    for name in ("l0l2l1", "gpt", "branch_fallback", "branch_recorded", "bucketed"):
        assert r0[name]["losses"] == r1[name]["losses"], name
        assert len(r0[name]["losses"]) == 3
        assert r0[name]["diff"] <= 1e-5, (name, r0[name]["diff"])
        print(name, "losses", r0[name]["losses"], "max |grad diff|", r0[name]["diff"])

    l0 = r0["l0l2l1"]
    assert l0["groups"] == [
        [""],
        ["layer0"],
        ["layer2"],
        ["layer2.0"],
        ["layer2.1"],
        ["layer2.2"],
        ["layer1"],
    ]
    # Symbolic order: no gradient order, so backward is the reverse forward order.
    # layer2 and layer2.1 (ReLU) hold no parameters: nothing to prefetch there.
    assert l0["prefetch"] == {
        "<root>": {"forward": ["layer0"], "backward": ["layer1"]},
        "layer0": {"forward": ["layer2.0"], "backward": []},
        "layer2": {"forward": [], "backward": []},
        "layer2.0": {"forward": ["layer2.2"], "backward": ["layer0"]},
        "layer2.1": {"forward": [], "backward": []},
        "layer2.2": {"forward": ["layer1"], "backward": ["layer2.0"]},
        "layer1": {"forward": [], "backward": ["layer2.2"]},
    }

    assert r0["gpt"]["groups"] == [[""], ["blocks.0"], ["blocks.1"]]
    assert r0["branch_fallback"]["method"] == "runtime"
    assert r0["branch_fallback"]["groups"] == [[""], ["inp"], ["pos"], ["out"]]

    br = r0["branch_recorded"]
    assert br["recording_before"] is True
    assert br["order"] == ["", "inp", "pos", "out"]
    assert br["recording_after"] is False
    # Units from init_policy alone (``neg`` too), re-ordered by the recorded order.
    assert br["groups"] == [[""], ["inp"], ["pos"], ["out"], ["neg"]]
    nothing = {"forward": [], "backward": []}
    assert br["prefetch_before"] == {g: nothing for g in ("<root>", "inp", "pos", "out", "neg")}
    assert br["prefetch_after"] == {
        "<root>": {"forward": ["inp"], "backward": ["out"]},
        "inp": {"forward": ["pos"], "backward": []},
        "pos": {"forward": ["out"], "backward": ["inp"]},
        "out": {"forward": [], "backward": ["pos"]},
        "neg": nothing,
    }
    # After step 1 only FSDP2's own hooks remain: the same census as the same
    # groups applied without recording.
    assert br["census_equal_to_plain"] is True
    assert br["census"]["global"] == 0

    b = r0["bucketed"]
    groups = [
        [""],
        ["blocks.0"],
        [
            "blocks.0.ln1",
            "blocks.0.attn.qkv",
            "blocks.0.attn.proj",
            "blocks.0.ln2",
            "blocks.0.mlp.fc",
        ],
        ["blocks.0.attn"],
        ["blocks.0.mlp"],
        [
            "blocks.0.mlp.proj",
            "blocks.1.ln1",
            "blocks.1.attn.qkv",
            "blocks.1.attn.proj",
            "blocks.1.ln2",
        ],
        ["blocks.1"],
        ["blocks.1.attn"],
        ["blocks.1.mlp"],
        ["blocks.1.mlp.fc", "blocks.1.mlp.proj", "ln_f"],
    ]
    assert b["groups"] == groups
    assert b["group_numel"] == [640, 0, 2240, 0, 0, 2192, 0, 0, 0, 2160]
    assert b["atomic_units"] == 20
    labels = ["+".join(display(m) for m in g) for g in groups]
    # FSDP2 built exactly these groups (one FSDP state each).
    assert sorted(b["prefetch"]) == sorted(labels)
    # Units without parameters (blocks.N, attn, mlp under always_wrap) stay
    # alone and do not interrupt a bucket, so the leaves fill 3 groups.
    # Forward: root + 3 groups; backward: the 3 again (the root keeps its
    # parameters, reshard_after_forward=False).
    assert b["all_gathers_per_step"] == [7, 7, 7]
    assert b["predicted"] == 7
    assert b["predicted_unbucketed"] > 7
    with_params = [0, 2, 5, 9]
    fwd = [labels[i] for i in with_params]  # groups with parameters, forward order
    bwd = list(reversed(fwd[1:]))
    assert b["prefetch"][labels[0]] == {"forward": [fwd[1]], "backward": [bwd[0]]}
    for k in range(1, len(fwd)):
        assert b["prefetch"][fwd[k]]["forward"] == fwd[k + 1 : k + 2]
    for k in range(len(bwd)):
        assert b["prefetch"][bwd[k]]["backward"] == bwd[k + 1 : k + 2]
    for i, label in enumerate(labels):
        if i not in with_params:
            assert b["prefetch"][label] == nothing
    print(
        "bucketed all-gathers per step",
        b["all_gathers_per_step"],
        "unbucketed prediction",
        b["predicted_unbucketed"],
    )
