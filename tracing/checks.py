"""Argument checks shared by tracing and execwrap (one rule, one message)."""

from __future__ import annotations

import math
import numbers
from typing import Any

__all__ = ["check_int", "check_integral", "check_size", "is_int"]


def is_int(value: Any) -> bool:
    """Whether ``value`` is an ``int`` and not a ``bool`` (``True`` is not a count).

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
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


def check_integral(
    value: Any,
    name: str,
    *,
    minimum: int = 0,
    unit: str = "",
    hint: str = "",
) -> int:
    """Return ``value`` as an ``int`` if it is an integer (NumPy's too, not a bool) ``>= minimum``.

    :func:`check_int` for counts that often come out of NumPy (a world size
    read from an array or a config): any :class:`numbers.Integral` is
    accepted and returned as a plain ``int`` (so it stays JSON-serialisable);
    a float, even a whole one, is refused. The messages are
    :func:`check_int`'s.

    Args:
        value: the argument to check.
        name: how the message names it, e.g. ``"simulate_step: world_size"``.
        minimum: the smallest allowed value.
        unit: what it counts, for the message (``"ranks"``).
        hint: text appended to the message.

    Returns:
        ``int(value)``.

    Raises:
        TypeError: ``value`` is not an integer (or is a bool).
        ValueError: ``value < minimum``.

    >>> check_integral(8, "world_size", minimum=1)  # np.int64(8) too
    8
    >>> check_integral(2.0, "world_size", minimum=1, unit="ranks")
    Traceback (most recent call last):
    ...
    TypeError: world_size must be an int >= 1 (ranks), got float 2.0
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)
    return check_int(value, name, minimum=minimum, unit=unit, hint=hint)


def check_size(
    value: Any,
    name: str,
    *,
    minimum: int = 1,
    unit: str = "",
    hint: str = "",
) -> int:
    """Return ``value`` as an ``int`` if it is a whole number ``>= minimum``.

    For sizes (elements, bytes), where ``1e8`` and ``40e9`` are how people
    write them: an integer (any :class:`numbers.Integral`, NumPy's too; not a
    ``bool``) or a finite float with no fractional part is accepted and
    returned as an ``int``; a count takes :func:`check_int` (prefetch depth)
    or :func:`check_integral` (ranks) instead.

    Args:
        value: the argument to check.
        name: how the message names it, e.g. ``"plan_wrap: memory_budget"``.
        minimum: the smallest allowed value.
        unit: what it counts, for the message (``"elements"``, ``"bytes per rank"``).
        hint: text appended to the message.

    Returns:
        ``int(value)``.

    Raises:
        TypeError: not a number, a bool, or a float with a fractional part or
            not finite.
        ValueError: ``value < minimum``.

    >>> check_size(1e8, "bucket_numel"), check_size(2**20, "bucket_numel")
    (100000000, 1048576)
    >>> check_size(0.5, "bucket_numel", unit="elements")
    Traceback (most recent call last):
    ...
    TypeError: bucket_numel must be a whole number >= 1 (elements), got float 0.5
    """
    counted = f" ({unit})" if unit else ""
    whole = not isinstance(value, bool) and (
        isinstance(value, numbers.Integral)
        or (isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer())
    )
    if not whole:
        raise TypeError(
            f"{name} must be a whole number >= {minimum}{counted}, got "
            f"{type(value).__name__} {value!r}{hint}"
        )
    if value < minimum:
        raise ValueError(
            f"{name} must be a whole number >= {minimum}{counted}, got {value!r}{hint}"
        )
    return int(value)
