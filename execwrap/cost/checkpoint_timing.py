"""The calibration of :class:`~execwrap.cost.checkpoint_overhead.CheckpointOpCost`.

:func:`measure_checkpoint_overhead` times two regions of tiny ops (2 and 16
layers of ``tanh(x @ w) * 0.5 + x`` on a 16 x 32 float32 activation) not
checkpointed, fully and selectively checkpointed (``torch.utils.checkpoint``,
non-reentrant, with :func:`~execwrap.util.selective_policy.selective_contexts`
for selective), forward and backward apart, in interleaved rounds (medians), and
fits what each mode adds as a cost per region call plus a cost per op its
forward dispatches (ops counted as the capture counts them, views included).
The recomputation's extra is its backward's less the forward it repeats.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from execwrap.cost.checkpoint_overhead import CheckpointOpCost
from execwrap.util.selective_policy import selective_contexts

__all__ = ["measure_checkpoint_overhead"]

#: Layers of the two timed regions, and the rows and width of their activations.
_SHORT, _LONG, _ROWS, _WIDTH = 2, 16, 16, 32


class _Region(nn.Module):
    """``layers`` layers of ``tanh(x @ w) * 0.5 + x``: tiny ops, parameters like a block's."""

    def __init__(self, dev: torch.device, layers: int) -> None:
        super().__init__()
        self.weights = nn.ParameterList(
            nn.Parameter(torch.randn(_WIDTH, _WIDTH, device=dev) / _WIDTH**0.5)
            for _ in range(layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for w in self.weights:
            x = torch.tanh(torch.mm(x, w)) * 0.5 + x
        return x


class _CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched, views included (as the capture counts them)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def measure_checkpoint_overhead(
    dev: torch.device, *, rounds: int = 31, warmup: int = 3
) -> CheckpointOpCost:
    """Time regions of :data:`_SHORT` and :data:`_LONG` layers (module docstring) without
    checkpointing, fully and selectively checkpointed, and fit what each mode adds: the
    slope over the two regions' op counts (per op) and the rest of the short one's
    (per region).

    Args:
        dev: the device (the regions and their input are made there, and freed after).
        rounds: interleaved rounds timed (medians over them), after ``warmup`` more.

    Returns:
        The :class:`CheckpointOpCost` measured (each field clamped at 0).
    """
    short = _extra(dev, _SHORT, rounds, warmup)
    long = _extra(dev, _LONG, rounds, warmup)
    out: dict[str, float] = {}
    for key, (ops_short, added_short) in short.items():
        ops_long, added_long = long[key]
        per_op = max(0.0, (added_long - added_short) / (ops_long - ops_short))
        out[f"{key}_op_s"] = per_op
        out[f"{key}_region_s"] = max(0.0, added_short - per_op * ops_short)
    return CheckpointOpCost(**out)


def _extra(
    dev: torch.device, layers: int, rounds: int, warmup: int
) -> dict[str, tuple[int, float]]:
    """For a region of ``layers`` layers: ``{"full_forward": (ops, seconds added), ...}``
    for both modes and phases (the recomputation less the forward it repeats)."""
    from torch.utils.checkpoint import checkpoint, noop_context_fn

    region = _Region(dev, layers)
    x = torch.randn(_ROWS, _WIDTH, device=dev, requires_grad=True)
    with _CountOps() as counter:
        region(x)
    ops = counter.ops
    kept = layers - layers // 2  # the policy keeps the 1st, 3rd, ... mm of the region

    def run(mode: str) -> Callable[[], torch.Tensor]:
        if mode == "none":
            return lambda: region(x)
        context = selective_contexts if mode == "selective" else noop_context_fn
        return lambda: checkpoint(region, x, use_reentrant=False, context_fn=context)

    modes = ("none", "full", "selective")
    runs = {m: run(m) for m in modes}
    forward: dict[str, list[float]] = {m: [] for m in modes}
    backward: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(warmup + rounds):
        for m in modes:
            f, b = _timed_step(runs[m], region, x, dev)
            if r >= warmup:
                forward[m].append(f)
                backward[m].append(b)
    fwd = {m: statistics.median(v) for m, v in forward.items()}
    bwd = {m: statistics.median(v) for m, v in backward.items()}
    again = {"full": fwd["none"], "selective": fwd["none"] * (ops - kept) / ops}
    return {
        f"{m}_{phase}": (ops, added)
        for m in ("full", "selective")
        for phase, added in (
            ("forward", fwd[m] - fwd["none"]),
            ("recompute", bwd[m] - bwd["none"] - again[m]),
        )
    }


def _timed_step(
    forward: Callable[[], torch.Tensor], region: nn.Module, x: torch.Tensor, dev: torch.device
) -> tuple[float, float]:
    """Seconds of one forward and of its backward (the device synchronised around each)."""
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    x.grad = None
    region.zero_grad(set_to_none=True)
    sync()
    t0 = time.perf_counter()
    out = forward()
    sync()
    t1 = time.perf_counter()
    out.sum().backward()
    sync()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1
