"""The calibration of :class:`~execwrap.cost.checkpoint_overhead.CheckpointOpCost`.

:func:`measure_checkpoint_overhead` times two regions of tiny pre-norm transformer
blocks (1 and 4 blocks of width 32, 2 heads, on 2 x 8 tokens: layer norms,
linears, causal attention, GELU, the op mix of what is checkpointed in practice,
with compute of a few microseconds per op) not
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
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from execwrap.cost.checkpoint_overhead import CheckpointOpCost
from execwrap.util.selective_policy import selective_contexts

__all__ = ["measure_checkpoint_overhead"]

#: Blocks of the two timed regions; the batch, tokens, width and heads of their activations.
_SHORT, _LONG, _BATCH, _TOKENS, _WIDTH, _HEADS = 1, 4, 2, 8, 32, 2


class _Block(nn.Module):
    """A tiny pre-norm transformer block (layer norms, bias-free linears, causal
    ``scaled_dot_product_attention``, GELU): the op mix of what is checkpointed in
    practice, on tensors small enough that their compute is a few microseconds."""

    def __init__(self, dev: torch.device) -> None:
        super().__init__()
        d = _WIDTH
        self.ln1, self.ln2 = nn.LayerNorm(d, device=dev), nn.LayerNorm(d, device=dev)
        self.qkv = nn.Linear(d, 3 * d, bias=False, device=dev)
        self.proj = nn.Linear(d, d, bias=False, device=dev)
        self.fc = nn.Linear(d, 4 * d, bias=False, device=dev)
        self.out = nn.Linear(4 * d, d, bias=False, device=dev)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            h.view(b, t, _HEADS, d // _HEADS).transpose(1, 2)
            for h in self.qkv(self.ln1(x)).split(d, dim=-1)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class _Region(nn.Sequential):
    """``blocks`` :class:`_Block` in a row: one checkpointed region."""

    def __init__(self, dev: torch.device, blocks: int) -> None:
        super().__init__(*(_Block(dev) for _ in range(blocks)))


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
    """Time regions of :data:`_SHORT` and :data:`_LONG` blocks (module docstring) without
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
    dev: torch.device, blocks: int, rounds: int, warmup: int
) -> dict[str, tuple[int, float]]:
    """For a region of ``blocks`` blocks: ``{"full_forward": (ops, seconds added), ...}``
    for both modes and phases (the recomputation less the forward it repeats)."""
    from torch.utils.checkpoint import checkpoint, noop_context_fn

    region = _Region(dev, blocks)
    x = torch.randn(_BATCH, _TOKENS, _WIDTH, device=dev, requires_grad=True)
    with _CountOps() as counter:
        region(x)
    ops = counter.ops
    kept = _kept_ops(region, x)

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


def _kept_ops(region: nn.Module, x: torch.Tensor) -> int:
    """The ops of one forward of ``region`` whose outputs the selective policy keeps."""
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    from execwrap.util.selective_policy import selective_checkpoint_policy

    kept = [0]
    policy = selective_checkpoint_policy()

    def counting(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        decision = policy(ctx, func, *args, **kwargs)
        if not ctx.is_recompute and decision == CheckpointPolicy.MUST_SAVE:
            kept[0] += 1
        return decision

    def contexts() -> Any:
        return create_selective_checkpoint_contexts(counting)

    checkpoint(region, x, use_reentrant=False, context_fn=contexts)
    return kept[0]


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
