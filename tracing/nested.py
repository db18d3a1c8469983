"""Tensors inside nested outputs: tuples, lists, mappings and dataclasses."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["default_loss", "tensors_in"]


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor in ``obj``, found through nested tuples, lists, mappings
    (dicts, transformers' ``ModelOutput``) and dataclasses, in order; each
    container is visited once.

    Example:
        >>> t = torch.ones(1)
        >>> tensors_in({"a": (t, [t]), "b": 3}) == [t, t]
        True
    """
    # an explicit stack, not a recursive closure: a nested function that calls itself
    # is a reference cycle, which would keep the tensors found alive until the garbage
    # collector runs (a forward hook calling this would hold every output for a while)
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack: list[Any] = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, torch.Tensor):
            out.append(value)
            continue
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, Mapping):
            items: list[Any] = list(value.values())
        elif isinstance(value, (list, tuple)):
            items = list(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            items = [getattr(value, f.name, None) for f in dataclasses.fields(value)]
        else:
            continue
        stack.extend(reversed(items))
    return out


def default_loss(output: Any) -> torch.Tensor | None:
    """Sum of every floating-point tensor in ``output`` that requires grad.

    Tensors are found through nested tuples, lists, dicts (and other
    mappings such as transformers' ``ModelOutput``) and dataclasses.

    Returns:
        A scalar tensor, or ``None`` when no output tensor requires grad.
    """
    tensors = [t for t in tensors_in(output) if t.is_floating_point() and t.requires_grad]
    if not tensors:
        return None
    device = tensors[0].device
    loss = tensors[0].sum()
    for t in tensors[1:]:
        loss = loss + t.sum().to(device)
    return loss
