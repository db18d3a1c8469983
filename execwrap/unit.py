"""One unit of a wrap plan: an FSDP1 unit, or one FSDP2 ``fully_shard`` group.

A :class:`WrapUnit` is plain data keyed by FQN strings: the modules it wraps,
the parameters it manages, their size, and the range of calls (indices into
``ExecutionOrder.module_forward_order``) over which it is active.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracing.fqn import display

__all__ = ["WrapUnit"]


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
    def from_dict(cls, data: dict[str, Any]) -> WrapUnit:
        """Inverse of :meth:`to_dict`."""
        return cls(
            module_fqns=tuple(str(m) for m in data["module_fqns"]),
            param_fqns=tuple(str(p) for p in data["param_fqns"]),
            numel=int(data["numel"]),
            bytes=int(data["bytes"]),
            first_use=None if data.get("first_use") is None else int(data["first_use"]),
            last_use=None if data.get("last_use") is None else int(data["last_use"]),
        )
