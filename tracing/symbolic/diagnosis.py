"""Why a trace failed: what the code needed a concrete value of, and where it came from.

fx fails the same way for very different causes: ``symbolically traced
variables cannot be used as inputs to control flow`` is raised for
``if use_cache:`` (a flag argument: ``concrete_args`` fixes it), for
``if x.shape[1] == 1:`` (a shape: fx Proxies have none, a run on fake tensors
knows it) and for ``if x.sum() > 0:`` (a value: only a real run decides it).
Advice that is true for one is false for the others.

:class:`ConcreteValueWatch` wraps the tracer's ``to_bool``, ``iter`` and
``keys`` (what fx calls when Python needs a concrete value of a Proxy) for one
trace and keeps the node that was asked for; :func:`diagnose` then walks that
node's inputs back to their sources: root arguments (placeholders) and
parameters or buffers (``get_attr``), split by whether a metadata read
(``.shape``, ``.dtype``, ``size()``) lies on the way.
"""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch.fx
from torch.fx.node import Node

from tracing.uses import METADATA_METHODS

__all__ = ["ConcreteValueWatch", "Diagnosis", "diagnose"]

_WATCHED = ("to_bool", "iter", "keys")
_METADATA_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "layout", "is_cuda", "T"})
_WHAT = {"to_bool": "a Python branch (if/while/and/or/bool())", "iter": "iteration", "keys": "**"}


class ConcreteValueWatch:
    """Remembers the last Proxy whose concrete value fx was asked for.

    Attributes:
        node: that Proxy's node, or ``None``.
        what: ``"to_bool"``, ``"iter"`` or ``"keys"``.
    """

    def __init__(self) -> None:
        self.node: Node | None = None
        self.what = ""

    @contextlib.contextmanager
    def patched(self, tracer: torch.fx.Tracer) -> Iterator[None]:
        """Wrap ``tracer``'s ``to_bool``/``iter``/``keys`` for one trace (restored after)."""
        saved = {name: vars(tracer)[name] for name in _WATCHED if name in vars(tracer)}
        for name in _WATCHED:
            setattr(tracer, name, self._wrap(name, getattr(tracer, name)))
        try:
            yield
        finally:
            for name in _WATCHED:
                if name in saved:
                    setattr(tracer, name, saved[name])
                else:
                    delattr(tracer, name)

    def _wrap(self, name: str, orig: Any) -> Any:
        def watched(obj: Any) -> Any:
            self.node = getattr(obj, "node", None)
            self.what = name
            result = orig(obj)
            self.node = None  # a custom tracer answered: nothing failed here
            return result

        return watched


@dataclass
class Diagnosis:
    """Where the value fx could not make concrete came from.

    Attributes:
        what: the Python construct that needed it (``"a Python branch ..."``).
        value_args: root arguments whose *values* it depends on.
        value_attrs: parameters/buffers whose values it depends on.
        shape_sources: arguments/parameters whose shape or dtype it reads.
    """

    what: str
    value_args: list[str] = field(default_factory=list)
    value_attrs: list[str] = field(default_factory=list)
    shape_sources: list[str] = field(default_factory=list)

    @property
    def cause(self) -> str:
        """The cause in words, e.g. ``"a Python branch (...) on the shape of 'input_ids'"``."""
        if self.value_args or self.value_attrs:
            names = _listed(self.value_args + self.value_attrs)
            return f"{self.what} on the value of {names}"
        if self.shape_sources:
            return (
                f"{self.what} on the shape or dtype of a tensor computed from "
                f"{_listed(self.shape_sources)} (fx Proxies carry no shapes or dtypes)"
            )
        return f"{self.what} on a traced value"


def _listed(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names[:3]) + (" ..." if len(names) > 3 else "")


def _is_metadata(node: Node) -> bool:
    if node.op == "call_method":
        return node.target in METADATA_METHODS
    if node.op == "call_function" and node.target is builtins.getattr and len(node.args) >= 2:
        return node.args[1] in _METADATA_ATTRS
    return False


def _source_name(node: Node) -> str:
    return str(node.target).lstrip("*")


def diagnose(watch: ConcreteValueWatch) -> Diagnosis | None:
    """Walk the watched node back to its sources; ``None`` if nothing was watched."""
    if watch.node is None:
        return None
    result = Diagnosis(_WHAT.get(watch.what, watch.what))
    seen: set[tuple[Node, bool]] = set()
    stack: list[tuple[Node, bool]] = [(watch.node, False)]
    while stack:
        node, through_metadata = stack.pop()
        if (node, through_metadata) in seen:
            continue
        seen.add((node, through_metadata))
        if node.op in ("placeholder", "get_attr"):
            name = _source_name(node)
            if through_metadata:
                bucket = result.shape_sources
            else:
                bucket = result.value_args if node.op == "placeholder" else result.value_attrs
            if name not in bucket:
                bucket.append(name)
            continue
        meta = through_metadata or _is_metadata(node)
        stack.extend((n, meta) for n in node.all_input_nodes)
    for name in result.value_args + result.value_attrs:
        if name in result.shape_sources:
            result.shape_sources.remove(name)
    return result
