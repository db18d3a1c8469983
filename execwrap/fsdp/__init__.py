"""Applying plans to FSDP: the FSDP1 policy, ``fully_shard`` groups, and the checks around them.

* :mod:`~execwrap.fsdp.fsdp1`: :class:`ParamExecOrderWrapPolicy`, an FSDP1 ``_Policy``;
* :mod:`~execwrap.fsdp.fsdp2`: :func:`apply_fully_shard`, groups in post-order with explicit
  prefetch;
* :mod:`~execwrap.fsdp.first_step`: recording the order during the first step (both paths);
* :mod:`~execwrap.fsdp.ranks`: the cross-rank checks of orders, parameters and plans;
* :mod:`~execwrap.fsdp.shardable`: parameters FSDP refuses, found before anything is wrapped;
* :mod:`~execwrap.fsdp.checkpointing`: activation checkpointing per unit, applied before
  sharding;
* :mod:`~execwrap.fsdp.precision`, :mod:`~execwrap.fsdp.offload`: mixed precision and CPU
  offload FSDP would refuse, found before anything is wrapped;
* :mod:`~execwrap.fsdp.accumulation`: gradient accumulation over micro-batches.

Importing this package loads nothing: ``torch.distributed.fsdp`` is imported by the module
that needs it, on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.fsdp.accumulation import GRADIENT_SYNCS, GradientSync, accumulate_gradients
    from execwrap.fsdp.checkpointing import (
        CHECKPOINT_MODES,
        CheckpointedForward,
        CheckpointMode,
        apply_checkpointing,
        selective_checkpoint_policy,
    )
    from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
    from execwrap.fsdp.fsdp2 import apply_fully_shard
    from execwrap.fsdp.offload import check_offload
    from execwrap.fsdp.precision import check_mixed_precision
    from execwrap.fsdp.ranks import check_order_across_ranks, order_fingerprint

_EXPORTS: dict[str, str] = {
    "GRADIENT_SYNCS": "execwrap.fsdp.accumulation",
    "GradientSync": "execwrap.fsdp.accumulation",
    "accumulate_gradients": "execwrap.fsdp.accumulation",
    "CHECKPOINT_MODES": "execwrap.fsdp.checkpointing",
    "CheckpointMode": "execwrap.fsdp.checkpointing",
    "CheckpointedForward": "execwrap.fsdp.checkpointing",
    "apply_checkpointing": "execwrap.fsdp.checkpointing",
    "selective_checkpoint_policy": "execwrap.fsdp.checkpointing",
    "check_mixed_precision": "execwrap.fsdp.precision",
    "check_offload": "execwrap.fsdp.offload",
    "ParamExecOrderWrapPolicy": "execwrap.fsdp.fsdp1",
    "apply_fully_shard": "execwrap.fsdp.fsdp2",
    "check_order_across_ranks": "execwrap.fsdp.ranks",
    "order_fingerprint": "execwrap.fsdp.ranks",
}

__all__ = [
    "CHECKPOINT_MODES",
    "CheckpointMode",
    "CheckpointedForward",
    "GRADIENT_SYNCS",
    "GradientSync",
    "ParamExecOrderWrapPolicy",
    "accumulate_gradients",
    "apply_checkpointing",
    "apply_fully_shard",
    "check_mixed_precision",
    "check_offload",
    "check_order_across_ranks",
    "order_fingerprint",
    "selective_checkpoint_policy",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
