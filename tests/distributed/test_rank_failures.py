"""A rank that fails during capture, the cross-rank check or planning is named on every rank.

One spawn of 2 gloo ranks runs every case in turn (a case that fails leaves the
process group healthy: both ranks took part in the status exchange). In each
case rank 1 fails and rank 0 does not; each rank returns what it raised. The
process group's timeout is 30 s, so a rank left waiting in a collective would
raise gloo's timeout error, not the :class:`~execwrap.RankFailure` the tests
expect: the other rank is told within 30 s by construction (no wall time is
measured).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from execwrap import (
    ModuleWrapPolicy,
    ParamExecOrderWrapPolicy,
    apply_fully_shard,
    check_order_across_ranks,
    plan_wrap,
)
from tests._dist import run_ranks
from tests.execwrap.autoplan_cases import cost_model
from tracing import record_execution_order

pytestmark = pytest.mark.timeout(240)


class Block(nn.Module):
    """A linear block that raises in forward when ``broken``."""

    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.broken = broken
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.broken:
            raise ValueError("block 1 broke on rank 1")
        return torch.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self, broken: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block(broken), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _outcome(fn: Callable[[], Any]) -> tuple[str, str, list[str]]:
    """``(exception type, message, notes)`` of what ``fn`` raised, or ``("ok", "", [])``."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned to the test
        return type(e).__name__, str(e), list(getattr(e, "__notes__", []))
    return "ok", "", []


def _capture(rank: int) -> tuple[str, str, list[str]]:
    torch.manual_seed(0)
    model = Net(broken=rank == 1)
    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}), example_inputs=torch.ones(2, 8))
    return _outcome(lambda: apply_fully_shard(model, policy))


def _rank_check(rank: int) -> tuple[str, str, list[str]]:
    torch.manual_seed(0)
    model = Net()
    order = record_execution_order(model, torch.ones(2, 8))
    if rank == 1:  # a lazy module never run on this rank: its parameter has no size yet
        model.blocks[1].fc = nn.LazyLinear(8)
    return _outcome(lambda: check_order_across_ranks(order, model=model))


