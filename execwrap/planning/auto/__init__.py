"""The auto-planner: ``plan_wrap(..., bucket_numel="auto")`` under a memory budget.

* :mod:`~execwrap.planning.auto.search`: :func:`search_plan`, the search and its choice;
* :mod:`~execwrap.planning.auto.space`: what a grouping costs (cached per group and choice);
* :mod:`~execwrap.planning.auto.partition`: the exact dynamic program over contiguous
  groupings;
* :mod:`~execwrap.planning.auto.mergeable`: which units may merge, and the facts per unit the
  search needs;
* :mod:`~execwrap.planning.auto.least`: the least-memory configuration every memory question
  starts from (the planner's baselines, the mesh search's probes, the largest micro-batch).

It prices plans with :mod:`execwrap.simulate` and :mod:`execwrap.cost` and records what it
compared in a :class:`~execwrap.PlanSearch`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.planning.auto.search import search_plan

_EXPORTS: dict[str, str] = {"search_plan": "execwrap.planning.auto.search"}

__all__ = ["search_plan"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
