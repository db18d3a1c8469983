"""FSDP1 (``FullyShardedDataParallel``) with ``ParamExecOrderWrapPolicy`` on 2 gloo ranks.

One spawn runs every case (spawning costs seconds); the test then checks
what each rank returned.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision

from execwrap import (
    ModuleWrapPolicy,
    ParamExecOrderWrapPolicy,
    TracingConfig,
    always_wrap_policy,
)
from execwrap.demo_models import Block
from tests._dist import run_ranks
from tests.distributed._policy_cases import (
    branch_case,
    gpt_case,
    hook_census,
    l0l2l1_case,
    run_parity,
)

CPU = torch.device("cpu")


def _clean(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "")


def _full_grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    with FSDP.summon_full_params(model, with_grads=True):
        return {
            _clean(n): (p.grad.detach().clone() if p.grad is not None else None)
            for n, p in model.named_parameters()
        }


def _units(model: nn.Module) -> list[str]:
    """FQNs of the FSDP1 instances, root first (pre-order)."""
    return [_clean(n) for n, m in model.named_modules() if isinstance(m, FSDP)]


def _wrapper(policy: ParamExecOrderWrapPolicy, **kwargs: Any):
    def wrap(model: nn.Module) -> nn.Module:
        return FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=CPU, **kwargs)

    return wrap


def _fsdp1_worker(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}

    # 1. layer0 -> layer2 -> layer1, symbolic order, always_wrap.
    case = l0l2l1_case()
    policy = ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig())
    res = run_parity(rank, world_size, case, _wrapper(policy), _full_grads)
    out["l0l2l1"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        "groups": policy.plan.groups,
        "fsdp_units": _units(res["wrapped"]),
        "method": policy.order.method,
    }

    # 2. GPT with tied embedding/output, blocks as units.
    case = gpt_case()
    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}), TracingConfig())
    res = run_parity(rank, world_size, case, _wrapper(policy, forward_prefetch=False), _full_grads)
    out["gpt"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        "groups": policy.plan.groups,
        "fsdp_units": _units(res["wrapped"]),
    }

    # 3. Data-dependent branch: tracing fails, falls back to example inputs.
    case = branch_case()
    policy = ParamExecOrderWrapPolicy(
        always_wrap_policy, TracingConfig(), example_inputs=case.example(rank, world_size)
    )
    res = run_parity(rank, world_size, case, _wrapper(policy), _full_grads)
    out["branch_fallback"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        "groups": policy.plan.groups,
        "fsdp_units": _units(res["wrapped"]),
        "method": policy.order.method,
        "fallback_reason": policy.order.fallback_reason,
    }

    # 4. Data-dependent branch, nothing to capture before wrapping: recorded in step 1.
    policy = ParamExecOrderWrapPolicy(always_wrap_policy)
    twin = FSDP(
        case.model(), auto_wrap_policy=always_wrap_policy, use_orig_params=True, device_id=CPU
    )
    seen: dict[str, Any] = {}

    def after_step(step: int, wrapped: nn.Module) -> None:
        if step == 0:
            seen["order_after_step1"] = list(policy.order.module_forward_order)
            seen["recording_after_step1"] = policy.recording
            seen["census"] = hook_census(wrapped)

    order_before = policy.order
    res = run_parity(rank, world_size, case, _wrapper(policy), _full_grads, after_step)
    x, y = case.make_batch(0)
    case.loss(twin(x.chunk(world_size)[rank]), y.chunk(world_size)[rank]).backward()
    out["branch_recorded"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        "order_before": order_before,
        "order_after_step1": seen["order_after_step1"],
        "recording_after_step1": seen["recording_after_step1"],
        "census_equal_to_torch_wrapped": seen["census"] == hook_census(twin),
        "global_hooks": seen["census"]["global"],
        "groups": policy.plan.groups,
        "fsdp_units": _units(res["wrapped"]),
        "backward_order": list(policy.order.param_backward_order),
    }

    # 5. FSDP kwargs keep working: mixed precision, ignored_modules. (FSDP1 refuses
    # sync_module_states for CPU modules; tests/execwrap/test_policy.py checks the
    # policy hands it to every unit.)
    model = l0l2l1_case().model()
    policy = ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig())
    mp = MixedPrecision(param_dtype=torch.float64, reduce_dtype=torch.float64)
    fsdp = FSDP(
        model, auto_wrap_policy=policy, mixed_precision=mp, use_orig_params=True, device_id=CPU
    )
    y = fsdp(torch.ones(2, 8))
    y.sum().backward()
    model = l0l2l1_case().model()
    ignoring = ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig())
    fsdp_ignoring = FSDP(
        model, auto_wrap_policy=ignoring, ignored_modules=[model.layer1], device_id=CPU
    )
    fsdp_ignoring(torch.ones(2, 8)).sum().backward()
    out["kwargs"] = {
        "mp_units": _units(fsdp),
        "param_dtypes": sorted(
            {str(m.mixed_precision.param_dtype) for m in fsdp.modules() if isinstance(m, FSDP)}
        ),
        "output_dtype": str(y.dtype),
        "ignoring_units": _units(fsdp_ignoring),
        "layer1_is_fsdp": isinstance(model.layer1, FSDP),
        "layer1_shape": tuple(model.layer1.weight.shape),
        "layer1_grad_shape": tuple(model.layer1.weight.grad.shape),
        "ignoring_groups": ignoring.plan.groups,
    }
    return out


def test_fsdp1_policy_parity_and_recording() -> None:
    results = run_ranks(_fsdp1_worker, world_size=2, timeout_s=120)
    r0, r1 = results
    for name in ("l0l2l1", "gpt", "branch_fallback", "branch_recorded"):
        assert r0[name]["losses"] == r1[name]["losses"], name
        assert len(r0[name]["losses"]) == 3
        assert r0[name]["diff"] <= 1e-5, (name, r0[name]["diff"])
        print(name, "losses", r0[name]["losses"], "max |grad diff|", r0[name]["diff"])

    l0 = r0["l0l2l1"]
    assert l0["method"] == "symbolic"
    # Execution order (layer1 last), not definition order; ReLU is a unit as in torch.
    assert l0["groups"] == [
        [""],
        ["layer0"],
        ["layer2"],
        ["layer2.0"],
        ["layer2.1"],
        ["layer2.2"],
        ["layer1"],
    ]
    assert l0["fsdp_units"] == [
        "",
        "layer0",
        "layer1",
        "layer2",
        "layer2.0",
        "layer2.1",
        "layer2.2",
    ]

    gpt = r0["gpt"]
    assert gpt["groups"] == [[""], ["blocks.0"], ["blocks.1"]]
    assert gpt["fsdp_units"] == ["", "blocks.0", "blocks.1"]

    bf = r0["branch_fallback"]
    assert bf["method"] == "runtime"
    assert "symbolic tracing failed" in bf["fallback_reason"]
    # ``neg`` never runs: it is not a unit, its parameters stay in the root.
    assert bf["groups"] == [[""], ["inp"], ["pos"], ["out"]]
    assert bf["fsdp_units"] == ["", "inp", "pos", "out"]

    br = r0["branch_recorded"]
    assert br["order_before"] is None
    assert br["order_after_step1"] == ["", "inp", "pos", "out"]
    assert br["recording_after_step1"] is False
    assert br["census_equal_to_torch_wrapped"] is True
    assert br["global_hooks"] == 0
    # Units were decided before the order (init_policy alone: neg too), then re-ordered.
    assert br["fsdp_units"] == ["", "inp", "pos", "neg", "out"]
    assert br["groups"] == [[""], ["inp"], ["pos"], ["out"], ["neg"]]
    assert br["backward_order"] == [
        "out.bias",
        "out.weight",
        "pos.bias",
        "pos.weight",
        "inp.bias",
        "inp.weight",
    ]

    kw = r0["kwargs"]
    assert kw["mp_units"] == ["", "layer0", "layer1", "layer2", "layer2.0", "layer2.1", "layer2.2"]
    assert kw["param_dtypes"] == ["torch.float64"]
    assert kw["output_dtype"] == "torch.float64"
    assert kw["ignoring_units"] == ["", "layer0", "layer2", "layer2.0", "layer2.1", "layer2.2"]
    assert kw["layer1_is_fsdp"] is False
    assert kw["layer1_shape"] == (8, 8)  # not sharded
    assert kw["layer1_grad_shape"] == (8, 8)
    assert kw["ignoring_groups"] == [
        [""],
        ["layer0"],
        ["layer2"],
        ["layer2.0"],
        ["layer2.1"],
        ["layer2.2"],
    ]
