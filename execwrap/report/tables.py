"""The report's two tables: one row per module call, one row per parameter.

``calls.csv`` and ``params.csv`` hold them; the HTML page shows them folded.
The columns are :data:`CALLS_COLUMNS` and :data:`PARAMS_COLUMNS`; a ``unit``
cell is the index in ``plan.units`` of the unit managing the module or
parameter (empty without a plan).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from execwrap.util.formatting import blank
from tracing.fqn import owner_fqn
from tracing.order import ExecutionOrder

if TYPE_CHECKING:
    from execwrap.report.context import ReportContext

__all__ = [
    "CALLS_COLUMNS",
    "PARAMS_COLUMNS",
    "calls_rows",
    "iter_calls",
    "own_numel",
    "params_rows",
]

CALLS_COLUMNS = ("index", "phase", "fqn", "class", "unit", "own_numel")
PARAMS_COLUMNS = (
    "fqn",
    "forward_index",
    "first_forward_call",
    "backward_index",
    "unit",
    "numel",
    "dtype",
    "shape",
    "requires_grad",
    "shared_with",
)


def own_numel(order: ExecutionOrder) -> dict[str, int]:
    """Module FQN -> elements of its own (directly held, canonical) parameters."""
    out: dict[str, int] = {}
    for fqn, info in order.params.items():
        owner = owner_fqn(fqn)
        out[owner] = out.get(owner, 0) + info.numel
    return out


def iter_calls(order: ExecutionOrder) -> Iterator[tuple[int, str, str]]:
    """``(index, phase, module_fqn)`` for every recorded module call.

    Phases: ``"forward"`` (``module_forward_order``), ``"backward"``
    (``module_backward_order``), ``"recompute"`` (``recompute_order``); the
    index counts within its phase.
    """
    for phase, calls in (
        ("forward", order.module_forward_order),
        ("backward", order.module_backward_order),
        ("recompute", order.recompute_order),
    ):
        for i, fqn in enumerate(calls):
            yield i, phase, fqn


def calls_rows(ctx: ReportContext) -> Iterator[list[Any]]:
    """The rows of the module-call table (:data:`CALLS_COLUMNS`)."""
    own = own_numel(ctx.order)
    classes = ctx.order.module_classes
    for index, phase, fqn in iter_calls(ctx.order):
        unit = ctx.unit_of(fqn)
        yield [
            index,
            phase,
            fqn,
            classes.get(fqn, ""),
            "" if unit is None else unit,
            own.get(fqn, 0),
        ]


def params_rows(ctx: ReportContext) -> Iterator[list[Any]]:
    """The rows of the parameter table (:data:`PARAMS_COLUMNS`)."""
    order = ctx.order
    forward_index = {fqn: i for i, fqn in enumerate(order.param_forward_order)}
    first_call = order.param_first_use_index()
    backward_index: dict[str, int] = {}
    for i, fqn in enumerate(order.param_backward_order):
        backward_index.setdefault(fqn, i)
    for fqn, info in order.params.items():
        yield [
            fqn,
            blank(forward_index.get(fqn)),
            blank(first_call.get(fqn)),
            blank(backward_index.get(fqn)),
            blank(ctx.param_unit.get(fqn)),
            info.numel,
            info.dtype,
            "x".join(str(s) for s in info.shape),
            info.requires_grad,
            ";".join(order.shared_params.get(fqn, [])),
        ]
