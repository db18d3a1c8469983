"""What FSDP1 wraps for a plan: its target modules, resolved in the model.

:class:`~execwrap.fsdp.fsdp1.ParamExecOrderWrapPolicy` hands FSDP1 one set of kwargs per
module it should wrap: :func:`fsdp1_targets` (the plan's FSDP1 view), found in the model
by :func:`resolve_modules`; :func:`empty_order` is the order of a policy that records its
order during the first step (no calls yet).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.nn as nn

from execwrap.plan.wrap_plan import WrapPlan
from tracing.order import ExecutionOrder, param_infos, shared_param_map

__all__ = ["empty_order", "fsdp1_targets", "resolve_modules"]


def empty_order(model: nn.Module) -> ExecutionOrder:
    """An order with the model's parameters and modules but no calls."""
    _, shared = shared_param_map(model)
    return ExecutionOrder(
        method="runtime",
        params=param_infos(model),
        shared_params=shared,
        module_classes={fqn: type(m).__name__ for fqn, m in model.named_modules()},
    )


def fsdp1_targets(plan: WrapPlan) -> list[str | nn.Module]:
    """The modules FSDP1 wraps for ``plan`` (FQNs; ``WrapPlan.fsdp1_modules``)."""
    fsdp1_modules = getattr(plan, "fsdp1_modules", None)
    if callable(fsdp1_modules):
        return list(fsdp1_modules())
    # Plans without the FSDP1 view: every module of every unit.
    return [fqn for unit in plan.units for fqn in unit.module_fqns]


def resolve_modules(root: nn.Module, targets: Iterable[str | nn.Module]) -> list[nn.Module]:
    """``targets`` as modules of ``root``.

    Raises:
        ValueError: a target FQN ``root`` does not have (a plan for another model).
    """
    modules: list[nn.Module] = []
    for target in targets:
        if isinstance(target, nn.Module):
            modules.append(target)
            continue
        try:
            modules.append(root.get_submodule(target))
        except AttributeError as e:
            raise ValueError(
                f"The wrap plan names module {target!r}, which the model "
                f"({type(root).__name__}) does not have; was the plan or order made for "
                "another model? Capture the order again for this model."
            ) from e
    return modules
