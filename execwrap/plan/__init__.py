"""The plan as data: FSDP units in execution order, what they cost by counting, checks, notes.

Everything above this layer (the simulator, the planners, FSDP1/FSDP2, reports, the
command line, the integrations) reads and writes plans through these modules; nothing here
plans, simulates or applies.

* :mod:`~execwrap.plan.wrap_plan`: :class:`WrapPlan`, lookups, FSDP1 view, JSON;
* :mod:`~execwrap.plan.unit`: :class:`WrapUnit`, one FSDP unit or ``fully_shard`` group;
* :mod:`~execwrap.plan.fields` and :mod:`~execwrap.plan.consistency`: a saved plan's fields
  and the checks on load;
* :mod:`~execwrap.plan.check`: the plan's self-check against the model (like fx's
  ``Graph.lint``);
* :mod:`~execwrap.plan.stats`: :class:`PlanStats`, the unsharded-memory timeline;
* :mod:`~execwrap.plan.notes`: the sentences in ``plan.notes``;
* :mod:`~execwrap.plan.model_view` and :mod:`~execwrap.plan.spans`: snapshots of the model
  and of the order that plans are built and checked against;
* :mod:`~execwrap.plan.prefetch`: :func:`prefetch_schedule`, the explicit prefetch lists
  (applied by FSDP2 and priced by the simulator);
* :mod:`~execwrap.plan.training_step` and :mod:`~execwrap.plan.precision`: the step around a
  plan (:class:`TrainingStep`, :class:`Precision` and the precisions by name);
* :mod:`~execwrap.plan.estimate`: :class:`StepEstimate`, the predicted step a plan carries;
* :mod:`~execwrap.plan.search_record`: :class:`PlanSearch`, what the auto-planner compared;
* :mod:`~execwrap.plan.compare`: :func:`compare_plans`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.plan.compare import compare_plans
    from execwrap.plan.estimate import MemoryBreakdown, StepEstimate, StreamEvent
    from execwrap.plan.prefetch import prefetch_schedule
    from execwrap.plan.search_record import Candidate, PlanSearch
    from execwrap.plan.stats import PlanStats, TimelineStep
    from execwrap.plan.unit import WrapUnit
    from execwrap.plan.wrap_plan import WrapPlan

_EXPORTS: dict[str, str] = {
    "compare_plans": "execwrap.plan.compare",
    "MemoryBreakdown": "execwrap.plan.estimate",
    "StepEstimate": "execwrap.plan.estimate",
    "StreamEvent": "execwrap.plan.estimate",
    "prefetch_schedule": "execwrap.plan.prefetch",
    "Candidate": "execwrap.plan.search_record",
    "PlanSearch": "execwrap.plan.search_record",
    "PlanStats": "execwrap.plan.stats",
    "TimelineStep": "execwrap.plan.stats",
    "WrapUnit": "execwrap.plan.unit",
    "WrapPlan": "execwrap.plan.wrap_plan",
}

__all__ = [
    "Candidate",
    "MemoryBreakdown",
    "PlanSearch",
    "PlanStats",
    "StepEstimate",
    "StreamEvent",
    "TimelineStep",
    "WrapPlan",
    "WrapUnit",
    "compare_plans",
    "prefetch_schedule",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
