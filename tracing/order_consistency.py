"""A saved :class:`~tracing.order.ExecutionOrder` checked against itself.

:mod:`tracing.order_fields` checks each field on its own (types, ranges,
dtype names); :func:`check_consistency` then checks the fields against each
other, so that a hand-edited file that contradicts itself is refused with the
same one-line :class:`~tracing.schema.SchemaError` naming the first bad field
and its value. The rules:

* every FQN a field names exists: module FQNs (``module_forward_order``,
  ``module_backward_order``, ``recompute_order``, ``param_uses[i].module_fqn``,
  ``backward_times_s`` keys) are modules of ``module_classes``, parameter FQNs
  (``param_forward_order``, ``param_backward_order``, ``param_uses[i].param_fqns``,
  ``shared_params`` keys) are canonical parameters of ``params`` (each table is
  only used when the file has it: hand-built orders may leave it empty);
* derived fields equal what they derive from: ``param_uses[i].module_fqn`` is
  the module of call ``call_index``; ``param_forward_order`` is each
  parameter's first use in ``param_uses`` order; ``params[p].numel`` is the
  product of its ``shape`` (an empty shape, not recorded by old writers, is
  not checked); the per-call timing lists have one entry per call;
* tied parameters are one tensor: an alias in ``shared_params`` is no
  canonical parameter of its own (a different shape or dtype is named), and
  no name is the alias of two parameters.
"""

from __future__ import annotations

import math
from typing import Any

from tracing.schema import SchemaError, field_path

__all__ = ["check_consistency"]

#: Timing fields with one entry per call of ``module_forward_order`` (when recorded).
_PER_CALL_FIELDS = ("forward_times_s", "forward_start_s", "backward_start_s")


def check_consistency(fields: dict[str, Any], *, prefix: str = "") -> None:
    """Check the fields of an order (as :data:`~tracing.order_fields.ORDER_FIELDS`
    returns them) against each other.

    Args:
        fields: the checked fields.
        prefix: where the order sits in its file (``"order"`` in a report).

    Raises:
        SchemaError: the first field that contradicts another, naming the
            field path and its value (without the file: the caller adds it).

    Example:
        >>> check_consistency({"module_forward_order": ["", "fc"], "module_classes": {"": "M"},
        ...     "params": {}, "param_uses": [], "param_forward_order": [],
        ...     "shared_params": {}}, prefix="order")
        Traceback (most recent call last):
        ...
        tracing.schema.SchemaError: <dict>: field order.module_forward_order[1]: names module \
'fc', which order.module_classes does not have
    """
    _check_names(fields, prefix)
    _check_param_uses(fields, prefix)
    _check_params(fields, prefix)
    _check_ties(fields, prefix)
    calls = len(fields["module_forward_order"])
    for name in (
        *_PER_CALL_FIELDS,
        "saved_activation_bytes",
        "input_activation_bytes",
        "forward_transient_bytes",
        "backward_transient_bytes",
        "forward_op_counts",
    ):
        values = fields.get(name) or []
        if values and len(values) != calls:
            raise SchemaError(
                field_path(prefix, name),
                f"has {len(values)} entries for {calls} calls of "
                f"{field_path(prefix, 'module_forward_order')} (one per call)",
            )


def _unknown(path: str, what: str, name: str, table: str) -> SchemaError:
    return SchemaError(path, f"names {what} {name!r}, which {table} does not have")


def _check_names(fields: dict[str, Any], prefix: str) -> None:
    """Every module and parameter FQN of the order's lists is in its table."""
    modules, params = fields["module_classes"], fields["params"]
    module_table = field_path(prefix, "module_classes")
    param_table = field_path(prefix, "params")
    if modules:
        for key in ("module_forward_order", "module_backward_order", "recompute_order"):
            for i, name in enumerate(fields.get(key) or []):
                if name not in modules:
                    path = field_path(field_path(prefix, key), i)
                    raise _unknown(path, "module", name, module_table)
        for name in fields.get("backward_times_s") or {}:
            if name not in modules:
                path = field_path(field_path(prefix, "backward_times_s"), name)
                raise _unknown(path, "module", name, module_table)
    if params:
        for key in ("param_forward_order", "param_backward_order"):
            for i, name in enumerate(fields.get(key) or []):
                if name not in params:
                    path = field_path(field_path(prefix, key), i)
                    raise _unknown(path, "parameter", name, param_table)


