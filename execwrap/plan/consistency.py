"""A saved :class:`~execwrap.plan.wrap_plan.WrapPlan` checked against itself and its order.

:mod:`execwrap.plan.fields` checks each field on its own and each unit's FQNs
against the order; the checks here refuse a plan whose fields contradict each
other, with the same one-line :class:`~tracing.schema.SchemaError` naming the
first bad field and its value:

* each module and each parameter is in at most one unit (FSDP would shard a
  parameter twice), every unit wraps at least one module, and one unit is the
  root's (:func:`first_overlap`, also refused by ``apply_fully_shard``);
* derived fields equal what they derive from: a unit's ``numel`` and
  ``bytes`` are the sums over its parameters (``order.params``), its
  ``first_use`` / ``last_use`` the span of its modules' calls and its
  parameters' uses (:class:`~execwrap.plan.spans.UseSpans`), each unit is a union
  of ``atomic_units`` (same modules, same parameters), and ``groups``,
  ``fsdp1_modules`` and ``stats`` are what the units give
  (:func:`check_derived`, once the plan is built);
* every FQN a field names exists: ``policy_fqns`` and ``ignored_modules`` are
  modules of the order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from execwrap.errors import PlanError
from execwrap.plan.spans import UseSpans
from execwrap.plan.stats import PlanStats
from execwrap.plan.unit import WrapUnit
from tracing.order import ExecutionOrder
from tracing.schema import SchemaError, field_path, type_and_value

__all__ = [
    "DerivedFields",
    "Overlap",
    "check_derived",
    "check_module_names",
    "check_units",
    "first_overlap",
    "overlap_error",
]


class Overlap(NamedTuple):
    """A module or parameter named by two units (or twice by one).

    Attributes:
        kind: ``"module"`` or ``"parameter"``.
        name: its FQN.
        first: index of the unit that names it first.
        second: index of the unit that names it again.
        position: its position in ``units[second].module_fqns`` / ``param_fqns``.
    """

    kind: str
    name: str
    first: int
    second: int
    position: int


class DerivedFields(Protocol):
    """What :func:`check_derived` reads of a plan (a :class:`~execwrap.plan.wrap_plan.WrapPlan`
    is one): the fields a saved plan repeats but that its units decide."""

    @property
    def groups(self) -> list[list[str]]: ...

    def fsdp1_modules(self) -> list[str]: ...

    def stats(self, prefetch: int = 1) -> PlanStats: ...


def first_overlap(units: Sequence[WrapUnit]) -> Overlap | None:
    """The first module, else the first parameter, that two units name (or
    one unit names twice), in unit order; ``None`` when the units are disjoint.

    Example:
        >>> a = WrapUnit(("",), ("w",), 1, 4, 0, 1)
        >>> first_overlap([a, WrapUnit(("fc",), ("w",), 1, 4, 1, 1)])
        Overlap(kind='parameter', name='w', first=0, second=1, position=0)
    """
    for kind in ("module", "parameter"):
        holder: dict[str, int] = {}
        for i, unit in enumerate(units):
            names = unit.module_fqns if kind == "module" else unit.param_fqns
            for k, name in enumerate(names):
                if name in holder:
                    return Overlap(kind, name, holder[name], i, k)
                holder[name] = i
    return None


def overlap_error(overlap: Overlap, units: Sequence[WrapUnit], what: str) -> PlanError:
    """The :class:`PlanError` ``what`` (``"apply_fully_shard"``) raises for ``overlap``."""
    a, b = units[overlap.first].label, units[overlap.second].label
    where = f"unit {a} twice" if overlap.first == overlap.second else f"two units ({a} and {b})"
    action = "shard it twice" if overlap.kind == "parameter" else "wrap it twice"
    return PlanError(
        f"{what}: {overlap.kind} {overlap.name!r} is in {where} of the plan; FSDP would "
        f"{action}. Build the plan again with plan_wrap (a saved plan was edited?)"
    )


def check_units(
    units: list[WrapUnit], atomic: list[WrapUnit], order: ExecutionOrder, prefix: str
) -> None:
    """The checks of a saved plan's units against each other and ``order``
    (``atomic`` empty: the plan saved no atomic units).

    Raises:
        SchemaError: naming the field path and the value (without the file).
    """
    spans = UseSpans(order)
    for key, group in (("units", units), ("atomic_units", atomic)):
        path = field_path(prefix, key)
        _check_disjoint(group, path)
        for i, unit in enumerate(group):
            _check_unit(unit, order, spans, field_path(path, i))
    if not any(u.is_root for u in units):
        raise SchemaError(
            field_path(prefix, "units"), "has no root unit (module ''); every plan has one"
        )
    if atomic:
        _check_atomic(units, atomic, prefix)


def check_module_names(names: Sequence[str], order: ExecutionOrder, path: str) -> None:
    """Every module FQN of ``names`` (a ``policy_fqns`` list) is a module of ``order``."""
    if not order.module_classes:
        return
    for k, name in enumerate(names):
        if name not in order.module_classes:
            raise SchemaError(
                field_path(path, k), f"names module {name!r}, which the order does not have"
            )


def _check_disjoint(units: list[WrapUnit], path: str) -> None:
    overlap = first_overlap(units)
    if overlap is None:
        return
    key = "module_fqns" if overlap.kind == "module" else "param_fqns"
    holder = "has" if overlap.kind == "module" else "holds"
    raise SchemaError(
        field_path(field_path(field_path(path, overlap.second), key), overlap.position),
        f"names {overlap.kind} {overlap.name!r}, which {field_path(path, overlap.first)} "
        f"{holder} too; a {overlap.kind} is in at most one unit",
    )


def _check_unit(unit: WrapUnit, order: ExecutionOrder, spans: UseSpans, where: str) -> None:
    """One unit: it has a module, its sizes add up over its parameters, and its
    use span is the order's."""
    if not unit.module_fqns:
        raise SchemaError(field_path(where, "module_fqns"), "is empty; a unit wraps a module")
    infos = order.params
    if infos and all(p in infos for p in unit.param_fqns):
        count = len(unit.param_fqns)
        params = f"its {count} parameter{'' if count == 1 else 's'}"
        for key, unit_word, stated in (
            ("numel", "elements", unit.numel),
            ("bytes", "bytes", unit.bytes),
        ):
            total = sum(getattr(infos[p], key) for p in unit.param_fqns)
            if stated != total:
                raise SchemaError(
                    field_path(where, key),
                    f"{stated} {unit_word}, but {params} have {total} (order.params)",
                )
    first, last = spans.span(unit.module_fqns, unit.param_fqns)
    if (unit.first_use, unit.last_use) != (first, last):
        key = "first_use" if unit.first_use != first else "last_use"
        raise SchemaError(
            field_path(where, key),
            f"calls {_span(unit.first_use, unit.last_use)}, but the order's calls of its "
            f"modules and uses of its parameters span {_span(first, last)}",
        )


