"""Where two execution orders of the same model first differ.

Used by the capture ladder to check a symbolic trace against a runtime
recording of the same call: the module call order first (the call index, and
the module each order has there), then the parameters' first-use order.

>>> from tracing.order import ExecutionOrder
>>> a = ExecutionOrder(module_forward_order=["", "x", "y"], module_classes={"x": "A", "y": "B"})
>>> b = ExecutionOrder(module_forward_order=["", "y"], module_classes={"x": "A", "y": "B"})
>>> first_difference(a, b, a_name="the trace", b_name="the run")
"at module call 1 the trace has 'x' (A) but the run has 'y' (B)"
"""

from __future__ import annotations

from collections.abc import Sequence

from tracing.fqn import quoted
from tracing.order import ExecutionOrder

__all__ = ["first_difference", "first_index"]


def _module(order: ExecutionOrder, i: int) -> str:
    calls = order.module_forward_order
    if i >= len(calls):
        return "no call (its order ends there)"
    fqn = calls[i]
    cls = order.module_classes.get(fqn)
    return quoted(fqn) + (f" ({cls})" if cls else "")


def _param(order: ExecutionOrder, i: int) -> str:
    params = order.param_forward_order
    return quoted(params[i]) if i < len(params) else "no parameter (its order ends there)"


def first_index(a: Sequence[str], b: Sequence[str]) -> int | None:
    """The first position where ``a`` and ``b`` differ: where their items
    differ, else the shorter one's length when one is a strict prefix of the
    other; ``None`` when they are equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def first_difference(
    a: ExecutionOrder, b: ExecutionOrder, *, a_name: str = "A", b_name: str = "B"
) -> str | None:
    """Where ``a`` and ``b`` first differ, in one sentence; ``None`` if they agree.

    Compares ``module_forward_order`` call by call, then
    ``param_forward_order`` position by position.

    Args:
        a: the order expected (e.g. the symbolic trace).
        b: the order found (e.g. the runtime recording).
        a_name: how the sentence names ``a``.
        b_name: how the sentence names ``b``.

    Returns:
        e.g. ``"at module call 3 the trace has 'mask_proj' (Linear) but the run
        has 'proj' (Linear)"``, or ``None``.
    """
    i = first_index(a.module_forward_order, b.module_forward_order)
    if i is not None:
        return f"at module call {i} {a_name} has {_module(a, i)} but {b_name} has {_module(b, i)}"
    i = first_index(a.param_forward_order, b.param_forward_order)
    if i is not None:
        return (
            f"at position {i} of the parameters' first-use order {a_name} has {_param(a, i)} "
            f"but {b_name} has {_param(b, i)}"
        )
    return None
