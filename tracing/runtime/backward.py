"""Backward order at run time: when gradients become ready, when modules finish.

:class:`GradReadyOrder` keeps the order in which parameters' gradients became
ready, fed by the gradient hooks the recorder installs
(``register_post_accumulate_grad_hook`` on each parameter, a tensor hook on
the unsharded view that FSDP1 swaps in with ``use_orig_params=True``).
:func:`module_backward_order` derives from it when each module's backward
finished, without any backward hook that would change the autograd graph.
"""

from __future__ import annotations

import torch

from tracing.fqn import ancestors, owner_fqn

__all__ = ["GradReadyOrder", "module_backward_order"]


class GradReadyOrder:
    """Canonical parameter FQNs in the order their gradients became ready.

    Attributes:
        order: the FQNs, each once, in gradient-ready order.
    """

    def __init__(self) -> None:
        self.order: list[str] = []
        # canonical FQN -> id() of the tensor whose gradient was recorded ready
        self._seen: dict[str, int] = {}

    def on_ready(self, fqn: str, param: torch.Tensor) -> None:
        """The gradient hook of parameter ``fqn`` fired for tensor ``param``.

        ``param`` is the parameter, or (for the tensor hook of a view a
        wrapper swapped in, FSDP1 ``use_orig_params=True``) its gradient.
        The same leaf can accumulate more than once per backward (a tied
        weight under reentrant checkpointing: one accumulation per inner
        backward); it is ready at its *last* accumulation, so it moves there.
        A hook fired again for another tensor of the same parameter (FSDP2
        runs the sharded parameter's hooks after its reduce-scatter, once the
        unsharded one has fired) is not a new accumulation and is ignored.
        """
        seen = self._seen.get(fqn)
        if seen is None:
            self._seen[fqn] = id(param)
        elif seen == id(param):
            self.order.remove(fqn)
        else:
            return
        self.order.append(fqn)


def module_backward_order(
    param_backward_order: list[str],
    module_forward_order: list[str],
    param_names: list[tuple[str, str]],
    module_classes: dict[str, str],
) -> list[str]:
    """Modules in the order their backward finished.

    A module's backward is finished when the gradients of all its trainable
    parameters (recursively, tied ones included) are ready: the point where
    FSDP can reduce-scatter it. Ties (a parent and its last child, or modules
    sharing a tied weight) put the deeper module first, then the one called
    later in forward. Modules without a gradient are left out.

    Args:
        param_backward_order: canonical FQNs in gradient-ready order.
        module_forward_order: module FQNs in forward call order.
        param_names: ``(FQN, canonical FQN)`` of every parameter name.
        module_classes: every module FQN to consider (values unused).

    Returns:
        Module FQNs, each once.
    """
    ready = {fqn: i for i, fqn in enumerate(param_backward_order)}
    first_call: dict[str, int] = {}
    for i, fqn in enumerate(module_forward_order):
        first_call.setdefault(fqn, i)
    # module FQN -> latest ready index over its parameters (recursively)
    finish: dict[str, int] = {}
    for pfqn, canonical in param_names:
        step = ready.get(canonical)
        if step is None:
            continue
        for owner in ancestors(owner_fqn(pfqn)):
            if owner in module_classes and finish.get(owner, -1) < step:
                finish[owner] = step
    keyed = [
        (step, -(fqn.count(".") + 1 if fqn else 0), -first_call.get(fqn, -1), fqn)
        for fqn, step in finish.items()
    ]
    keyed.sort()
    return [k[3] for k in keyed]
