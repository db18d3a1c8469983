"""A plan's predicted cost for one training step, by counting.

:class:`PlanStats` (collectives and bytes) and the unsharded timeline
(:class:`TimelineStep`) behind :meth:`WrapPlan.stats`,
:meth:`WrapPlan.unsharded_timeline` and :meth:`WrapPlan.runs_backward`. They
count what FSDP does in a step; they do not time it.

Model of the step (FSDP's unshard/reshard schedule: FSDP2's
``FSDPParamGroup.pre_forward``/``post_forward``/``pre_backward``/
``post_backward`` and explicit prefetching; FSDP1's ``_pre_forward_unshard``
/ ``_post_forward_reshard`` with ``forward_prefetch`` and ``BACKWARD_PRE``;
FSDP1 ``FULL_SHARD`` and FSDP2 defaults):

* all-gathers: each unit with parameters is all-gathered once per forward
  activation (a unit whose module is called ``c`` times is resharded and
  gathered ``c`` times) and, with reshard after forward, once more per
  activation in backward; the root unit is not resharded after forward
  (FSDP1 and FSDP2 both keep it), so it is gathered in forward only. Without
  reshard after forward each unit is gathered once;
* frozen prefix: autograd never runs backward through a unit whose whole
  span (every module call of it, see :attr:`WrapUnit.last_use`) comes before
  the first forward use of any trainable (``requires_grad``) parameter, as
  recorded in ``order.param_uses`` and ``order.params``: assuming the model's
  input needs no grad, its outputs do not require grad, so FSDP's
  pre-backward hook never fires and the unit has no backward all-gather
  (:func:`runs_backward`). FSDP1 agrees even with ``BACKWARD_PRE`` prefetch
  (it skips handles whose ``_needs_pre_backward_unshard`` is unset); FSDP2's
  implicit backward prefetch, or an explicit list naming such a unit, still
  gathers it. Spans are computed from the plan's order, not read from the
  units; a unit never called in forward, and every unit when the order
  records no parameter uses, counts as running backward;
* reduce-scatters: one per unit with a trainable parameter (none for a unit
  whose parameters are all frozen);
* forward visits the units in plan order; while unit ``j`` runs, unsharded
  are: unit ``j``, the next ``prefetch`` units (their all-gathers were issued
  early), every unit enclosing ``j`` (its forward is still running), and the
  root unit (never resharded after forward). Without reshard after forward
  every unit gathered so far stays unsharded;
* backward visits the units in reverse; while unit ``j`` runs, unsharded are:
  unit ``j``, the ``prefetch`` units before it, every unit enclosing ``j``
  (its post-backward waits for its children) and the root. Without reshard
  after forward units ``0..j`` are unsharded (later ones were freed after
  their gradients);
* units that autograd never runs backward through are not all-gathered in
  backward: with reshard after forward they are left out of every backward
  step (their own step shows what stays unsharded meanwhile) and are not
  counted among the ``prefetch`` units; without it they stay unsharded
  through all of backward (their post-backward, which would free them, never
  runs);
* peak unsharded bytes: the maximum over the timeline.

Only parameter bytes count (no gradients, activations, or padding); a group
spanning modules in several subtrees counts the enclosing units of all of
them (an upper bound).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from execwrap.plan.spans import OrderFacts, order_requires_grad
from execwrap.plan.unit import WrapUnit, enclosing_units
from tracing.checks import check_int

if TYPE_CHECKING:
    from execwrap.plan.estimate import StepEstimate
    from tracing.order import ExecutionOrder

__all__ = [
    "PlanLike",
    "PlanStats",
    "chosen_collectives",
    "TimelineStep",
    "check_prefetch",
    "plan_stats",
    "peak_unsharded_bytes",
    "runs_backward",
    "unsharded_timeline",
]


class PlanLike(Protocol):
    """What the stats read of a plan (a :class:`~execwrap.plan.wrap_plan.WrapPlan` is one).

    Declared here so that these functions need not import the plan class that calls them.
    """

    @property
    def units(self) -> list[WrapUnit]: ...

    @property
    def order(self) -> ExecutionOrder: ...

    @property
    def root_index(self) -> int: ...

    @property
    def prefetch(self) -> int | None: ...

    @property
    def reshard_after_forward(self) -> tuple[bool, ...] | None: ...

    @property
    def estimate(self) -> StepEstimate | None: ...


@dataclass(frozen=True)
class PlanStats:
    """Predicted cost of a plan for one training step (see :meth:`WrapPlan.stats`).

    Attributes:
        num_units: units (FSDP2 groups) in the plan.
        all_gathers_per_step: parameter all-gathers per step with reshard after
            forward (the default of FSDP1 ``FULL_SHARD`` and FSDP2).
        all_gathers_per_step_no_reshard: the same without reshard after forward
            (FSDP1 ``SHARD_GRAD_OP``, FSDP2 ``reshard_after_forward=False``).
        reduce_scatters_per_step: gradient reduce-scatters per step.
        bytes_per_all_gather: unsharded bytes each unit all-gathers, one entry
            per unit in unit order (``0``: the unit has no parameters and
            issues no all-gather).
        largest_unit_bytes: the largest entry of ``bytes_per_all_gather``.
        peak_unsharded_bytes: peak unsharded parameter bytes over the step at
            this prefetch depth, with reshard after forward.
        prefetch: the prefetch depth the peak was computed for.
        total_bytes: bytes over all units (the unsharded model, ignored
            parameters excluded).
        peak_unsharded_bytes_no_reshard: the peak without reshard after forward.
    """

    num_units: int
    all_gathers_per_step: int
    all_gathers_per_step_no_reshard: int
    reduce_scatters_per_step: int
    bytes_per_all_gather: tuple[int, ...]
    largest_unit_bytes: int
    peak_unsharded_bytes: int
    prefetch: int
    total_bytes: int = 0
    peak_unsharded_bytes_no_reshard: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


class TimelineStep(NamedTuple):
    """One step of :meth:`WrapPlan.unsharded_timeline`.

    Attributes:
        step: position in the timeline (forward steps first, then backward).
        phase: ``"forward"`` or ``"backward"``.
        unit: the running unit's :attr:`WrapUnit.label`.
        unsharded_bytes: parameter bytes unsharded while that unit runs.
    """

    step: int
    phase: str
    unit: str
    unsharded_bytes: int


def check_prefetch(prefetch: int) -> None:
    """Raise unless ``prefetch`` is an int ``>= 0`` (units prefetched ahead).

    Raises:
        TypeError: ``prefetch`` is not an int (or is a bool).
        ValueError: ``prefetch`` is negative.
    """
    check_int(prefetch, "prefetch", minimum=0, unit="units ahead")


def runs_backward(plan: PlanLike) -> list[bool]:
    """For each unit of ``plan``, whether autograd runs backward through it
    (the frozen prefix of the module docstring); one bool per unit."""
    return OrderFacts(plan.order).runs_backward(
        [(unit.module_fqns, unit.param_fqns) for unit in plan.units]
    )


def unsharded_timeline(
    plan: PlanLike, prefetch: int = 1, *, reshard_after_forward: bool | Sequence[bool] = True
) -> list[TimelineStep]:
    """``2 * len(plan.units)`` steps, forward then backward (see
    :meth:`WrapPlan.unsharded_timeline`).

    Raises:
        ValueError: ``prefetch`` is negative, or ``reshard_after_forward`` is a
            sequence whose length is not the number of units.
    """
    check_prefetch(prefetch)
    if not plan.units:
        return []
    n = len(plan.units)
    if isinstance(reshard_after_forward, bool):
        flags = [reshard_after_forward] * n
    else:
        flags = [bool(f) for f in reshard_after_forward]
        if len(flags) != n:
            raise ValueError(
                f"unsharded_timeline: reshard_after_forward has {len(flags)} flags for {n} units"
            )
    return _timeline(plan, prefetch, flags, enclosing_units(plan.units), runs_backward(plan))


def chosen_collectives(plan: PlanLike) -> tuple[int, int] | None:
    """``(all-gathers per step, peak unsharded bytes)`` at an auto plan's own prefetch
    depth and per-group ``reshard_after_forward``; ``None`` for a plan that chose none."""
    if plan.estimate is None or plan.prefetch is None or plan.reshard_after_forward is None:
        return None
    peak = peak_unsharded_bytes(
        plan, plan.prefetch, reshard_after_forward=plan.reshard_after_forward
    )
    return plan.estimate.all_gathers, peak


def peak_unsharded_bytes(
    plan: PlanLike, prefetch: int = 1, *, reshard_after_forward: bool | Sequence[bool] = True
) -> int:
    """The largest ``unsharded_bytes`` of :func:`unsharded_timeline` (``0``
    without units): the peak of unsharded parameter bytes in one step."""
    steps = unsharded_timeline(plan, prefetch, reshard_after_forward=reshard_after_forward)
    return max((s.unsharded_bytes for s in steps), default=0)


def plan_stats(plan: PlanLike, prefetch: int = 1) -> PlanStats:
    """The :class:`PlanStats` of ``plan`` (see :meth:`WrapPlan.stats`)."""
    check_prefetch(prefetch)
    backward = runs_backward(plan)
    gathers, gathers_no_reshard, reduce_scatters = _collectives(plan, backward)
    per_gather = tuple(u.bytes for u in plan.units)
    anc = enclosing_units(plan.units)
    return PlanStats(
        num_units=len(plan.units),
        all_gathers_per_step=gathers,
        all_gathers_per_step_no_reshard=gathers_no_reshard,
        reduce_scatters_per_step=reduce_scatters,
        bytes_per_all_gather=per_gather,
        largest_unit_bytes=max(per_gather, default=0),
        peak_unsharded_bytes=_peak(plan, prefetch, True, anc, backward),
        prefetch=prefetch,
        total_bytes=sum(per_gather),
        peak_unsharded_bytes_no_reshard=_peak(plan, prefetch, False, anc, backward),
    )


def _collectives(plan: PlanLike, backward: list[bool]) -> tuple[int, int, int]:
    """All-gathers with and without reshard after forward, and reduce-scatters,
    per step."""
    root = plan.root_index
    gathers = 0
    gathers_no_reshard = 0
    reduce_scatters = 0
    calls = Counter(plan.order.module_forward_order)
    for i, unit in enumerate(plan.units):
        if unit.numel <= 0:
            continue
        acts = max(1, max(calls.get(m, 0) for m in unit.module_fqns))
        gathers += acts if i == root or not backward[i] else 2 * acts
        gathers_no_reshard += 1
        if any(order_requires_grad(plan.order, p) for p in unit.param_fqns):
            reduce_scatters += 1
    return gathers, gathers_no_reshard, reduce_scatters


def _peak(
    plan: PlanLike, prefetch: int, reshard: bool, anc: list[set[int]], backward: list[bool]
) -> int:
    """The largest ``unsharded_bytes`` of the timeline (``0`` without units)."""
    flags = [reshard] * len(plan.units)
    steps = _timeline(plan, prefetch, flags, anc, backward) if plan.units else []
    return max((s.unsharded_bytes for s in steps), default=0)


def _timeline(
    plan: PlanLike,
    prefetch: int,
    reshard: Sequence[bool],
    anc: list[set[int]],
    active: list[bool],
) -> list[TimelineStep]:
    """:func:`unsharded_timeline` given one reshard-after-forward flag per unit,
    the enclosing units of each unit and :func:`runs_backward` (computed once
    by :func:`plan_stats` for both reshard settings). A unit that does not
    reshard after forward stays unsharded from its forward until its backward
    (to the end of the step when autograd skips it)."""
    n = len(plan.units)
    nbytes = [u.bytes for u in plan.units]
    root = plan.root_index
    steps: list[TimelineStep] = []

    def add(phase: str, j: int, live: set[int]) -> None:
        steps.append(
            TimelineStep(len(steps), phase, plan.units[j].label, sum(nbytes[i] for i in live))
        )

    no_reshard = [i for i in range(n) if not reshard[i]]  # empty in the common case
    for j in range(n):
        kept = {i for i in no_reshard if i < j}
        add("forward", j, {j, root, *anc[j], *range(j + 1, min(n, j + 1 + prefetch)), *kept})
    for j in range(n - 1, -1, -1):
        before = [i for i in range(j - 1, -1, -1) if active[i]][:prefetch]
        kept = {i for i in no_reshard if i < j or not active[i]}
        add("backward", j, {i for i in (j, *anc[j], *before) if active[i]} | {root} | kept)
    return steps
