"""The FSDP2 stacks' rounds under steal, on 2 spawned gloo ranks: more rounds while the
host interrupts them, the same rounds on every rank, medians over the clean runs.

The host's steal cannot be made on demand, so each rank reads a scripted counter in
place of ``/proc/stat`` (``execwrap.cost.fixed_costs.steal_seconds``); the rounds, the
barriers and the all-reduce that shares the readings are real.
"""

from __future__ import annotations

from typing import Any

from tests._dist import run_ranks


def _rounds(rank: int, world_size: int, dirty_calls: tuple[int, ...]) -> dict[str, Any]:
    import torch

    import execwrap.cost.fixed_costs as fixed_costs

    counter = {"steal": 0.0}
    fixed_costs.steal_seconds = lambda: counter["steal"]  # type: ignore[assignment]
    calls = {"a": 0, "b": 0}

    def run(name: str) -> tuple[float, ...]:
        index = calls[name]
        calls[name] += 1
        if name == "b" and rank == 1 and index in dirty_calls:  # only rank 1's host steals
            counter["steal"] += 0.01
        return (float(index),)

    fns = {"a": lambda: run("a"), "b": lambda: run("b")}
    got = fixed_costs.interleaved_medians(fns, torch.device("cpu"), None, rounds=4)
    return {"medians": got, "rounds": calls["a"]}


def test_rounds_are_added_until_every_stack_has_enough_clean_runs() -> None:
    # b's first two runs are interrupted (on rank 1): rounds go on until b has 4 clean
    # runs (6 rounds); a's median is over all its runs 0..5, b's over its clean runs 2..5
    results = run_ranks(_rounds, world_size=2, args=((0, 1),), timeout_s=60)
    assert results[0] == results[1] == {"medians": {"a": (2.5,), "b": (3.5,)}, "rounds": 6}


def test_at_most_twice_the_rounds_then_the_clean_half_or_all() -> None:
    # b is interrupted in all but runs 0 and 5: 8 rounds (twice 4) and 2 clean runs, half
    # of the 4 asked for, so b's median is over runs 0 and 5
    clean_two = tuple(i for i in range(8) if i not in (0, 5))
    results = run_ranks(_rounds, world_size=2, args=(clean_two,), timeout_s=60)
    assert results[0] == results[1] == {"medians": {"a": (3.5,), "b": (2.5,)}, "rounds": 8}
    # one clean run only: fewer than half of 4, so b's median is over all 8 runs
    clean_one = tuple(range(1, 8))
    results = run_ranks(_rounds, world_size=2, args=(clean_one,), timeout_s=60)
    assert results[0]["medians"] == {"a": (3.5,), "b": (3.5,)}
