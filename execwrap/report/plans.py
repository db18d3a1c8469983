"""What a report reads from a plan: its JSON entry, its stats and its memory timeline.

The report takes plans duck-typed (anything with ``units`` and an
:class:`~tracing.ExecutionOrder` ``order``), so reports need not import the
planner.
"""

from __future__ import annotations

from typing import Any

from tracing.order import ExecutionOrder

__all__ = ["is_plan", "plan_to_dict", "stats_to_dict", "unsharded_timeline"]


def is_plan(obj: Any) -> bool:
    """Whether ``obj`` is a :class:`~execwrap.plan.wrap_plan.WrapPlan` (has units and an order)."""
    return hasattr(obj, "units") and isinstance(getattr(obj, "order", None), ExecutionOrder)


def plan_to_dict(plan: Any, prefetch: int = 1) -> dict[str, Any]:
    """The ``"plan"`` entry of ``report.json``: :meth:`WrapPlan.to_dict` with
    its ``"stats"`` computed at ``prefetch`` (``to_dict`` uses prefetch 1)."""
    data = plan.to_dict()
    data["stats"] = stats_to_dict(plan.stats(prefetch))
    return data


def stats_to_dict(stats: Any) -> dict[str, Any]:
    """A :class:`~execwrap.plan.stats.PlanStats` as a JSON-ready dict (tuples as lists)."""
    return dict(stats.to_dict())


def unsharded_timeline(
    plan: Any, prefetch: int = 1, *, reshard_after_forward: Any = True
) -> list[int]:
    """Unsharded parameter bytes at each unit step of one training step.

    The bytes of :meth:`WrapPlan.unsharded_timeline` (its docstring states
    the model of the step): ``2 * len(plan.units)`` entries, forward then
    backward; with reshard after forward everywhere the maximum is
    ``plan.stats(prefetch).peak_unsharded_bytes``.
    """
    steps = plan.unsharded_timeline(prefetch, reshard_after_forward=reshard_after_forward)
    return [int(step.unsharded_bytes) for step in steps]
