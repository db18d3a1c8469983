"""accelerate: apply an execwrap plan before ``accelerator.prepare``.

accelerate's FSDP2 path (``FullyShardedDataParallelPlugin(fsdp_version=2)``)
builds its own groups from ``transformer_cls_names_to_wrap`` or
``min_num_params`` and ignores any other ``auto_wrap_policy``: a
:class:`~execwrap.ParamExecOrderWrapPolicy` given there leaves the blocks
unsharded, silently. The supported way in is :func:`prepare_fully_shard`:
it shards the model with :func:`execwrap.apply_fully_shard`, with the
plugin's own settings (``reshard_after_forward``, ``mixed_precision_policy``,
``cpu_offload``, ``ignored_modules``, ``activation_checkpointing``: full
checkpointing of the plan's units, applied before sharding with FQNs kept, where
accelerate would put a ``checkpoint_wrapper`` around its wrapped layers; the
accelerator's FSDP mesh: with ``ParallelismConfig(dp_replicate_size=...)`` HSDP's
2-D mesh, which a policy without a ``mesh`` plans for), and
leaves the plugin consistent with the result (no wrap policy, no class
names), so ``accelerator.prepare(model, optimizer)`` finds an FSDP2 model and
keeps it as it is. A plugin that keeps ``transformer_cls_names_to_wrap`` would
otherwise fail in ``prepare`` with "Could not find the transformer layer
class ..." (the classes are renamed ``FSDP<Name>`` by sharding).

accelerate's FSDP1 path (``fsdp_version=1``) calls a policy object given as
``auto_wrap_policy``: ``FullyShardedDataParallelPlugin(fsdp_version=1,
auto_wrap_policy=policy)`` works unchanged.

accelerate's own CPU limit: on CPU (``accelerate launch --cpu``, ``torchrun``
without GPUs) accelerate drops the FSDP plugin and sets up plain
multi-process CPU training; :func:`prepare_fully_shard` refuses such an
accelerator rather than shard behind its back.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch.distributed.fsdp import MixedPrecisionPolicy

from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
from execwrap.fsdp.fsdp2 import apply_fully_shard
from execwrap.integrations.mesh import plan_for_mesh
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.util.mesh import MeshShape

__all__ = ["check_fsdp_plugin", "prepare_fully_shard"]

logger = logging.getLogger(__name__)


def prepare_fully_shard(
    accelerator: Accelerator,
    model: nn.Module,
    policy_or_plan: ParamExecOrderWrapPolicy | WrapPlan,
    *,
    prefetch: int = 1,
    group_kwargs: Callable[[list[str]], Mapping[str, Any]] | None = None,
) -> WrapPlan:
    """Shard ``model`` with FSDP2 from a plan, with the accelerator's plugin settings.

    Call it after creating the model and before ``accelerator.prepare``; build
    the optimizer after it (on the sharded parameters)::

        plan = prepare_fully_shard(accelerator, model, policy)
        optimizer = torch.optim.AdamW(model.parameters())
        model, optimizer = accelerator.prepare(model, optimizer)

    Args:
        accelerator: an ``Accelerator`` set up for FSDP2.
        model: the unwrapped model.
        policy_or_plan: a policy or a ready plan (see :func:`execwrap.apply_fully_shard`).
        prefetch: groups prefetched ahead in each direction.
        group_kwargs: per-group ``fully_shard`` overrides (see
            :func:`execwrap.apply_fully_shard`).

    Returns:
        The plan applied.

    Raises:
        ValueError: the accelerator has no FSDP plugin (on CPU accelerate drops
            it), or an FSDP1 plugin (pass the policy as its
            ``auto_wrap_policy`` instead), or the plugin's
            ``activation_checkpointing_offload`` is on (not applied by execwrap);
            what :func:`execwrap.apply_fully_shard` refuses (an
            ``mixed_precision_policy`` FSDP would refuse, CPU offload on a CPU mesh).
    """
    plugin = _fsdp2_plugin(accelerator)
    if isinstance(plugin.auto_wrap_policy, ParamExecOrderWrapPolicy):
        logger.debug("prepare_fully_shard: dropping the policy object from the FSDP2 plugin")
    kwargs: dict[str, Any] = {
        "reshard_after_forward": plugin.reshard_after_forward,
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
    }
    if plugin.cpu_offload is not None:
        kwargs["offload_policy"] = plugin.cpu_offload
    ignored = _ignored_params(model, plugin.ignored_modules)
    if ignored:
        kwargs["ignored_params"] = ignored
    mesh = _fsdp_mesh(accelerator)
    if mesh is not None:  # HSDP's replicas (dp_replicate_size) and tp_size, planned for
        dp = MeshShape.from_device_mesh(mesh, where="prepare_fully_shard")
        tp = getattr(accelerator.parallelism_config, "tp_size", 1) or 1
        plan_for_mesh(policy_or_plan, MeshShape(dp.replicate, dp.shard, tp))
    plan = apply_fully_shard(
        model,
        policy_or_plan,
        mesh=mesh,
        prefetch=prefetch,
        group_kwargs=group_kwargs,
        checkpointing="full" if plugin.activation_checkpointing else None,
        **kwargs,
    )
    # What prepare() reads: nothing left to wrap, no class names to look up.
    plugin.auto_wrap_policy = None
    plugin.transformer_cls_names_to_wrap = None
    logger.info("prepare_fully_shard: %d FSDP2 groups: %s", len(plan.groups), plan.groups)
    return plan


def check_fsdp_plugin(plugin: Any) -> None:
    """Refuse an FSDP2 plugin that holds a policy object it would ignore.

    Args:
        plugin: an ``accelerate.utils.FullyShardedDataParallelPlugin``.

    Raises:
        TypeError: ``plugin.fsdp_version == 2`` and ``plugin.auto_wrap_policy``
            is a policy object (accelerate's FSDP2 path knows only
            ``transformer_auto_wrap_policy`` and ``size_based_auto_wrap_policy``
            and would leave the blocks unsharded).
    """
    policy = getattr(plugin, "auto_wrap_policy", None)
    if getattr(plugin, "fsdp_version", 1) == 2 and isinstance(policy, ParamExecOrderWrapPolicy):
        raise TypeError(
            "accelerate's FSDP2 plugin ignores a ParamExecOrderWrapPolicy as auto_wrap_policy "
            "(its FSDP2 preparation knows only transformer_auto_wrap_policy and "
            "size_based_auto_wrap_policy, so the blocks would stay unsharded). Create the "
            "plugin without auto_wrap_policy and call "
            "execwrap.integrations.accelerate.prepare_fully_shard(accelerator, model, policy) "
            "before accelerator.prepare"
        )


def _fsdp2_plugin(accelerator: Accelerator) -> Any:
    state = accelerator.state
    plugin = getattr(state, "fsdp_plugin", None)
    if state.distributed_type != DistributedType.FSDP or plugin is None:
        raise ValueError(
            "prepare_fully_shard: the Accelerator is not set up for FSDP (distributed_type="
            f"{state.distributed_type}); pass fsdp_plugin=FullyShardedDataParallelPlugin("
            "fsdp_version=2) to Accelerator and launch on accelerators: on CPU "
            "(accelerate launch --cpu, torchrun without GPUs) accelerate drops the FSDP plugin"
        )
    if plugin.fsdp_version != 2:
        raise ValueError(
            "prepare_fully_shard: the FSDP plugin has fsdp_version=1; accelerate's FSDP1 path "
            "calls a policy object itself: FullyShardedDataParallelPlugin(fsdp_version=1, "
            "auto_wrap_policy=policy), no prepare_fully_shard needed"
        )
    if getattr(plugin, "activation_checkpointing_offload", False):
        raise ValueError(
            "prepare_fully_shard: the plugin's activation_checkpointing_offload (save_on_cpu "
            "around each checkpointed layer) is not applied by execwrap; set it False "
            "(activation_checkpointing=True alone checkpoints the plan's units)"
        )
    return plugin


def _fsdp_mesh(accelerator: Accelerator) -> Any:
    """The accelerator's FSDP mesh (as accelerate's FSDP2 preparation picks it), or ``None``."""
    mesh = getattr(accelerator, "torch_device_mesh", None)
    config = getattr(accelerator, "parallelism_config", None)
    if mesh is None or config is None:
        return None
    return mesh[tuple(config.fsdp_dim_names)]


def _ignored_params(model: nn.Module, ignored: Any) -> set[nn.Parameter]:
    """Parameters of the plugin's ``ignored_modules`` (modules, or a regex of FQNs)."""
    if not ignored:
        return set()
    if isinstance(ignored, str):
        pattern = re.compile(ignored)
        modules = [m for n, m in model.named_modules() if pattern.fullmatch(n)]
    else:
        modules = list(ignored)
    return {p for m in modules for p in m.parameters()}
