"""Saved reports and orders, as ``show`` and ``diff`` read them: :func:`load_saved`.

A saved file is a ``report.json`` (``schema_version`` of the report, an
``"order"`` and a ``"plan"``, see :mod:`execwrap.report`), a bare order
(:meth:`tracing.ExecutionOrder.save`) or a plan file (:func:`execwrap.save_plan`,
``execwrap fit --out``: the plan with its order). The order is rebuilt with
:meth:`~tracing.ExecutionOrder.from_dict`, the plan with
:meth:`~execwrap.plan.wrap_plan.WrapPlan.from_dict`; every problem is a
:class:`~execwrap.cli.errors.CLIError` naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execwrap.cli.errors import CLIError
from execwrap.cli.text import shorten, terminal_safe
from execwrap.plan.figures import plan_figures
from execwrap.plan.pinned import is_pinned_dict, plan_from_pinned_dict
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.report.files import REPORT_SCHEMA_VERSION
from execwrap.report.json_file import REPORT_FIELDS
from tracing.checks import is_int
from tracing.fqn import display
from tracing.order import ExecutionOrder
from tracing.order_fields import parse_json
from tracing.schema import SchemaError, field_path

__all__ = ["SavedReport", "call_label", "load_saved"]


@dataclass(frozen=True)
class SavedReport:
    """A saved order, with its plan when the file is a report.

    Attributes:
        order: the order.
        plan: the report's plan; ``None`` for a bare order or an order-only report.
        plan_stats: the plan's ``"stats"`` as saved (at the report's prefetch), or ``None``.
        pinned: the file is a plan file (:func:`execwrap.save_plan`, ``execwrap fit --out``).
    """

    order: ExecutionOrder
    plan: WrapPlan | None
    plan_stats: dict[str, Any] | None
    pinned: bool = False


def load_saved(path: Path) -> SavedReport:
    """Read a saved report, a bare order or a plan file (``path`` as :func:`~execwrap.cli.options.locate_saved`
    gives it), every field checked in one pass.

    The report's own fields are checked against
    :data:`~execwrap.report.json_file.REPORT_FIELDS`, the order by
    :meth:`ExecutionOrder.from_dict`, the plan by :meth:`WrapPlan.from_dict`
    (its units against the order).

    Raises:
        CLIError: the file cannot be read, is not UTF-8 JSON (nested too
            deeply included), is not an execwrap report, order or plan file, is of another
            schema version, or a field is malformed; one line naming the file and
            the field.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CLIError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CLIError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    source = str(path)
    try:
        data = parse_json(text, source)
        if is_pinned_dict(data):  # a plan file (save_plan, execwrap fit --out)
            plan = plan_from_pinned_dict(data, source=source)
            return SavedReport(plan.order, plan, data["plan"].get("stats"), pinned=True)
        order_data, plan_data, prefix, report = _unwrap(data, path)
        order = ExecutionOrder.from_dict(order_data, source=source, prefix=prefix)
        if report is not None:
            _check_report(report, order, source)
        if plan_data is None:
            return SavedReport(order, None, None)
        plan = WrapPlan.from_dict(plan_data, order, source=source, prefix="plan")
        if report is not None:
            _check_figures(report, plan, source)
    except ValueError as exc:  # SchemaError included: names the file and the field
        raise CLIError(shorten(exc, 400)) from exc
    stats = plan_data.get("stats")  # checked by WrapPlan.from_dict: a dict or None
    return SavedReport(order, plan, stats)


