"""Lazy re-exports for package ``__init__`` modules (PEP 562).

A package that re-exports names from heavy modules (torch, FSDP) imports each
one on first use, so that importing the package itself costs nothing:

>>> __getattr__, __dir__ = lazy_exports(__name__, {"WrapPlan": "execwrap.plan.wrap_plan"}, globals())
... # doctest: +SKIP
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: MutableMapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Module-level ``__getattr__`` and ``__dir__`` for ``package``.

    Args:
        package: the package's ``__name__`` (for the ``AttributeError`` text).
        exports: public name -> module that defines it.
        namespace: the package's ``globals()``; a name, once imported, is
            stored there so later lookups skip ``__getattr__``.

    Returns:
        ``(__getattr__, __dir__)``: assign both at the package's module level.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
