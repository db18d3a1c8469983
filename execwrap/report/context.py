"""What every report file is made from, computed once: :class:`ReportContext`.

:func:`~execwrap.report.write_report` builds one context per call and hands it to
the writer of each file (:data:`execwrap.report.writer.FILE_WRITERS`: one function
per format module). The format modules only read the context; the context knows
none of them.
"""

from __future__ import annotations

from typing import Any

from tracing.order import ExecutionOrder

__all__ = ["ReportContext"]


class ReportContext:
    """The order, the plan and its baselines, with their stats and unit lookups.

    Args:
        order: the order reported.
        plan: the :class:`~execwrap.plan.wrap_plan.WrapPlan` of ``order``, or ``None``.
        prefetch: prefetch depth for every stat (units all-gathered ahead) of a
            plan that did not choose its own (an auto plan's ``plan.prefetch``).
        baselines: other plans of ``order`` by name, compared with ``plan``.
        title: page title; ``None`` -> ``"execwrap report: <model class>"``.
    """

    def __init__(
        self,
        order: ExecutionOrder,
        plan: Any,
        prefetch: int,
        baselines: dict[str, Any],
        title: str | None,
    ) -> None:
        self.order = order
        self.plan = plan
        self.prefetch = prefetch
        self.baselines = baselines
        self.model_class = order.module_classes.get("", "")
        self.title = title or f"execwrap report: {self.model_class or 'model'}"
        self.param_unit: dict[str, int] = {}
        self.module_unit: dict[str, int | None] = {}
        if plan is not None:
            for i, unit in enumerate(plan.units):
                for fqn in unit.param_fqns:
                    self.param_unit.setdefault(fqn, i)
        self._stats: dict[str | None, Any] = {}
        self._figures: Any = None

    # shared pieces ------------------------------------------------------
    def stats(self, name: str | None = None) -> Any:
        """Stats of the plan (``name=None``) or of a baseline, cached: at the plan's
        own prefetch depth where it chose one, else at :attr:`prefetch`."""
        if name not in self._stats:
            plan = self.plan if name is None else self.baselines[name]
            own = getattr(plan, "prefetch", None)
            self._stats[name] = plan.stats(self.prefetch if own is None else own)
        return self._stats[name]

    def figures(self) -> Any:
        """The plan's :class:`~execwrap.plan.figures.PlanFigures` (every file and the
        terminal show these), cached; ``None`` without a plan."""
        if self.plan is None:
            return None
        if self._figures is None:
            from execwrap.plan.figures import plan_figures

            self._figures = plan_figures(self.plan, self.prefetch)
        return self._figures

    def named_plans(self) -> list[tuple[str, Any, Any]]:
        """``(name, plan, stats)``: the plan (named ``"plan"``), then each baseline."""
        return [("plan", self.plan, self.stats())] + [
            (name, base, self.stats(name)) for name, base in self.baselines.items()
        ]

    def unit_of(self, module_fqn: str) -> int | None:
        """Index of the unit managing ``module_fqn`` (``None`` without a plan)."""
        if self.plan is None:
            return None
        if module_fqn not in self.module_unit:
            self.module_unit[module_fqn] = self.plan.unit_of_module(module_fqn)
        return self.module_unit[module_fqn]