def _planning_policy(rank: int) -> tuple[str, str, list[str]]:
    torch.manual_seed(0)
    model = Net()

    def init_policy(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
        if rank == 1 and isinstance(module, Block):
            raise ValueError("the policy broke on rank 1")
        return recurse or isinstance(module, Block)

    policy = ParamExecOrderWrapPolicy(init_policy, example_inputs=torch.ones(2, 8))
    return _outcome(lambda: apply_fully_shard(model, policy))


def _planning_auto(rank: int) -> tuple[str, str, list[str]]:
    torch.manual_seed(0)
    model = Net()
    order = record_execution_order(model, torch.ones(2, 8))
    cost = cost_model(world_size=2)
    budget = 1_000 if rank == 1 else None  # rank 1's budget fits no plan
    return _outcome(
        lambda: plan_wrap(
            model,
            order,
            ModuleWrapPolicy({Block}),
            bucket_numel="auto",
            cost_model=cost,
            memory_budget=budget,
        )
    )


def _checks_before_sharding(rank: int) -> tuple[str, str, list[str]]:
    torch.manual_seed(0)
    model = Net()
    order = record_execution_order(model, torch.ones(2, 8))
    plan = plan_wrap(model, order, ModuleWrapPolicy({Block}))
    if rank == 1:  # another model on rank 1: the plan names a module it lacks
        model.blocks[2] = nn.Linear(8, 8)
        del model.blocks[2]
    return _outcome(lambda: apply_fully_shard(model, plan))


CASES = {
    "capture": _capture,
    "rank check": _rank_check,
    "planning (policy)": _planning_policy,
    "planning (auto)": _planning_auto,
    "checks before sharding": _checks_before_sharding,
}


def _worker(rank: int, world_size: int) -> dict[str, tuple[str, str, list[str]]]:
    out = {}
    for name, case in CASES.items():
        out[name] = case(rank)
        dist.barrier()  # the group is still healthy after each case
    return out


@pytest.fixture(scope="module")
def outcomes() -> list[dict[str, tuple[str, str, list[str]]]]:
    return run_ranks(_worker, world_size=2, timeout_s=30)


def test_capture_failure_is_named_on_the_other_rank(outcomes: list[Any]) -> None:
    kind, message, _ = outcomes[0]["capture"]
    assert kind == "RankFailure"
    assert message.startswith(
        "rank 1 failed during capture (ParamExecOrderWrapPolicy): ValueError: block 1 broke "
        "on rank 1. This rank (0) stops too: every rank takes this step together"
    )
    kind, message, notes = outcomes[1]["capture"]
    assert (kind, message) == ("ValueError", "block 1 broke on rank 1")
    assert notes == [
        "While recording the execution order, in module 'blocks.1' (Block)",
        "execwrap: rank 1 failed during capture (ParamExecOrderWrapPolicy); every rank of the "
        "process group was told and stops too",
    ]


def test_rank_check_failure_is_named_on_the_other_rank(outcomes: list[Any]) -> None:
    kind, message, _ = outcomes[0]["rank check"]
    assert kind == "RankFailure"
    assert message.startswith(
        "rank 1 failed during the cross-rank order check (building its order digest and "
        "parameter table): ValueError: Attempted to use an uninitialized parameter in "
        "<method 'numel' of 'torch._C.TensorBase' objects>."
    )
    assert outcomes[1]["rank check"][0] == "ValueError"


def test_planning_failure_is_named_on_the_other_rank(outcomes: list[Any]) -> None:
    kind, message, _ = outcomes[0]["planning (policy)"]
    assert kind == "RankFailure"
    assert message.startswith(
        "rank 1 failed during planning: ValueError: the policy broke on rank 1. This rank (0)"
    )
    assert outcomes[1]["planning (policy)"][:2] == ("ValueError", "the policy broke on rank 1")
    kind, message, _ = outcomes[0]["planning (auto)"]
    assert kind == "RankFailure"
    assert message.startswith("rank 1 failed during planning: MemoryBudgetError: ")
    assert outcomes[1]["planning (auto)"][0] == "MemoryBudgetError"


def test_failure_in_the_checks_before_sharding_is_named(outcomes: list[Any]) -> None:
    kind, message, _ = outcomes[0]["checks before sharding"]
    assert kind == "RankFailure"
    assert message.startswith(
        "rank 1 failed during apply_fully_shard: the checks before sharding: ValueError: "
        "apply_fully_shard: the plan (policy ModuleWrapPolicy({Block}), 4 groups) was planned "
        "for another model than the Net it is applied to, so nothing was wrapped: the order's "
        "parameters do not match those of Net: 2 parameters differ (in the order but not in "
        "the model: 'blocks.2.fc.weight', 'blocks.2.fc.bias')"
    )
    assert outcomes[1]["checks before sharding"][0] == "ValueError"


def _leaves(rank: int, folder: str) -> None:
    """Rank 1's process ends inside a step; rank 0 writes what it raised."""
    import datetime
    import os
    from pathlib import Path

    from execwrap.distributed.status import fail_together

    dist.init_process_group(
        "gloo",
        init_method=f"file://{folder}/rendezvous",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        with fail_together("capture"):
            if rank == 1:
                os._exit(0)  # the process ends without a word (exit 0: spawn keeps rank 0)
    except Exception as e:  # noqa: BLE001 - written for the test
        Path(folder, "rank0.txt").write_text(f"{type(e).__name__}: {e}")
    os._exit(0)


def test_a_rank_whose_process_ends_is_reported_as_gone(tmp_path: Any) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_leaves, args=(str(tmp_path),), nprocs=2, join=True)
    text = (tmp_path / "rank0.txt").read_text()
    assert text.startswith("RankFailure: the ranks' status exchange after capture failed (")
    assert text.endswith(
        "): a rank left the job before reporting (its process ended, or it failed outside "
        "execwrap). Look for the first failure in the other ranks' output"
    )
