"""The FSDP2 stacks' rounds under steal, on 2 spawned gloo ranks: more rounds while the
host interrupts them, the same rounds on every rank, medians over the clean runs.

The host's steal cannot be made on demand, so each rank reads a scripted counter in
place of ``/proc/stat`` (``execwrap.cost.fixed_costs.disturbance_reading``: steal, no
other processes); the rounds, the barriers and the all-reduce that shares the readings
are real.
"""

from __future__ import annotations

from typing import Any

from tests._dist import run_ranks


def _rounds(rank: int, world_size: int, dirty_calls: tuple[int, ...]) -> dict[str, Any]:
    import torch

    import execwrap.cost.fixed_costs as fixed_costs

    counter = {"steal": 0.0}
    fixed_costs.disturbance_reading = lambda: (counter["steal"], 0.0)  # type: ignore[assignment]
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


def test_rounds_go_on_while_half_are_clean_and_at_most_twice() -> None:
    # b is interrupted in every other run: at each round at least half of b's runs so
    # far were clean, so rounds go on until b has 4 clean runs (0, 2, 4, 6): 7 rounds
    results = run_ranks(_rounds, world_size=2, args=((1, 3, 5, 7),), timeout_s=60)
    assert results[0] == results[1] == {"medians": {"a": (3.0,), "b": (3.0,)}, "rounds": 7}


def test_a_machine_that_stays_busy_gets_no_more_rounds() -> None:
    # b is interrupted in all but run 0: after 4 rounds 1 of 4 was clean, fewer than
    # half, so more rounds would not help: 4 rounds, and b's median is over all of them
    busy = tuple(range(1, 8))
    results = run_ranks(_rounds, world_size=2, args=(busy,), timeout_s=60)
    assert results[0] == results[1] == {"medians": {"a": (1.5,), "b": (1.5,)}, "rounds": 4}
