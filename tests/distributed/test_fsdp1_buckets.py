"""FSDP1 with ``bucket_numel``: it builds the plan's units, or it is refused.

FSDP1 wraps one module per unit. A bucketed group that one module holds
exactly is built as that module's unit (the units FSDP1 builds are the plan's);
a group no module holds, and any auto plan (its prefetch, resharding and
estimate are FSDP2's), is refused before anything is wrapped, with a message
that says what to use instead. Never a plan describing what was not built.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from execwrap import ModuleWrapPolicy, ParamExecOrderWrapPolicy, TracingConfig
from execwrap.demo_models import Block, build_demo_model
from tests._dist import run_ranks
from tests.execwrap.autoplan_cases import cost_model


class _Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 4)  # 68 elements
        self.b = nn.Linear(4, 16)  # 80 elements

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class _Net(nn.Module):
    """``first`` (144 elements), ``pair`` (148), ``last`` (136): under a cap of 148
    elements the pair's two units form one group, which ``pair`` holds exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16)
        self.pair = _Pair()
        self.last = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.pair(self.first(x)))


def _units(model: nn.Module) -> list[str]:
    return [
        n.replace("_fsdp_wrapped_module.", "")
        for n, m in model.named_modules()
        if isinstance(m, FSDP)
    ]


def _refusal(policy: ParamExecOrderWrapPolicy, model: nn.Module) -> str:
    try:
        FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu"))
    except ValueError as e:
        return str(e)
    return "built"


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    torch.manual_seed(0)
    net = _Net()
    policy = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({nn.Linear}), TracingConfig(), bucket_numel=148
    )
    wrapped = FSDP(net, auto_wrap_policy=policy, use_orig_params=True, device_id="cpu")
    assert policy.plan is not None
    built = {
        "groups": policy.plan.groups,
        "fsdp1_modules": policy.plan.fsdp1_modules(),
        "units": _units(wrapped),
    }
    split = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({Block}), TracingConfig(), bucket_numel=100_000
    )
    auto = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({Block}),
        TracingConfig(),
        bucket_numel="auto",
        cost_model=cost_model(world_size=world_size),
    )
    return {
        "built": built,
        "split": _refusal(split, build_demo_model(n_blocks=4)),
        "auto": _refusal(auto, build_demo_model(n_blocks=2)),
    }


def test_fsdp1_builds_the_bucketed_units_or_refuses() -> None:
    (result,) = run_ranks(_worker, world_size=1)
    assert result["built"] == {
        "groups": [[""], ["first"], ["pair.a", "pair.b"], ["last"]],
        "fsdp1_modules": ["", "first", "pair", "last"],
        "units": ["", "first", "pair", "last"],
    }
    fix = (
        "For FSDP1 leave bucket_numel out and choose the units with init_policy (e.g. a "
        "ModuleWrapPolicy of a larger block class, or functools.partial("
        "size_based_auto_wrap_policy, min_num_params=N)); for this plan use FSDP2: "
        "execwrap.apply_fully_shard(model, policy, mesh=mesh"
    )
    assert result["split"] == (
        "ParamExecOrderWrapPolicy(bucket_numel=100000) merged units into FSDP2 groups that "
        "FSDP1 cannot build: no module holds exactly the units of 2 of 3 groups "
        "(['blocks.0', 'blocks.1'], ['blocks.2', 'blocks.3']), so FSDP1 would build 5 units "
        f"where the plan has 3. {fix})"
    )
    assert result["auto"] == (
        'ParamExecOrderWrapPolicy(bucket_numel="auto") plans for FSDP2: its groups, prefetch '
        "depth, reshard_after_forward per group and predicted step are FSDP2's, and FSDP1 "
        f'builds none of them (it wraps one module per unit). {fix}, prefetch="auto")'
    )
