"""Apply an execwrap plan through transformers' own ``from_pretrained(..., distributed_config=...)``.

transformers 5 shards a model inside ``from_pretrained`` (``maybe_distribute_model``:
it builds the device mesh, applies tensor and expert parallelism, then FSDP2 through
``apply_fully_sharded_data_parallelism``, then loads each rank's shard of the
weights). Its plan format holds one style per group and no tuple group it will
apply (:mod:`~execwrap.integrations.transformers.fsdp_plan`), and a
``DistributedConfig(fsdp_plan=...)`` can override the model's rules but not remove
one. Two ways in:

* :func:`applying_plan`: inside the ``with`` block, transformers' FSDP2 step is
  execwrap's :func:`execwrap.apply_fully_shard` of the plan, on the mesh and with the
  ``fully_shard`` settings transformers chose (``fsdp_mixed_precision``,
  ``fsdp_cpu_offload``, HSDP's 2-D mesh); everything else (the mesh, loading the
  weights into the shards, tying) stays transformers'. Activation checkpointing per
  unit, which transformers' format has no place for, is applied here too
  (``checkpointing=``, before sharding, as :func:`execwrap.apply_fully_shard` does).
  transformers ties weights only after loading them, so at sharding time a tied output head still has a parameter
  of its own (FSDP2 refuses a parameter shared by two groups; transformers' own path
  relies on this too); a plan made on the tied model is applied with that parameter
  in the group its module falls in (the root's, unless the head is in a group), as
  transformers' own path has it (:func:`_as_loaded`). Any plan applies this way:
  groups of several modules, per-group resharding, explicit prefetching.
* ``DistributedConfig(fsdp_plan=...)`` from
  :func:`~execwrap.integrations.transformers.distributed_config_for`, for plans the
  format holds; then :func:`set_prefetch` sets the plan's explicit prefetching on the
  loaded model (the one thing the format cannot say that can be set after sharding).

The replacement is scoped: it is installed on entering the block and the original
put back on leaving it (also when the block raises); blocks do not nest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch.nn as nn
from torch.distributed.fsdp import FSDPModule

from execwrap.fsdp.checkpointing import Checkpointing
from execwrap.fsdp.fsdp2 import apply_fully_shard
from execwrap.integrations.groups import fsdp_groups
from execwrap.plan.prefetch import prefetch_schedule
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.given_groups import plan_from_groups
from tracing.order import param_infos, shared_param_map

__all__ = ["AppliedPlans", "applying_plan", "set_prefetch"]

logger = logging.getLogger(__name__)

_ACTIVE: list[AppliedPlans] = []


@dataclass
class AppliedPlans:
    """What an :func:`applying_plan` block applied.

    Attributes:
        plan: the plan.
        prefetch: the prefetch depth applied.
        checkpointing: the activation checkpointing applied with it (``None``: none).
        checkpoint_every: with one checkpointing mode, every N-th unit.
        models: every model transformers sharded with the plan inside the block.
    """

    plan: WrapPlan
    prefetch: int
    checkpointing: Checkpointing = None
    checkpoint_every: int = 1
    models: list[nn.Module] = field(default_factory=list)


@contextlib.contextmanager
def applying_plan(
    plan: WrapPlan,
    *,
    prefetch: int | None = None,
    checkpointing: Checkpointing = None,
    checkpoint_every: int = 1,
) -> Iterator[AppliedPlans]:
    """Make transformers' ``from_pretrained(..., distributed_config=...)`` apply ``plan``.

    Args:
        plan: a plan for the model being loaded (e.g. from :func:`execwrap.plan_wrap`
            on the same architecture built on the meta device, or
            :func:`~execwrap.integrations.transformers.load_fsdp_plan`).
        prefetch: explicit prefetch depth (``0``: FSDP2's implicit prefetching, as
            transformers runs); ``None``: the plan's own (``plan.prefetch``), else 1.
        checkpointing, checkpoint_every: activation checkpointing per unit, applied
            before sharding (:func:`execwrap.apply_fully_shard`'s; transformers' own
            format has no place for it).

    Yields:
        An :class:`AppliedPlans`, filled as models are sharded.

    Raises:
        RuntimeError: a block is already active, or transformers has no
            ``apply_fully_sharded_data_parallelism`` step to replace (not transformers 5).
        ValueError: inside the block, when transformers shards a model with expert
            parallelism (``ep_size > 1``: not supported here); and whatever
            :func:`execwrap.apply_fully_shard` raises (a plan for another model).

    Example:
        >>> with applying_plan(plan) as applied:  # doctest: +SKIP
        ...     model = AutoModelForCausalLM.from_pretrained(
        ...         path, distributed_config=DistributedConfig(fsdp_size=8))
        >>> fsdp_groups(model) == sorted(plan.groups)  # doctest: +SKIP
        True
    """
    if not isinstance(plan, WrapPlan):
        raise TypeError(f"applying_plan: expected a WrapPlan, got {type(plan).__name__}")
    if _ACTIVE:
        raise RuntimeError("applying_plan: a block is already active; blocks do not nest")
    mixin = _mixin()
    depth = (
        prefetch if prefetch is not None else (plan.prefetch if plan.prefetch is not None else 1)
    )
    applied = AppliedPlans(plan, depth, checkpointing, checkpoint_every)
    original = mixin.apply_fully_sharded_data_parallelism

    def apply_plan(model: Any, mesh_manager: Any, fsdp_plan: Any, ep_plan: Any) -> Any:
        return _apply(model, mesh_manager, applied)

    mixin.apply_fully_sharded_data_parallelism = apply_plan
    _ACTIVE.append(applied)
    try:
        yield applied
    finally:
        mixin.apply_fully_sharded_data_parallelism = original
        _ACTIVE.pop()
    if not applied.models:
        logger.warning(
            "applying_plan: no model was sharded inside the block, so the plan (%d groups) was "
            "not applied: call from_pretrained(..., distributed_config=DistributedConfig("
            "fsdp_size=N)) with N > 1 inside it",
            len(plan.units),
        )


def _mixin() -> Any:
    import transformers
    from transformers.distributed import mixin

    if not hasattr(mixin, "apply_fully_sharded_data_parallelism"):
        raise RuntimeError(
            f"applying_plan: transformers {transformers.__version__} has no "
            "distributed.mixin.apply_fully_sharded_data_parallelism step to apply the plan in; "
            "install transformers>=5.0, or shard with execwrap.apply_fully_shard(model, plan)"
        )
    return mixin


def _apply(model: Any, mesh_manager: Any, applied: AppliedPlans) -> Any:
    """transformers' FSDP2 step with the plan: its mesh and ``fully_shard`` settings."""
    from transformers.distributed import fsdp as hf_fsdp

    config = getattr(model.config, "distributed_config", None)
    if config is not None and (config.ep_size or 1) > 1:
        raise ValueError(
            f"applying_plan: ep_size={config.ep_size}: transformers shards the dispatched "
            "experts on their own mesh, which applying_plan does not set up; load with ep_size=1"
        )
    replicate = config is not None and (config.dp_replicate_size or 1) > 1
    mesh = mesh_manager.get_mesh(("dp_replicate", "fsdp") if replicate else "fsdp")
    kwargs = hf_fsdp._get_fsdp_policy_kwargs(config)
    plan = _as_loaded(applied.plan, model)
    apply_fully_shard(
        model,
        plan,
        mesh=mesh,
        prefetch=applied.prefetch,
        checkpointing=applied.checkpointing,
        checkpoint_every=applied.checkpoint_every,
        **kwargs,
    )
    model._is_fsdp_managed_module = True  # what transformers' own step sets (generation reads it)
    applied.models.append(model)
    logger.info(
        "applying_plan: %s sharded into %d groups (prefetch %d)",
        type(model).__name__,
        len(applied.plan.units),
        applied.prefetch,
    )
    return model


