"""A :class:`~execwrap.plan.wrap_plan.WrapPlan` on disk: its JSON fields and the checks on load.

:data:`PLAN_FIELDS` says how each field of ``WrapPlan.to_dict()`` is checked
(one pass, strict JSON types, one-line errors naming the file and the field;
see :mod:`tracing.schema`); :func:`plan_fields` also checks every unit against
its order, the fields against each other (:mod:`execwrap.plan.consistency`)
and reads the auto-planner's estimate and search.
"""

from __future__ import annotations

from typing import Any

from execwrap.plan.consistency import check_module_names, check_units
from execwrap.plan.search_record import PlanSearch
from execwrap.plan.training_step import TrainingStep
from execwrap.plan.unit import WrapUnit
from execwrap.util.mesh import MeshShape
from tracing.checks import is_int
from tracing.order import ExecutionOrder
from tracing.schema import (
    Field,
    Record,
    SchemaError,
    boolean,
    field_path,
    integer,
    list_of,
    optional,
    string,
    type_and_value,
)

__all__ = [
    "PLAN_FIELDS",
    "PLAN_SCHEMA_VERSION",
    "READABLE_PLAN_VERSIONS",
    "STATS_FIELDS",
    "plan_fields",
]


def plan_fields(data: Any, order: ExecutionOrder, *, source: str, prefix: str) -> dict[str, Any]:
    """The :class:`~execwrap.plan.wrap_plan.WrapPlan` keywords (all but ``order``) of a saved plan, checked.

    Raises:
        ValueError: another layout version, or a malformed field (a
            :class:`~tracing.schema.SchemaError` naming ``source`` and the field).
    """
    what = "WrapPlan"
    if not isinstance(data, dict):
        raise SchemaError(prefix, f"expected an object, got {type_and_value(data)}", source, what)
    version = data.get("schema_version", PLAN_SCHEMA_VERSION)
    if not is_int(version) or version not in READABLE_PLAN_VERSIONS:
        raise ValueError(
            f"{source}: unsupported WrapPlan schema_version {version!r} (this execwrap reads "
            f"{', '.join(map(str, READABLE_PLAN_VERSIONS))}); build the plan again with "
            "plan_wrap"
        )
    f = PLAN_FIELDS.check(data, source=source, prefix=prefix, what=what)
    try:
        units = [_unit(u, order, field_path(prefix, "units"), i) for i, u in enumerate(f["units"])]
        atomic = [
            _unit(u, order, field_path(prefix, "atomic_units"), i)
            for i, u in enumerate(f["atomic_units"])
        ]
        check_units(units, atomic, order, prefix)
        for key in ("policy_fqns", "ignored_modules"):
            check_module_names(f[key], order, field_path(prefix, key))
    except SchemaError as e:
        raise SchemaError(e.path, e.problem, source, what) from None
    return dict(
        units=units,
        atomic_units=atomic or list(units),
        notes=f["notes"],
        bucket_numel=f["bucket_numel"],
        policy_name=f["policy_name"],
        policy_fqns=tuple(f["policy_fqns"]),
        ignored_modules=tuple(f["ignored_modules"]),
        **_auto_fields(f, len(units), prefix, source),
    )


#: Version of the layout written by :meth:`WrapPlan.to_dict` (2: the auto-planner's
#: ``prefetch``, ``reshard_after_forward``, ``estimate`` and ``search``; 3: the
#: ``training`` step).
PLAN_SCHEMA_VERSION = 3


#: Layout versions :meth:`WrapPlan.from_dict` reads (version 1 has no auto-planner fields,
#: version 2 no training step).
READABLE_PLAN_VERSIONS = (1, 2, 3)


def _any(value: Any, path: str) -> Any:
    """Any value (units are checked one by one, with their order)."""
    return value


def _mesh(value: Any, path: str) -> MeshShape:
    """A :class:`~execwrap.util.mesh.MeshShape` as ``to_dict`` writes it."""
    try:
        return MeshShape.from_dict(value)
    except (TypeError, ValueError) as e:
        raise SchemaError(
            path, f"expected {{replicate, shard, tp}} ranks >= 1, got {value!r} ({e})"
        ) from None


