"""Compute per plan unit: forward/backward seconds and saved activations, from the order's timing.

:class:`UnitCompute` is what the step simulator needs to know of the model's
own work: per unit of a plan, the forward and backward compute that runs while
that unit is the innermost active one, the part of it that runs after the
units nested in it (the root's final norm, head and loss in forward; its
embedding backward at the end of backward), and the bytes of activations it
saves for backward. :func:`unit_compute` derives it from a plan's order
(``record_execution_order(..., timing=True)``); tests and the planner build
one directly, and :meth:`UnitCompute.merge` sums atomic units into candidate
groups so that every candidate shares one measurement.

Attribution (from the order's clock, see :mod:`tracing.runtime.timing`):

* forward: the calls' ``[start, start + inclusive time]`` intervals nest; the
  time between two consecutive boundaries belongs to the innermost open call,
  hence to its unit (:meth:`~execwrap.WrapPlan.unit_of_module`). The time
  between the end of the model's forward and the first backward event (the
  loss, forward and backward) goes to the root unit's forward tail;
* backward: calls' backward start times are sorted; the time from one to the
  next (the last: to the end of backward) belongs to the call that started;
* activations: each call's saved bytes go to its unit;
* activation checkpointing (orders captured with estimated timing): what each
  mode keeps and how long the recomputation takes
  (:mod:`execwrap.simulate.checkpointing`); the transient memory of the
  unit's forward and backward is the largest of its calls'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from execwrap.plan.unit import enclosing_units
from execwrap.simulate.checkpointing import checkpoint_facts

if TYPE_CHECKING:
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = ["UnitCompute", "unit_compute"]

#: The WARNING of ``plan_wrap(bucket_numel="auto")`` for an order without compute
#: times (the command line, which has no Python call to point to, words it its own way).
NO_COMPUTE_TIMES = (
    "plan_wrap(bucket_numel='auto'): the order has no compute times, so the auto-planner "
    "weighs communication and parameter memory only (no compute to overlap, no "
    "activations); capture with tracing.record_execution_order(model, *inputs, "
    "timing=True), or on the meta device with timing=cost_model.compute"
)

#: The fields of :class:`UnitCompute` that may be empty (not recorded).
_OPTIONAL = (
    "checkpoint_ops",
    "checkpoint_regions",
    "checkpoint_bytes",
    "selective_bytes",
    "selective_saved_s",
    "forward_transient_bytes",
    "backward_transient_bytes",
    "activation_tail_bytes",
    "head_grad_share",
)
#: Of :data:`_OPTIONAL`, the fields that mean "all zero" when empty.
_ZERO_WHEN_EMPTY = (
    "checkpoint_ops",
    "checkpoint_regions",
    "forward_transient_bytes",
    "backward_transient_bytes",
    "activation_tail_bytes",
    "head_grad_share",
)


@dataclass(frozen=True)
class UnitCompute:
    """Per plan unit (in ``plan.units`` order): compute seconds and saved-activation bytes.

    Attributes:
        forward_s: forward compute while the unit is the innermost active one.
        backward_s: backward compute of the same ops.
        activation_bytes: bytes saved for backward by the unit's ops; alive
            from its forward until its backward ran.
        forward_tail_s: the part of ``forward_s`` after the units nested in
            it ran (empty: all zero).
        backward_tail_s: the part of ``backward_s`` after the backward of the
            units nested in it (empty: all zero).
        optimizer_s: the optimizer step; ``None``: the simulator estimates it
            from the cost model.
        method: ``"measured"``, ``"estimated"`` or ``"given"``.
        device_type: the device the times are for (``""``: unspecified).
        checkpoint_bytes: bytes full activation checkpointing keeps of the unit
            (its regions' inputs); empty: not known (checkpointing cannot be simulated).
        selective_bytes: bytes selective (op-level) checkpointing keeps; empty: not known.
        selective_saved_s: forward seconds that selective checkpointing does not
            run again (the ops whose outputs it keeps); empty: not known.
        checkpoint_ops: aten ops the unit's checkpoint regions dispatch in one forward
            (:attr:`tracing.ExecutionOrder.forward_op_counts`; empty: all zero, no
            host work priced for checkpointing).
        checkpoint_regions: the unit's checkpoint region calls in one forward (empty:
            all zero).
        forward_transient_bytes: the most bytes the unit's forward has alive beyond
            what it saves (empty: all zero).
        backward_transient_bytes: the same for its backward (empty: all zero).
        activation_tail_bytes: the part of ``activation_bytes`` saved by the unit's
            forward tail (its calls after the units nested in it ran forward: a
            model's final norm, head and loss); they are made at the tail and freed by
            the backward of the same ops, which runs first (empty: all zero).
        head_grad_share: the share (0..1, by bytes) of the unit's trainable parameters
            used only before or between the units nested in it (a model's input
            embedding), whose gradients are computed at the end of its backward, after
            the nested units' (empty: all zero).

    Example:
        >>> c = UnitCompute(forward_s=(1.0, 2.0, 3.0), backward_s=(2.0, 4.0, 6.0),
        ...                 activation_bytes=(0, 10, 20))
        >>> c.merge([[0], [1, 2]]).forward_s
        (1.0, 5.0)
    """

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    activation_bytes: tuple[int, ...]
    forward_tail_s: tuple[float, ...] = field(default=())
    backward_tail_s: tuple[float, ...] = field(default=())
    optimizer_s: float | None = None
    method: str = "given"
    device_type: str = ""
    checkpoint_bytes: tuple[int, ...] = field(default=())
    selective_bytes: tuple[int, ...] = field(default=())
    selective_saved_s: tuple[float, ...] = field(default=())
    checkpoint_ops: tuple[int, ...] = field(default=())
    checkpoint_regions: tuple[int, ...] = field(default=())
    forward_transient_bytes: tuple[int, ...] = field(default=())
    backward_transient_bytes: tuple[int, ...] = field(default=())
    activation_tail_bytes: tuple[int, ...] = field(default=())
    head_grad_share: tuple[float, ...] = field(default=())

    def __post_init__(self) -> None:
        n = len(self.forward_s)
        for name in (
            "backward_s",
            "activation_bytes",
            "forward_tail_s",
            "backward_tail_s",
            *_OPTIONAL,
        ):
            value = getattr(self, name)
            if name in _OPTIONAL and not value:
                if name in _ZERO_WHEN_EMPTY:
                    object.__setattr__(self, name, (0,) * n)
            elif name.endswith("tail_s") and not value:
                object.__setattr__(self, name, (0.0,) * n)
            elif len(value) != n:
                raise ValueError(
                    f"UnitCompute.{name} has {len(value)} entries, forward_s has {n}: one per "
                    "plan unit"
                )
        for name in ("forward_s", "backward_s", "forward_tail_s", "backward_tail_s"):
            for i, v in enumerate(getattr(self, name)):
                if not math.isfinite(v) or v < 0:
                    raise ValueError(f"UnitCompute.{name}[{i}] must be seconds >= 0, got {v!r}")
        for i, (tail, total) in enumerate(zip(self.forward_tail_s, self.forward_s, strict=True)):
            if tail > total * (1 + 1e-9) + 1e-15:
                raise ValueError(
                    f"UnitCompute.forward_tail_s[{i}] = {tail} exceeds forward_s {total}"
                )
        for i, (tail, total) in enumerate(zip(self.backward_tail_s, self.backward_s, strict=True)):
            if tail > total * (1 + 1e-9) + 1e-15:
                raise ValueError(
                    f"UnitCompute.backward_tail_s[{i}] = {tail} exceeds backward_s {total}"
                )
        for name in ("activation_bytes", *_OPTIONAL):
            if any(b < 0 for b in getattr(self, name)):
                raise ValueError(f"UnitCompute.{name} must be >= 0")
        for i, (tail, total) in enumerate(
            zip(self.activation_tail_bytes, self.activation_bytes, strict=True)
        ):
            if tail > total:
                raise ValueError(
                    f"UnitCompute.activation_tail_bytes[{i}] = {tail} exceeds activation_bytes "
                    f"{total}"
                )
        if any(not 0.0 <= f <= 1.0 for f in self.head_grad_share):
            raise ValueError("UnitCompute.head_grad_share must be shares between 0 and 1")
        if self.optimizer_s is not None and (
            not math.isfinite(self.optimizer_s) or self.optimizer_s < 0
        ):
            raise ValueError(
                f"UnitCompute.optimizer_s must be seconds >= 0, got {self.optimizer_s!r}"
            )

    def __len__(self) -> int:
        return len(self.forward_s)

    @classmethod
    def zeros(cls, num_units: int) -> UnitCompute:
        """No compute at all (a communication-only estimate)."""
        return cls((0.0,) * num_units, (0.0,) * num_units, (0,) * num_units)

    def merge(self, groups: Sequence[Sequence[int]]) -> UnitCompute:
        """Sum units into groups (e.g. contiguous atomic units into candidate buckets).

        Args:
            groups: for each new unit, the indices of the units it merges.

        Returns:
            A :class:`UnitCompute` with one entry per group.

        Raises:
            ValueError: an index is out of range or used twice.
        """
        seen: set[int] = set()
        for g in groups:
            for i in g:
                if not 0 <= i < len(self) or i in seen:
                    raise ValueError(f"UnitCompute.merge: index {i} out of range or repeated")
                seen.add(i)

        def total(values: tuple[float, ...], g: Sequence[int]) -> float:
            return float(sum(values[i] for i in g))

        def summed(values: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(total(values, g) for g in groups) if values else ()

        def largest(values: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(max((values[i] for i in g), default=0) for g in groups)

        return UnitCompute(
            forward_s=tuple(total(self.forward_s, g) for g in groups),
            backward_s=tuple(total(self.backward_s, g) for g in groups),
            activation_bytes=tuple(sum(self.activation_bytes[i] for i in g) for g in groups),
            forward_tail_s=tuple(total(self.forward_tail_s, g) for g in groups),
            backward_tail_s=tuple(total(self.backward_tail_s, g) for g in groups),
            optimizer_s=self.optimizer_s,
            method=self.method,
            device_type=self.device_type,
            checkpoint_bytes=tuple(int(v) for v in summed(self.checkpoint_bytes)),
            selective_bytes=tuple(int(v) for v in summed(self.selective_bytes)),
            selective_saved_s=summed(self.selective_saved_s),
            checkpoint_ops=tuple(sum(self.checkpoint_ops[i] for i in g) for g in groups),
            checkpoint_regions=tuple(sum(self.checkpoint_regions[i] for i in g) for g in groups),
            forward_transient_bytes=largest(self.forward_transient_bytes),
            backward_transient_bytes=largest(self.backward_transient_bytes),
            activation_tail_bytes=tuple(
                sum(self.activation_tail_bytes[i] for i in g) for g in groups
            ),
            # a group's gradients come as its members' do: the earliest share counts
            head_grad_share=tuple(
                min((self.head_grad_share[i] for i in g), default=0.0) for g in groups
            ),
        )


def unit_compute(plan: WrapPlan) -> UnitCompute:
    """Per-unit compute of ``plan`` from the timing fields of ``plan.order``.

    Args:
        plan: a plan whose order was captured with ``timing=True``
            (:func:`tracing.record_execution_order`, :class:`tracing.RuntimeRecorder`).

    Returns:
        A :class:`UnitCompute` in ``plan.units`` order, ``method`` and
        ``device_type`` from the order.

    Raises:
        ValueError: the order has no timing, or its timing fields do not have
            one entry per forward call.
    """
    order = plan.order
    n_calls = len(order.module_forward_order)
    if not order.has_timing:
        raise ValueError(
            "the plan's order has no compute times: capture it with "
            "tracing.record_execution_order(model, *inputs, timing=True) (or "
            "RuntimeRecorder(model, timing=True)), or pass compute=UnitCompute(...)"
        )
    for name in ("forward_times_s", "forward_start_s", "saved_activation_bytes"):
        if len(getattr(order, name)) != n_calls:
            raise ValueError(
                f"order.{name} has {len(getattr(order, name))} entries for {n_calls} forward calls"
            )
    unit_of_call = [plan.unit_of_module(fqn) for fqn in order.module_forward_order]
    root = plan.root_index
    calls = [root if u is None else u for u in unit_of_call]
    n = len(plan.units)
    enclosing = enclosing_units(plan.units)
    fwd = _forward_segments(order.forward_start_s, order.forward_times_s, calls)
    forward_end = max(
        (s + d for s, d in zip(order.forward_start_s, order.forward_times_s, strict=True)),
        default=0.0,
    )
    bwd = _backward_segments(order.backward_start_s, order.backward_end_s, calls)
    if bwd:  # the loss: between the model's forward and the first backward event
        gap = bwd[0][1] - forward_end
        if gap > 0:
            fwd.append((root, forward_end, forward_end + gap))
    forward_s, forward_tail = _totals_and_tails(fwd, enclosing, n)
    backward_s, backward_tail = _totals_and_tails(bwd, enclosing, n)
    acts = [0] * n
    for call, nbytes in zip(calls, order.saved_activation_bytes, strict=True):
        acts[call] += int(nbytes)
    tail, head_share = _tails(plan, calls, enclosing)
    ac = checkpoint_facts(plan, calls)
    return UnitCompute(
        forward_s=tuple(forward_s),
        backward_s=tuple(backward_s),
        activation_bytes=tuple(acts),
        forward_tail_s=tuple(forward_tail),
        backward_tail_s=tuple(backward_tail),
        method=order.timing_method or "measured",
        device_type=order.timing_device,
        checkpoint_bytes=() if ac is None else ac.input_bytes,
        selective_bytes=() if ac is None else ac.selective_bytes,
        selective_saved_s=() if ac is None else ac.selective_saved_s,
        checkpoint_ops=() if ac is None else ac.region_ops,
        checkpoint_regions=() if ac is None else ac.regions,
        forward_transient_bytes=_largest(calls, order.forward_transient_bytes, n),
        backward_transient_bytes=_largest(calls, order.backward_transient_bytes, n),
        activation_tail_bytes=tail,
        head_grad_share=head_share,
    )


def _tails(
    plan: WrapPlan, calls: Sequence[int], enclosing: Sequence[set[int]]
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Per unit: the bytes its forward tail saves, and the share of its trainable bytes
    used only before (or between) the units nested in it.

    A unit's tail is its calls after the last call of a unit nested in it; the root's own
    call (index 0) is in its tail too, since it holds the loss, computed after the
    model's forward (as :func:`unit_compute` times it). A parameter used in a tail call
    gets its gradient in the unit's first backward part; the others at its end.
    """
    order = plan.order
    n = len(plan.units)
    last_nested = [-1] * n
    for c, u in enumerate(calls):
        for outer in enclosing[u]:
            last_nested[outer] = max(last_nested[outer], c)
    root = plan.root_index
    in_tail = [
        last_nested[u] >= 0 and (c > last_nested[u] or (c == 0 and u == root))
        for c, u in enumerate(calls)
    ]
    tail = [0] * n
    for c, (u, nbytes) in enumerate(zip(calls, order.saved_activation_bytes, strict=True)):
        if in_tail[c]:
            tail[u] += int(nbytes)
    late = {
        p
        for use in order.param_uses
        if 0 <= use.call_index < len(in_tail) and in_tail[use.call_index]
        for p in use.param_fqns
    }
    shares = []
    for u, unit in enumerate(plan.units):
        sizes = [
            (order.params[p].bytes, p in late)
            for p in unit.param_fqns
            if p in order.params and order.params[p].requires_grad
        ]
        total = sum(b for b, _ in sizes)
        head = sum(b for b, used_late in sizes if not used_late)
        shares.append(head / total if last_nested[u] >= 0 and total else 0.0)
    return tuple(tail), tuple(shares)


def _largest(calls: Sequence[int], values: Sequence[int], n: int) -> tuple[int, ...]:
    """Per unit, the largest of its calls' ``values`` (empty when not recorded)."""
    if len(values) != len(calls):
        return ()
    out = [0] * n
    for u, v in zip(calls, values, strict=True):
        out[u] = max(out[u], int(v))
    return tuple(out)


Segment = tuple[int, float, float]  # (unit, start, end)


def _forward_segments(
    starts: Sequence[float], durations: Sequence[float], units: Sequence[int]
) -> list[Segment]:
    """Elementary forward segments, each owned by the innermost open call's unit."""
    segments: list[Segment] = []
    stack: list[int] = []
    cursor = 0.0
    ends = [s + d for s, d in zip(starts, durations, strict=True)]

    def close_until(t: float) -> float:
        c = cursor
        while stack and ends[stack[-1]] <= t + 1e-12:
            top = stack.pop()
            e = max(c, ends[top])
            segments.append((units[top], c, e))
            c = e
        return c

    for i, s in enumerate(starts):
        cursor = close_until(s)
        if stack and s > cursor:
            segments.append((units[stack[-1]], cursor, s))
        cursor = max(cursor, s)
        stack.append(i)
    close_until(math.inf)
    return [seg for seg in segments if seg[2] > seg[1]]


def _backward_segments(
    starts: Sequence[float | None], end: float | None, units: Sequence[int]
) -> list[Segment]:
    """Backward segments: from each call's backward start to the next one's (or the end)."""
    events = sorted((t, i) for i, t in enumerate(starts) if t is not None)
    if not events:
        return []
    stop = end if end is not None else events[-1][0]
    segments: list[Segment] = []
    for k, (t, i) in enumerate(events):
        nxt = events[k + 1][0] if k + 1 < len(events) else max(stop, t)
        segments.append((units[i], t, nxt))
    return segments


def _totals_and_tails(
    segments: list[Segment], enclosing: list[set[int]], n: int
) -> tuple[list[float], list[float]]:
    """Per unit: total seconds, and seconds after the last segment of a unit nested in it."""
    totals = [0.0] * n
    last_nested_end = [-math.inf] * n
    for unit, t0, t1 in segments:
        totals[unit] += t1 - t0
        for a in enclosing[unit]:
            if t1 > last_nested_end[a]:
                last_nested_end[a] = t1
    tails = [0.0] * n
    for unit, t0, t1 in segments:
        if last_nested_end[unit] > -math.inf and t0 >= last_nested_end[unit] - 1e-12:
            tails[unit] += t1 - t0
    return totals, [min(t, tot) for t, tot in zip(tails, totals, strict=True)]
