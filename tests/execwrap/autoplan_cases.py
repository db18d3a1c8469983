"""Small instances for the auto-planner tests, and a brute force to check it against.

An instance is a chain of bias-free ``nn.Linear`` layers (one unit each under
``ModuleWrapPolicy({nn.Linear})``; the root holds no parameter), a
hand-made :class:`~execwrap.simulate.UnitCompute` and a hand-made
:class:`~execwrap.cost.CostModel` with one alpha-beta segment per collective.
:func:`brute_force` simulates every contiguous grouping of the layers with
every prefetch depth and every ``reshard_after_forward`` vector, building the
plans itself (``merge_units``, ``UnitCompute.merge``) and calling
``simulate_step`` directly, so it shares nothing with the search but the
simulator.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch.nn as nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap import WrapPlan, plan_wrap
from execwrap.cost import CollectiveCurve, ComputeRates, CostModel, CurveSegment
from execwrap.planning.bucketing import merge_units
from execwrap.simulate import StepEstimate, UnitCompute, simulate_step
from tracing import trace_execution_order

__all__ = ["Outcome", "atomic_plan", "brute_force", "cost_model", "groupings", "unit_compute"]


def cost_model(
    *,
    latency: float = 1e-3,
    per_byte: float = 0.0,
    overhead: float = 1e-4,
    param_overhead: float = 0.0,
    overlap: float = 0.0,
    device: str = "cpu",
    world_size: int = 2,
    copy_bytes_per_s: float = 1.024e6,
    sync_jitter: float = 0.0,
) -> CostModel:
    """One alpha-beta segment for both collectives, fixed costs per collective
    (``overhead``, plus ``param_overhead`` per parameter tensor), the wait for
    the slowest rank (``sync_jitter``); compute rates that do not matter (the
    tests pass compute)."""
    seg = (CurveSegment(None, latency, per_byte),)
    return CostModel(
        device_type=device,
        backend="gloo" if device == "cpu" else "nccl",
        world_size=world_size,
        all_gather=CollectiveCurve(seg),
        reduce_scatter=CollectiveCurve(seg),
        copy_bytes_per_s=copy_bytes_per_s,
        group_overhead_s=overhead,
        param_overhead_s=param_overhead,
        overlap=overlap,
        sync_jitter=sync_jitter,
        compute=ComputeRates(device, flops_per_s=1e12, memory_bytes_per_s=1e12),
        source="test",
        created="2026-12-01T00:00:00",
    )


def atomic_plan(widths: Sequence[int]) -> WrapPlan:
    """The per-layer plan of ``Linear(w[0], w[1]) -> Linear(w[1], w[2]) -> ...``."""
    layers = [nn.Linear(a, b, bias=False) for a, b in itertools.pairwise(widths)]
    model = nn.Sequential(*layers)
    return plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({nn.Linear}))


def unit_compute(
    forward: Sequence[float], backward: Sequence[float], activations: Sequence[int]
) -> UnitCompute:
    """Compute of the atomic plan: the root (nothing) then one entry per layer;
    no optimizer time (``optimizer_s=0``)."""
    return UnitCompute(
        forward_s=(0.0, *forward),
        backward_s=(0.0, *backward),
        activation_bytes=(0, *activations),
        optimizer_s=0.0,
    )


def groupings(n: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Every cut of ``range(n)`` into consecutive intervals (one empty cut for 0)."""
    if n == 0:
        yield ()
        return
    for cuts in itertools.product((False, True), repeat=max(n - 1, 0)):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        yield tuple(itertools.pairwise(bounds))


class Outcome(NamedTuple):
    """One brute-force candidate."""

    groups: tuple[tuple[int, int], ...]
    prefetch: int
    flags: tuple[bool, ...]
    estimate: StepEstimate


def brute_force(
    plan: WrapPlan, cm: CostModel, compute: UnitCompute, *, world_size: int = 2
) -> list[Outcome]:
    """Every grouping of the layers x prefetch 0-2 x every reshard vector, simulated."""
    root = plan.units[0]
    layers = plan.units[1:]
    out = []
    for groups in groupings(len(layers)):
        units = [root] + [merge_units(layers[i:j]) for i, j in groups]
        candidate = dataclasses.replace(plan, units=units, bucket_numel=None)
        merged = compute.merge([[0]] + [list(range(i + 1, j + 1)) for i, j in groups])
        for flags in itertools.product((True, False), repeat=len(groups)):
            for prefetch in (0, 1, 2):
                estimate = simulate_step(
                    candidate,
                    cm,
                    world_size=world_size,
                    prefetch=prefetch,
                    reshard_after_forward=(False, *flags),
                    compute=merged,
                )
                out.append(Outcome(groups, prefetch, flags, estimate))
    return out
