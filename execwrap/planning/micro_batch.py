"""How large a micro-batch fits: :func:`largest_micro_batch`, and orders scaled to a size.

People size a job by the micro-batch: the largest one whose step fits in the device's
memory with the fastest plan. :func:`largest_micro_batch` answers it with the joint
auto-planner (:func:`execwrap.plan_wrap` with ``bucket_numel="auto"``): a micro-batch
fits when some plan (groups, prefetch, resharding, checkpointing per group, offload,
accumulation) stays within the budget. Sizes are tried doubling from 1 until one
does not fit (or ``max_micro_batch``), then bisected between the last that fits and
the first that does not: the peak of the best plan only grows with the micro-batch.

The order of each size comes from ``capture(size)`` (e.g. ``record_execution_order``
on the meta device with inputs of that many sequences), or, with ``scaled=True`` (the
default), from two captures only, at sizes 1 and 2, by :func:`scaled_order`: every
per-call figure an order holds (activation, input and transient bytes, the matmul and
attention outputs, compute seconds) extrapolated along the line through its values
at 1 and 2. That is exact for what is linear or affine in the micro-batch: bytes of
tensors whose leading dimension is the batch (all activations of a transformer at a
fixed sequence length), and roofline seconds as long as each op stays bound by the
same resource (``flops / rate`` or ``bytes / bandwidth``, both affine: the weights'
bytes do not grow), plus the per-op overhead; it is not for quantities that are not
affine (an op that turns from memory- to compute-bound between the sizes: capture at
each size with ``scaled=False``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from execwrap.errors import MemoryBudgetError
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.auto_wrap import always_wrap_policy
from execwrap.planning.planner import plan_wrap_unwatched
from tracing.checks import check_int
from tracing.compute_op import ComputeOp
from tracing.order import ExecutionOrder

if TYPE_CHECKING:
    import torch.nn as nn

    from execwrap.cost import CostModel
    from execwrap.plan.training_step import TrainingStep

__all__ = ["MicroBatchFit", "largest_micro_batch", "scaled_order"]


@dataclass(frozen=True)
class MicroBatchFit:
    """What :func:`largest_micro_batch` found.

    Attributes:
        micro_batch: the largest micro-batch size (sequences per micro-batch) that fits.
        plan: the fastest plan within the budget at that size (its ``estimate``,
            ``training`` and ``search`` as :func:`execwrap.plan_wrap` gives them).
        tried: each size tried, in order, with the predicted peak of its best plan in
            bytes per rank (``None``: no plan fits).
    """

    micro_batch: int
    plan: WrapPlan
    tried: tuple[tuple[int, int | None], ...]


def largest_micro_batch(
    model: nn.Module,
    capture: Callable[[int], ExecutionOrder],
    init_policy: Any = always_wrap_policy,
    *,
    cost_model: CostModel,
    memory_budget: int,
    world_size: int | None = None,
    training: TrainingStep | None = None,
    optimizer: str | None = None,
    choose: Iterable[str] | None = None,
    max_micro_batch: int = 1024,
    scaled: bool = True,
) -> MicroBatchFit:
    """The largest micro-batch whose step fits ``memory_budget`` with the fastest plan.

    The search and the scaling are described in :mod:`execwrap.planning.micro_batch`.

    Args:
        model: the unwrapped model (the meta device is fine).
        capture: ``capture(size)``: the model's order for a micro-batch of ``size``
            sequences, with timing (on meta: ``timing=cost_model.compute``).
        init_policy: the units' policy (:func:`execwrap.plan_wrap`'s).
        cost_model, memory_budget, world_size, training, optimizer, choose: as for
            :func:`execwrap.plan_wrap` with ``bucket_numel="auto"`` (``training``'s
            micro-batch count is the number of micro-batches per optimizer step).
        max_micro_batch: the largest size tried.
        scaled: capture at sizes 1 and 2 only and scale (:func:`scaled_order`);
            ``False``: capture every size tried.

    Returns:
        A :class:`MicroBatchFit`.

    Raises:
        MemoryBudgetError: not even a micro-batch of 1 fits (the planner's message).
        ValueError: ``max_micro_batch`` below 1; the two captures differ in structure
            (:func:`scaled_order`); what :func:`execwrap.plan_wrap` refuses.

    Example:
        >>> fit = largest_micro_batch(model, lambda b: record_execution_order(  # doctest: +SKIP
        ...     model, torch.zeros(b, 4096, dtype=torch.long, device="meta"),
        ...     timing=cm.compute), ModuleWrapPolicy({Block}), cost_model=cm,
        ...     memory_budget=80 * 2**30)
        >>> fit.micro_batch, fit.plan.search.best.label  # doctest: +SKIP
    """
    check_int(max_micro_batch, "largest_micro_batch: max_micro_batch", minimum=1, unit="sequences")
    orders: dict[int, ExecutionOrder] = {}

    def order_of(size: int) -> ExecutionOrder:
        if size not in orders:
            if scaled and size > 2:
                orders[size] = scaled_order(order_of(1), order_of(2), size)
            else:
                orders[size] = capture(size)
        return orders[size]

    tried: list[tuple[int, int | None]] = []
    plans: dict[int, WrapPlan] = {}

    planning: dict[str, Any] = dict(
        bucket_numel="auto", cost_model=cost_model, world_size=world_size,
        memory_budget=memory_budget, optimizer=optimizer, training=training, choose=choose,
    )  # fmt: skip

    def fits(size: int) -> bool:
        try:
            plan = plan_wrap_unwatched(model, order_of(size), init_policy, **planning)
        except MemoryBudgetError:
            if size == 1:
                raise
            tried.append((size, None))
            return False
        assert plan.estimate is not None
        plans[size] = plan
        tried.append((size, int(plan.estimate.peak_memory_bytes)))
        return True

    fits(1)  # raises MemoryBudgetError when even one sequence does not fit
    best = _largest(fits, max_micro_batch)
    return MicroBatchFit(best, plans[best], tuple(tried))


def _largest(fits: Callable[[int], bool], limit: int) -> int:
    """The largest ``n <= limit`` with ``fits(n)``, for a monotone ``fits`` that holds at
    1: doubling until a size does not fit (or ``limit``), then bisection."""
    good, bad = 1, 0
    while not bad:
        size = min(good * 2, limit)
        if size == good:
            return good
        if fits(size):
            good = size
        else:
            bad = size
    while bad - good > 1:
        mid = (good + bad) // 2
        if fits(mid):
            good = mid
        else:
            bad = mid
    return good


def scaled_order(one: ExecutionOrder, two: ExecutionOrder, size: int) -> ExecutionOrder:
    """The order of a micro-batch of ``size`` from those of sizes 1 and 2: each per-call
    figure on the line through its two values (module docstring), bytes rounded to
    whole bytes, nothing below 0.

    Raises:
        ValueError: the two orders differ in their calls or recorded ops (not the same
            model and step at two batch sizes), or ``size`` is below 1.

    Example:
        >>> a = ExecutionOrder(module_forward_order=[""], saved_activation_bytes=[100],
        ...                    forward_times_s=[1.0])
        >>> b = dataclasses.replace(a, saved_activation_bytes=[180], forward_times_s=[1.5])
        >>> c = scaled_order(a, b, 4)
        >>> c.saved_activation_bytes, c.forward_times_s
        ([340], [2.5])
    """
    check_int(size, "scaled_order: size", minimum=1, unit="sequences")
    if one.module_forward_order != two.module_forward_order or [
        (o.call_index, o.op) for o in one.compute_ops
    ] != [(o.call_index, o.op) for o in two.compute_ops]:
        raise ValueError(
            "scaled_order: the orders of micro-batches 1 and 2 differ in their calls or "
            "recorded ops; capture the same model and step at both sizes (or pass "
            "scaled=False to capture every size)"
        )
    k = size - 1  # value(size) = value(1) + (size - 1) * (value(2) - value(1))

    def line(a: float, b: float) -> float:
        return max(0.0, a + k * (b - a))

    def whole(a: int, b: int) -> int:
        return max(0, int(round(a + k * (b - a))))

    def per_call(name: str, kind: Callable[[Any, Any], Any]) -> list[Any]:
        xs, ys = getattr(one, name), getattr(two, name)
        if len(xs) != len(ys):
            raise ValueError(f"scaled_order: {name} has {len(xs)} and {len(ys)} entries")
        return [None if x is None or y is None else kind(x, y) for x, y in zip(xs, ys, strict=True)]

    end = None
    if one.backward_end_s is not None and two.backward_end_s is not None:
        end = line(one.backward_end_s, two.backward_end_s)
    return dataclasses.replace(
        one,
        forward_times_s=per_call("forward_times_s", line),
        forward_start_s=per_call("forward_start_s", line),
        backward_start_s=per_call("backward_start_s", line),
        backward_end_s=end,
        backward_times_s={
            f: line(t, two.backward_times_s.get(f, t)) for f, t in one.backward_times_s.items()
        },
        saved_activation_bytes=per_call("saved_activation_bytes", whole),
        input_activation_bytes=per_call("input_activation_bytes", whole),
        forward_transient_bytes=per_call("forward_transient_bytes", whole),
        backward_transient_bytes=per_call("backward_transient_bytes", whole),
        compute_ops=[
            ComputeOp(
                a.call_index,
                a.op,
                whole(a.output_bytes, b.output_bytes),
                line(a.seconds, b.seconds),
            )  # fmt: skip
            for a, b in zip(one.compute_ops, two.compute_ops, strict=True)
        ],
    )
