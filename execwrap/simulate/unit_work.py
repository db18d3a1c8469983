"""Per plan unit, the work and memory of one micro-batch under its checkpointing mode.

:class:`UnitWork` turns a :class:`~execwrap.simulate.compute.UnitCompute` and
each unit's activation-checkpointing mode
(:meth:`~execwrap.TrainingStep.checkpoint_modes`) into what
the step program (:class:`~execwrap.simulate.schedule.StepProgram`) schedules:

* ``"none"``: the unit keeps what its ops save, from its forward to the end of
  its backward;
* ``"full"``: it keeps its regions' inputs; before its backward its forward
  runs again (the unit's forward seconds), making again the rest of what it
  saves, which lives until its backward ends;
* ``"selective"``: it keeps its regions' inputs and the outputs of the ops
  the policy saves; the rest of its forward runs again (the forward seconds
  less those ops').

A checkpointed unit's forward and its recomputation also pay checkpointing's
host work, per region call and per op (:class:`~execwrap.cost.CheckpointOpCost`
of the cost model, with the unit's
:attr:`~execwrap.simulate.UnitCompute.checkpoint_ops` and ``checkpoint_regions``).

A recomputation has the transient memory of the forward it repeats; the
backward has its own (:attr:`~execwrap.simulate.compute.UnitCompute.backward_transient_bytes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from execwrap.cost.checkpoint_overhead import CheckpointOpCost
from execwrap.simulate.compute import UnitCompute

__all__ = ["UnitWork", "unit_work"]


@dataclass(frozen=True)
class UnitWork:
    """What the program schedules per unit beyond its compute (see the module docstring).

    Attributes:
        modes: each unit's checkpointing mode.
        activation_bytes: bytes kept from the unit's forward to the end of its backward.
        recompute_s: seconds of forward run again before the unit's backward.
        recompute_bytes: bytes made again by that run, alive until its backward ends.
        forward_transient_bytes: transient bytes while the unit's forward (or its
            recomputation) runs.
        backward_transient_bytes: transient bytes while its backward runs.
        tail_bytes: the part of ``activation_bytes`` made by the unit's forward tail and
            freed by its first backward part (not checkpointed units only; empty: none).
        head_grad_share: the share of the unit's gradients made at the end of its
            backward (:attr:`~execwrap.simulate.UnitCompute.head_grad_share`; empty: none).
        forward_overhead_s: seconds checkpointing adds to the unit's forward (empty:
            none).
    """

    modes: tuple[str, ...]
    activation_bytes: tuple[int, ...]
    recompute_s: tuple[float, ...]
    recompute_bytes: tuple[int, ...]
    forward_transient_bytes: tuple[int, ...]
    backward_transient_bytes: tuple[int, ...]
    tail_bytes: tuple[int, ...] = ()
    head_grad_share: tuple[float, ...] = ()
    forward_overhead_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.modes)
        if not self.forward_overhead_s:
            object.__setattr__(self, "forward_overhead_s", (0.0,) * n)
        if not self.tail_bytes:
            object.__setattr__(self, "tail_bytes", (0,) * n)
        if not self.head_grad_share:
            object.__setattr__(self, "head_grad_share", (0.0,) * n)


def unit_work(
    compute: UnitCompute,
    modes: Sequence[str],
    labels: Sequence[str],
    overhead: CheckpointOpCost | None = None,
) -> UnitWork:
    """The :class:`UnitWork` of ``compute`` with one checkpointing mode per unit.

    Args:
        compute: per-unit compute.
        modes: ``"none"``, ``"full"`` or ``"selective"`` per unit.
        labels: the units' labels (for messages).
        overhead: checkpointing's host work (``None``: none).

    Raises:
        ValueError: a unit is checkpointed but ``compute`` does not say what the mode
            keeps (an order captured without estimated timing, or a hand-built
            ``UnitCompute`` without ``checkpoint_bytes`` / ``selective_bytes``).

    Example:
        >>> c = UnitCompute((1.0, 2.0), (2.0, 4.0), (0, 100), checkpoint_bytes=(0, 10),
        ...                 selective_bytes=(0, 40), selective_saved_s=(0.0, 0.5))
        >>> w = unit_work(c, ["none", "selective"], ["<root>", "b"])
        >>> w.activation_bytes, w.recompute_s, w.recompute_bytes
        ((0, 40), (0.0, 1.5), (0, 60))
    """
    overhead = overhead or CheckpointOpCost()
    kept, again_s, again_bytes, extra_s = [], [], [], []
    for u, mode in enumerate(modes):
        saved = compute.activation_bytes[u]
        if mode == "none":
            kept.append(saved)
            again_s.append(0.0)
            again_bytes.append(0)
            extra_s.append(0.0)
            continue
        table = compute.checkpoint_bytes if mode == "full" else compute.selective_bytes
        if not table or (mode == "selective" and not compute.selective_saved_s):
            raise ValueError(
                f"simulate_step: unit {labels[u]!r} is checkpointed ({mode!r}) but the compute "
                "does not say what that keeps: capture the order on the target's rates "
                "(tracing.record_execution_order(model, *inputs, timing=cost_model.compute), "
                "which records each call's inputs and matmul outputs), or pass "
                "compute=UnitCompute(..., checkpoint_bytes=..., selective_bytes=..., "
                "selective_saved_s=...)"
            )
        keep = int(table[u])
        kept.append(keep)
        again_bytes.append(max(0, saved - keep))
        forward = compute.forward_s[u]
        if mode == "selective":
            forward = max(0.0, forward - compute.selective_saved_s[u])
        ops, regions = compute.checkpoint_ops[u], compute.checkpoint_regions[u]
        again_s.append(forward + overhead.recompute_s(mode, ops=ops, regions=regions))
        extra_s.append(overhead.forward_s(mode, ops=ops, regions=regions))
    return UnitWork(
        modes=tuple(modes),
        activation_bytes=tuple(kept),
        recompute_s=tuple(again_s),
        recompute_bytes=tuple(again_bytes),
        forward_transient_bytes=tuple(compute.forward_transient_bytes),
        backward_transient_bytes=tuple(compute.backward_transient_bytes),
        tail_bytes=tuple(
            t if m == "none" else 0
            for t, m in zip(compute.activation_tail_bytes, modes, strict=True)
        ),
        head_grad_share=tuple(compute.head_grad_share),
        forward_overhead_s=tuple(extra_s),
    )
