"""Argument checks shared by tracing and execwrap (one rule, one message)."""

from __future__ import annotations

from typing import Any

__all__ = ["check_int", "is_int"]


def is_int(value: Any) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool`` (``True`` is not a count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(
    value: Any,
    name: str,
    *,
    minimum: int = 0,
    unit: str = "",
    hint: str = "",
) -> int:
    """Return ``value`` if it is an int (not a bool) ``>= minimum``.

    Args:
        value: the argument to check.
        name: how the message names it, e.g. ``"plan_wrap: bucket_numel"``.
        minimum: the smallest allowed value.
        unit: what it counts, for the message (``"elements"``, ``"units ahead"``).
        hint: text appended to the message (e.g. ``"; pass None for no bucketing"``).

    Returns:
        ``value``.

    Raises:
        TypeError: ``value`` is not an int (or is a bool).
        ValueError: ``value < minimum``.

    >>> check_int(2, "prefetch")
    2
    >>> check_int(-1, "prefetch")
    Traceback (most recent call last):
    ...
    ValueError: prefetch must be an int >= 0, got -1
    """
    counted = f" ({unit})" if unit else ""
    if not is_int(value):
        raise TypeError(
            f"{name} must be an int >= {minimum}{counted}, got {type(value).__name__} "
            f"{value!r}{hint}"
        )
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{counted}, got {value!r}{hint}")
    return int(value)
