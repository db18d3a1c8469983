"""One auto plan on every rank, whatever each rank measured, through every entry point.

Each of 2 gloo ranks holds the same order with its own compute times (injected:
rank 0's blocks 0-2 ten times slower than the rest, rank 1's blocks 2-5, so rank
1's step is the slower one), and a memory budget that binds: planned apart
(``across_ranks=False``), the ranks choose different groupings. Through
``plan_wrap``, ``apply_fully_shard`` with a policy, the FSDP1 policy and the
torchtitan integration, both ranks get the same plan: rank 1's (the slowest
rank's timing record, :mod:`execwrap.distributed.timing`). FSDP1 plans it too, then
refuses it on both ranks (an auto plan is FSDP2's groups).

Then 20 rounds of what a user does, with real timing: each rank captures with
``record_execution_order(..., timing=True)``, plans with ``bucket_numel="auto"``
and applies the plan with ``apply_fully_shard`` (whose cross-rank check raises
``PlanError`` when the plans differ), under a budget that binds. Planned apart
(``across_ranks=False``), the same rounds gave the two ranks different groupings
in 3 of 8 rounds on the (loaded) development machine.

Both run in one spawn of 2 ranks (entry points, then rounds); each test checks its part.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any

import pytest
import torch
import torch.nn as nn

from execwrap import ModuleWrapPolicy, ParamExecOrderWrapPolicy, apply_fully_shard, plan_wrap
from execwrap.demo_models import GPT, Block, GPTConfig
from tests._dist import run_ranks
from tests.execwrap.autoplan_cases import cost_model
from tracing import ExecutionOrder, record_execution_order

pytestmark = pytest.mark.timeout(300)

#: Blocks ten times slower than the others, per rank.
SLOW = {0: (0, 1, 2), 1: (2, 3, 4, 5)}
#: Where the budget sits between the smallest and the largest peak of the free search.
BUDGET_AT = 0.8


def _model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_blocks=6, dim=32, vocab_size=64, max_seq_len=16))


def _inputs() -> torch.Tensor:
    return torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


def injected_timing(order: ExecutionOrder, slow: tuple[int, ...]) -> ExecutionOrder:
    """``order`` with a made-up timeline: each call costs 1 ms of its own (10 ms in a
    slow block) in forward and twice that in backward, calls nested by
    ``module_call_depths``; 1000 saved bytes per call."""
    calls, depths = order.module_forward_order, order.module_call_depths
    prefixes = tuple(f"blocks.{b}" for b in slow)
    own = [(10e-3 if fqn.startswith(prefixes) else 1e-3) for fqn in calls]
    start, duration, open_calls, t = [0.0] * len(calls), [0.0] * len(calls), [], 0.0
    for i in range(len(calls)):
        while open_calls and depths[open_calls[-1]] >= depths[i]:
            j = open_calls.pop()
            duration[j] = t - start[j]
        start[i], t = t, t + own[i]
        open_calls.append(i)
    for j in open_calls:
        duration[j] = t - start[j]
    backward: list[float | None] = [None] * len(calls)
    for i in reversed(range(len(calls))):
        backward[i], t = t, t + 2 * own[i]
    return dataclasses.replace(
        order,
        forward_times_s=duration,
        forward_start_s=start,
        backward_start_s=backward,
        backward_end_s=t,
        backward_times_s={},
        saved_activation_bytes=[1000] * len(calls),
        timing_device="cpu",
        timing_method="measured",
    )


def _choices(plan: Any) -> tuple[Any, ...]:
    return (plan.groups, plan.prefetch, plan.reshard_after_forward)


def _policy(order: ExecutionOrder, cm: Any, budget: int) -> ParamExecOrderWrapPolicy:
    return ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({Block}),
        order=order,
        bucket_numel="auto",
        cost_model=cm,
        memory_budget=budget,
    )


def _entry_points(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel

    from execwrap.integrations.torchtitan import apply_fsdp

    model = _model()
    order = record_execution_order(model, _inputs())
    cm = cost_model(world_size=2, latency=1e-3, per_byte=1e-7, overlap=1.0)
    free = plan_wrap(
        model, injected_timing(order, ()), ModuleWrapPolicy({Block}), bucket_numel="auto",
        cost_model=cm, across_ranks=False,
    )  # fmt: skip
    peaks = [c.peak_memory_bytes for c in free.search.candidates]
    budget = int(min(peaks) + BUDGET_AT * (max(peaks) - min(peaks)))
    mine = injected_timing(order, SLOW[rank])
    auto: dict[str, Any] = dict(bucket_numel="auto", cost_model=cm, memory_budget=budget)
    out: dict[str, Any] = {
        "apart": [
            _choices(plan_wrap(model, injected_timing(order, SLOW[r]), ModuleWrapPolicy({Block}),
                               across_ranks=False, **auto))
            for r in (0, 1)
        ],
    }  # fmt: skip
    planned = plan_wrap(model, mine, ModuleWrapPolicy({Block}), **auto)
    out["plan_wrap"] = _choices(planned)
    out["plan_wrap timing"] = planned.order.forward_times_s
    out["apply_fully_shard"] = _choices(apply_fully_shard(_model(), _policy(mine, cm, budget)))
    policy = _policy(mine, cm, budget)
    try:  # FSDP1 plans (a collective), then refuses an auto plan on every rank
        FullyShardedDataParallel(
            _model(), auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu")
        )
    except ValueError as e:
        out["FSDP1 refusal"] = str(e)
    assert policy.plan is not None
    out["FSDP1 policy"] = _choices(policy.plan)
    plan = apply_fsdp(
        _model(),
        init_device_mesh("cpu", (world_size,)),
        torch.float32,
        torch.float32,
        False,
        policy_or_plan=_policy(mine, cm, budget),
    )
    out["torchtitan apply_fsdp"] = _choices(plan)
    out["rank 1 timing"] = injected_timing(order, SLOW[1]).forward_times_s
    return out


#: The frameworks ``_entry_points`` needs (torchtitan's apply_fsdp imports triton).
_FRAMEWORKS = ("triton", "torchtitan")


def _both(rank: int, world_size: int, entry_points: bool) -> dict[str, Any]:
    return {
        "entry_points": _entry_points(rank, world_size) if entry_points else None,
        "rounds": _rounds(rank, world_size),
    }


@pytest.fixture(scope="module")
def one_plan() -> dict[str, list[Any]]:
    """Worker -> ``[rank 0's result, rank 1's]``, from one spawn of 2 ranks (the entry
    points only where their frameworks are installed)."""
    available = all(importlib.util.find_spec(name) is not None for name in _FRAMEWORKS)
    results = run_ranks(_both, world_size=2, args=(available,))
    return {name: [r[name] for r in results] for name in results[0]}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_every_entry_point_gives_the_slowest_ranks_plan_on_every_rank(
    one_plan: dict[str, list[Any]],
) -> None:
    for name in _FRAMEWORKS:
        pytest.importorskip(name)
    ranks = one_plan["entry_points"]
    apart = ranks[0]["apart"]
    assert apart[0][0] != apart[1][0], "premise: the injected timings give different groupings"
    expected = apart[1]  # rank 1's timing: its step is the slower one
    for name in ("plan_wrap", "apply_fully_shard", "FSDP1 policy", "torchtitan apply_fsdp"):
        assert ranks[0][name] == ranks[1][name] == expected, name
    for rank in ranks:
        assert rank["plan_wrap timing"] == rank["rank 1 timing"]
        assert rank["FSDP1 refusal"].startswith(
            'ParamExecOrderWrapPolicy(bucket_numel="auto") plans for FSDP2: its groups, '
            "prefetch depth, reshard_after_forward per group and predicted step are FSDP2's"
        )


class _Net(nn.Module):
    """Six linear blocks: a fast timed step (milliseconds) for the repeated rounds."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(64, 64) for _ in range(6)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return x


