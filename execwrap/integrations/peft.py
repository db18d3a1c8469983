"""PEFT: adapters on a frozen model, sharded by an execwrap plan.

A PEFT model mixes frozen base weights and trainable adapter weights in the
same blocks. What that means depends on the target, and the plan says it for
the target it is applied to (``plan_wrap(..., target=...)``; the policy passes
it itself):

* FSDP2 (:func:`execwrap.apply_fully_shard`) accepts a group mixing them: it
  shards and all-gathers both and reduce-scatters only the adapters'
  gradients.
* FSDP1 flattens each unit into one flat parameter with one
  ``requires_grad``: with ``use_orig_params=False`` a unit that mixes them is
  refused by :class:`~execwrap.ParamExecOrderWrapPolicy` before anything is
  wrapped, naming the units. PEFT's own policy
  (:func:`peft_init_policy`, ``peft.utils.other.fsdp_auto_wrap_policy``)
  wraps every trainable leaf module (the adapters' ``lora_A``/``lora_B``) as a
  unit of its own besides the decoder blocks, so no unit mixes them, and it
  works with ``use_orig_params=False``.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from peft.utils.other import fsdp_auto_wrap_policy

from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy

__all__ = ["peft_init_policy", "peft_wrap_policy"]


def peft_init_policy(model: nn.Module) -> Any:
    """PEFT's own FSDP auto-wrap policy for ``model``, to pass as ``init_policy``.

    Args:
        model: a PEFT model (``get_peft_model(base, config)``).

    Returns:
        ``peft.utils.other.fsdp_auto_wrap_policy(model)``: decoder blocks (the
        model's ``_no_split_modules``, or the ``FSDP_TRANSFORMER_CLS_TO_WRAP``
        environment variable) and every trainable leaf module with a weight.
    """
    return fsdp_auto_wrap_policy(model)


def peft_wrap_policy(model: nn.Module, **policy_kwargs: Any) -> ParamExecOrderWrapPolicy:
    """A :class:`~execwrap.ParamExecOrderWrapPolicy` with PEFT's units, ordered by execution.

    Args:
        model: the PEFT model.
        **policy_kwargs: the policy's other arguments (``tracing_config``,
            ``example_inputs``, ``bucket_numel``, ...).

    Returns:
        ``ParamExecOrderWrapPolicy(peft_init_policy(model), **policy_kwargs)``.
    """
    return ParamExecOrderWrapPolicy(peft_init_policy(model), **policy_kwargs)