def _as_loaded(plan: WrapPlan, model: nn.Module) -> WrapPlan:
    """``plan`` for ``model`` as ``from_pretrained`` holds it before tying its weights.

    When names the plan's order holds as aliases of one tied parameter are separate
    parameters of ``model``, the plan's groups are laid out again on ``model``
    (:func:`~execwrap.planning.given_groups.plan_from_groups`, the order's parameter
    tables replaced by the model's); otherwise ``plan`` itself.
    """
    params = dict(model.named_parameters())
    untied = [
        alias
        for canonical, aliases in plan.order.shared_params.items()
        for alias in aliases
        if alias in params and canonical in params and params[alias] is not params[canonical]
    ]
    if not untied:
        return plan
    _, shared = shared_param_map(model)
    order = dataclasses.replace(plan.order, params=param_infos(model), shared_params=shared)
    flags = plan.reshard_after_forward or tuple(not u.is_root for u in plan.units)
    groups = [(u.module_fqns, f) for u, f in zip(plan.units, flags, strict=True) if not u.is_root]
    logger.info(
        "applying_plan: %s is not tied yet (%s), its groups laid out on it as loaded",
        type(model).__name__,
        ", ".join(untied),
    )
    loaded = plan_from_groups(
        model,
        order,
        [fqns for fqns, _ in groups],
        reshard_after_forward=[bool(f) for _, f in groups],
        prefetch=plan.prefetch,
        policy_name=plan.policy_name,
        notes=plan.notes,
    )
    loaded.mesh = plan.mesh  # the mesh it was planned for, checked against transformers'
    return loaded


