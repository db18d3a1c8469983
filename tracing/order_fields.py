"""An :class:`~tracing.order.ExecutionOrder` on disk: its JSON layout and the checks on load.

:data:`ORDER_FIELDS` says how every field of ``ExecutionOrder.to_dict()`` is
checked when a file is read (one pass, strict JSON types, one-line errors
naming the file and the field; see :mod:`tracing.schema`); a new field is one
line there. :func:`checked_fields` runs it after the layout version.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from tracing.checks import is_int
from tracing.order_consistency import check_consistency
from tracing.schema import (
    Field,
    Record,
    SchemaError,
    boolean,
    dict_of,
    field_path,
    integer,
    list_of,
    number,
    one_of,
    optional,
    string,
    type_and_value,
)

__all__ = [
    "CAPTURE_METHODS",
    "ORDER_FIELDS",
    "READABLE_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "TIMING_FIELDS",
    "TIMING_METHODS",
    "checked_fields",
    "parse_json",
]

#: Version of the JSON layout written by :meth:`ExecutionOrder.to_dict`.
#: Version 2 added the optional timing fields (``forward_times_s`` ...) and the
#: capture fields ``zero_cost`` and ``warnings``; version 3 the mode of the
#: capture, ``training`` and ``grad_enabled``. Older files still load (the
#: fields they lack get their defaults: ``None``, not recorded).
SCHEMA_VERSION = 3
#: Layout versions :meth:`ExecutionOrder.from_dict` reads.
READABLE_SCHEMA_VERSIONS: tuple[int, ...] = (1, 2, 3)

#: ``ExecutionOrder.method`` values.
CAPTURE_METHODS: tuple[str, ...] = ("symbolic", "runtime")
#: ``ExecutionOrder.timing_method`` values (``""``: no timing recorded).
TIMING_METHODS: tuple[str, ...] = ("", "measured", "estimated")


def checked_fields(data: Any, *, source: str, prefix: str = "") -> dict[str, Any]:
    """The fields of an order's dict, checked: layout version, then :data:`ORDER_FIELDS`,
    then every ``param_uses[i].call_index`` against ``module_forward_order``, then
    the fields against each other (:func:`~tracing.order_consistency.check_consistency`).

    Raises:
        ValueError: not an order, another layout version, or a malformed field
            (a :class:`~tracing.schema.SchemaError` naming ``source`` and the field).
    """
    if not isinstance(data, dict):
        raise ValueError(
            f"{source}: expected a JSON object for an ExecutionOrder, got {type(data).__name__}"
        )
    if "schema_version" not in data and "module_forward_order" not in data:
        raise ValueError(
            f"{source}: not an execwrap ExecutionOrder or report (it has no "
            "'schema_version' or 'module_forward_order' field)"
        )
    version = data.get("schema_version")
    if not is_int(version):
        raise SchemaError(
            field_path(prefix, "schema_version"),
            f"expected an int layout version ({_versions()}), got {type_and_value(version)}",
            source,
            "ExecutionOrder",
        )
    if version not in READABLE_SCHEMA_VERSIONS:
        raise ValueError(
            f"{source}: unsupported ExecutionOrder schema_version {version!r} "
            f"(this execwrap reads versions {list(READABLE_SCHEMA_VERSIONS)}); capture "
            "the order again with this version"
        )
    fields = ORDER_FIELDS.check(data, source=source, prefix=prefix, what="ExecutionOrder")
    _check_call_indices(fields, source, prefix)
    _check_call_depths(fields, source, prefix)
    try:
        check_consistency(fields, prefix=prefix)
    except SchemaError as e:
        raise SchemaError(e.path, e.problem, source, "ExecutionOrder") from None
    return fields


def _versions() -> str:
    """``"1, 2 or 3"``: the readable layout versions, in words."""
    *head, last = map(str, READABLE_SCHEMA_VERSIONS)
    return f"{', '.join(head)} or {last}" if head else last


def parse_json(text: str, source: str) -> Any:
    """``json.loads(text)``, with every way it can fail as one ``ValueError``
    naming ``source``: invalid JSON, nesting too deep for the parser
    (``RecursionError``), an int literal over Python's digit limit."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not valid JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{source}: not valid JSON (nested too deeply to read)") from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise ValueError(f"{source}: not valid JSON ({str(e).splitlines()[0]})") from None


def _dtype_name(value: Any, path: str) -> str:
    """A torch dtype name without the ``torch.`` prefix (``"float32"``)."""
    if not isinstance(value, str):
        raise SchemaError(
            path, f"expected a dtype name such as 'float32', got {type_and_value(value)}"
        )
    if not isinstance(getattr(torch, value, None), torch.dtype):
        raise SchemaError(
            path, f"unknown dtype {value!r} (expected a torch dtype name such as 'float32')"
        )
    return value


_PARAM_USE = Record(
    {
        "module_fqn": Field(string()),
        "call_index": Field(integer(what="a call index")),
        "param_fqns": Field(list_of(string())),
        "op": Field(string(), required=False, default="call_module"),
    }
)


def _optional_dtype(value: Any, path: str) -> str:
    """``""`` or a dtype name (:func:`_dtype_name`)."""
    return "" if value == "" else _dtype_name(value, path)


