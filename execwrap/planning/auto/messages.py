"""What the auto-planner says when nothing fits: :func:`nothing_fits`, and its names for memory.

:class:`~execwrap.errors.MemoryBudgetError` names the smallest peak any candidate
reached (the memory-leanest plan the search knows: per-unit groups at prefetch 0,
resharding everywhere, every unit it may checkpoint fully checkpointed, CPU offload
where the device has host memory to offload to and the planner chooses it), the part
of the memory breakdown that dominates it, and how to shrink that part; when the
activations dominate even with full checkpointing of every unit, what is left is the
activations of one micro-batch: a shorter sequence or a smaller micro-batch.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from execwrap.errors import MemoryBudgetError
from execwrap.util.formatting import format_bytes

if TYPE_CHECKING:
    from execwrap.cost import CostModel
    from execwrap.plan.search_record import Candidate
    from execwrap.simulate import StepEstimate

__all__ = ["cost_model_line", "dominant_hint", "dominant_part", "nothing_fits"]

_FINER = "wrap smaller modules (a finer init_policy) so less is unsharded at once"

#: What each part of a memory breakdown (``MemoryBreakdown`` field) is called in
#: messages, and how to shrink it.
_PART_HINTS: dict[str, tuple[str, str]] = {
    "sharded_params": ("sharded parameters", "add ranks or use a lower-precision dtype"),
    "sharded_grads": ("sharded gradients", "add ranks or freeze parameters"),
    "optimizer_state": (
        "optimizer state",
        'add ranks, or plan for an optimizer with less state (optimizer="sgd" or '
        '"sgd_momentum", if you train with one)',
    ),
    "unsharded_params": ("unsharded parameters", _FINER),
    "unsharded_grads": ("unsharded gradients", _FINER),
    "activations": ("activations", "use a smaller batch or sequence, or activation checkpointing"),
    "all_gather_buffers": ("all-gather buffers", _FINER),
    "reduce_scatter_buffers": ("reduce-scatter buffers", _FINER),
    "temporaries": ("transient memory", "use a smaller batch or sequence"),
}
#: The remedy once every unit that may be checkpointed is fully checkpointed.
_ONE_MICRO_BATCH = "lower the sequence length or the micro-batch"


def cost_model_line(cm: CostModel) -> str:
    """One line naming the cost model."""
    name = cm.source or "unnamed"
    return f"{name} ({cm.device_type}, {cm.backend}, {cm.world_size} rank(s))"


def dominant_part(estimate: StepEstimate) -> tuple[str, int]:
    """The largest part of ``estimate``'s memory breakdown: ``(name, bytes)``."""
    parts = _memory_parts(estimate)
    key = max(parts, key=lambda k: (parts[k], k))
    return _PART_HINTS.get(key, (key.replace("_", " "), ""))[0], parts[key]


def dominant_hint(part: str) -> str:
    """How to shrink the part named ``part`` (as :func:`dominant_part` names it)."""
    for name, hint in _PART_HINTS.values():
        if name == part:
            return f"to fit, raise the budget, or {hint}"
    return "to fit, raise the budget"


def nothing_fits(
    candidates: list[Candidate],
    estimates: list[StepEstimate],
    budget: int | None,
    world_size: int,
    all_full: bool,
) -> MemoryBudgetError:
    """The :class:`MemoryBudgetError` when no candidate fits ``budget``.

    Args:
        candidates: every candidate simulated, with ``estimates`` (the same order).
        budget: the budget, bytes per rank.
        world_size: ranks planned for.
        all_full: whether the smallest peak's candidate checkpoints fully every unit
            that may be checkpointed (then dominant activations are one micro-batch's).
    """
    smallest = min(range(len(candidates)), key=lambda i: (candidates[i].peak_memory_bytes, i))
    estimate = estimates[smallest]
    part, nbytes = dominant_part(estimate)
    parts = _memory_parts(estimate)
    key = max(parts, key=lambda k: (parts[k], k))  # the field dominant_part named
    where = (
        f"{part} of one micro-batch ({_bytes_text(nbytes)}) even with full checkpointing of "
        "every unit"
        if key == "activations" and all_full
        else f"{part} ({_bytes_text(nbytes)})"
    )
    finding = (
        f"no plan fits the memory budget of {_bytes_text(budget or 0)} per rank: the smallest "
        f"peak any candidate reaches is {_bytes_text(candidates[smallest].peak_memory_bytes)} "
        f"({candidates[smallest].label}; {len(candidates)} candidate(s) simulated for "
        f"{world_size} rank(s)), dominated by {where}"
    )
    hint = (
        f"to fit, raise the budget, or {_ONE_MICRO_BATCH}"
        if key == "activations" and all_full
        else dominant_hint(part)
    )
    return MemoryBudgetError(f"{finding}; {hint}", part=key, finding=finding)


def _memory_parts(estimate: StepEstimate) -> dict[str, int]:
    memory: Any = estimate.memory
    return {f.name: int(getattr(memory, f.name)) for f in dataclasses.fields(memory)}


def _bytes_text(nbytes: int) -> str:
    return f"{format_bytes(nbytes)} ({nbytes} bytes)"
