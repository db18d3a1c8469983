"""Use spans: the call-index range over which each FSDP unit is active.

Facts of one :class:`~tracing.ExecutionOrder` that the plan, its cost and the
FSDP2 prefetch schedule all need: where a set of modules first runs, when it
is last active, and where the first trainable parameter is used.
:class:`OrderFacts` computes them once for everything that reads one order
(the auto-planner simulates dozens of plans of the same order).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import cached_property

from tracing.fqn import ancestors
from tracing.order import ExecutionOrder

__all__ = ["OrderFacts", "UseSpans", "first_trainable_use", "order_requires_grad"]


class UseSpans:
    """Call-index spans of units in one order (see :class:`WrapUnit`).

    Built once per order in O(calls x depth + uses); :meth:`span` then costs
    O(modules + params) per unit.
    """

    def __init__(self, order: ExecutionOrder) -> None:
        self.first_call = order.first_call_index()
        # module FQN -> last call of it or of any module nested inside it
        self.last_within: dict[str, int] = {}
        for i, fqn in enumerate(order.module_forward_order):
            for anc in ancestors(fqn):
                self.last_within[anc] = i
        canonical = order.alias_to_canonical()
        self.param_last: dict[str, int] = {}
        for use in order.param_uses:
            for p in use.param_fqns:
                name = canonical.get(p, p)
                self.param_last[name] = max(self.param_last.get(name, -1), use.call_index)

    def span(self, modules: Iterable[str], params: Iterable[str]) -> tuple[int | None, int | None]:
        """``(first_use, last_use)`` of a unit with these modules and
        canonical parameters (``(None, None)`` if no module is called)."""
        modules = list(modules)
        firsts = [self.first_call[m] for m in modules if m in self.first_call]
        if not firsts:
            return None, None
        lasts = [self.last_within[m] for m in modules if m in self.last_within]
        lasts += [self.param_last[p] for p in params if p in self.param_last]
        return min(firsts), max(lasts)


class OrderFacts:
    """Facts of one order, each computed on first use and then kept.

    The order must not change while its facts are in use (build a new one
    after changing it).

    Attributes:
        order: the execution order.
    """

    def __init__(self, order: ExecutionOrder) -> None:
        self.order = order

    @cached_property
    def first_call(self) -> dict[str, int]:
        """``order.first_call_index()``."""
        return self.order.first_call_index()

    @cached_property
    def first_trainable(self) -> float | None:
        """:func:`first_trainable_use` of the order."""
        return first_trainable_use(self.order)

    @cached_property
    def spans(self) -> UseSpans:
        """The order's :class:`UseSpans`."""
        return UseSpans(self.order)

    @cached_property
    def gradient_ready(self) -> dict[str, int]:
        """Parameter FQN -> its first position in ``order.param_backward_order``."""
        ready: dict[str, int] = {}
        for position, fqn in enumerate(self.order.param_backward_order):
            ready.setdefault(fqn, position)
        return ready

    def runs_backward(self, units: Sequence[tuple[Sequence[str], Sequence[str]]]) -> list[bool]:
        """For each ``(module_fqns, param_fqns)`` unit, whether autograd runs backward
        through it (:meth:`execwrap.plan.wrap_plan.WrapPlan.runs_backward`)."""
        first_trainable = self.first_trainable
        if first_trainable is None:
            return [True] * len(units)
        spans = self.spans
        out: list[bool] = []
        for modules, params in units:
            _, last = spans.span(modules, params)
            out.append(last is None or last >= first_trainable)
        return out


def first_trainable_use(order: ExecutionOrder) -> float | None:
    """Call index of the first ``param_uses`` entry with a trainable
    parameter; ``math.inf`` if no use is trainable; ``None`` if the order
    records no parameter uses at all (nothing is known)."""
    if not order.param_uses:
        return None
    canonical = order.alias_to_canonical()
    trainable = [
        use.call_index
        for use in order.param_uses
        if any(order_requires_grad(order, canonical.get(p, p)) for p in use.param_fqns)
    ]
    return min(trainable, default=math.inf)


def order_requires_grad(order: ExecutionOrder, fqn: str) -> bool:
    """``requires_grad`` recorded for canonical ``fqn`` (``True`` if unknown)."""
    info = order.params.get(fqn)
    return True if info is None else info.requires_grad
