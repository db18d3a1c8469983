"""Orders and plans of a submodule, named the way its parent names them.

Frameworks hold the user's model as an attribute: a LightningModule's
``self.model``, PEFT's ``base_model.model``. An order captured on (or a plan
made for) that model names its modules ``layers.0``; the user, looking
through the framework, sees ``model.layers.0`` (in ``named_parameters()``,
checkpoints, model summaries). :func:`lift_order` and :func:`lift_plan`
rename an order or a plan of the submodule at ``prefix`` into its parent's
FQNs: every FQN ``fqn`` becomes ``prefix.fqn`` (the submodule itself,
``""``, becomes ``prefix``; in a plan its root unit stays the root).

A lifted order describes the parent: its first call is the parent's (``""``,
enclosing the submodule's calls: a LightningModule's training step through
the FSDP1 root), and its parameter table and module classes gain the
parent's modules and parameters outside the submodule, so
:func:`execwrap.plan_wrap` accepts it for the parent. A lifted plan is a
plan of the parent with the submodule's units renamed (its notes too: FQNs in
notes are always quoted, the root written ``<root>``).
"""

from __future__ import annotations

import dataclasses
import re

import torch.nn as nn

from execwrap.plan.unit import WrapUnit
from execwrap.plan.wrap_plan import WrapPlan
from tracing.fqn import join_fqn
from tracing.order import ExecutionOrder, ParamUse, param_infos

__all__ = ["lift_order", "lift_plan", "submodule_prefix"]

_QUOTED = re.compile(r"'([^'\s]+)'")


def submodule_prefix(parent: nn.Module, module: nn.Module) -> str:
    """The FQN of ``module`` inside ``parent`` (``""`` when it is ``parent``).

    Raises:
        ValueError: ``module`` is not a submodule of ``parent``.
    """
    for fqn, m in parent.named_modules():
        if m is module:
            return fqn
    raise ValueError(
        f"{type(module).__name__} is not a submodule of {type(parent).__name__}; pass the "
        "module that the parent holds (e.g. a LightningModule's self.model)"
    )


def lift_order(
    order: ExecutionOrder, prefix: str, parent: nn.Module | None = None
) -> ExecutionOrder:
    """The order of the submodule at ``prefix``, in ``parent``'s FQNs.

    Args:
        order: an order captured on the submodule (its root is ``""``).
        prefix: the submodule's FQN in the parent (``"model"``).
        parent: the parent; when given, the order starts with the parent's
            call (``""``; call indices shift by one) and the parent's
            parameters and modules outside the submodule join the order's
            tables (never used), so that the order fits the parent.

    Returns:
        A new order; ``order`` is not changed.

    Example:
        >>> lift_order(ExecutionOrder(module_forward_order=["", "fc"]), "model").module_forward_order
        ['model', 'model.fc']
    """
    lifted = _renamed(order, prefix)
    if parent is None or not prefix:
        return lifted
    inside = f"{prefix}."
    outer_params = {
        k: v
        for k, v in param_infos(parent).items()
        if not k.startswith(inside) and k not in lifted.params
    }
    outer = {
        f: type(m).__name__
        for f, m in parent.named_modules()
        if f != prefix and not f.startswith(inside)
    }
    return dataclasses.replace(
        lifted,
        module_forward_order=["", *lifted.module_forward_order],
        module_call_depths=[0, *(d + 1 for d in lifted.module_call_depths)]
        if lifted.module_call_depths
        else [],
        param_uses=[dataclasses.replace(u, call_index=u.call_index + 1) for u in lifted.param_uses],
        module_backward_order=[*lifted.module_backward_order, ""]
        if lifted.module_backward_order
        else [],
        params={**outer_params, **lifted.params},
        module_classes={**outer, **lifted.module_classes},
    )


def _renamed(order: ExecutionOrder, prefix: str) -> ExecutionOrder:
    """``order`` with every FQN under ``prefix``."""
    if not prefix:
        return order

    def name(fqn: str) -> str:
        return join_fqn(prefix, fqn) if fqn else prefix

    def names(fqns: list[str]) -> list[str]:
        return [name(f) for f in fqns]

    return dataclasses.replace(
        order,
        module_forward_order=names(order.module_forward_order),
        param_forward_order=names(order.param_forward_order),
        param_uses=[
            ParamUse(name(u.module_fqn), u.call_index, tuple(names(list(u.param_fqns))), u.op)
            for u in order.param_uses
        ],
        param_backward_order=names(order.param_backward_order),
        module_backward_order=names(order.module_backward_order),
        recompute_order=names(order.recompute_order),
        shared_params={name(k): names(v) for k, v in order.shared_params.items()},
        params={name(k): v for k, v in order.params.items()},
        module_classes={name(k): v for k, v in order.module_classes.items()},
    )


def lift_plan(plan: WrapPlan, prefix: str, parent: nn.Module) -> WrapPlan:
    """The plan of the submodule at ``prefix``, as a plan of ``parent``.

    The units are the submodule's, renamed: the root unit stays the root
    (``[""]``: the parent's root group, holding what the submodule's root
    held; with FSDP2 it is realised by the submodule's own ``fully_shard``
    call when the parent's ``forward`` never runs, as a LightningModule's),
    every other FQN becomes ``prefix.fqn``; the order is :func:`lift_order`'s
    (call indices shifted past the parent's call); quoted FQNs in the notes
    are renamed. The result is a valid plan of ``parent`` (``plan.check(parent)``
    passes when the parent holds no parameters outside the submodule).

    Args:
        plan: a plan for the submodule.
        prefix: the submodule's FQN in the parent.
        parent: the parent.

    Returns:
        A new plan; ``plan`` is not changed.
    """
    if not prefix:
        return plan

    def name(fqn: str) -> str:
        return join_fqn(prefix, fqn) if fqn else ""

    def unit(u: WrapUnit) -> WrapUnit:
        first = None if u.first_use is None else (0 if u.is_root else u.first_use + 1)
        return dataclasses.replace(
            u,
            module_fqns=tuple(name(m) for m in u.module_fqns),
            param_fqns=tuple(join_fqn(prefix, p) for p in u.param_fqns),
            first_use=first,
            last_use=None if u.last_use is None else u.last_use + 1,
        )

    def note(text: str) -> str:
        return _QUOTED.sub(lambda m: repr(join_fqn(prefix, m.group(1))), text)

    return dataclasses.replace(
        plan,
        units=[unit(u) for u in plan.units],
        atomic_units=[unit(u) for u in plan.atomic_units],
        order=lift_order(plan.order, prefix, parent),
        notes=[note(n) for n in plan.notes],
        policy_fqns=tuple(name(f) for f in plan.policy_fqns),
        ignored_modules=tuple(name(f) for f in plan.ignored_modules),
    )
