"""Edits of saved orders that keep them consistent (what another capture would write).

A saved order is checked against itself on load (:mod:`tracing.order_consistency`):
``param_uses[i].module_fqn`` must be the module of call ``call_index``, and
``param_forward_order`` the first uses in ``param_uses`` order. Tests that make
"another capture" by editing a file use these helpers, so the edit is one a
real capture could produce.
"""

from __future__ import annotations

from typing import Any

__all__ = ["swap_calls", "swap_uses"]


def swap_calls(order: dict[str, Any], i: int, j: int) -> None:
    """Swap forward calls ``i`` and ``j`` of an order's dict, with their parameter uses."""
    calls = order["module_forward_order"]
    calls[i], calls[j] = calls[j], calls[i]
    for use in order["param_uses"]:
        if use["call_index"] in (i, j):
            use["call_index"] = j if use["call_index"] == i else i


def swap_uses(order: dict[str, Any], i: int, j: int) -> None:
    """Swap ``param_uses`` entries ``i`` and ``j`` and derive ``param_forward_order`` again."""
    uses = order["param_uses"]
    uses[i], uses[j] = uses[j], uses[i]
    order["param_forward_order"] = list(dict.fromkeys(p for use in uses for p in use["param_fqns"]))
