"""torchtitan's op-level selective activation checkpointing policy, in plain torch.

:func:`selective_checkpoint_policy` decides per aten op whether
``torch.utils.checkpoint`` keeps its output or runs it again;
:func:`selective_contexts` is the ``context_fn`` that applies it. Both know
torch only: :mod:`execwrap.fsdp.checkpointing` applies them to a plan's units,
and :mod:`execwrap.cost.checkpoint_overhead` times their host work per op on
the device being calibrated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["selective_checkpoint_policy", "selective_contexts"]


#: torch.ops the selective policy counts as matmuls (every second one is recomputed).
_MM_OPS = (torch.ops.aten.mm.default, torch.ops.aten.linear.default)
_TO_COPY: Any = torch.ops.aten._to_copy.default


def _save_ops() -> frozenset[Any]:
    """torchtitan 0.3's ``_get_default_save_ops()``: the partitioner's compute-intensive
    ops, attention variants, ``max`` (float8 scales), ``linear``, ``topk`` and the
    communication ops; those a build of torch lacks are skipped."""
    from torch._functorch.partitioners import get_default_op_list

    intensive: Any = get_default_op_list().compute_intensive_ops
    ops: set[Any] = {op.default for op in intensive}
    aten = torch.ops.aten
    for name in (
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable",
        "max",
        "linear",
        "topk",
    ):
        packet = getattr(aten, name, None)
        if packet is not None:
            ops.add(packet.default)
    for hop in ("flex_attention", "inductor_compiled_code"):
        found = getattr(torch._higher_order_ops, hop, None)
        if found is not None:
            ops.add(found)
    functional = getattr(torch.ops, "_c10d_functional", None)
    for name in ("reduce_scatter_tensor", "all_to_all_single"):
        packet = getattr(functional, name, None) if functional is not None else None
        if packet is not None:
            ops.add(packet.default)
    return frozenset(ops)


def selective_checkpoint_policy() -> Callable[..., Any]:
    """A fresh op-level selective checkpointing policy (torchtitan's, with its own counters).

    For ``torch.utils.checkpoint.create_selective_checkpoint_contexts``; make one per
    checkpointed forward (a ``context_fn`` calls this each time), as torchtitan does:
    matmuls are counted separately in forward and in recomputation so that both make
    the same choices.

    Returns:
        ``policy(ctx, func, *args, **kwargs) -> CheckpointPolicy``: ``MUST_SAVE`` for a
        device-to-host copy and for the save ops (:func:`_save_ops`) except every
        second matmul (``aten.mm``/``aten.linear``: the 2nd, 4th, ... of the region),
        ``PREFER_RECOMPUTE`` otherwise. torchtitan's ``force_recompute_mm_shapes_by_fqns``
        (MoE router gates) is not taken over: execwrap's units carry no such names.

    Source:
        torchtitan 0.3 ``torchtitan/distributed/activation_checkpoint.py``,
        ``SelectiveAC._wrap_block``.
    """
    from torch.utils.checkpoint import CheckpointPolicy

    save_ops = _save_ops()
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if (
            func == _TO_COPY
            and args
            and "cuda" in str(getattr(args[0], "device", ""))
            and str(kwargs.get("device", "")) == "cpu"
        ):
            return CheckpointPolicy.MUST_SAVE
        key = "recompute" if ctx.is_recompute else "forward"
        if func in _MM_OPS:
            counts[key] += 1
        if func in save_ops:
            if func in _MM_OPS and counts[key] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def selective_contexts() -> Any:
    """The ``context_fn`` of ``torch.utils.checkpoint.checkpoint`` that applies a fresh
    :func:`selective_checkpoint_policy` (a pair of dispatch modes: forward, recompute)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(selective_checkpoint_policy())
