"""What every report file is made from, computed once: :class:`ReportContext`.

:func:`~execwrap.report.write_report` builds one context per call; each file
is written by one method of it (``write_json``, ``write_calls_csv``,
``write_params_csv``, ``write_graphml``, ``write_html``), which hands the
context to that format's module. The format modules only read the context.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from execwrap.report import csv_files, graphml_file, html_page, json_file, tables
from tracing.order import ExecutionOrder

__all__ = ["ReportContext"]


class ReportContext:
    """The order, the plan and its baselines, with their stats and unit lookups.

    Args:
        order: the order reported.
        plan: the :class:`~execwrap.plan.WrapPlan` of ``order``, or ``None``.
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
        """The plan's :class:`~execwrap.plan_figures.PlanFigures` (every file and the
        terminal show these), cached; ``None`` without a plan."""
        if self.plan is None:
            return None
        if self._figures is None:
            from execwrap.plan_figures import plan_figures

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

    def calls_rows(self) -> Iterator[list[Any]]:
        """Rows of the module-call table (see :mod:`execwrap.report.tables`)."""
        return tables.calls_rows(self)

    def params_rows(self) -> Iterator[list[Any]]:
        """Rows of the parameter table (see :mod:`execwrap.report.tables`)."""
        return tables.params_rows(self)

    def timeline_caption(self) -> str:
        """The units-timeline caption: says how its backward half was drawn."""
        return html_page.timeline_caption(self.order)

    # one writer per file --------------------------------------------------
    def write_json(self, f: IO[bytes]) -> None:
        """``report.json``."""
        json_file.write_json(self, f)

    def write_calls_csv(self, f: IO[bytes]) -> None:
        """``calls.csv``."""
        csv_files.write_calls_csv(self, f)

    def write_params_csv(self, f: IO[bytes]) -> None:
        """``params.csv``."""
        csv_files.write_params_csv(self, f)

    def write_graphml(self, f: IO[bytes]) -> None:
        """``order.graphml``."""
        graphml_file.write_graphml(self, f)

    def write_html(self, f: IO[bytes]) -> None:
        """``report.html``."""
        html_page.write_html(self, f)