ROUNDS = 20


def _rounds(rank: int, world_size: int) -> list[Any]:
    cm = cost_model(world_size=2, latency=1e-4, per_byte=1e-8, overlap=1.0)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
    torch.manual_seed(0)
    first = record_execution_order(_Net(), x, timing=True)
    free = plan_wrap(_Net(), first, ModuleWrapPolicy({nn.Linear}), bucket_numel="auto",
                     cost_model=cm, across_ranks=False)  # fmt: skip
    peaks = [c.peak_memory_bytes for c in free.search.candidates]  # memory: the same on both
    budget = int(min(peaks) + BUDGET_AT * (max(peaks) - min(peaks)))  # binds: times decide
    chosen = []
    for _ in range(ROUNDS):
        torch.manual_seed(0)
        model = _Net()
        order = record_execution_order(model, x, timing=True)
        plan = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}), bucket_numel="auto",
                         cost_model=cm, memory_budget=budget)  # fmt: skip
        apply_fully_shard(model, plan, prefetch="auto")  # PlanError if the ranks disagree
        chosen.append(_choices(plan))
    return chosen


def test_twenty_rounds_of_real_timing_give_one_plan(one_plan: dict[str, list[Any]]) -> None:
    ranks = one_plan["rounds"]
    assert len(ranks[0]) == ROUNDS
    assert ranks[0] == ranks[1]
