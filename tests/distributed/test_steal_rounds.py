"""The FSDP2 stacks' rounds under steal, on 2 spawned gloo ranks: more rounds while the
host interrupts them, the same rounds on every rank, medians over the clean runs.

The host's steal cannot be made on demand, so each rank reads a scripted counter in
place of ``/proc/stat`` (``execwrap.cost.fixed_costs.disturbance_reading``: steal, no
other processes); the rounds, the barriers and the all-reduce that shares the readings
are real. One spawn of 2 ranks runs the three scripts in turn (each with its own counter).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests._dist import run_ranks

#: Which of stack b's runs rank 1's host interrupts, per test.
SCRIPTS = {
    "first two": (0, 1),
    "every other": (1, 3, 5, 7),
    "busy": tuple(range(1, 8)),  # all but run 0
}


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


def _scripts(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    return {name: _rounds(rank, world_size, dirty) for name, dirty in SCRIPTS.items()}


@pytest.fixture(scope="module")
def rounds() -> dict[str, list[dict[str, Any]]]:
    """Script -> ``[rank 0's result, rank 1's]``, from one spawn of 2 ranks."""
    results = run_ranks(_scripts, world_size=2, timeout_s=60)
    return {name: [r[name] for r in results] for name in SCRIPTS}


def test_rounds_are_added_until_every_stack_has_enough_clean_runs(
    rounds: dict[str, list[dict[str, Any]]],
) -> None:
    # b's first two runs are interrupted (on rank 1): rounds go on until b has 4 clean
    # runs (6 rounds); a's median is over all its runs 0..5, b's over its clean runs 2..5
    results = rounds["first two"]
    assert results[0] == results[1] == {"medians": {"a": (2.5,), "b": (3.5,)}, "rounds": 6}


def test_rounds_go_on_while_half_are_clean_and_at_most_twice(
    rounds: dict[str, list[dict[str, Any]]],
) -> None:
    # b is interrupted in every other run: at each round at least half of b's runs so
    # far were clean, so rounds go on until b has 4 clean runs (0, 2, 4, 6): 7 rounds
    results = rounds["every other"]
    assert results[0] == results[1] == {"medians": {"a": (3.0,), "b": (3.0,)}, "rounds": 7}


def test_a_machine_that_stays_busy_gets_no_more_rounds(
    rounds: dict[str, list[dict[str, Any]]],
) -> None:
    # b is interrupted in all but run 0: after 4 rounds 1 of 4 was clean, fewer than
    # half, so more rounds would not help: 4 rounds, and b's median is over all of them
    results = rounds["busy"]
    assert results[0] == results[1] == {"medians": {"a": (1.5,), "b": (1.5,)}, "rounds": 4}