def _unwrap(data: Any, path: Path) -> tuple[Any, Any, str, dict[str, Any] | None]:
    """``(order data, plan data or None, where the order sits, the report's
    checked fields)`` of a report; ``(data, None, "", None)`` of a bare order."""
    not_ours = f"{path} is not an execwrap report, order or plan file"
    if not isinstance(data, dict):
        raise CLIError(f"{not_ours} (a JSON {type(data).__name__}, not an object)")
    if "order" in data and "module_forward_order" not in data:  # a report
        version = data.get("schema_version")
        if version is None:
            raise CLIError(f"{not_ours} (an 'order' but no 'schema_version')")
        if not is_int(version) or version != REPORT_SCHEMA_VERSION:
            raise CLIError(
                f"{path}: unsupported execwrap report schema_version {version!r} (this "
                f"execwrap reads version {REPORT_SCHEMA_VERSION}); write the report again "
                "with this version's 'execwrap report'"
            )
        fields = REPORT_FIELDS.check(data, source=str(path), what="report")
        return fields["order"], fields["plan"], "order", fields
    if "schema_version" not in data and "module_forward_order" not in data:
        raise CLIError(f"{not_ours} (no 'schema_version' / 'module_forward_order')")
    return data, None, "", None


def _check_report(fields: dict[str, Any], order: ExecutionOrder, source: str) -> None:
    """The report's own fields against its order: ``model_class`` is the
    order's root class, every stats block (the plan's and each baseline's) is
    at the report's ``prefetch``, and every module of a baseline's groups is a
    module of the order.

    Raises:
        SchemaError: naming ``source``, the field path and the value.
    """
    classes = order.module_classes
    root = classes.get("")
    if fields["model_class"] and root is not None and fields["model_class"] != root:
        raise SchemaError(
            "model_class",
            f"is {fields['model_class']!r}, but order.module_classes[''] is {root!r}",
            source,
            "report",
        )
    prefetch = fields["prefetch"]
    plan = fields["plan"]
    # a plan's stats are at its own prefetch depth where it chose one (an auto plan's)
    blocks = [(field_path("baselines", n), b) for n, b in fields["baselines"].items()]
    if isinstance(plan, dict):
        blocks.insert(0, ("plan", plan))
    for where, block in blocks:
        stats = block.get("stats")
        own = block.get("prefetch")
        expected = own if is_int(own) else prefetch
        if (
            isinstance(stats, dict)
            and is_int(stats.get("prefetch"))
            and stats["prefetch"] != expected
        ):
            whose = "the plan's own prefetch" if is_int(own) else "the report's prefetch"
            raise SchemaError(
                field_path(field_path(where, "stats"), "prefetch"),
                f"is {stats['prefetch']!r}, but {whose} is {expected}",
                source,
                "report",
            )
    for name, baseline in fields["baselines"].items():
        for i, group in enumerate(baseline["groups"]):
            for k, fqn in enumerate(group):
                if classes and fqn not in classes:
                    path = field_path(field_path(field_path("baselines", name), "groups"), i)
                    raise SchemaError(
                        field_path(path, k),
                        f"names module {fqn!r}, which the order does not have",
                        source,
                        "report",
                    )


def _check_figures(fields: dict[str, Any], plan: WrapPlan, source: str) -> None:
    """The report's ``figures``, when saved, are what the plan gives
    (:func:`~execwrap.plan.figures.plan_figures`: derived, not read).

    Raises:
        SchemaError: naming ``source``, the field and both values.
    """
    saved = fields.get("figures")
    if saved is None:
        return
    want = plan_figures(plan, fields["prefetch"]).to_dict()
    if not isinstance(saved, dict):
        raise SchemaError("figures", f"expected an object, got {saved!r}", source, "report")
    for key, value in want.items():
        if key in saved and saved[key] != value:
            raise SchemaError(
                field_path("figures", key),
                f"is {saved[key]!r}, but the plan gives {value!r} (derived from plan, not read)",
                source,
                "report",
            )


def call_label(fqn: str | None) -> str:
    """A module call as ``show`` and ``diff`` print it: the root as ``<root>``,
    past the end of an order (``None``) as ``(end)``; escaped as the terminal
    shows it (:func:`~execwrap.cli.text.terminal_safe`), so columns line up."""
    return "(end)" if fqn is None else terminal_safe(display(fqn))
