"""``execwrap diff A B``: the first call where two saved orders part.

Exit 1 when they differ (a finding), 0 when they are the same: first the
forward module calls are compared (and an aligned view around the first
divergence printed), then the parameter forward order, then the parameter
backward order when both captures recorded one, then each parameter's
metadata (shape, dtype, ``requires_grad``, numel: what decides FSDP's flat
buffers), then the tied parameters.
"""

from __future__ import annotations

from execwrap.cli.errors import EXIT_FINDING, EXIT_OK
from execwrap.cli.options import DiffOptions
from execwrap.cli.saved import call_label, load_saved
from execwrap.cli.text import echo
from execwrap.order.divergence import Divergence, first_divergence
from tracing import ExecutionOrder
from tracing.order import ParamInfo

__all__ = ["run_diff"]


def run_diff(options: DiffOptions) -> int:
    """Compare the orders of ``options.path_a`` and ``options.path_b`` and print the result.

    Returns:
        1 when the orders differ, 0 when they are the same.

    Raises:
        CLIError: a file is not a readable execwrap report or order.
    """
    order_a = load_saved(options.path_a).order
    order_b = load_saved(options.path_b).order
    div = first_divergence(order_a, order_b, context=options.context)
    if div is not None:
        _print_call_divergence(div, order_a, order_b, options)
        return EXIT_FINDING
    calls = len(order_a.module_forward_order)
    param_div = _param_divergence(order_a, order_b)
    if param_div is not None:
        label, at = param_div
        echo(
            f"orders differ: same {calls} module calls, but the {label} differs at position "
            f"{at.index}: A {call_label(at.expected)}, B {call_label(at.found)}"
        )
        return EXIT_FINDING
    same = f"same {calls} module calls and parameter order"
    param = _param_info_difference(order_a, order_b) or _tie_difference(order_a, order_b)
    if param is not None:
        echo(f"orders differ: {same}, but {param}")
        return EXIT_FINDING
    echo(
        f"orders are the same: {calls} module calls, "
        f"{len(order_a.param_forward_order)} parameters in the same order"
    )
    return EXIT_OK


def _print_call_divergence(
    div: Divergence, order_a: ExecutionOrder, order_b: ExecutionOrder, options: DiffOptions
) -> None:
    """The first divergent forward call, and both orders side by side around it."""
    calls_a, calls_b = order_a.module_forward_order, order_b.module_forward_order
    index = div.index
    echo(
        f"orders differ: first divergence at forward call {index}: "
        f"A runs {call_label(div.expected)}, B runs {call_label(div.found)}"
    )
    echo(f"  A = {options.a} ({len(calls_a)} calls, {order_a.method})")
    echo(f"  B = {options.b} ({len(calls_b)} calls, {order_b.method})")
    lo, hi = max(0, index - options.context), index + options.context + 1
    width = max([len(call_label(c)) for c in div.context_a] + [len("A")])
    echo()
    echo(f"  {'':>6}  {'A':<{width}}   B")
    for i in range(lo, hi):
        x = calls_a[i] if i < len(calls_a) else None
        y = calls_b[i] if i < len(calls_b) else None
        if x is None and y is None:
            break
        mark = ">>" if i == index else ("  " if x == y else "!=")
        echo(f"  {mark}{i:>4}  {call_label(x):<{width}}   {call_label(y)}")


def _param_divergence(
    order_a: ExecutionOrder, order_b: ExecutionOrder
) -> tuple[str, Divergence] | None:
    """``(which order, divergence)`` of the first parameter order that differs."""
    param_orders = [
        ("parameter forward order", order_a.param_forward_order, order_b.param_forward_order)
    ]
    if order_a.param_backward_order and order_b.param_backward_order:
        # (symbolic capture records no backward order)
        param_orders.append(
            ("parameter backward order", order_a.param_backward_order, order_b.param_backward_order)
        )
    for label, xs, ys in param_orders:
        div = first_divergence(xs, ys, context=0)
        if div is not None:
            return label, div
    return None


#: The metadata of a parameter ``diff`` compares, as printed, in this order.
_INFO_FIELDS = ("shape", "dtype", "requires_grad", "numel")


def _info_value(info: ParamInfo, name: str) -> str:
    value = getattr(info, name)
    return str(list(value)) if name == "shape" else str(value)


def _param_info_difference(order_a: ExecutionOrder, order_b: ExecutionOrder) -> str | None:
    """The first parameter (A's ``params`` order, then B's) whose metadata
    differs, or that only one order has, as a phrase; ``None`` if none does."""
    a, b = order_a.params, order_b.params
    differing: list[str] = []
    first = ""
    for fqn in [*a, *(f for f in b if f not in a)]:
        if fqn in a and fqn in b:
            fields = [
                f"{name} A {_info_value(a[fqn], name)}, B {_info_value(b[fqn], name)}"
                for name in _INFO_FIELDS
                if getattr(a[fqn], name) != getattr(b[fqn], name)
            ]
            if not fields:
                continue
            phrase = f"parameter {fqn!r} differs: {'; '.join(fields)}"
        else:
            phrase = f"parameter {fqn!r} is only in {'A' if fqn in a else 'B'}"
        differing.append(fqn)
        first = first or phrase
    if not differing:
        return None
    more = len(differing) - 1
    if not more:
        return first
    return first + (
        " (1 more parameter differs)" if more == 1 else f" ({more} more parameters differ)"
    )


def _tie_difference(order_a: ExecutionOrder, order_b: ExecutionOrder) -> str | None:
    """The first parameter whose tied names differ, as a phrase; ``None`` if none does."""
    a, b = order_a.shared_params, order_b.shared_params
    for fqn in [*a, *(f for f in b if f not in a)]:
        names_a, names_b = a.get(fqn, []), b.get(fqn, [])
        if list(names_a) != list(names_b):
            shown = [", ".join(names) or "none" for names in (names_a, names_b)]
            return f"the tied names of parameter {fqn!r} differ: A {shown[0]}, B {shown[1]}"
    return None
