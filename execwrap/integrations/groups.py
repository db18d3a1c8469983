"""The FSDP groups a model really has, read back from FSDP1 or FSDP2.

:func:`fsdp_groups` answers "what did the framework actually build?", so a
test or a user can compare it with ``plan.groups`` after Lightning, accelerate,
the HF Trainer or torchtitan has set the model up. It reads FSDP's own state:
FSDP2 keeps one state per ``fully_shard`` call, shared by every module of a
grouped call (``fully_shard([norm, lm_head])``); FSDP1 has one
``FullyShardedDataParallel`` wrapper per unit. Names are those of the original
model (FSDP1's ``_fsdp_wrapped_module.`` components removed).
"""

from __future__ import annotations

import sys

import torch.nn as nn

from tracing.fqn import clean_fqn

__all__ = ["fsdp_groups"]


def fsdp_groups(model: nn.Module) -> list[list[str]]:
    """The module FQNs of every FSDP group of ``model``, in definition order.

    Args:
        model: a model with ``fully_shard`` applied (FSDP2) or wrapped in
            ``FullyShardedDataParallel`` (FSDP1), or any module holding one.

    Returns:
        One list per FSDP2 ``fully_shard`` call (its modules in definition
        order) or per FSDP1 wrapper (its wrapped module), sorted by the first
        module's position in ``model.named_modules()``; ``[]`` for a model
        without FSDP. The root is ``""``. Compare with ``plan.groups`` as
        sets: ``sorted(fsdp_groups(model)) == sorted(plan.groups)``.

    Example:
        >>> fsdp_groups(torch.nn.Linear(2, 2))  # doctest: +SKIP
        []
    """
    fsdp2 = sys.modules.get("torch.distributed.fsdp")
    fsdp1 = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    fsdp_module = getattr(fsdp2, "FSDPModule", None)
    wrapper = getattr(fsdp1, "FullyShardedDataParallel", None)
    position: dict[int, int] = {}
    names: dict[int, str] = {}
    for i, (fqn, module) in enumerate(model.named_modules()):
        position.setdefault(id(module), i)
        names.setdefault(id(module), clean_fqn(fqn))
    groups: dict[int, list[nn.Module]] = {}
    for module in model.modules():
        if fsdp_module is not None and isinstance(module, fsdp_module):
            state = module._get_fsdp_state()  # one FSDP2 state per fully_shard call
            groups.setdefault(id(state), list(state._modules))
        elif wrapper is not None and isinstance(module, wrapper):
            groups.setdefault(id(module), [module])
    ordered = sorted(
        (sorted(members, key=lambda m: position[id(m)]) for members in groups.values()),
        key=lambda members: position[id(members[0])],
    )
    return [[names[id(m)] for m in members] for members in ordered]
