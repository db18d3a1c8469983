"""The largest micro-batch that fits, from each size's least-memory plan.

Some plan of a micro-batch fits exactly when its least-memory plan fits
(:mod:`execwrap.planning.auto.least`, shared with the joint auto-planner's baselines and
its mesh search): every unit its own group, prefetch 0, every group but the root
resharded after forward, every unit fully checkpointed, and, where the device has host
memory to offload to, CPU offload. Resharding the root too is no plan the planner can
choose, and it is not always less memory: the root is then gathered again in backward,
and that all-gather's buffers can land at the peak (0.44 GB more for a Llama-3.1-8B
with CPU offload).

:func:`largest_fitting` finds the largest size whose least-memory plan is within the
budget with one simulation per size tried (sizes 1 and 2, the size the line through
their peaks reaches the budget at and the next, then doubling and bisecting where the
peaks are not on that line), instead of a full search per size
(:func:`execwrap.largest_micro_batch`, which also returns the fastest plan at that
size). The peak of the least-memory plan only grows with the micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn as nn

from execwrap.cost import CostModel
from execwrap.plan.training_step import TrainingStep
from execwrap.planning.auto.least import (
    LEAST_PREFETCH,
    least_memory_step,
    least_reshard,
    may_offload,
)
from execwrap.planning.planner import plan_wrap_unwatched
from execwrap.simulate.step import step_estimate
from tracing.order import ExecutionOrder

__all__ = ["least_memory_peak", "largest_fitting"]


def least_memory_peak(
    model: nn.Module,
    order: ExecutionOrder,
    init_policy: Any,
    *,
    cost_model: CostModel,
    world_size: int,
    training: TrainingStep,
    optimizer: str = "adamw",
) -> int:
    """Predicted peak bytes per rank of the least-memory plan of ``order`` (module
    docstring): the smaller of the peaks without and, where the device has host
    memory, with CPU offload."""
    plan = plan_wrap_unwatched(model, order, init_policy)
    steps = [least_memory_step(training, cost_model, offload=False)]
    if may_offload(cost_model):
        steps.append(least_memory_step(training, cost_model))
    reshard = least_reshard(plan)
    peaks = [
        int(
            step_estimate(  # no WARNING for trials over the device's memory
                plan,
                cost_model,
                world_size=world_size,
                prefetch=LEAST_PREFETCH,
                reshard_after_forward=reshard,
                optimizer=optimizer,
                training=s,
            ).peak_memory_bytes
        )
        for s in steps
    ]
    return min(peaks)


def largest_fitting(
    peak_of: Callable[[int], int], budget: int, *, max_micro_batch: int = 1024
) -> tuple[int, tuple[tuple[int, int], ...]]:
    """The largest size ``b <= max_micro_batch`` with ``peak_of(b) <= budget``.

    Args:
        peak_of: the least-memory peak (bytes per rank) of a micro-batch size; grows
            with the size.
        budget: bytes per rank.
        max_micro_batch: the largest size tried.

    Returns:
        ``(size, tried)``: the size (0 when not even 1 fits) and each size tried with
        its peak, in the order tried.

    >>> largest_fitting(lambda b: 10 * b, 55)
    (5, ((1, 10), (2, 20), (5, 50), (6, 60)))
    >>> largest_fitting(lambda b: 10 * b + b * b, 200)  # not on the line: bisected
    (10, ((1, 11), (2, 24), (15, 375), (8, 144), (11, 231), (9, 171), (10, 200)))
    """
    tried: list[tuple[int, int]] = []

    def fits(size: int) -> bool:
        peak = peak_of(size)
        tried.append((size, peak))
        return peak <= budget

    if not fits(1):
        return 0, tuple(tried)
    good, bad = 1, None
    if (
        max_micro_batch >= 2
    ):  # peaks grow about linearly: try the size the line through 1 and 2 gives
        if not fits(2):
            return 1, tuple(tried)
        good, slope = 2, tried[1][1] - tried[0][1]
        guess = (
            min(max_micro_batch, 1 + (budget - tried[0][1]) // slope)
            if slope > 0
            else max_micro_batch
        )
        if guess > 2:
            if fits(guess):
                good = guess
                if guess < max_micro_batch and not fits(guess + 1):
                    return guess, tuple(tried)
            else:
                bad = guess
    while bad is None and good < max_micro_batch:
        size = min(2 * good, max_micro_batch)
        if fits(size):
            good = size
        else:
            bad = size
    while bad is not None and bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good, tuple(tried)
