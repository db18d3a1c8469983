"""Applying plans to FSDP: the FSDP1 policy, ``fully_shard`` groups, and the checks around them.

* :mod:`~execwrap.fsdp.fsdp1`: :class:`ParamExecOrderWrapPolicy`, an FSDP1 ``_Policy``;
* :mod:`~execwrap.fsdp.fsdp2`: :func:`apply_fully_shard`, groups in post-order with explicit
  prefetch;
* :mod:`~execwrap.fsdp.first_step`: recording the order during the first step (both paths);
* :mod:`~execwrap.fsdp.ranks`: the cross-rank checks of orders, parameters and plans;
* :mod:`~execwrap.fsdp.shardable`: parameters FSDP refuses, found before anything is wrapped.

Importing this package loads nothing: ``torch.distributed.fsdp`` is imported by the module
that needs it, on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
    from execwrap.fsdp.fsdp2 import apply_fully_shard
    from execwrap.fsdp.ranks import check_order_across_ranks, order_fingerprint

_EXPORTS: dict[str, str] = {
    "ParamExecOrderWrapPolicy": "execwrap.fsdp.fsdp1",
    "apply_fully_shard": "execwrap.fsdp.fsdp2",
    "check_order_across_ranks": "execwrap.fsdp.ranks",
    "order_fingerprint": "execwrap.fsdp.ranks",
}

__all__ = [
    "ParamExecOrderWrapPolicy",
    "apply_fully_shard",
    "check_order_across_ranks",
    "order_fingerprint",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
