"""Plans side by side: one row of predicted cost per plan.

:func:`compare_plans` turns named :class:`~execwrap.plan.wrap_plan.WrapPlan` objects
into rows of their :meth:`~execwrap.plan.wrap_plan.WrapPlan.stats` (units,
all-gathers, reduce-scatters, bytes, notes), for reports and benchmarks that
compare a plan with its baselines.
"""

from __future__ import annotations

from typing import Any

from execwrap.plan.stats import check_prefetch
from execwrap.plan.wrap_plan import WrapPlan

__all__ = ["compare_plans"]


def compare_plans(plans: dict[str, WrapPlan], *, prefetch: int = 1) -> list[dict[str, Any]]:
    """One row of predicted cost per plan, for reports and benchmarks.

    Args:
        plans: name -> plan; rows follow this mapping's order.
        prefetch: prefetch depth for the peak (``>= 0``).

    Returns:
        Dicts with ``name``, ``units`` (count), ``all_gathers_per_step``,
        ``all_gathers_per_step_no_reshard``, ``reduce_scatters_per_step``,
        ``largest_unit_bytes``, ``peak_unsharded_bytes``, ``total_bytes`` and
        ``notes`` (count).

    Raises:
        TypeError: a value is not a :class:`WrapPlan`, or ``prefetch`` is not
            an int.
        ValueError: ``prefetch`` is negative.

    Example:
        >>> rows = compare_plans({"blocks": plan_a, "bucketed": plan_b})  # doctest: +SKIP
        >>> [r["all_gathers_per_step"] for r in rows]  # doctest: +SKIP
        [9, 5]
    """
    check_prefetch(prefetch)
    rows: list[dict[str, Any]] = []
    for name, plan in plans.items():
        if not isinstance(plan, WrapPlan):
            raise TypeError(
                f"compare_plans: {name!r} is a {type(plan).__name__}, expected a WrapPlan "
                "(build one with plan_wrap)"
            )
        st = plan.stats(prefetch)
        rows.append(
            {
                "name": str(name),
                "units": st.num_units,
                "all_gathers_per_step": st.all_gathers_per_step,
                "all_gathers_per_step_no_reshard": st.all_gathers_per_step_no_reshard,
                "reduce_scatters_per_step": st.reduce_scatters_per_step,
                "largest_unit_bytes": st.largest_unit_bytes,
                "peak_unsharded_bytes": st.peak_unsharded_bytes,
                "total_bytes": st.total_bytes,
                "notes": len(plan.notes),
            }
        )
    return rows