def set_prefetch(model: nn.Module, plan: WrapPlan, *, prefetch: int = 1) -> None:
    """Set ``plan``'s explicit prefetching on a model transformers sharded with the plan's groups.

    For a model loaded with ``distributed_config_for(plan, model, ...)``: transformers
    sets no explicit prefetching; this sets what :func:`execwrap.apply_fully_shard`
    would (:func:`execwrap.prefetch_schedule` of the plan's order).

    Args:
        model: the sharded model.
        plan: the plan its groups came from (with an order that has calls).
        prefetch: groups prefetched ahead in each direction (``0``: none set).

    Raises:
        ValueError: the model's groups are not the plan's (naming the first that
            differs); the plan's order has no calls (nothing to schedule from).
    """
    built = {frozenset(g): g for g in fsdp_groups(model)}
    for unit in plan.units:
        if frozenset(unit.module_fqns) not in built:
            raise ValueError(
                f"set_prefetch: the plan's group {list(unit.module_fqns)} is not a group of "
                f"the sharded {type(model).__name__} (its groups: {sorted(built.values())}); "
                "load it with distributed_config_for(plan, model, ...)"
            )
    if prefetch == 0:
        return
    if not plan.order.module_forward_order:
        raise ValueError(
            "set_prefetch: the plan's order has no calls, so there is no order to prefetch in; "
            "build the plan on an order with calls (model_order(model, example_kwargs))"
        )
    groups = [list(u.module_fqns) for u in plan.units]
    forward, backward = prefetch_schedule(
        groups, plan.order, param_fqns=[list(u.param_fqns) for u in plan.units], prefetch=prefetch
    )
    handles = []
    for fqns in groups:
        module = model.get_submodule(fqns[0])
        assert isinstance(module, FSDPModule), f"{fqns[0]!r} has no fully_shard applied"
        handles.append(module)
    for i, targets in forward.items():
        handles[i].set_modules_to_forward_prefetch([handles[t] for t in targets])
    for i, targets in backward.items():
        handles[i].set_modules_to_backward_prefetch([handles[t] for t in targets])
