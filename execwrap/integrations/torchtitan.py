"""torchtitan: an execwrap ``apply_fsdp`` and a drop-in ``parallelize_fn``.

torchtitan shards a decoder in ``torchtitan.distributed.fsdp.apply_fsdp_to_decoder``
(called by each model's ``parallelize_fn``, e.g. ``parallelize_llama``): the
token embeddings alone, ``[norm, lm_head]`` as one group (not resharded after
forward by default), each transformer block, then the root; FSDP's gradient
division turned off (torchtitan divides the loss by the global token count).

* :func:`apply_fsdp` takes the same arguments (mesh, dtypes for mixed
  precision, ``pp_enabled``, ``cpu_offload``, ``reshard_after_forward_policy``)
  and applies an execwrap policy or plan instead, with the same semantics:
  mixed precision without casting forward inputs, the group that runs last in
  forward (``[norm, lm_head]`` in torchtitan's grouping) not resharded after
  forward unless the policy is ``"always"``, the root without an explicit
  ``reshard_after_forward``, gradient division off; plus explicit prefetching
  from the captured order.
* :func:`decoder_policy` is torchtitan's grouping stated for execwrap
  (:func:`torchtitan_groups`: ``[["tok_embeddings"], ["norm", "lm_head"]]``,
  or one group of the three when the weights are tied), for any decoder.
* :func:`parallelize_fn` returns a function with the signature torchtitan's
  trainer calls (``model_spec.parallelize_fn(model, parallel_dims=...,
  training=..., parallelism=..., compile_config=..., ac_config=...,
  dump_folder=...)``), doing what ``parallelize_llama`` does with
  :func:`apply_fsdp` in place of ``apply_fsdp_to_decoder``.

torchtitan's own CPU limits: its trainer builds CUDA meshes
(``torchtitan.tools.utils.device_type``), its language models refuse SDPA
attention in their configs and FlexAttention has no backward on CPU, its model
package imports ``triton``, and FSDP's reduction with a divide factor
(``PREMUL_SUM``) does not exist on gloo. :func:`apply_fsdp` handles the last
(on a gloo mesh it sums instead, which is the same reduction for a divide
factor of 1); the others limit what runs on CPU to the model and its
parallelize step (see the README).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy
from torchtitan.distributed.fsdp import (
    disable_fsdp_gradient_division,
    get_fsdp_reshard_after_forward_policy,
)

from execwrap.fsdp.checkpointing import CheckpointMode, apply_checkpointing
from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
from execwrap.fsdp.fsdp2 import apply_fully_shard
from execwrap.integrations.mesh import plan_for_mesh
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.util.mesh import MeshShape

__all__ = [
    "Parallelize",
    "apply_fsdp",
    "checkpointing_of",
    "decoder_policy",
    "parallelize_fn",
    "torchtitan_groups",
]

logger = logging.getLogger(__name__)

PolicyOrPlan = ParamExecOrderWrapPolicy | WrapPlan


def apply_fsdp(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    pp_enabled: bool,
    cpu_offload: bool = False,
    reshard_after_forward_policy: str = "default",
    *,
    policy_or_plan: PolicyOrPlan,
    prefetch: int = 1,
    dp_mesh_dims: Any = None,
) -> WrapPlan:
    """Shard ``model`` with FSDP2 from an execwrap plan, as ``apply_fsdp_to_decoder`` does.

    Args:
        model: the model (on the meta device or materialised).
        dp_mesh: the data-parallel mesh (``parallel_dims.get_mesh("fsdp")``).
        param_dtype: mixed-precision parameter dtype (``torch.bfloat16``).
        reduce_dtype: mixed-precision gradient reduction dtype.
        pp_enabled: whether pipeline parallelism is on (the ``"default"``
            policy then keeps parameters after forward).
        cpu_offload: offload parameters to CPU (``CPUOffloadPolicy``).
        reshard_after_forward_policy: ``"default"``, ``"always"`` or ``"never"``
            (torchtitan's ``fsdp_reshard_after_forward``).
        policy_or_plan: the execwrap policy (e.g. :func:`decoder_policy`) or plan.
        prefetch: groups prefetched ahead in each direction (``0``: FSDP2's
            implicit prefetching).
        dp_mesh_dims: ``DataParallelMeshDims`` under torchtitan's
            ``full_dtensor`` / ``spmd_types`` backends, else ``None``.

    Returns:
        The plan applied.

    Raises:
        ValueError: an unknown ``reshard_after_forward_policy`` (torchtitan's
            message), or what :func:`execwrap.apply_fully_shard` raises.
    """
    reshard = get_fsdp_reshard_after_forward_policy(reshard_after_forward_policy, pp_enabled)
    last_reshard = reshard_after_forward_policy == "always"
    config: dict[str, Any] = {
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=False
        ),
    }
    if dp_mesh_dims is not None:
        config["dp_mesh_dims"] = dp_mesh_dims
    if cpu_offload:
        config["offload_policy"] = CPUOffloadPolicy()

    last: list[list[str] | None] = []  # found once, on the first group (the plan exists then)

    def group_kwargs(fqns: list[str]) -> dict[str, Any]:
        if fqns == [""]:
            return {}  # the root: FSDP2's default (kept after forward)
        if not last:
            plan = policy_or_plan if isinstance(policy_or_plan, WrapPlan) else policy_or_plan.plan
            last.append(_last_forward_group(plan) if plan is not None else None)
        return {"reshard_after_forward": last_reshard if fqns == last[0] else reshard}

    plan = apply_fully_shard(
        model,
        policy_or_plan,
        mesh=dp_mesh,
        prefetch=prefetch,
        group_kwargs=group_kwargs,
        **config,
    )
    disable_fsdp_gradient_division(model)
    if _is_gloo(dp_mesh):
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    logger.info("apply_fsdp: %d FSDP2 groups: %s", len(plan.groups), plan.groups)
    return plan


def torchtitan_groups(model: nn.Module) -> list[list[str]]:
    """torchtitan's stated groups for a decoder: what ``apply_fsdp_to_decoder`` builds
    besides its blocks.

    Returns:
        ``[["tok_embeddings"], ["norm", "lm_head"]]``, or
        ``[["tok_embeddings", "norm", "lm_head"]]`` when ``model.enable_weight_tying``
        (one group holds the tied weight), leaving out modules the model lacks.
    """
    present = [
        n for n in ("tok_embeddings", "norm", "lm_head") if getattr(model, n, None) is not None
    ]
    if getattr(model, "enable_weight_tying", False):
        return [present] if present else []
    groups: list[list[str]] = [["tok_embeddings"]] if "tok_embeddings" in present else []
    tail: list[str] = [n for n in ("norm", "lm_head") if n in present]
    return [*groups, tail] if len(tail) == 2 else groups


def decoder_policy(model: nn.Module, **policy_kwargs: Any) -> ParamExecOrderWrapPolicy:
    """An execwrap policy with torchtitan's decoder grouping: one unit per block of
    ``model.layers``, plus :func:`torchtitan_groups`.

    Args:
        model: a torchtitan decoder (``model.layers`` holds its blocks).
        **policy_kwargs: :class:`~execwrap.ParamExecOrderWrapPolicy` arguments
            (``tracing_config``, ``example_inputs``, ``bucket_numel``, ...).

    Returns:
        The policy.
    """
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    layers = getattr(model, "layers", None)
    blocks = layers.values() if isinstance(layers, nn.ModuleDict) else (layers or [])
    classes = {type(b) for b in blocks}
    if not classes:
        raise ValueError(
            f"decoder_policy: {type(model).__name__} has no blocks in model.layers; build a "
            "ParamExecOrderWrapPolicy with your own init_policy"
        )
    policy_kwargs.setdefault("groups", torchtitan_groups(model))
    return ParamExecOrderWrapPolicy(ModuleWrapPolicy(classes), **policy_kwargs)


def parallelize_fn(
    policy_or_plan: PolicyOrPlan | Callable[[nn.Module], PolicyOrPlan], *, prefetch: int = 1
) -> Parallelize:
    """A torchtitan ``parallelize_fn`` that shards with an execwrap plan.

    Args:
        policy_or_plan: a policy or plan, or a function of the model returning
            one (e.g. :func:`decoder_policy`, called with the model torchtitan
            passes).
        prefetch: groups prefetched ahead in each direction.

    Returns:
        A :class:`Parallelize`: call it as torchtitan calls a model's
        ``parallelize_fn``; set it as ``ModelSpec.parallelize_fn``.

    Example:
        >>> spec.parallelize_fn = parallelize_fn(decoder_policy)  # doctest: +SKIP
    """
    return Parallelize(policy_or_plan, prefetch=prefetch)


class Parallelize:
    """torchtitan's parallelize step with :func:`apply_fsdp` for FSDP.

    ``Parallelize(policy)(model, *, parallel_dims, training, parallelism,
    compile_config, ac_config, dump_folder)`` applies tensor parallelism,
    activation checkpointing and ``torch.compile`` as ``parallelize_llama``
    applies them, then :func:`apply_fsdp` with the mesh and settings torchtitan
    would pass to ``apply_fsdp_to_decoder``; it returns the model. A policy without a
    ``mesh`` plans for torchtitan's (``dp_replicate`` replicas of ``dp_shard`` ranks,
    ``tp``: :func:`~execwrap.integrations.mesh.plan_for_mesh`). Full and
    selective checkpointing are applied by execwrap (:func:`checkpointing_of`:
    the same blocks, the same policy, FQNs kept), other ``ac_config`` by
    torchtitan.

    Attributes:
        plan: the plan applied by the last call (``None`` before).

    Raises:
        NotImplementedError: (from a call) context parallelism, which
            torchtitan applies per model family: use the model's own
            ``parallelize_fn``.
    """

    def __init__(
        self, policy_or_plan: PolicyOrPlan | Callable[[nn.Module], PolicyOrPlan], *, prefetch: int
    ) -> None:
        self.policy_or_plan = policy_or_plan
        self.prefetch = prefetch
        self.plan: WrapPlan | None = None

    def __call__(
        self,
        model: nn.Module,
        *,
        parallel_dims: Any,
        training: Any,
        parallelism: Any,
        compile_config: Any,
        ac_config: Any,
        dump_folder: str,
    ) -> nn.Module:
        from torchtitan.config import TORCH_DTYPE_MAP
        from torchtitan.distributed.compile import apply_compile

        if parallel_dims.cp_enabled:
            raise NotImplementedError(
                "execwrap parallelize_fn: context parallelism is applied per model family by "
                "torchtitan; use the model's own parallelize_fn"
            )
        full = parallelism.spmd_backend in ("full_dtensor", "spmd_types")
        if full:
            from torchtitan.distributed.full_dtensor import resolve_fsdp_mesh, validate_config

            validate_config(parallel_dims, model)
            model.parallelize(parallel_dims)  # type: ignore[operator]
        elif parallel_dims.tp_enabled:
            model.parallelize(parallel_dims)  # type: ignore[operator]
        if ac_config is not None:
            modes = checkpointing_of(model, ac_config)
            if modes is None:
                ac_config.build(dump_folder=dump_folder).apply(model)
            else:
                apply_checkpointing(model, (), modes)
        if compile_config.enable and "model" in compile_config.components:
            apply_compile(model, compile_config=compile_config, parallel_dims=parallel_dims)
        if full:
            dp_mesh, dims = resolve_fsdp_mesh(parallel_dims)
        else:
            names = ["dp_replicate", "fsdp"] if parallel_dims.dp_replicate_enabled else ["fsdp"]
            dp_mesh, dims = parallel_dims.get_mesh(names), None
        chosen = self.policy_or_plan
        if not isinstance(chosen, (ParamExecOrderWrapPolicy, WrapPlan)):
            chosen = chosen(model)
        dp = MeshShape.from_device_mesh(dp_mesh, where="parallelize_fn")
        plan_for_mesh(chosen, MeshShape(dp.replicate, dp.shard, parallel_dims.tp))
        self.plan = apply_fsdp(
            model,
            dp_mesh,
            param_dtype=TORCH_DTYPE_MAP[training.mixed_precision_param],
            reduce_dtype=TORCH_DTYPE_MAP[training.mixed_precision_reduce],
            pp_enabled=parallel_dims.pp_enabled,
            cpu_offload=training.enable_cpu_offload,
            reshard_after_forward_policy=parallelism.fsdp_reshard_after_forward,
            policy_or_plan=chosen,
            prefetch=self.prefetch,
            dp_mesh_dims=dims,
        )
        return model


def checkpointing_of(model: nn.Module, ac_config: Any) -> dict[str, CheckpointMode] | None:
    """torchtitan's activation checkpointing config as execwrap checkpointing of the blocks.

    torchtitan checkpoints every block of ``model.layers`` with torch's
    ``checkpoint_wrapper``, which inserts ``_checkpoint_wrapped_module`` into their
    FQNs (the plan and its order then name modules the runtime capture does not).
    The same checkpointing, applied by :func:`execwrap.fsdp.checkpointing.apply_checkpointing`,
    keeps the FQNs; selective is torchtitan's own op-level policy
    (:func:`execwrap.selective_checkpoint_policy`).

    Args:
        model: the decoder (``model.layers`` holds its blocks).
        ac_config: torchtitan's ``ActivationCheckpointingConfig``: ``FullAC.Config``,
            ``SelectiveAC.Config``, ``MemoryBudgetAC.Config`` or ``None``.

    Returns:
        ``{"layers.<i>": "full" | "selective"}`` for every block, or ``None`` where
        torchtitan's own policy must apply: another config, options changed from
        their defaults (RNG state, determinism check, debug), or a module matching
        ``force_recompute_mm_shapes_by_fqns`` (MoE router gates, which execwrap's
        selective policy does not single out).
    """
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    kinds: dict[type, CheckpointMode] = {FullAC.Config: "full", SelectiveAC.Config: "selective"}
    mode = kinds.get(type(ac_config))
    layers = getattr(model, "layers", None)
    if mode is None or not isinstance(layers, nn.Module):
        return None
    defaults = type(ac_config)()
    forced = list(getattr(ac_config, "force_recompute_mm_shapes_by_fqns", None) or ())
    changed = [
        f.name
        for f in dataclasses.fields(ac_config)
        if f.name != "force_recompute_mm_shapes_by_fqns"
        and getattr(ac_config, f.name) != getattr(defaults, f.name)
    ]
    matched = [n for n, _ in model.named_modules() if any(f in n for f in forced)]
    if changed or matched:
        logger.info(
            "torchtitan's own activation checkpointing applies (%s)",
            f"options {changed}" if changed else f"forced recompute of {matched[:3]}",
        )
        return None
    return {f"layers.{name}": mode for name, _ in layers.named_children()}


def _last_forward_group(plan: WrapPlan) -> list[str] | None:
    """The non-root group that starts last in forward (``None`` if there is none)."""
    groups = [u for u in plan.units if not u.is_root]
    if not groups:
        return None
    called = [u for u in groups if u.first_use is not None]
    last = max(called, key=lambda u: u.first_use or 0) if called else groups[-1]
    return list(last.module_fqns)


def _is_gloo(mesh: DeviceMesh) -> bool:
    try:
        return dist.get_backend(mesh.get_group(0)) == "gloo"
    except (RuntimeError, ValueError):
        return False
