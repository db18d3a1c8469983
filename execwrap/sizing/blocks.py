"""A model given as an ``nn.Module`` or a factory: its units and its token-id inputs.

:func:`module_target` sizes any language model whose forward takes token ids
``[micro_batch, sequence_length]`` as its first argument: its FSDP units are its
repeated blocks (the classes of the longest ``nn.ModuleList`` of modules, as
``ModuleWrapPolicy({Block})`` would be written by hand; the whole model when it has
none), its inputs meta token ids.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy, always_wrap_policy

from execwrap.sizing.job import SizingModel

__all__ = ["block_policy", "module_target"]


def block_policy(model: nn.Module) -> Any:
    """``ModuleWrapPolicy`` of the classes in the model's longest ``nn.ModuleList``
    (its repeated blocks); ``always_wrap_policy`` on the root only when it has none.

    >>> from execwrap.demo_models import GPT
    >>> sorted(c.__name__ for c in block_policy(GPT())._module_classes)
    ['Block']
    """
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) > 0]
    if not lists:
        return always_wrap_policy
    longest = max(lists, key=len)
    return ModuleWrapPolicy({type(m) for m in longest})


def module_target(
    model: nn.Module, *, name: str | None = None, source: dict[str, str] | None = None
) -> SizingModel:
    """A :class:`~execwrap.sizing.job.SizingModel` of a language model on the meta device
    whose first forward argument is token ids (module docstring).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fit: model must be an nn.Module; got {type(model).__name__}")

    def inputs(micro_batch: int, sequence_length: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        ids = torch.zeros(micro_batch, sequence_length, dtype=torch.long, device="meta")
        return (ids,), {}

    return SizingModel(
        model=model,
        name=name or type(model).__name__,
        init_policy=block_policy(model),
        inputs=inputs,
        source=source or {"kind": "module"},
    )
