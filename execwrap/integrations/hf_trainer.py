"""The HF Trainer: :class:`ExecwrapTrainer`, a ``transformers.Trainer`` that applies an execwrap plan.

No ``TrainingArguments`` field takes a policy object, and a policy assigned to
the Trainer's FSDP plugin after construction is ignored by accelerate's FSDP2
path. The Trainer's own extension point for what happens to the model before
the optimizer is built is a subclass overriding ``create_optimizer``; so
:class:`ExecwrapTrainer` takes the policy (or plan) as ``wrap_policy`` and:

1. at ``train()``, when the policy has nothing to capture its order with
   (no ``order``, ``tracing_config`` or ``example_inputs``), gives it one
   collated batch of the training set as example inputs (the global RNG is
   left as it was, so the training data order does not change);
2. FSDP2 (``fsdp_config={"fsdp_version": 2}``): in ``create_optimizer``,
   before the optimizer is built, captures the order and shards the model
   with :func:`execwrap.integrations.accelerate.prepare_fully_shard` (the
   plugin's settings; the plugin left consistent, so ``accelerator.prepare``
   keeps the sharded model);
3. FSDP1 (``fsdp_version`` 1): sets the policy as the plugin's
   ``auto_wrap_policy``, which accelerate's FSDP1 path calls when the Trainer
   prepares the model (before it builds the optimizer).

The plan applied is ``trainer.wrap_plan`` (FSDP1: ``policy.plan``).

The Trainer's own CPU limit: FSDP comes from accelerate, which drops the FSDP
plugin on CPU; :class:`ExecwrapTrainer` then refuses to start rather than
train without the plan.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import Trainer

from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
from execwrap.integrations.accelerate import prepare_fully_shard
from execwrap.plan.wrap_plan import WrapPlan

__all__ = ["ExecwrapTrainer"]

logger = logging.getLogger(__name__)


class ExecwrapTrainer(Trainer):
    """A ``transformers.Trainer`` whose FSDP units come from an execwrap policy or plan.

    Args:
        *args: ``Trainer``'s arguments; ``args.fsdp`` must be on
            (``TrainingArguments(fsdp=True, fsdp_config={"fsdp_version": 2})``).
        wrap_policy: a :class:`~execwrap.ParamExecOrderWrapPolicy` (FSDP1 or
            FSDP2) or a :class:`~execwrap.WrapPlan` for the model (FSDP2).
        prefetch: FSDP2 groups prefetched ahead in each direction.
        example_batch_size: rows of the training set collated into the batch
            the order is captured with (when the policy has no order source).
        **kwargs: ``Trainer``'s keyword arguments. ``optimizers=(optimizer, ...)``
            is refused under FSDP2 (an optimizer built before sharding holds
            the unsharded parameters); use ``optimizer_cls_and_kwargs``.

    Attributes:
        wrap_plan: the plan applied (``None`` until ``train()`` builds the
            optimizer under FSDP2; under FSDP1 it is ``wrap_policy.plan``).

    Raises:
        ValueError: FSDP is not enabled (``args.fsdp`` off, or accelerate
            dropped the plugin, as it does on CPU); a plan is given with FSDP1.

    Example:
        >>> trainer = ExecwrapTrainer(model=model, args=args, train_dataset=data,  # doctest: +SKIP
        ...                           wrap_policy=ParamExecOrderWrapPolicy(ModuleWrapPolicy({LlamaDecoderLayer})))
        >>> trainer.train()  # doctest: +SKIP
    """

    def __init__(
        self,
        *args: Any,
        wrap_policy: ParamExecOrderWrapPolicy | WrapPlan,
        prefetch: int = 1,
        example_batch_size: int = 1,
        **kwargs: Any,
    ) -> None:
        if not isinstance(wrap_policy, (ParamExecOrderWrapPolicy, WrapPlan)):
            raise TypeError(
                "ExecwrapTrainer: wrap_policy must be a ParamExecOrderWrapPolicy or a WrapPlan; "
                f"got {type(wrap_policy).__name__}"
            )
        self.wrap_policy = wrap_policy
        self.wrap_plan: WrapPlan | None = None
        self.prefetch = prefetch
        self.example_batch_size = example_batch_size
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------ Trainer hooks
    def create_accelerator_and_postprocess(self) -> None:
        """Trainer's accelerator set-up, then the FSDP plugin made to follow the plan."""
        super().create_accelerator_and_postprocess()
        state = self.accelerator.state
        plugin = getattr(state, "fsdp_plugin", None)
        if not self.is_fsdp_enabled or plugin is None:
            raise ValueError(
                "ExecwrapTrainer: FSDP is not enabled (accelerate distributed_type="
                f"{state.distributed_type}); pass TrainingArguments(fsdp=True, "
                "fsdp_config={'fsdp_version': 2}) and launch on accelerators: on CPU accelerate "
                "drops the FSDP plugin, and the plan would not be applied"
            )
        if plugin.fsdp_version == 1:
            if not isinstance(self.wrap_policy, ParamExecOrderWrapPolicy):
                raise ValueError(
                    "ExecwrapTrainer: FSDP1 (fsdp_version=1) takes a ParamExecOrderWrapPolicy, "
                    "not a WrapPlan; pass the policy, or use fsdp_version=2"
                )
            plugin.auto_wrap_policy = self.wrap_policy

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """``Trainer.train``, with the policy given an example batch first if it has none."""
        self._give_example_batch()
        return super().train(*args, **kwargs)

    def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
        """Apply the plan (FSDP2) to the model, then build the optimizer on its parameters."""
        plugin = self.accelerator.state.fsdp_plugin
        if plugin.fsdp_version == 2 and self.wrap_plan is None:
            if self.optimizer is not None:
                raise ValueError(
                    "ExecwrapTrainer: an optimizer passed in optimizers= was built on the "
                    "unsharded parameters, which FSDP2 replaces; pass optimizer_cls_and_kwargs= "
                    "so the optimizer is built after the plan is applied"
                )
            assert self.model is not None
            self.wrap_plan = prepare_fully_shard(
                self.accelerator, self.model, self.wrap_policy, prefetch=self.prefetch
            )
        elif plugin.fsdp_version == 1 and isinstance(self.wrap_policy, ParamExecOrderWrapPolicy):
            self.wrap_plan = self.wrap_policy.plan
        return super().create_optimizer(model)

    # ------------------------------------------------------------ helpers
    def _give_example_batch(self) -> None:
        policy = self.wrap_policy
        if not isinstance(policy, ParamExecOrderWrapPolicy) or self.train_dataset is None:
            return
        if any(
            x is not None
            for x in (policy.order, policy.tracing_config, policy.example_inputs, policy.plan)
        ):
            return
        n = min(self.example_batch_size, len(self.train_dataset))  # type: ignore[arg-type]
        with torch.random.fork_rng(devices=[]):
            batch = self.data_collator([self.train_dataset[i] for i in range(n)])
        assert self.model is not None
        device = next(self.model.parameters()).device
        policy.example_inputs = ()
        policy.example_kwargs = {
            k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in dict(batch).items()
        }
        logger.info(
            "ExecwrapTrainer: capturing the order with %d collated training row(s) (%s)",
            n,
            ", ".join(policy.example_kwargs),
        )
