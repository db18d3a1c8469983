"""Apply a wrap plan to FSDP2 (``fully_shard``) with execution-order prefetching.

:func:`apply_fully_shard` calls ``fully_shard`` once per plan group (a list of
modules where the group spans several: ``fully_shard([m1, m2])`` shares one
FSDP state, one all-gather and one reduce-scatter), children before parents,
the root last, as FSDP2 requires; then it sets explicit prefetching from the
captured order, the way torchtitan sets it for its transformer blocks
(``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``),
but for any model and any grouping.

The model of the algorithm:

- Sharding order: groups are applied in post-order (a group after every group
  nested in its modules: a topological sort of "is enclosed by", see
  :func:`_post_order`), the root module last.
- Prefetching (:func:`prefetch_schedule`): for each group in forward order
  (first call in ``order.module_forward_order``), the group's FSDP state
  prefetches the next ``prefetch`` groups in forward, and the next
  ``prefetch`` groups in backward order: the order in which their first
  gradient became ready (``order.param_backward_order``, runtime capture)
  when every executed group has one, else the reverse forward order. The root
  prefetches the first groups of each direction. Groups that never run in
  forward, and groups without parameters (nothing to all-gather; their
  neighbours prefetch past them), are not prefetched. Groups that run
  entirely before the first use of a trainable parameter never run backward
  (their outputs need no grad) and are left out of the backward lists.
- Without an order yet (a policy with nothing to capture before wrapping),
  the groups come from ``init_policy`` alone, the order is recorded during the
  first forward/backward (:func:`execwrap.fsdp.first_step.record_first_step`), and
  prefetching is set at the end of that backward, before the second step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from execwrap.distributed.status import fail_together
from execwrap.fsdp.checkpointing import (
    Checkpointing,
    check_checkpointing,
    checkpoint_modules,
    checkpoint_targets,
)
from execwrap.fsdp.first_step import record_first_step
from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
from execwrap.fsdp.groups import kwargs_by_group, plan_groups, shard_groups
from execwrap.fsdp.mesh import fsdp_mesh
from execwrap.fsdp.offload import check_offload
from execwrap.fsdp.plan_step import fsdp2_step
from execwrap.fsdp.precision import check_mixed_precision
from execwrap.fsdp.ranks import check_group, check_plan_before_sharding
from execwrap.fsdp.shardable import check_shardable
from execwrap.plan.consistency import first_overlap, overlap_error
from execwrap.plan.prefetch import prefetch_schedule
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.watch.registry import check_same_model, mark_applied, unwatched_if_refused
from tracing.checks import check_int
from tracing.order import ExecutionOrder

__all__ = ["apply_fully_shard"]

logger = logging.getLogger(__name__)


@unwatched_if_refused("policy_or_plan")
def apply_fully_shard(
    model: nn.Module,
    policy_or_plan: ParamExecOrderWrapPolicy | WrapPlan,
    *,
    mesh: DeviceMesh | None = None,
    prefetch: int | Literal["auto"] = 1,
    group_kwargs: Callable[[list[str]], Mapping[str, Any]] | None = None,
    checkpointing: Checkpointing = None,
    checkpoint_every: int = 1,
    **fully_shard_kwargs: Any,
) -> WrapPlan:
    """Shard ``model`` with FSDP2: one ``fully_shard`` call per plan group, children
    first, the root last, then explicit prefetching from the plan's order (module docstring).

    Args:
        model: the unwrapped model; sharded in place.
        policy_or_plan: a :class:`ParamExecOrderWrapPolicy` (its order is
            captured and its plan built here), or a :class:`execwrap.WrapPlan`.
        mesh: 1-D, ``(replicate, shard)`` (HSDP) or with ``"tp"`` (its dp part used), checked
            against ``plan.mesh``; default: ``plan.mesh`` built, else 1-D.
        prefetch: groups prefetched ahead each way; ``0`` keeps FSDP2's implicit
            prefetching; ``"auto"``: the auto-planner's depth (``plan.prefetch``).
        group_kwargs: per-group overrides: called with each group's module FQNs (``[""]``
            for the root), kwargs over ``fully_shard_kwargs`` and the plan's resharding.
        checkpointing: activation checkpointing applied before sharding, a mode for every unit
            or ``{module FQN: mode}`` (default: a policy's own, else ``plan.training``'s).
        checkpoint_every: with one mode, checkpoint every N-th unit only.
        **fully_shard_kwargs: passed to every ``fully_shard`` call
            (``mp_policy=MixedPrecisionPolicy(...)``, ``offload_policy``,
            ``reshard_after_forward``, ``ignored_params``, ...). Without them, the
            plan's own (``reshard_after_forward``, ``plan.training``'s precision and
            offload: :mod:`execwrap.fsdp.plan_step`); given ones that differ, one WARNING.

    Returns:
        The plan applied (a policy recording during the first step replaces ``policy.plan``
        by the re-ordered plan after it); one for another world size with a WARNING.

    Raises:
        ValueError: ``prefetch`` is negative, or ``"auto"`` for a plan that did not choose
            one; the model already has ``fully_shard`` applied; a plan made for another
            model (named), or naming a module the model lacks, or putting the root in a
            group. Before anything is wrapped: a 0-dim parameter, a group of mixed dtypes
            its ``mp_policy`` does not cast (:mod:`~execwrap.fsdp.shardable`), an
            ``mp_policy`` FSDP would refuse (:mod:`~execwrap.fsdp.precision`), CPU offload
            on a CPU mesh (:mod:`~execwrap.fsdp.offload`), an unknown checkpointing mode or
            FQN; a mesh not of ``plan.mesh``'s shard group, a ``"tp"`` one without DTensors.
        RankFailure: another rank failed (named; :mod:`execwrap.distributed.status`).
        PlanError: a ready plan puts a module or parameter in two units; the
            ranks would apply different groups, prefetch or resharding.
        TypeError: ``prefetch``, ``policy_or_plan``, ``mp_policy``, ``offload_policy`` or
            ``checkpointing`` of a wrong type.
        tracing.TracingError, execwrap.OrderDivergenceError: from capture and its check.

    Example:
        >>> policy = ParamExecOrderWrapPolicy(  # doctest: +SKIP
        ...     ModuleWrapPolicy({Block}), TracingConfig(), bucket_numel=2_000_000)
        >>> plan = apply_fully_shard(model, policy, mesh=mesh,  # doctest: +SKIP
        ...     mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16), checkpointing="full")
        >>> plan.groups  # doctest: +SKIP
        [[''], ['blocks.0', 'blocks.1'], ['blocks.2', 'blocks.3']]
    """
    _check_arguments(model, prefetch)
    plan, fully_shard_kwargs, checkpointing, every = _plan_and_step(
        model, policy_or_plan, mesh, fully_shard_kwargs, checkpointing, checkpoint_every
    )
    mesh = fsdp_mesh(model, plan, mesh)  # the plan's HSDP mesh, or the caller's checked
    with _together("apply_fully_shard: the checks before sharding", mesh):
        depth, groups, reshard = _prepare(model, policy_or_plan, plan, prefetch, fully_shard_kwargs)
        sharding = kwargs_by_group(
            model, groups, mesh, fully_shard_kwargs, reshard, group_kwargs, plan
        )
        targets = checkpoint_targets(model, plan.groups, checkpointing, every=every)
    check_plan_before_sharding(plan, depth, reshard, mesh, fully_shard_kwargs)
    with _together("apply_fully_shard: sharding", mesh):
        checkpoint_modules(model, targets)
        shard_groups(model, sharding, mesh)
        mark_applied(policy_or_plan)
        if depth > 0:
            _schedule_prefetch(model, groups, plan, policy_or_plan, depth, mesh)
    return plan


def _prepare(
    model: nn.Module,
    policy_or_plan: ParamExecOrderWrapPolicy | WrapPlan,
    plan: WrapPlan,
    prefetch: int | str,
    fully_shard_kwargs: dict[str, Any],
) -> tuple[int, list[list[str]], dict[tuple[str, ...], bool]]:
    """The checks before sharding (a ready plan's own too): the prefetch depth,
    the non-root groups and each group's ``reshard_after_forward``."""
    if plan is policy_or_plan:
        _check_ready_plan(plan, model)
    check_shardable(model, ignored_params=fully_shard_kwargs.get("ignored_params") or ())
    depth = _resolve_prefetch(prefetch, plan)
    return depth, plan_groups(model, plan), _group_reshard(plan, fully_shard_kwargs)


# ------------------------------------------------------------------ apply_fully_shard helpers
def _plan_and_step(
    model: nn.Module,
    policy_or_plan: ParamExecOrderWrapPolicy | WrapPlan,
    mesh: DeviceMesh | None,
    kwargs: dict[str, Any],
    checkpointing: Checkpointing,
    checkpoint_every: int,
) -> tuple[WrapPlan, dict[str, Any], Checkpointing, int]:
    """The plan (checked settings first), and the ``fully_shard`` kwargs and
    checkpointing with the plan's training step filled in (:func:`fsdp2_step`)."""
    checkpointing, every = _checkpointing(policy_or_plan, checkpointing, checkpoint_every)
    _check_step_kwargs(kwargs, mesh, model, checkpointing, every)
    plan = _build_plan(model, policy_or_plan, mesh, kwargs.get("ignored_params"))
    return (plan, *fsdp2_step(model, plan, kwargs, checkpointing, every, mesh))


def _check_arguments(model: nn.Module, prefetch: int | str) -> None:
    if prefetch != "auto":
        check_int(prefetch, "apply_fully_shard: prefetch", unit="groups ahead", hint=_AUTO_HINT)
    if isinstance(model, FSDPModule):
        raise ValueError(
            f"apply_fully_shard: the model ({type(model).__name__}) already has fully_shard "
            "applied; pass the unwrapped model"
        )


def _mesh_group(mesh: DeviceMesh | None) -> dist.ProcessGroup | None:
    """A 1-D mesh's process group (the cross-rank check's group), else ``None``."""
    return mesh.get_group() if mesh is not None and mesh.ndim == 1 else None


def _build_plan(
    model: nn.Module,
    policy_or_plan: ParamExecOrderWrapPolicy | WrapPlan,
    mesh: DeviceMesh | None,
    ignored_params: Any,
) -> WrapPlan:
    """The plan to apply: a policy's (built now) or the plan given."""
    if isinstance(policy_or_plan, ParamExecOrderWrapPolicy):
        return policy_or_plan.build_plan(
            model,
            ignored_modules=_ignored_modules(model, ignored_params),
            group=_mesh_group(mesh),
            target="fsdp2",
        )
    if isinstance(policy_or_plan, WrapPlan):
        return policy_or_plan  # checked by _check_ready_plan, on every rank together
    raise TypeError(
        "apply_fully_shard: policy_or_plan must be a ParamExecOrderWrapPolicy or a "
        f"WrapPlan; got {type(policy_or_plan).__name__}"
    )


def _check_ready_plan(plan: WrapPlan, model: nn.Module) -> None:
    """A ready plan: no module or parameter in two units, and planned for this model
    (:func:`~execwrap.watch.registry.check_same_model`: refused, naming what differs)."""
    overlap = first_overlap(plan.units)
    if overlap is not None:
        raise overlap_error(overlap, plan.units, "apply_fully_shard")
    check_same_model(plan, model, "apply_fully_shard")


def _together(phase: str, mesh: DeviceMesh | None) -> contextlib.AbstractContextManager[None]:
    """:func:`~execwrap.distributed.status.fail_together` over the ranks that apply the plan
    together (:func:`~execwrap.fsdp.ranks.check_group`); nothing for an n-D mesh over part
    of the world."""
    compared, group = check_group(mesh)
    return fail_together(phase, group=group) if compared else contextlib.nullcontext()


_AUTO_HINT = '; or pass "auto" for the depth the auto-planner chose'


def _resolve_prefetch(prefetch: int | str, plan: WrapPlan) -> int:
    """``prefetch`` as an int: ``"auto"`` becomes the plan's chosen depth."""
    if prefetch != "auto":
        assert isinstance(prefetch, int)
        if plan.prefetch is not None and prefetch != plan.prefetch:
            logger.warning(
                "apply_fully_shard: prefetch=%d applied where the auto plan chose %d: "
                'plan.estimate no longer describes the step; pass prefetch="auto" to apply '
                "the plan's depth",
                prefetch,
                plan.prefetch,
            )
        return prefetch
    if plan.prefetch is None:
        raise ValueError(
            'apply_fully_shard: prefetch="auto" uses the depth the auto-planner chose, but this '
            'plan has none (made without bucket_numel="auto"); plan with '
            'bucket_numel="auto", cost_model=... and world_size=..., or pass prefetch=0, 1 or 2'
        )
    return plan.prefetch


def _group_reshard(
    plan: WrapPlan, fully_shard_kwargs: dict[str, Any]
) -> dict[tuple[str, ...], bool]:
    """Group (module FQNs) -> the plan's ``reshard_after_forward`` for it; empty
    when the plan has no per-group choice or the caller passed one for all."""
    flags = plan.reshard_after_forward
    if flags is None:
        return {}
    if "reshard_after_forward" in fully_shard_kwargs:
        given = fully_shard_kwargs["reshard_after_forward"]
        if not isinstance(given, bool) or any(given != f for f in flags):
            logger.warning(
                "apply_fully_shard: reshard_after_forward=%r given for every group, the root "
                "included, overrides the auto plan's per-group choices %s: plan.estimate and "
                "the memory budget it was planned under no longer describe the step; leave "
                "reshard_after_forward out to apply the plan's choices",
                given,
                tuple(flags),
            )
        return {}
    if len(flags) != len(plan.units):
        raise ValueError(
            f"apply_fully_shard: the plan has {len(plan.units)} unit(s) but "
            f"{len(flags)} reshard_after_forward flag(s); plan the model again"
        )
    return {u.module_fqns: bool(f) for u, f in zip(plan.units, flags, strict=True)}


def _checkpointing(
    policy_or_plan: Any, checkpointing: Checkpointing, every: int
) -> tuple[Checkpointing, int]:
    """The checkpointing to apply: the arguments', else a policy's own (both given: equal)."""
    own = getattr(policy_or_plan, "checkpointing", None)
    if own is None:
        return checkpointing, every
    own_every = getattr(policy_or_plan, "checkpoint_every", 1)
    if checkpointing is None and every == 1:
        return own, own_every
    given = (own if checkpointing is None else checkpointing, every)
    if given != (own, own_every):
        raise ValueError(
            f"apply_fully_shard: checkpointing={given[0]!r}, checkpoint_every={given[1]} given, "
            f"but the policy has checkpointing={own!r}, checkpoint_every={own_every}; set "
            "them in one place"
        )
    return own, own_every


def _check_step_kwargs(
    kwargs: Mapping[str, Any],
    mesh: DeviceMesh | None,
    model: nn.Module | None = None,
    checkpointing: Checkpointing = None,
    every: int = 1,
) -> None:
    """``mp_policy``, ``offload_policy`` and checkpointing FSDP2 would refuse later."""
    if model is not None:
        check_checkpointing(checkpointing, every=every, model=model)
    check_mixed_precision(kwargs.get("mp_policy"))
    check_offload(kwargs.get("offload_policy"), mesh=mesh)


def _schedule_prefetch(
    model: nn.Module,
    groups: list[list[str]],
    plan: WrapPlan,
    policy_or_plan: ParamExecOrderWrapPolicy | WrapPlan,
    prefetch: int,
    mesh: DeviceMesh | None,
) -> None:
    """Set prefetching now from the plan's order, or after a first-step recording."""
    policy = policy_or_plan if isinstance(policy_or_plan, ParamExecOrderWrapPolicy) else None
    if plan.order.module_forward_order:
        _set_prefetch(model, groups, plan, plan.order, prefetch)
    elif policy is not None:

        def on_recorded(recorded: ExecutionOrder) -> None:
            _set_prefetch(model, groups, plan, recorded, prefetch)

        record_first_step(
            policy, model, on_recorded=on_recorded, start_now=True, group=_mesh_group(mesh)
        )
    else:
        logger.info(
            "apply_fully_shard: the plan's order has no calls; FSDP2's implicit prefetching is kept"
        )


def _set_prefetch(
    model: nn.Module,
    groups: list[list[str]],
    plan: WrapPlan,
    order: ExecutionOrder,
    prefetch: int,
) -> None:
    all_groups = [[""], *groups]
    params_by_group = _group_params(plan, all_groups)
    forward, backward = prefetch_schedule(
        all_groups, order, param_fqns=params_by_group, prefetch=prefetch
    )
    handles: list[FSDPModule] = []
    for fqns in all_groups:
        module = model.get_submodule(fqns[0])
        assert isinstance(module, FSDPModule), f"{fqns[0]!r} has no fully_shard applied"
        handles.append(module)
    for i, targets in forward.items():
        handles[i].set_modules_to_forward_prefetch([handles[t] for t in targets])
    for i, targets in backward.items():
        handles[i].set_modules_to_backward_prefetch([handles[t] for t in targets])
    logger.debug(
        "apply_fully_shard: forward prefetch %s; backward prefetch %s",
        {tuple(all_groups[i]): [all_groups[t] for t in ts] for i, ts in forward.items()},
        {tuple(all_groups[i]): [all_groups[t] for t in ts] for i, ts in backward.items()},
    )


def _group_params(plan: WrapPlan, groups: list[list[str]]) -> list[list[str]]:
    by_modules = {tuple(u.module_fqns): list(u.param_fqns) for u in plan.units}
    return [by_modules.get(tuple(g), []) for g in groups]


def _ignored_modules(model: nn.Module, ignored_params: Any) -> list[nn.Module]:
    """Modules all of whose parameters are in FSDP2's ``ignored_params``."""
    if not ignored_params:
        return []
    ignored = {id(p) for p in ignored_params}
    result: list[nn.Module] = []
    for module in model.modules():
        params = list(module.parameters())
        if params and all(id(p) in ignored for p in params):
            result.append(module)
    return result
