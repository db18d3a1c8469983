"""Activation checkpointing's host work per op: what it adds beyond the compute it repeats.

``torch.utils.checkpoint`` (non-reentrant, as :mod:`execwrap.fsdp.checkpointing`
applies it) costs more than the forward it runs again:

* full checkpointing packs every tensor the region's ops save into a holder
  (a saved-tensor hook) in forward, and in backward unpacks them, runs the
  forward again under other hooks and hands the recomputed tensors over;
* selective checkpointing also runs the region's forward, and its
  recomputation, under a ``TorchDispatchMode`` that asks the policy
  (:func:`~execwrap.util.selective_policy.selective_checkpoint_policy`) about
  every op, keeps the outputs it must save and returns them when recomputed.

Both are Python work per op, and each region call sets up its hooks and modes
once: :class:`CheckpointOpCost` prices a cost per region call plus a cost per op
the region's forward dispatches (counted as the capture counts them,
:attr:`tracing.ExecutionOrder.forward_op_counts`), in forward and in the
recomputation (beyond the recomputed ops' own time). Calibration measures it
(:mod:`execwrap.cost.checkpoint_timing`).

Measured on this project's 2-core CPU (2026-12-05, one thread, regions of tiny
transformer blocks): selective checkpointing added 31 us per op and 450-480 us
per region call in forward, 31-32 us per op and 170-220 us per region in
recomputation; full checkpointing 5.5 us per op and 76-89 us per region in
forward, 9-10 us per op and 93-133 us per region in recomputation. A block of
:mod:`execwrap.demo_models` dispatches about 30 ops, so selective
checkpointing costs it about 1.5 ms in forward and 1 ms in backward, as much as
its compute at small sizes. On a GPU this work runs on the host while the
device computes, ahead of the kernels, hidden unless the step is host-bound:
the presets carry none (``CheckpointOpCost()``); a model calibrated on a GPU
measures it with the device synchronised, which over-counts it there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

__all__ = ["CheckpointOpCost"]


@dataclass(frozen=True)
class CheckpointOpCost:
    """Seconds activation checkpointing adds to a checkpointed region: a fixed cost per
    region call and a cost per aten op its forward dispatches, in forward and in the
    recomputation (beyond the recomputed ops' own time).

    Attributes:
        full_forward_op_s, full_forward_region_s: full checkpointing, forward.
        full_recompute_op_s, full_recompute_region_s: full checkpointing, backward.
        selective_forward_op_s, selective_forward_region_s: selective, forward.
        selective_recompute_op_s, selective_recompute_region_s: selective, backward.

    Example:
        >>> cost = CheckpointOpCost(selective_forward_op_s=3e-5, selective_forward_region_s=3e-4)
        >>> round(cost.forward_s("selective", ops=30, regions=1) * 1e3, 3)
        1.2
        >>> cost.recompute_s("none", ops=30, regions=1)
        0.0
    """

    full_forward_op_s: float = 0.0
    full_forward_region_s: float = 0.0
    full_recompute_op_s: float = 0.0
    full_recompute_region_s: float = 0.0
    selective_forward_op_s: float = 0.0
    selective_forward_region_s: float = 0.0
    selective_recompute_op_s: float = 0.0
    selective_recompute_region_s: float = 0.0

    def __post_init__(self) -> None:
        for name, value in self.to_dict().items():
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"CheckpointOpCost.{name} must be seconds >= 0, got {value!r}")

    def forward_s(self, mode: str, *, ops: int, regions: int) -> float:
        """Seconds added to the forward of ``regions`` region calls dispatching ``ops``
        ops in all under ``mode`` (``"none"``, ``"full"`` or ``"selective"``)."""
        return self._seconds(mode, "forward", ops, regions)

    def recompute_s(self, mode: str, *, ops: int, regions: int) -> float:
        """Seconds added to their recomputation in backward under ``mode``."""
        return self._seconds(mode, "recompute", ops, regions)

    def _seconds(self, mode: str, phase: str, ops: int, regions: int) -> float:
        if mode not in ("full", "selective"):
            return 0.0
        per_op = getattr(self, f"{mode}_{phase}_op_s")
        per_region = getattr(self, f"{mode}_{phase}_region_s")
        return float(per_op * ops + per_region * regions)

    @property
    def is_zero(self) -> bool:
        """Whether no mode adds anything (presets, models saved before it was measured)."""
        return not any(self.to_dict().values())

    def to_dict(self) -> dict[str, float]:
        """JSON-ready dict of the eight fields."""
        return {f.name: getattr(self, f.name) for f in fields(self)}
