"""Tensor parallelism as FSDP sees it: each parameter's local shard, planned for.

With a ``(dp, tp)`` mesh (or ``(replicate, shard, tp)``) a tensor-parallel plan
(torch's ``parallelize_module(model, mesh["tp"], plan)``, transformers'
``base_model_tp_plan``) leaves DTensor parameters sharded over ``tp``; FSDP2 then
shards each one's *local* tensor over the data-parallel ranks. So the plan is
made from the local sizes: :func:`local_order` returns the order with each
parameter's local shape, from

* the model's DTensor parameters (the plan was applied): their local tensors;
* else a tensor-parallel plan, ``{module FQN pattern: style}`` (``fnmatch``
  patterns, as both torch's and transformers' plans write them; a style is a
  ``ParallelStyle`` such as ``ColwiseParallel()`` or transformers' name:
  ``"colwise"``, ``"rowwise"``, ``"colwise_rep"``, ``"rowwise_rep"``,
  ``"local_colwise"``, ``"local_rowwise"``, ``"sequence_parallel"``...): colwise
  shards a ``Linear`` weight's dim 0 and its bias, an ``Embedding``'s dim 1;
  rowwise a ``Linear`` weight's dim 1 (bias replicated), an ``Embedding``'s dim 0;
  other styles replicate.

Not modelled: TP's own collectives (the all-reduces and all-gathers of
activations inside each block), sequence parallelism's, async TP, and a
tensor-parallel dimension that does not divide a sharded dimension evenly (the
local size is rounded up, as ``torch.chunk`` does on rank 0).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from tracing.fqn import owner_fqn
from tracing.order import ExecutionOrder, ParamInfo

__all__ = ["TP_STYLES", "local_order"]

#: Style name -> ``(Linear weight dim, Linear bias sharded?, Embedding weight dim)``;
#: ``None``: replicated.
TP_STYLES: dict[str, tuple[int | None, bool, int | None]] = {
    "colwise": (0, True, 1),
    "colwise_rep": (0, True, 1),
    "local_colwise": (0, True, 1),
    "packed_colwise": (0, True, 1),
    "rowwise": (1, False, 0),
    "rowwise_rep": (1, False, 0),
    "local_rowwise": (1, False, 0),
    "packed_rowwise": (1, False, 0),
    # transformers 5's names (transformers/distributed/tensor_parallel.py)
    "colwise_gather_output": (0, True, 1),
    "unit_colwise": (0, True, 1),
    "unit_rowwise": (1, False, 0),
    "rowwise_split_input": (1, False, 0),
    "embedding_rowwise": (None, False, 0),
    "embedding_colwise": (None, False, 1),
}


def local_order(
    order: ExecutionOrder,
    model: nn.Module,
    *,
    tp: int,
    tp_plan: Mapping[str, Any] | None = None,
    where: str = "plan_wrap",
) -> ExecutionOrder:
    """``order`` with each parameter's local shape under ``tp``-way tensor parallelism.

    Args:
        order: the model's order (global sizes, as captured).
        model: the model: its DTensor parameters give their local shapes.
        tp: tensor-parallel ranks.
        tp_plan: when the model has no DTensor parameters yet, the plan that will
            make them (module docstring).
        where: the caller, for messages.

    Returns:
        A copy of ``order`` whose ``params`` hold the local numel and shape.

    Raises:
        ValueError: ``tp > 1`` but no parameter of ``model`` is a DTensor and no
            ``tp_plan`` is given (the message says what to pass), or an unknown style.
    """
    from torch.distributed.tensor import DTensor

    local: dict[str, tuple[int, ...]] = {
        fqn: tuple(p.to_local().shape)
        for fqn, p in model.named_parameters()
        if isinstance(p, DTensor)
    }
    if not local and tp > 1:
        if tp_plan is None:
            raise ValueError(
                f"{where}: the mesh has a tensor-parallel dimension of {tp} ranks but no "
                f"parameter of {type(model).__name__} is a DTensor: apply the tensor-parallel "
                "plan first (torch.distributed.tensor.parallel.parallelize_module(model, "
                "mesh['tp'], plan)) and plan that model, or pass tp_plan= (the "
                "parallelize_module plan, or transformers' model.base_model_tp_plan) to plan "
                "from the local sizes it leaves"
            )
        local = _planned_shapes(order, tp_plan, tp, where)
    params = {
        fqn: _resized(info, local[fqn]) if fqn in local else info
        for fqn, info in order.params.items()
    }
    return dataclasses.replace(order, params=params)


def _resized(info: ParamInfo, shape: tuple[int, ...]) -> ParamInfo:
    numel = 1
    for d in shape:
        numel *= d
    return dataclasses.replace(info, numel=numel, shape=shape)


def _planned_shapes(
    order: ExecutionOrder, tp_plan: Mapping[str, Any], tp: int, where: str
) -> dict[str, tuple[int, ...]]:
    """Parameter FQN -> its local shape under ``tp_plan`` (only those it shards)."""
    out: dict[str, tuple[int, ...]] = {}
    for fqn, info in order.params.items():
        module = owner_fqn(fqn)
        style = _style_of(module, tp_plan, where)
        if style is None or style not in TP_STYLES:
            continue
        linear_dim, bias_sharded, embedding_dim = TP_STYLES[style]
        kind = order.module_classes.get(module, "")
        name = fqn.rpartition(".")[2]
        if kind == "Embedding":
            dim = embedding_dim if name == "weight" else None
        elif name == "bias":
            dim = 0 if bias_sharded else None
        else:
            dim = linear_dim
        if dim is not None and dim < len(info.shape):
            shape = list(info.shape)
            shape[dim] = -(-shape[dim] // tp)
            out[fqn] = tuple(shape)
    return out


def _style_of(module: str, tp_plan: Mapping[str, Any], where: str) -> str | None:
    """The style name the plan gives ``module`` (its first matching pattern)."""
    for pattern, style in tp_plan.items():
        if module == pattern or fnmatch.fnmatchcase(module, pattern):
            return _style_name(style, where)
    return None


def _style_name(style: Any, where: str) -> str:
    if isinstance(style, str):
        return style
    names = {"ColwiseParallel": "colwise", "RowwiseParallel": "rowwise"}
    kind = type(style).__name__
    if kind in names:
        return names[kind]
    if kind in ("SequenceParallel", "PrepareModuleInput", "PrepareModuleOutput"):
        return "replicated"
    raise ValueError(
        f"{where}: tp_plan style {style!r} is not one execwrap sizes; use ColwiseParallel(), "
        f"RowwiseParallel(), SequenceParallel() or one of {sorted(TP_STYLES)}"
    )