_COMPUTE_OP = Record(
    {
        "call_index": Field(integer(what="a call index")),
        "op": Field(string()),
        "output_bytes": Field(integer(what="bytes")),
        "seconds": Field(number(), required=False, default=0.0),
    }
)
_PARAM_INFO = Record(
    {
        "numel": Field(integer(what="elements")),
        "dtype": Field(_dtype_name),
        "requires_grad": Field(boolean()),
        "shape": Field(list_of(integer()), required=False, default=[]),
    }
)

#: The fields of :meth:`ExecutionOrder.to_dict` and how each is checked on load
#: (``schema_version`` is checked first, on its own). A new field is one line here.
ORDER_FIELDS = Record(
    {
        "method": Field(one_of(*CAPTURE_METHODS)),
        "fallback_reason": Field(optional(string()), required=False),
        "torch_version": Field(string(), required=False, default=""),
        "module_forward_order": Field(list_of(string())),
        "param_forward_order": Field(list_of(string())),
        "param_uses": Field(list_of(_PARAM_USE)),
        "param_backward_order": Field(list_of(string()), required=False, default=[]),
        "module_backward_order": Field(list_of(string()), required=False, default=[]),
        "recompute_order": Field(list_of(string()), required=False, default=[]),
        "shared_params": Field(dict_of(list_of(string())), required=False, default={}),
        "params": Field(dict_of(_PARAM_INFO), required=False, default={}),
        "module_classes": Field(dict_of(string()), required=False, default={}),
        # schema 2: capture and timing (absent in version-1 files)
        "zero_cost": Field(boolean(), required=False, default=False),
        "warnings": Field(list_of(string()), required=False, default=[]),
        "forward_times_s": Field(list_of(number()), required=False, default=[]),
        "forward_start_s": Field(list_of(number()), required=False, default=[]),
        "backward_start_s": Field(list_of(optional(number())), required=False, default=[]),
        "backward_end_s": Field(optional(number()), required=False),
        "backward_times_s": Field(dict_of(number()), required=False, default={}),
        "saved_activation_bytes": Field(list_of(integer(what="bytes")), required=False, default=[]),
        "timing_device": Field(string(), required=False, default=""),
        "timing_method": Field(one_of(*TIMING_METHODS), required=False, default=""),
        "input_activation_bytes": Field(list_of(integer(what="bytes")), required=False, default=[]),
        "compute_ops": Field(list_of(_COMPUTE_OP), required=False, default=[]),
        "forward_transient_bytes": Field(
            list_of(integer(what="bytes")), required=False, default=[]
        ),
        "backward_transient_bytes": Field(
            list_of(integer(what="bytes")), required=False, default=[]
        ),
        "param_dtype": Field(_optional_dtype, required=False, default=""),
        "forward_op_counts": Field(list_of(integer(what="ops")), required=False, default=[]),
        "module_call_depths": Field(list_of(integer(what="a depth")), required=False, default=[]),
        # schema 3: the mode the order was captured in (absent in older files: not recorded)
        "training": Field(optional(boolean()), required=False),
        "grad_enabled": Field(optional(boolean()), required=False),
    }
)

#: The schema-2 timing fields, passed to the constructor as loaded.
TIMING_FIELDS = (
    "forward_times_s",
    "forward_start_s",
    "backward_start_s",
    "backward_end_s",
    "backward_times_s",
    "saved_activation_bytes",
    "timing_device",
    "timing_method",
    "input_activation_bytes",
    "compute_ops",
    "forward_transient_bytes",
    "backward_transient_bytes",
    "param_dtype",
    "forward_op_counts",
)


def _check_call_indices(fields: dict[str, Any], source: str, prefix: str) -> None:
    """Every ``param_uses[i].call_index`` is a call of ``module_forward_order``."""
    calls = len(fields["module_forward_order"])
    for i, use in enumerate(fields["param_uses"]):
        if use["call_index"] >= calls:
            raise SchemaError(
                field_path(field_path(field_path(prefix, "param_uses"), i), "call_index"),
                f"call {use['call_index']} is past the end of module_forward_order ({calls} calls)",
                source,
                "ExecutionOrder",
            )


def _check_call_depths(fields: dict[str, Any], source: str, prefix: str) -> None:
    """``module_call_depths`` (when present) has one depth per call, starts at 0
    and goes at most one level deeper from one call to the next (a pre-order walk)."""
    depths = fields["module_call_depths"]
    if not depths:
        return
    path = field_path(prefix, "module_call_depths")
    calls = len(fields["module_forward_order"])
    if len(depths) != calls:
        raise SchemaError(
            path,
            f"{len(depths)} depths for {calls} calls of module_forward_order",
            source,
            "ExecutionOrder",
        )
    for i, d in enumerate(depths):
        if d > (depths[i - 1] + 1 if i else 0):
            raise SchemaError(
                field_path(path, i),
                f"depth {d} after depth {depths[i - 1] if i else 'none'}: a call is at most one "
                "level deeper than the call before it (0 for the first)",
                source,
                "ExecutionOrder",
            )