def _span(first: int | None, last: int | None) -> str:
    return "null (never called)" if first is None else f"{first}..{last}"


def _check_atomic(units: list[WrapUnit], atomic: list[WrapUnit], prefix: str) -> None:
    """Each unit is the union of the atomic units whose modules it has."""
    unit_of = {m: i for i, u in enumerate(units) for m in u.module_fqns}
    atomic_path = field_path(prefix, "atomic_units")
    members: dict[int, set[str]] = {i: set() for i in range(len(units))}
    covered: set[str] = set()
    for i, a in enumerate(atomic):
        path = field_path(field_path(atomic_path, i), "module_fqns")
        owners: list[int] = []
        for k, m in enumerate(a.module_fqns):
            owner = unit_of.get(m)
            if owner is None:
                raise SchemaError(
                    field_path(path, k),
                    f"names module {m!r}, which no unit of {field_path(prefix, 'units')} has",
                )
            owners.append(owner)
        if len(set(owners)) > 1:
            raise SchemaError(
                path,
                f"its modules are in {field_path(prefix, 'units')}[{owners[0]}] and "
                f"[{next(o for o in owners if o != owners[0])}]; an atomic unit is in one unit",
            )
        covered.update(a.module_fqns)
        members[owners[0]].update(a.param_fqns)
    for j, unit in enumerate(units):
        path = field_path(field_path(prefix, "units"), j)
        for k, m in enumerate(unit.module_fqns):
            if m not in covered:
                raise SchemaError(
                    field_path(field_path(path, "module_fqns"), k),
                    f"names module {m!r}, which no unit of {atomic_path} has",
                )
        if set(unit.param_fqns) != members[j]:
            extra = sorted(set(unit.param_fqns) ^ members[j])[0]
            holds = "holds" if extra in unit.param_fqns else "does not hold"
            raise SchemaError(
                field_path(path, "param_fqns"),
                f"{holds} parameter {extra!r}, but its atomic units in {atomic_path} "
                f"{'do not' if holds == 'holds' else 'do'}; a unit holds its atomic units' "
                "parameters",
            )


def check_derived(plan: DerivedFields, data: dict[str, Any], *, source: str, prefix: str) -> None:
    """``groups``, ``fsdp1_modules`` and ``stats`` of a saved plan (``data``,
    when it has them) are what ``plan``'s units give.

    Raises:
        SchemaError: naming ``source``, the field path and the value.
    """
    try:
        derived: list[tuple[str, Any]] = [
            ("groups", plan.groups),
            ("fsdp1_modules", plan.fsdp1_modules()),
        ]
        stats = data.get("stats")
        if isinstance(stats, dict):
            saved = plan.stats(stats["prefetch"]).to_dict()
            derived += [(f"stats.{k}", saved[k]) for k in saved if k in stats]
    except (PlanError, ValueError, TypeError, KeyError) as e:
        raise SchemaError(
            prefix, f"its units give no stats ({type(e).__name__}: {e})", source, "WrapPlan"
        ) from None
    for key, want in derived:
        node: Any = data
        for part in key.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is _MISSING or node == want:
            continue
        path = prefix
        for part in key.split("."):
            path = field_path(path, part)
        raise SchemaError(
            path,
            f"is {_shown(node)}, but the plan's units give {_shown(want)} (derived from "
            f"{field_path(prefix, 'units')}, not read)",
            source,
            "WrapPlan",
        )


_MISSING = object()


def _shown(value: Any, limit: int = 60) -> str:
    """A value in a message: short ones as they are, long ones by type and size."""
    text = repr(value)
    return text if len(text) <= limit else type_and_value(value)