def _check_param_uses(fields: dict[str, Any], prefix: str) -> None:
    """Each use names its call's module and known parameters, and the first
    uses give ``param_forward_order``."""
    calls = fields["module_forward_order"]
    modules, params = fields["module_classes"], fields["params"]
    uses = fields["param_uses"]
    for i, use in enumerate(uses):
        where = field_path(field_path(prefix, "param_uses"), i)
        name = use["module_fqn"]
        if modules and name not in modules:
            raise _unknown(
                field_path(where, "module_fqn"),
                "module",
                name,
                field_path(prefix, "module_classes"),
            )
        called = calls[use["call_index"]]  # call_index was checked against the calls
        if name != called:
            raise SchemaError(
                field_path(where, "module_fqn"),
                f"names module {name!r}, but call {use['call_index']} of "
                f"{field_path(prefix, 'module_forward_order')} is {called!r}",
            )
        for k, p in enumerate(use["param_fqns"]):
            if params and p not in params:
                path = field_path(field_path(where, "param_fqns"), k)
                raise _unknown(path, "parameter", p, field_path(prefix, "params"))
    if not uses:
        return  # a hand-built order without uses: nothing to derive from
    first_uses = list(dict.fromkeys(p for use in uses for p in use["param_fqns"]))
    saved = fields["param_forward_order"]
    for k in range(max(len(first_uses), len(saved))):
        want = first_uses[k] if k < len(first_uses) else None
        got = saved[k] if k < len(saved) else None
        if want != got:
            path = field_path(prefix, "param_forward_order")
            raise SchemaError(
                field_path(path, k) if got is not None else path,
                f"{'is ' + repr(got) if got is not None else f'ends after {k} entries'}, but "
                f"the first uses in {field_path(prefix, 'param_uses')} give "
                f"{repr(want) if want is not None else f'{k} parameters'} there "
                "(each parameter's first use, in order)",
            )


def _check_params(fields: dict[str, Any], prefix: str) -> None:
    """Each parameter's numel is the product of its recorded shape."""
    for name, info in fields["params"].items():
        shape = info["shape"]
        if shape and math.prod(shape) != info["numel"]:
            raise SchemaError(
                field_path(field_path(field_path(prefix, "params"), name), "numel"),
                f"{info['numel']} elements, but its shape {list(shape)} has {math.prod(shape)}",
            )


def _describe(info: dict[str, Any]) -> str:
    return f"shape {list(info['shape'])}, {info['dtype']}"


def _check_ties(fields: dict[str, Any], prefix: str) -> None:
    """Every tied parameter exists, and each alias is one more name of it alone."""
    params = fields["params"]
    table = field_path(prefix, "params")
    seen: dict[str, str] = {}
    for canonical, aliases in fields["shared_params"].items():
        where = field_path(field_path(prefix, "shared_params"), canonical)
        if params and canonical not in params:
            raise _unknown(where, "parameter", canonical, table)
        for k, alias in enumerate(aliases):
            path = field_path(where, k)
            if alias in seen:
                raise SchemaError(
                    path,
                    f"names {alias!r}, which "
                    f"{field_path(field_path(prefix, 'shared_params'), seen[alias])} names too; "
                    "a name is an alias of one parameter",
                )
            seen[alias] = canonical
            if alias == canonical:
                raise SchemaError(path, f"ties {canonical!r} to itself")
            if alias not in params:
                continue
            mine, other = params.get(canonical), params[alias]
            if mine is not None and _describe(mine) != _describe(other):
                raise SchemaError(
                    path,
                    f"ties {canonical!r} ({_describe(mine)}) to {alias!r}, a parameter of "
                    f"{_describe(other)}; tied names are one tensor, of one shape and dtype",
                )
            raise SchemaError(
                path,
                f"names {alias!r}, which {table} lists as a parameter of its own; an alias "
                "of a tied parameter is not a canonical FQN",
            )
