"""Lightning: execwrap plans through ``ModelParallelStrategy`` (FSDP2) and ``FSDPStrategy`` (FSDP1).

A LightningModule holds the user's model as an attribute (``self.model``) and
Lightning calls ``training_step``, not ``forward``, so:

* FSDP2 (``Trainer(strategy=ModelParallelStrategy(...))``): call
  :func:`shard_lightning_module` in ``configure_model``. It shards the held
  model (the module whose forward runs) with :func:`execwrap.apply_fully_shard`
  on the strategy's ``data_parallel`` mesh, exactly as Lightning's own
  per-block recipe does with ``fully_shard``, and returns the plan as a plan
  of the LightningModule (``model.model.layers.0``): the names the user sees
  in ``named_parameters()``, checkpoints and the model summary, the same
  names as the FSDP1 path's plan.
* FSDP1 (``Trainer(strategy=FSDPStrategy(auto_wrap_policy=...))``): Lightning
  wraps the LightningModule itself, so FSDP1 hands the policy the
  LightningModule. A :class:`~execwrap.ParamExecOrderWrapPolicy` works there
  unchanged when it records its order during the first step; wrapped in
  :func:`lightning_wrap_policy`, a policy whose order, ``tracing_config`` or
  ``example_inputs`` are for the held model (whose ``forward`` runs) captures
  on that model and plans the LightningModule with the order renamed
  (:func:`execwrap.integrations.lift_order`).

The training step: with FSDP2, :func:`shard_lightning_module` takes ``mp_policy=``
and ``checkpointing=`` as :func:`execwrap.apply_fully_shard` does. With FSDP1,
Lightning's precision (``FSDPStrategy(mixed_precision=...)``, or
``precision="bf16-mixed"``) and ``cpu_offload`` reach FSDP1 as its root kwargs, which
the policy hands to every unit and checks before anything is wrapped; the policy's
own ``checkpointing=`` checkpoints its units before wrapping, keeping the FQNs
(Lightning's ``activation_checkpointing_policy`` puts torch's ``checkpoint_wrapper``
in after wrapping instead).

Lightning's own CPU limits: ``FSDPStrategy`` refuses ``accelerator="cpu"``
("requires a GPU accelerator") and passes ``device_id=None`` on CPU, which
FSDP1 refuses; ``ModelParallelStrategy`` runs on CPU with gloo. Nothing here
imports Lightning: the helpers work on the LightningModule as an
``nn.Module``.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp.wrap import _Policy

from execwrap.distributed.status import fail_together
from execwrap.fsdp.checkpointing import Checkpointing
from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
from execwrap.fsdp.fsdp2 import apply_fully_shard
from execwrap.integrations.mesh import plan_for_mesh
from execwrap.integrations.prefix import lift_order, lift_plan, submodule_prefix
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.util.mesh import MeshShape
from tracing import capture_execution_order

__all__ = ["lightning_wrap_policy", "shard_lightning_module"]

logger = logging.getLogger(__name__)

#: The plan applied to each held model (so a second ``configure_model`` call,
#: e.g. ``trainer.test`` after ``trainer.fit``, returns it instead of re-sharding).
_APPLIED: weakref.WeakKeyDictionary[nn.Module, WrapPlan] = weakref.WeakKeyDictionary()


def shard_lightning_module(
    pl_module: nn.Module,
    policy_or_plan: ParamExecOrderWrapPolicy | WrapPlan,
    *,
    module: nn.Module | str | None = None,
    mesh: DeviceMesh | None = None,
    prefetch: int = 1,
    checkpointing: Checkpointing = None,
    checkpoint_every: int = 1,
    **fully_shard_kwargs: Any,
) -> WrapPlan:
    """Shard a LightningModule's model with FSDP2 from a plan; call it in ``configure_model``.

    Args:
        pl_module: the LightningModule (``self`` in ``configure_model``).
        policy_or_plan: a :class:`~execwrap.ParamExecOrderWrapPolicy` whose
            order, ``tracing_config`` or ``example_inputs`` are for the held
            model (its ``forward`` runs; the LightningModule's does not), or a
            ready :class:`~execwrap.WrapPlan` for the held model.
        module: the held model: the submodule itself or its FQN in
            ``pl_module``; default: the one direct child holding parameters.
        mesh: the data-parallel mesh; default ``ModelParallelStrategy``'s ``data_parallel``
            (a policy without a ``mesh`` plans the local shards of its ``tensor_parallel``
            size once the held model's parameters are DTensors), else FSDP2's default.
        prefetch: groups prefetched ahead, as in :func:`execwrap.apply_fully_shard`.
        checkpointing: activation checkpointing of the held model's units (its module
            FQNs: ``"layers.0"``), as in :func:`execwrap.apply_fully_shard`.
        checkpoint_every: with one checkpointing mode, every N-th unit only.
        **fully_shard_kwargs: passed to every ``fully_shard`` call
            (``mp_policy=MixedPrecisionPolicy(...)``, ``reshard_after_forward``, ...;
            Lightning's FSDP2 strategy leaves mixed precision to ``configure_model``).

    Returns:
        The plan applied, as a plan of the LightningModule
        (:func:`execwrap.integrations.lift_plan`): ``[[""], ["model.model.layers.0"], ...]``;
        its root group ``[""]`` is realised by the held model's own
        ``fully_shard(self.model)`` (the LightningModule's forward never
        runs), so :func:`execwrap.integrations.fsdp_groups` reports it as
        ``["model"]``. Called again for an already sharded model, it returns
        the same plan.

    Raises:
        ValueError: ``module`` is not held by ``pl_module``, or there is no
            single child holding parameters to default to (the message lists
            them); ``pl_module`` holds parameters outside the held model
            (FSDP2 could not shard them: its forward never runs).
        TypeError, tracing.TracingError, execwrap.OrderDivergenceError: from
            :func:`execwrap.apply_fully_shard`.

    Example:
        >>> class LitLlama(L.LightningModule):  # doctest: +SKIP
        ...     def configure_model(self):
        ...         self.plan = shard_lightning_module(self, self.policy)
    """
    held, prefix = _held_model(pl_module, module)
    if isinstance(held, FSDPModule) and held in _APPLIED:
        return _APPLIED[held]
    _check_nothing_outside(pl_module, prefix)
    if mesh is None:
        mesh, tp = _strategy_mesh(pl_module, held)
        if mesh is not None:  # the strategy's data-parallel and tensor-parallel sizes
            plan_for_mesh(policy_or_plan, MeshShape(1, mesh.size(), tp))
    plan = apply_fully_shard(
        held,
        policy_or_plan,
        mesh=mesh,
        prefetch=prefetch,
        checkpointing=checkpointing,
        checkpoint_every=checkpoint_every,
        **fully_shard_kwargs,
    )
    lifted = lift_plan(plan, prefix, pl_module)
    _APPLIED[held] = lifted
    logger.info(
        "shard_lightning_module: %d FSDP2 groups on %r: %s",
        len(lifted.groups),
        prefix,
        lifted.groups,
    )
    return lifted


def lightning_wrap_policy(
    policy: ParamExecOrderWrapPolicy, *, module: str | None = None
) -> _Policy:
    """``policy`` for ``FSDPStrategy(auto_wrap_policy=...)``, its order taken on the held model.

    Lightning's FSDP1 strategy wraps the LightningModule, whose ``forward``
    does not run. The returned policy captures ``policy``'s order on the held
    model (with ``policy.tracing_config`` / ``example_inputs``, or renames a
    saved ``policy.order`` of the held model) before FSDP1 asks for units, and
    lets ``policy`` plan the LightningModule with that order, so ``policy.plan``
    names the LightningModule's modules (``model.layers.0``). A policy with
    nothing to capture records during the first step, as it does unwrapped.

    Args:
        policy: the execwrap policy.
        module: FQN of the held model in the LightningModule; default: the one
            direct child holding parameters.

    Returns:
        A torch ``_Policy`` to pass as ``auto_wrap_policy``.

    Example:
        >>> strategy = FSDPStrategy(auto_wrap_policy=lightning_wrap_policy(policy))  # doctest: +SKIP
    """
    if not isinstance(policy, ParamExecOrderWrapPolicy):
        raise TypeError(
            "lightning_wrap_policy: policy must be a ParamExecOrderWrapPolicy; got "
            f"{type(policy).__name__} (pass other FSDP policies to FSDPStrategy directly)"
        )
    return _HeldModelPolicy(policy, module)


class _HeldModelPolicy(_Policy):
    """FSDP1 ``_Policy`` around a policy whose order is for the held model."""

    def __init__(self, policy: ParamExecOrderWrapPolicy, module: str | None) -> None:
        self.policy = policy
        self.module = module

    def _run_policy(
        self,
        root_module: nn.Module,
        ignored_modules: set[nn.Module],
        root_kwargs: dict[str, Any],
    ) -> dict[nn.Module, dict[str, Any]]:
        policy = self.policy
        held, prefix = _held_model(root_module, self.module)
        order = policy.order
        if order is not None and order.module_classes.get("") == type(held).__name__:
            policy.order = lift_order(order, prefix, root_module)
        elif order is None and (
            policy.tracing_config is not None or policy.example_inputs is not None
        ):
            group = root_kwargs.get("process_group")
            phase = "capture (execwrap.integrations.lightning)"
            with (
                fail_together(phase, group=group if isinstance(group, dist.ProcessGroup) else None)
                if policy.check_ranks
                else contextlib.nullcontext()
            ):  # a failing rank is named
                captured = capture_execution_order(
                    held,
                    tracing_config=policy.tracing_config,
                    example_inputs=policy.example_inputs,
                    example_kwargs=policy.example_kwargs,
                )
            policy.order = lift_order(captured, prefix, root_module)
        return policy._run_policy(root_module, ignored_modules, root_kwargs)


def _held_model(pl_module: nn.Module, module: nn.Module | str | None) -> tuple[nn.Module, str]:
    """The held model and its FQN in ``pl_module``."""
    if isinstance(module, nn.Module):
        return module, submodule_prefix(pl_module, module)
    if isinstance(module, str):
        try:
            return pl_module.get_submodule(module), module
        except AttributeError as e:
            raise ValueError(
                f"{type(pl_module).__name__} has no submodule {module!r}; its children are "
                f"{[n for n, _ in pl_module.named_children()]}"
            ) from e
    holding = [
        (name, child)
        for name, child in pl_module.named_children()
        if next(child.parameters(), None) is not None
    ]
    if len(holding) != 1:
        raise ValueError(
            f"{type(pl_module).__name__} has {len(holding)} children holding parameters "
            f"({[n for n, _ in holding]}); pass module= the one whose forward runs in "
            "training_step (e.g. module='model')"
        )
    return holding[0][1], holding[0][0]


def _check_nothing_outside(pl_module: nn.Module, prefix: str) -> None:
    """FSDP2 shards the held model only: the LightningModule may hold no other parameters."""
    own = [n for n, _ in pl_module.named_parameters() if not n.startswith(prefix + ".")]
    if own:
        raise ValueError(
            f"shard_lightning_module: {type(pl_module).__name__} holds parameters outside "
            f"{prefix!r} ({own[:3]}); FSDP2 shards the held model only (Lightning calls "
            "training_step, so the LightningModule's forward never runs): move them into it"
        )


def _strategy_mesh(pl_module: nn.Module, held: nn.Module) -> tuple[DeviceMesh | None, int]:
    """``ModelParallelStrategy``'s data-parallel mesh, if the module has one, and its
    tensor-parallel size when the held model's parameters are DTensors (its TP plan
    applied in ``configure_model`` first); without them FSDP shards whole tensors (1)."""
    try:
        mesh = getattr(pl_module, "device_mesh", None)  # LightningModule.device_mesh
    except RuntimeError:  # no strategy mesh set up yet
        return None, 1
    if not isinstance(mesh, DeviceMesh):
        return None, 1
    names = mesh.mesh_dim_names or ()
    tp = mesh["tensor_parallel"].size() if "tensor_parallel" in names else 1
    if tp > 1:
        from torch.distributed.tensor import DTensor

        tp = tp if any(isinstance(p, DTensor) for p in held.parameters()) else 1
    return (mesh["data_parallel"] if "data_parallel" in names else mesh), tp
