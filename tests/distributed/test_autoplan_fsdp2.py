"""Auto plans applied on 2 gloo ranks: FSDP2 with per-group reshard and prefetch="auto", and FSDP1.

One spawn runs every case, each trained against an unwrapped reference
(same losses, same full gradients):

* a plan with hand-set choices (prefetch 2, the first block kept unsharded
  after forward): ``apply_fully_shard(..., prefetch="auto")`` gives each
  ``fully_shard`` group its flag (read back from the FSDP states:
  ``post_forward_mesh_info is None`` means no reshard after forward) and
  prefetches 2 groups ahead;
* ``ParamExecOrderWrapPolicy(..., bucket_numel="auto", cost_model=...)``
  through ``apply_fully_shard(..., prefetch="auto")``: the groups, prefetch
  depth and flags applied are the plan's;
* (the same policy under FSDP1 is refused: ``tests/distributed/test_fsdp1_buckets.py``);
* ``prefetch="auto"`` on a plan without a chosen depth is refused;
* an explicit ``reshard_after_forward`` and an int ``prefetch`` that differ
  from the plan's choices are applied, each with one WARNING.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule

from execwrap import (
    ModuleWrapPolicy,
    ParamExecOrderWrapPolicy,
    TracingConfig,
    apply_fully_shard,
    plan_wrap,
)
from execwrap.demo_models import Block
from tests._dist import run_ranks
from tests.distributed._policy_cases import dtensor_full_grads, gpt_case, run_parity
from tests.execwrap.autoplan_cases import cost_model
from tests.integrations._frameworks import Records
from tracing import trace_execution_order
from tracing.fqn import display


def _applied(model: nn.Module) -> dict[str, dict[str, Any]]:
    """Group label -> whether it reshards after forward and its prefetch targets."""
    names = {id(m): n for n, m in model.named_modules()}
    states = {}
    for m in model.modules():
        if isinstance(m, FSDPModule):
            state = m._get_fsdp_state()
            states[id(state)] = state

    def label(state: Any) -> str:
        return "+".join(display(names[id(m)]) for m in state._modules)

    out = {}
    for s in states.values():
        group = s._fsdp_param_group
        out[label(s)] = {
            "reshard": group is not None and group.post_forward_mesh_info is not None,
            "forward": [label(t) for t in s._states_to_forward_prefetch],
            "backward": [label(t) for t in s._states_to_backward_prefetch],
        }
    return out


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    mesh = init_device_mesh("cpu", (world_size,))
    out: dict[str, Any] = {}
    cm = cost_model(world_size=world_size)

    # 1. Hand-set choices on a plain plan.
    model = gpt_case().model()
    base = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))
    chosen = dataclasses.replace(base, prefetch=2, reshard_after_forward=(False, False, True))
    seen: dict[str, Any] = {}

    def wrap_chosen(m: nn.Module) -> nn.Module:
        seen["plan"] = apply_fully_shard(m, chosen, mesh=mesh, prefetch="auto")
        seen["applied"] = _applied(m)
        return m

    res = run_parity(rank, world_size, gpt_case(), wrap_chosen, dtensor_full_grads)
    out["chosen"] = {"losses": res["losses"], "diff": res["max_grad_diff"], **seen}
    out["chosen"]["plan"] = seen["plan"].groups

    # 2. The auto-planner through the policy, FSDP2.
    policy = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({Block}), TracingConfig(), bucket_numel="auto", cost_model=cm
    )
    applied: dict[str, Any] = {}

    def wrap_auto(m: nn.Module) -> nn.Module:
        apply_fully_shard(m, policy, mesh=mesh, prefetch="auto")
        applied.update(_applied(m))
        return m

    res = run_parity(rank, world_size, gpt_case(), wrap_auto, dtensor_full_grads)
    plan = policy.plan
    out["auto"] = {
        "losses": res["losses"],
        "diff": res["max_grad_diff"],
        "applied": applied,
        "groups": plan.groups,
        "labels": [u.label for u in plan.units],
        "flags": plan.reshard_after_forward,
        "prefetch": plan.prefetch,
    }

    # 4. prefetch="auto" needs a chosen depth.
    try:
        apply_fully_shard(gpt_case().model(), base, mesh=mesh, prefetch="auto")
    except ValueError as e:
        out["refused"] = str(e)

    # 5. The caller's reshard_after_forward and prefetch over the plan's, with a WARNING each.
    model = gpt_case().model()
    with Records() as records:
        apply_fully_shard(model, chosen, mesh=mesh, prefetch=1, reshard_after_forward=True)
    out["overridden"] = {"applied": _applied(model), "warnings": records.messages}
    return out


def test_auto_plans_on_fsdp2_and_fsdp1() -> None:
    r0, r1 = run_ranks(_worker, world_size=2, timeout_s=180)
    for name in ("chosen", "auto"):
        assert r0[name]["losses"] == r1[name]["losses"], name
        assert len(r0[name]["losses"]) == 3
        assert r0[name]["diff"] <= 1e-5, (name, r0[name]["diff"])

    chosen = r0["chosen"]
    assert chosen["plan"] == [[""], ["blocks.0"], ["blocks.1"]]
    assert chosen["applied"] == {
        "<root>": {
            "reshard": False,
            "forward": ["blocks.0", "blocks.1"],
            "backward": ["blocks.1", "blocks.0"],
        },
        "blocks.0": {"reshard": False, "forward": ["blocks.1"], "backward": []},
        "blocks.1": {"reshard": True, "forward": [], "backward": ["blocks.0"]},
    }

    auto = r0["auto"]
    assert auto["groups"] == r1["auto"]["groups"]
    assert set(auto["applied"]) == set(auto["labels"])
    for label, flag in zip(auto["labels"], auto["flags"], strict=True):
        assert auto["applied"][label]["reshard"] is flag, label
    depth = auto["prefetch"]
    others = [lb for lb in auto["labels"] if lb != "<root>"]
    assert auto["applied"]["<root>"]["forward"] == others[:depth]

    assert r0["refused"].startswith(
        'apply_fully_shard: prefetch="auto" uses the depth the auto-planner chose, but this '
        "plan has none"
    )

    overridden = r0["overridden"]
    assert overridden["applied"] == {
        "<root>": {"reshard": True, "forward": ["blocks.0"], "backward": ["blocks.1"]},
        "blocks.0": {"reshard": True, "forward": ["blocks.1"], "backward": []},
        "blocks.1": {"reshard": True, "forward": [], "backward": ["blocks.0"]},
    }
    assert overridden["warnings"] == [
        "apply_fully_shard: prefetch=1 applied where the auto plan chose 2: plan.estimate no "
        'longer describes the step; pass prefetch="auto" to apply the plan\'s depth',
        "apply_fully_shard: reshard_after_forward=True given for every group, the root "
        "included, overrides the auto plan's per-group choices (False, False, True): "
        "plan.estimate and the memory budget it was planned under no longer describe the "
        "step; leave reshard_after_forward out to apply the plan's choices",
    ]
