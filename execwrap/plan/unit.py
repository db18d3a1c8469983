"""One unit of a wrap plan: an FSDP1 unit, or one FSDP2 ``fully_shard`` group.

A :class:`WrapUnit` is plain data keyed by FQN strings: the modules it wraps,
the parameters it manages, their size, and the range of calls (indices into
``ExecutionOrder.module_forward_order``) over which it is active.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tracing.fqn import ancestors, display
from tracing.schema import (
    Field,
    Record,
    SchemaError,
    field_path,
    integer,
    list_of,
    optional,
    string,
)

__all__ = ["UNIT_FIELDS", "WrapUnit", "enclosing_units"]

#: The fields of :meth:`WrapUnit.to_dict` and how each is checked on load.
UNIT_FIELDS = Record(
    {
        "module_fqns": Field(list_of(string())),
        "param_fqns": Field(list_of(string())),
        "numel": Field(integer(what="elements")),
        "bytes": Field(integer(what="bytes")),
        "first_use": Field(optional(integer(what="a call index")), required=False),
        "last_use": Field(optional(integer(what="a call index")), required=False),
    }
)


@dataclass(frozen=True)
class WrapUnit:
    """One FSDP unit (FSDP1) or one ``fully_shard`` group (FSDP2).

    Attributes:
        module_fqns: the module(s) of the unit: one module, or several for a
            merged FSDP2 group (``fully_shard([m1, m2])``), in execution order.
        param_fqns: canonical FQNs of the parameters this unit manages (its
            modules' parameters not managed by a nested unit), in forward order.
        numel: elements over ``param_fqns``.
        bytes: bytes over ``param_fqns`` (numel times each dtype's size).
        first_use: the first call index (in ``order.module_forward_order``) of
            any of the unit's modules (``None`` if none is ever called).
        last_use: the last call index at which the unit is still active: the
            last call of any of its modules or of any module nested inside
            them (the range of calls a unit's forward spans), or the last
            ``order.param_uses`` entry using one of its parameters (a
            parameter used from elsewhere), whichever is later. For the root
            unit this is the last call of the whole forward. ``None`` exactly
            when ``first_use`` is ``None``.
    """

    module_fqns: tuple[str, ...]
    param_fqns: tuple[str, ...]
    numel: int
    bytes: int
    first_use: int | None
    last_use: int | None

    @property
    def label(self) -> str:
        """``"+"``-joined module FQNs, the root written ``<root>``."""
        return "+".join(display(m) for m in self.module_fqns)

    @property
    def is_root(self) -> bool:
        """Whether this unit is the root module's."""
        return "" in self.module_fqns

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists instead of tuples)."""
        return {
            "module_fqns": list(self.module_fqns),
            "param_fqns": list(self.param_fqns),
            "numel": self.numel,
            "bytes": self.bytes,
            "first_use": self.first_use,
            "last_use": self.last_use,
        }

    @classmethod
    def from_dict(cls, data: Any, *, path: str = "") -> WrapUnit:
        """Inverse of :meth:`to_dict`, checked against :data:`UNIT_FIELDS`.

        Args:
            data: the dict (parsed JSON).
            path: where ``data`` sits in its file (``"plan.units[2]"``), for messages.

        Raises:
            tracing.schema.SchemaError: (a ``ValueError``) a field is missing or
                of the wrong type or range, or exactly one of ``first_use`` /
                ``last_use`` is ``null``, or ``first_use > last_use``.
        """
        f = UNIT_FIELDS(data, path)
        first, last = f["first_use"], f["last_use"]
        if (first is None) != (last is None) or (first is not None and first > last):
            raise SchemaError(
                field_path(path, "first_use"),
                f"first_use {first!r} and last_use {last!r} are not a range of calls "
                "(both null, or first_use <= last_use)",
            )
        return cls(
            module_fqns=tuple(f["module_fqns"]),
            param_fqns=tuple(f["param_fqns"]),
            numel=f["numel"],
            bytes=f["bytes"],
            first_use=first,
            last_use=last,
        )


def enclosing_units(units: Sequence[WrapUnit]) -> list[set[int]]:
    """For each unit, the indices of the other units whose modules enclose one of its modules.

    FSDP nests units by module tree: a unit whose module is an ancestor of another unit's
    module stays unsharded while the inner one runs. Walks each module FQN up to the root
    (O(units x depth)) instead of comparing every pair of units.

    Example: units ``[("",), ("layers.0",)]`` give ``[set(), {0}]``.
    """
    unit_of: dict[str, int] = {}
    for i, unit in enumerate(units):
        for fqn in unit.module_fqns:
            unit_of[fqn] = i
    out: list[set[int]] = []
    for i, unit in enumerate(units):
        anc: set[int] = set()
        for fqn in unit.module_fqns:
            for a in ancestors(fqn):
                j = unit_of.get(a)
                if a != fqn and j is not None and j != i:
                    anc.add(j)
        out.append(anc)
    return out
