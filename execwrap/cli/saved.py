"""Saved reports and orders, as ``show`` and ``diff`` read them: :func:`load_saved`.

A saved file is a ``report.json`` (``schema_version`` of the report, an
``"order"`` and a ``"plan"``, see :mod:`execwrap.report`) or a bare order
(:meth:`tracing.ExecutionOrder.save`). The order is rebuilt with
:meth:`~tracing.ExecutionOrder.from_dict`, the plan with
:meth:`~execwrap.plan.WrapPlan.from_dict`; every problem is a
:class:`~execwrap.cli.errors.CLIError` naming the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execwrap.cli.errors import CLIError
from execwrap.cli.text import shorten
from execwrap.errors import ExecwrapError
from execwrap.plan import WrapPlan
from execwrap.report.files import REPORT_SCHEMA_VERSION
from tracing import ExecutionOrder
from tracing.fqn import display

__all__ = ["SavedReport", "call_label", "load_saved"]


@dataclass(frozen=True)
class SavedReport:
    """A saved order, with its plan when the file is a report.

    Attributes:
        order: the order.
        plan: the report's plan; ``None`` for a bare order or an order-only report.
        plan_stats: the plan's ``"stats"`` as saved (at the report's prefetch), or ``None``.
    """

    order: ExecutionOrder
    plan: WrapPlan | None
    plan_stats: dict[str, Any] | None


def load_saved(path: Path) -> SavedReport:
    """Read a saved report or a bare order (``path`` as :func:`~execwrap.cli.options.locate_saved`
    gives it).

    Raises:
        CLIError: the file cannot be read, is not JSON, is not an execwrap
            report or order, is of another schema version, or is malformed.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise CLIError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CLIError(f"{path}: not valid JSON ({exc})") from exc
    order_data, plan_data = _unwrap(data, path)
    try:
        order = ExecutionOrder.from_dict(order_data, source=str(path))
    except ValueError as exc:
        raise CLIError(shorten(exc, 300)) from exc
    if plan_data is None:
        return SavedReport(order, None, None)
    try:
        plan = WrapPlan.from_dict(plan_data, order)
    except (ValueError, TypeError, KeyError, ExecwrapError) as exc:
        raise CLIError(f"{path}: malformed report 'plan': {shorten(exc, 240)}") from exc
    stats = plan_data.get("stats")  # from_dict took it: a dict
    return SavedReport(order, plan, stats if isinstance(stats, dict) else None)


def _unwrap(data: Any, path: Path) -> tuple[Any, Any]:
    """``(order data, plan data or None)`` of a report; ``(data, None)`` of a bare order."""
    not_ours = f"{path} is not an execwrap report or order"
    if not isinstance(data, dict):
        raise CLIError(f"{not_ours} (a JSON {type(data).__name__}, not an object)")
    if "order" in data and "module_forward_order" not in data:  # a report
        version = data.get("schema_version")
        if version is None:
            raise CLIError(f"{not_ours} (an 'order' but no 'schema_version')")
        if version != REPORT_SCHEMA_VERSION:
            raise CLIError(
                f"{path}: unsupported execwrap report schema_version {version!r} (this "
                f"execwrap reads version {REPORT_SCHEMA_VERSION}); write the report again "
                "with this version's 'execwrap report'"
            )
        return data["order"], data.get("plan")
    if "schema_version" not in data and "module_forward_order" not in data:
        raise CLIError(f"{not_ours} (no 'schema_version' / 'module_forward_order')")
    return data, None


def call_label(fqn: str | None) -> str:
    """A module call as ``show`` and ``diff`` print it: the root as ``<root>``,
    past the end of an order (``None``) as ``(end)``."""
    return "(end)" if fqn is None else display(fqn)
