"""``report.json``: the order, the plan (units, groups, notes, stats) and the baselines.

The layout is versioned by ``schema_version``
(:data:`~execwrap.report.files.REPORT_SCHEMA_VERSION`); the embedded order is
exactly :meth:`ExecutionOrder.to_dict`, so ``ExecutionOrder.load`` reads a
report too.
"""

from __future__ import annotations

import json
from typing import IO, TYPE_CHECKING, Any

from execwrap.plan.fields import STATS_FIELDS
from execwrap.report.files import REPORT_SCHEMA_VERSION
from execwrap.report.plans import stats_to_dict
from tracing.schema import Field, Record, dict_of, integer, list_of, one_of, optional, string

if TYPE_CHECKING:
    from execwrap.report.context import ReportContext

__all__ = ["REPORT_FIELDS", "report_dict", "write_json"]


def _any(value: Any, path: str) -> Any:
    """Any value (``order`` and ``plan`` are checked by their own tables)."""
    return value


#: The fields of ``report.json`` around the order and the plan, and how each is
#: checked on load (``schema_version`` first, on its own; ``order`` by
#: :data:`tracing.order.ORDER_FIELDS`, ``plan`` by
#: :data:`execwrap.plan.fields.PLAN_FIELDS`). A new field is one line here.
REPORT_FIELDS = Record(
    {
        "kind": Field(one_of("execwrap-report"), required=False),
        "title": Field(string(), required=False, default=""),
        "model_class": Field(string(), required=False, default=""),
        "prefetch": Field(integer(what="units ahead"), required=False, default=1),
        "order": Field(_any),
        "plan": Field(_any, required=False),
        # the plan's headline figures (execwrap.plan.figures), derived from the plan, not read
        "figures": Field(_any, required=False),
        "baselines": Field(
            dict_of(
                Record(
                    {
                        "policy_name": Field(string(), required=False, default=""),
                        "bucket_numel": Field(optional(integer(1)), required=False),
                        "groups": Field(list_of(list_of(string()))),
                        "stats": Field(STATS_FIELDS),
                    }
                )
            ),
            required=False,
            default={},
        ),
    }
)


def report_dict(ctx: ReportContext) -> dict[str, Any]:
    """The JSON report as a dict."""
    plan = None
    baselines: dict[str, Any] = {}
    if ctx.plan is not None:
        plan = {**ctx.plan.to_dict(), "stats": stats_to_dict(ctx.stats())}
        for name, base in ctx.baselines.items():
            baselines[name] = {
                "policy_name": str(getattr(base, "policy_name", "") or ""),
                "bucket_numel": getattr(base, "bucket_numel", None),
                "groups": [list(g) for g in base.groups],
                "stats": stats_to_dict(ctx.stats(name)),
                "estimate": _estimate_dict(base),
            }
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": "execwrap-report",
        "title": ctx.title,
        "model_class": ctx.model_class,
        "prefetch": ctx.prefetch,
        "order": ctx.order.to_dict(),
        "plan": plan,
        "figures": None if ctx.plan is None else ctx.figures().to_dict(),
        "baselines": baselines,
    }


def write_json(ctx: ReportContext, f: IO[bytes]) -> None:
    """Write :func:`report_dict` to ``f`` as indented UTF-8 JSON."""
    f.write(json.dumps(report_dict(ctx), indent=1).encode("utf-8"))


def _estimate_dict(plan: Any) -> dict[str, Any] | None:
    """A baseline's predicted step (``StepEstimate.to_dict()``), if it has one."""
    estimate = getattr(plan, "estimate", None)
    return None if estimate is None else estimate.to_dict()