def _auto_fields(f: dict[str, Any], num_units: int, prefix: str, source: str) -> dict[str, Any]:
    """The auto-planner's fields of a checked :data:`PLAN_FIELDS` dict (``None``
    where absent: version-1 plans and plans not made by the auto-planner)."""
    reshard = f["reshard_after_forward"]
    if reshard is not None and len(reshard) != num_units:
        raise SchemaError(
            field_path(prefix, "reshard_after_forward"),
            f"has {len(reshard)} entries for {num_units} units",
            source,
            "WrapPlan",
        )
    from execwrap.plan.estimate import StepEstimate

    readers: dict[str, Any] = {
        "estimate": StepEstimate.from_dict,
        "search": PlanSearch.from_dict,
        "training": TrainingStep.from_dict,
    }
    read: dict[str, Any] = {}
    for key, reader in readers.items():
        try:
            read[key] = None if f[key] is None else reader(f[key])
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise SchemaError(
                field_path(prefix, key), f"malformed ({type(e).__name__}: {e})", source, "WrapPlan"
            ) from None
    return {
        "prefetch": f["prefetch"],
        "reshard_after_forward": None if reshard is None else tuple(reshard),
        **read,
        "mesh": f["mesh"],
    }


def _unit(data: Any, order: ExecutionOrder, path: str, index: int) -> WrapUnit:
    """One saved unit, checked, and checked against ``order``."""
    where = field_path(path, index)
    unit = WrapUnit.from_dict(data, path=where)
    for key, names, known, what in (
        ("module_fqns", unit.module_fqns, order.module_classes, "module"),
        ("param_fqns", unit.param_fqns, order.params, "parameter"),
    ):
        if not order.module_classes and not order.params:  # a hand-built order, no tables
            continue
        for k, name in enumerate(names):
            if name not in known:
                raise SchemaError(
                    field_path(field_path(where, key), k),
                    f"names {what} {name!r}, which the order does not have",
                )
    calls = len(order.module_forward_order)
    if unit.last_use is not None and unit.last_use >= calls:
        raise SchemaError(
            field_path(where, "last_use"),
            f"call {unit.last_use} is past the end of the order's module_forward_order "
            f"({calls} calls)",
        )
    return unit


#: ``stats`` as :meth:`PlanStats.to_dict` writes it (read by ``execwrap show``).
STATS_FIELDS = Record(
    {
        "num_units": Field(integer(what="units")),
        "all_gathers_per_step": Field(integer()),
        "all_gathers_per_step_no_reshard": Field(integer(), required=False),
        "reduce_scatters_per_step": Field(integer()),
        "bytes_per_all_gather": Field(list_of(integer(what="bytes"))),
        "largest_unit_bytes": Field(integer(what="bytes")),
        "peak_unsharded_bytes": Field(integer(what="bytes")),
        "prefetch": Field(integer(what="units ahead")),
        "total_bytes": Field(integer(what="bytes"), required=False),
        "peak_unsharded_bytes_no_reshard": Field(integer(what="bytes"), required=False),
    }
)


#: The fields of :meth:`WrapPlan.to_dict` and how each is checked on load
#: (``schema_version`` first, on its own; ``groups`` and ``fsdp1_modules`` are
#: derived from the units and not read). A new field is one line here.
PLAN_FIELDS = Record(
    {
        "policy_name": Field(string(), required=False, default=""),
        "bucket_numel": Field(optional(integer(1, what="elements")), required=False),
        "policy_fqns": Field(list_of(string()), required=False, default=[]),
        "ignored_modules": Field(list_of(string()), required=False, default=[]),
        "units": Field(list_of(_any)),
        "atomic_units": Field(list_of(_any), required=False, default=[]),
        "notes": Field(list_of(string()), required=False, default=[]),
        "stats": Field(optional(STATS_FIELDS), required=False),
        # schema 2: the auto-planner's choices (absent in version-1 plans)
        "prefetch": Field(optional(integer(what="units ahead")), required=False),
        "reshard_after_forward": Field(optional(list_of(boolean())), required=False),
        "estimate": Field(optional(_any), required=False),
        "search": Field(optional(_any), required=False),
        # the mesh (HSDP / tensor parallelism) the plan is for; absent: FSDP over all ranks
        "mesh": Field(optional(_mesh), required=False),
        # schema 3: the training step (absent in version-1 and -2 plans)
        "training": Field(optional(_any), required=False),
    }
)
