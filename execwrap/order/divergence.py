"""Where two module orders first differ: :func:`first_divergence`.

Used by the cross-rank check (:mod:`execwrap.fsdp.ranks`), ``execwrap diff`` and
the drift monitor's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracing.checks import check_int
from tracing.fqn import quoted
from tracing.order import ExecutionOrder
from tracing.order_diff import first_index

__all__ = ["Divergence", "first_divergence"]


@dataclass(frozen=True)
class Divergence:
    """Where two module orders first differ.

    Attributes:
        index: first call index (into ``module_forward_order``) that differs.
        expected: module FQN at ``index`` in the first order, ``None`` if the
            first order ended there (it is a prefix of the second).
        found: module FQN at ``index`` in the second order, ``None`` if the
            second order ended there.
        context_a: calls of the first order from ``index - context`` to
            ``index + context`` (clipped to the order).
        context_b: the same window of the second order.
    """

    index: int
    expected: str | None
    found: str | None
    context_a: tuple[str, ...]
    context_b: tuple[str, ...]

    def __str__(self) -> str:
        def name(fqn: str | None) -> str:
            if fqn is None:
                return "<end of order>"
            return repr(fqn) if fqn else quoted(fqn)

        return (
            f"orders differ at call {self.index}: expected {name(self.expected)}, "
            f"found {name(self.found)} (context: {list(self.context_a)} vs "
            f"{list(self.context_b)})"
        )


def _module_calls(order: ExecutionOrder | Sequence[str], which: str) -> list[str]:
    if isinstance(order, ExecutionOrder):
        return list(order.module_forward_order)
    if isinstance(order, str) or not isinstance(order, Sequence):
        raise TypeError(
            f"first_divergence: {which} must be an ExecutionOrder or a list of module "
            f"FQNs, got {type(order).__name__}"
        )
    for fqn in order:
        if not isinstance(fqn, str):
            raise TypeError(
                f"first_divergence: {which} must hold module FQN strings, got "
                f"{type(fqn).__name__} {fqn!r}"
            )
    return list(order)


def first_divergence(
    a: ExecutionOrder | Sequence[str],
    b: ExecutionOrder | Sequence[str],
    *,
    context: int = 3,
) -> Divergence | None:
    """The first call where two module orders differ.

    Compares ``module_forward_order`` of two orders (or two lists of module
    FQNs) call by call. When one is a strict prefix of the other, the
    divergence is at the shorter one's length, and its side is ``None``.

    Args:
        a: the expected order (e.g. rank 0's, or the first iteration's).
        b: the order to check.
        context: calls of context on each side of the divergence (``>= 0``).

    Returns:
        A :class:`Divergence`, or ``None`` when the orders are equal.

    Raises:
        TypeError: ``a`` or ``b`` is neither an order nor a list of strings.
        ValueError: ``context`` is negative.

    Example:
        >>> d = first_divergence(["", "a", "b", "d"], ["", "a", "c", "d"], context=1)
        >>> (d.index, d.expected, d.found, d.context_a, d.context_b)
        (2, 'b', 'c', ('a', 'b', 'd'), ('a', 'c', 'd'))
    """
    check_int(context, "first_divergence: context")
    calls_a = _module_calls(a, "a")
    calls_b = _module_calls(b, "b")
    index = first_index(calls_a, calls_b)
    if index is None:
        return None
    lo, hi = max(0, index - context), index + context + 1
    return Divergence(
        index=index,
        expected=calls_a[index] if index < len(calls_a) else None,
        found=calls_b[index] if index < len(calls_b) else None,
        context_a=tuple(calls_a[lo:hi]),
        context_b=tuple(calls_b[lo:hi]),
    )
