"""Adapters from the frameworks people train with to execwrap's plans.

One module per framework, each imported only when used (importing
``execwrap.integrations`` imports no framework, and nothing in execwrap's
core imports one):

* :mod:`execwrap.integrations.lightning`: FSDP2 through
  ``ModelParallelStrategy`` (:func:`~execwrap.integrations.lightning.shard_lightning_module`
  in ``configure_model``) and FSDP1 through ``FSDPStrategy(auto_wrap_policy=...)``
  (:func:`~execwrap.integrations.lightning.lightning_wrap_policy`); plans named
  the way the LightningModule names its modules (``model.`` prefix).
* :mod:`execwrap.integrations.accelerate`: apply the plan before
  ``accelerator.prepare`` and leave the FSDP2 plugin consistent with it
  (:func:`~execwrap.integrations.accelerate.prepare_fully_shard`); refuse a
  policy object on a plugin that would ignore it.
* :mod:`execwrap.integrations.hf_trainer`: a ``transformers.Trainer``
  subclass that captures the order and applies the plan before the optimizer
  is built (:class:`~execwrap.integrations.hf_trainer.ExecwrapTrainer`).
* :mod:`execwrap.integrations.torchtitan`: ``apply_fsdp`` with torchtitan's
  arguments (mesh, ``reshard_after_forward`` policy, mixed precision) and a
  drop-in ``parallelize_fn``.
* :mod:`execwrap.integrations.peft`: PEFT's own wrap policy as ``init_policy``.
* :mod:`execwrap.integrations.transformers`: transformers 5's own FSDP2 path
  (``from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=...))``): its
  ``fsdp_plan`` read as an execwrap plan (:func:`~execwrap.integrations.transformers.load_fsdp_plan`,
  :func:`~execwrap.integrations.transformers.plan_from_pretrained`), execwrap's plans written
  in its format (:func:`~execwrap.integrations.transformers.to_fsdp_plan`) and applied
  through ``from_pretrained`` (:func:`~execwrap.integrations.transformers.applying_plan`).

Framework-free helpers, re-exported here: :func:`fsdp_groups` (the groups
FSDP really built), :func:`lift_order` / :func:`lift_plan` (a submodule's
order or plan in its parent's FQNs), :func:`plan_for_mesh` (a policy plans for
the framework's mesh: HSDP's replicas, tensor parallelism).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracing.lazy import lazy_exports

if TYPE_CHECKING:
    from execwrap.integrations.groups import fsdp_groups
    from execwrap.integrations.mesh import plan_for_mesh
    from execwrap.integrations.prefix import lift_order, lift_plan, submodule_prefix

_EXPORTS: dict[str, str] = {
    "fsdp_groups": "execwrap.integrations.groups",
    "lift_order": "execwrap.integrations.prefix",
    "lift_plan": "execwrap.integrations.prefix",
    "plan_for_mesh": "execwrap.integrations.mesh",
    "submodule_prefix": "execwrap.integrations.prefix",
}

__all__ = ["fsdp_groups", "lift_order", "lift_plan", "plan_for_mesh", "submodule_prefix"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
