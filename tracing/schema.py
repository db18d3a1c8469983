"""Check loaded JSON against a table of fields: one pass, a one-line error naming the field.

Files that execwrap reads back (a saved :class:`~tracing.ExecutionOrder`, a
``report.json``) may be damaged, hand-edited or written by someone else. Each
layout is a table: a :class:`Record` of named fields, each with a checker
(:func:`string`, :func:`integer`, :func:`list_of`, ...). :meth:`Record.check`
walks the document once; the first value that does not fit raises
:class:`SchemaError`, whose message names the file, the field path (JSON
style: ``params['fc.weight'].numel``, ``param_uses[3].call_index``), what was
expected and what was found, on one line. A checker returns the value it
accepted, so callers build their objects from checked data only.

Strictness follows from what the values mean: counts are ints, never bools or
floats (``true`` is not a version, ``1.0`` is not ``1``, and ``1e999`` is an
infinite float), sizes are ``>= 0``, names are strings. Unknown keys are left
alone (a newer writer may add optional fields); a new field of a layout is one
more line in its table.

>>> table = Record({"numel": Field(integer()), "name": Field(string(), required=False)})
>>> table.check({"numel": 3}, source="a.json")
{'numel': 3, 'name': None}
>>> table.check({"numel": -1}, source="a.json", what="order")
Traceback (most recent call last):
...
tracing.schema.SchemaError: a.json: malformed order: field numel: expected an int >= 0, got int -1
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Check",
    "Field",
    "Record",
    "SchemaError",
    "boolean",
    "dict_of",
    "field_path",
    "integer",
    "number",
    "list_of",
    "one_of",
    "optional",
    "string",
    "type_and_value",
]

#: A checker: ``(value, path) -> accepted value``; raises :class:`SchemaError`.
Check = Callable[[Any, str], Any]


class SchemaError(ValueError):
    """A loaded document does not fit its table.

    Attributes:
        path: the field, e.g. ``"params['fc.weight'].numel"`` (``""``: the document).
        problem: what was expected and what was found.
        source: the file (or ``"<dict>"``) the document came from.
        what: what the document is (``"ExecutionOrder"``), or ``""``.
    """

    def __init__(self, path: str, problem: str, source: str = "<dict>", what: str = "") -> None:
        self.path = path
        self.problem = problem
        self.source = source
        self.what = what
        where = f"field {path}" if path else "the document"
        kind = f"malformed {what}: " if what else ""
        super().__init__(f"{source}: {kind}{where}: {problem}")


def field_path(prefix: str, key: str | int) -> str:
    """``prefix`` extended by a key: ``.name`` for identifiers, ``[3]`` for list
    positions, ``['a.b']`` for any other text (quoted like Python, so control
    characters in names stay escaped and the message stays one line)."""
    if isinstance(key, int):
        return f"{prefix}[{key}]"
    if not key:
        return prefix
    if key.isidentifier() and key.isascii():
        return f"{prefix}.{key}" if prefix else key
    return f"{prefix}[{key!r}]"


def type_and_value(value: Any, limit: int = 40) -> str:
    """How a found value is named in messages: ``int -1``, ``float inf``, ``a list``."""
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return f"an object of {len(value)} keys"
    if value is None:
        return "null"
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(value).__name__} {text}"


def _fail(path: str, expected: str, value: Any) -> SchemaError:
    return SchemaError(path, f"expected {expected}, got {type_and_value(value)}")


# ----------------------------------------------------------------- checkers
def string() -> Check:
    """A JSON string."""

    def check(value: Any, path: str) -> str:
        if not isinstance(value, str):
            raise _fail(path, "a string", value)
        return value

    return check


def boolean() -> Check:
    """``true`` or ``false``."""

    def check(value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise _fail(path, "true or false", value)
        return value

    return check


def integer(minimum: int | None = 0, *, what: str = "") -> Check:
    """An int (not a bool, not a float) ``>= minimum`` (``None``: any int).

    Args:
        minimum: the smallest value allowed.
        what: what it counts, for the message (``"elements"``).
    """
    counted = f" ({what})" if what else ""
    expected = f"an int >= {minimum}{counted}" if minimum is not None else f"an int{counted}"

    def check(value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and not math.isfinite(value):
                raise SchemaError(path, f"expected {expected}, got float {value!r}")
            raise _fail(path, expected, value)
        if minimum is not None and value < minimum:
            raise _fail(path, expected, value)
        return value

    return check


def number(minimum: float | None = 0.0) -> Check:
    """A finite JSON number (an int or a float, not a bool) ``>= minimum``
    (``None``: any finite number); returned as a float."""
    expected = f"a finite number >= {minimum}" if minimum is not None else "a finite number"

    def check(value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _fail(path, expected, value)
        if not math.isfinite(value) or (minimum is not None and value < minimum):
            raise SchemaError(path, f"expected {expected}, got {value!r}")
        return float(value)

    return check


def one_of(*choices: Any) -> Check:
    """One of ``choices`` (compared with their type: ``true`` is not ``1``)."""

    def check(value: Any, path: str) -> Any:
        for choice in choices:
            if type(value) is type(choice) and value == choice:
                return value
        listed = ", ".join(repr(c) for c in choices)
        raise _fail(path, f"one of {listed}", value)

    return check


def optional(inner: Check) -> Check:
    """``null`` or what ``inner`` accepts."""

    def check(value: Any, path: str) -> Any:
        return None if value is None else inner(value, path)

    return check


def list_of(item: Check) -> Check:
    """A JSON array whose every item ``item`` accepts (returned as a list)."""

    def check(value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise _fail(path, "a list", value)
        return [item(v, f"{path}[{i}]") for i, v in enumerate(value)]

    return check


def dict_of(item: Check) -> Check:
    """A JSON object (string keys) whose every value ``item`` accepts."""

    def check(value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _fail(path, "an object", value)
        return {k: item(v, field_path(path, k)) for k, v in value.items()}

    return check


# ------------------------------------------------------------------- records
@dataclass(frozen=True)
class Field:
    """One field of a :class:`Record`.

    Attributes:
        check: the field's checker.
        required: whether a document must have it.
        default: the value used when an optional field is missing (copied for
            lists and dicts).
    """

    check: Check
    required: bool = True
    default: Any = None


class Record:
    """A JSON object with named fields (a table of :class:`Field`).

    Args:
        fields: field name -> :class:`Field`, in the order they are checked.
    """

    def __init__(self, fields: Mapping[str, Field]) -> None:
        self.fields = dict(fields)

    def __call__(self, value: Any, path: str) -> dict[str, Any]:
        """Check ``value`` (a nested record at ``path``); see :meth:`check`."""
        if not isinstance(value, dict):
            raise _fail(path, "an object", value)
        out: dict[str, Any] = {}
        for name, spec in self.fields.items():
            where = field_path(path, name)
            if name not in value:
                if spec.required:
                    raise SchemaError(where, "missing")
                default = spec.default
                out[name] = type(default)(default) if isinstance(default, (list, dict)) else default
                continue
            out[name] = spec.check(value[name], where)
        return out

    def check(
        self, value: Any, *, source: str = "<dict>", prefix: str = "", what: str = ""
    ) -> dict[str, Any]:
        """The checked fields of ``value`` (missing optional ones at their default).

        Args:
            value: the loaded JSON.
            source: the file it came from, for the message.
            prefix: where ``value`` sits in its file (``"order"`` in a report).
            what: what the document is, for the message (``"ExecutionOrder"``).

        Returns:
            Field name -> checked value, for every field of the table (unknown
            keys of ``value`` are left out).

        Raises:
            SchemaError: the first field that does not fit (one line).
        """
        try:
            return self(value, prefix)
        except SchemaError as e:
            raise SchemaError(e.path, e.problem, source, what) from None
