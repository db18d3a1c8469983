"""Planning: from an init policy and an execution order to a :class:`WrapPlan`.

:func:`plan_wrap` takes these steps:

1. Units come from ``init_policy`` exactly as FSDP1 decides them
   (:func:`policy_units`); the root is always a unit.
2. A unit whose module is registered under two parents (``conv1.embed``
   and ``conv2.embed`` the same module) is dropped: FSDP1 puts a unit's
   wrapper under the module's first name only, so calls through the other
   names would bypass it. With a non-empty order: a unit whose module never
   runs its own forward is dropped, since its FSDP hooks would never fire: a container
   (``nn.ModuleList``, a module only iterated) keeps its called children
   as units; a dead module's parameters go to the nearest enclosing unit.
   Without module calls (nothing captured yet), units whose class does not
   implement ``forward`` are dropped instead.
3. Every parameter must be unsharded wherever it is used: the unit
   holding it must enclose every module that uses it (``param_uses``) and
   every name of it (tied weights, and every path through a shared module).
   If not, the units between the parameter and the lowest common ancestor
   unit that enclose its names are dropped, so that ancestor holds it (FSDP
   gives a parameter to the innermost wrapped module on the path it meets
   it by, so the parameter cannot move otherwise). Then, with call depths in
   the order, a unit whose parameters are used by a call running outside
   every call of the unit's module (``block0.fc2`` called from the root
   after ``block0`` returned) is dropped: FSDP gathers a unit's parameters
   when its forward starts and frees them when it ends.
4. Units are ordered by first call (ties by definition order; never-called
   units last, in definition order).
5. With ``bucket_numel``, consecutive units are merged greedily into FSDP2
   groups of at most ``bucket_numel`` elements (:mod:`execwrap.planning.bucketing`;
   greedy is optimal for a contiguous grouping under a cap). Members of a
   group must be called, not nest one another, not be the root, and share
   one trainable dtype (FSDP2 reduce-scatters one dtype per group); a larger
   unit stays alone. With ``bucket_numel="auto"`` the auto-planner
   (:mod:`execwrap.planning.auto.search`) chooses the groups, the prefetch depth and
   ``reshard_after_forward`` per group from a cost model instead.
6. The plan checks itself (:mod:`execwrap.plan.check`).

With ``groups`` (stated groups, :mod:`execwrap.planning.stated_groups`), each listed
module is a unit candidate next to the policy's in steps 1 to 4; then each
list's units merge into one group, and step 5 buckets only the runs of units
between stated groups.

Every departure from the policy, each tied parameter, units mixing
``requires_grad``, ignored modules, never-called modules with parameters,
0-dim parameters (which FSDP refuses) and groups FSDP1 cannot realise are
explained in ``plan.notes`` (:mod:`execwrap.plan.notes`); modules without
parameters that are not units share one note.

Planning with a policy callable (the default included) does not import
``torch.distributed.fsdp``.

With a process group initialised, ``plan_wrap(..., bucket_numel="auto")`` is a
collective: the ranks agree on one timing record first (the slowest rank's,
:mod:`execwrap.distributed.timing`), so that every rank makes the same plan, and a
rank that fails to plan is named on the others (:mod:`execwrap.distributed.status`);
``across_ranks`` widens or drops this.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch.distributed as dist
import torch.nn as nn

from execwrap.cost.device_memory import (
    default_memory_budget,
    overshoot_message,
    refused_within_default,
)
from execwrap.distributed.status import fail_together, is_distributed
from execwrap.distributed.timing import agree_timing
from execwrap.errors import MemoryBudgetError, PlanError
from execwrap.plan.check import check_plan
from execwrap.plan.model_view import ModelView, OrderView, check_order_fits
from execwrap.plan.notes import (
    fsdp1_split_note,
)
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.auto.mesh import search_mesh
from execwrap.planning.auto.options import AutoOptions, check_auto_options, check_training
from execwrap.planning.auto_wrap import (
    always_wrap_policy,
    expand_ignored_modules,
    policy_name,
    policy_unit_modules,
)
from execwrap.planning.bucketing import bucket_units
from execwrap.planning.stated_groups import (
    StatedGroups,
    bucket_between_groups,
    check_stated_groups,
    stated_group_note,
    stated_group_units,
)
from execwrap.planning.steps import FSDPTarget, Planner
from execwrap.util.mesh import MeshShape
from execwrap.watch.registry import watch
from tracing.checks import check_size
from tracing.fqn import is_within
from tracing.order import ExecutionOrder

if TYPE_CHECKING:
    from execwrap.cost import CostModel
    from execwrap.plan.training_step import TrainingStep

__all__ = ["FSDPTarget", "plan_wrap", "plan_wrap_unwatched", "policy_units"]

logger = logging.getLogger(__name__)

_TARGETS = ("fsdp1", "fsdp2")


def policy_units(
    model: nn.Module,
    init_policy: Any = always_wrap_policy,
    *,
    ignored_modules: Iterable[nn.Module | str] | None = None,
) -> list[str]:
    """The module FQNs FSDP1 itself would wrap for ``init_policy``.

    Replays FSDP1's auto wrapping without wrapping anything: a callable
    policy goes through ``_recursive_wrap``'s traversal (``recurse=True`` before
    the children, ``recurse=False`` with the remaining numel after), a
    ``ModuleWrapPolicy``/``CustomPolicy`` through its ``_run_policy``. No
    execution order is involved.

    Args:
        model: the unwrapped root module.
        init_policy: a policy callable ``(module, recurse, nonwrapped_numel)``
            or ``(module, recurse, unwrapped_params)`` (numel in elements), a
            ``_Policy`` instance, or ``None`` (root only).
        ignored_modules: modules FSDP ignores (with their subtrees): an
            iterable of ``nn.Module`` objects or module FQN strings.

    Returns:
        FQNs, root ``""`` first, then the wrapped modules.

    Raises:
        TypeError: ``init_policy`` has an unusable type or signature, or
            ``ignored_modules`` is a single module or string (wrap it in a list).
        ValueError: an ignored module is not part of ``model`` (or an FQN
            names no submodule).

    Source: ``torch/distributed/fsdp/_wrap_utils.py::_auto_wrap`` and
    ``torch/distributed/fsdp/wrap.py::_recursive_wrap``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"policy_units: model must be an nn.Module, got {type(model).__name__}")
    ignored = expand_ignored_modules(model, ignored_modules)
    names = {id(m): fqn for fqn, m in model.named_modules()}
    return [names[id(m)] for m in policy_unit_modules(model, init_policy, ignored)]


def plan_wrap(
    model: nn.Module,
    order: ExecutionOrder,
    init_policy: Any = always_wrap_policy,
    *,
    bucket_numel: int | Literal["auto"] | None = None,
    ignored_modules: Iterable[nn.Module | str] | None = None,
    groups: Iterable[Iterable[str]] | None = None,
    target: FSDPTarget | None = None,
    cost_model: CostModel | None = None,
    world_size: int | None = None,
    memory_budget: int | None = None,
    optimizer: str | None = None,
    mesh: Any = None,
    tp_plan: Mapping[str, Any] | None = None,
    training: TrainingStep | None = None,
    choose: Iterable[str] | None = None,
    group: dist.ProcessGroup | None = None,
    across_ranks: bool | None = None,
) -> WrapPlan:
    """Plan FSDP units from an init policy and the model's execution order.

    The steps are in :mod:`execwrap.planning.planner`; departures from the policy: ``plan.notes``.

    Args:
        model: the unwrapped root module (the meta device is fine).
        order: its execution order (from ``tracing.capture_execution_order``).
        init_policy: see :func:`policy_units`.
        bucket_numel: FSDP2 group size cap in elements (whole: ``1e8`` too); ``None``: no buckets;
            ``"auto"``: the auto-planner (:mod:`execwrap.planning.auto.search`) chooses the
            groups, the prefetch depth, ``reshard_after_forward`` per group and the
            training step's checkpointing per group, offload and accumulation mode
            (``plan.prefetch``, ``.reshard_after_forward``, ``.training``, ``.estimate``, ``.search``).
        ignored_modules: modules (or FQNs) FSDP ignores; their parameters are in no unit.
        groups: stated groups of module FQNs, each one FSDP group (``[["norm", "lm_head"]]``).
        target: ``"fsdp1"``/``"fsdp2"``: notes of that target only (``None``: both).
        cost_model, world_size, memory_budget, optimizer: ``"auto"`` only: the
            :class:`execwrap.cost.CostModel`; ranks (default: the cost model's); peak bytes per
            rank (``None``: the device's, less a reserve); the optimizer (``None``: ``"adamw"``).
        mesh: the mesh (``plan.mesh``): a ``(replicate, shard)`` shape, a
            :class:`~execwrap.util.mesh.MeshShape` or a ``DeviceMesh`` (HSDP; a ``tp``
            dimension: plans the local shards, :mod:`execwrap.planning.tensor_parallel`),
            or with ``"auto"``: ``"auto"``, the shard group size chosen too
            (:mod:`execwrap.planning.auto.mesh`); ``None``: FSDP over every rank.
        tp_plan: with a ``tp`` mesh dimension and a model without DTensors: the TP plan.
        training, choose: the :class:`execwrap.TrainingStep` the plan is for
            (``plan.training``); ``"auto"`` keeps its precision and micro-batch count and
            chooses ``choose`` (default: ``"checkpointing"``, ``"offload"``, ``"accumulation"``).
        group: with a process group initialised, planning is a collective of ``group``
            (default ``WORLD``): every rank plans from the slowest rank's compute times
            (:mod:`execwrap.distributed.timing`), a failing rank named on the others.
        across_ranks: whether planning is that collective: ``None``, for
            ``bucket_numel="auto"`` only; ``True``, always; ``False``, never (one rank).

    Returns:
        A :class:`WrapPlan`; until it is applied, the first optimizer step logs
        a WARNING naming it (:mod:`execwrap.watch.registry`).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: ``bucket_numel`` is not positive; bad auto-planner keywords
            (:func:`~execwrap.planning.auto.options.check_auto_options`, ``groups`` with
            ``"auto"``, a step the capture or cost model cannot price); a mesh not of
            ``world_size`` ranks; an ignored module not in ``model``; a stated group that
            cannot be formed; an order that does not fit ``model`` (capture it again).
        PlanError: no plan fits ``memory_budget`` (naming the smallest peak
            reached and what dominates it); the plan failed its own check.

    Example:
        >>> from execwrap.demo_models import GPT, GPTConfig, Block
        >>> model = GPT(GPTConfig(n_blocks=2))
        >>> from tracing import trace_execution_order
        >>> plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block})).groups
        [[''], ['blocks.0'], ['blocks.1']]
    """
    plan = plan_wrap_unwatched(
        model, order, init_policy, bucket_numel=bucket_numel, ignored_modules=ignored_modules,
        groups=groups, target=target, cost_model=cost_model, world_size=world_size,
        memory_budget=memory_budget, optimizer=optimizer, mesh=mesh, tp_plan=tp_plan,
        training=training, choose=choose,
        group=group, across_ranks=across_ranks,
    )  # fmt: skip
    watch(plan, f"WrapPlan (policy {plan.policy_name}, {len(plan.units)} groups)")
    return plan


def plan_wrap_unwatched(
    model: nn.Module,
    order: ExecutionOrder,
    init_policy: Any = always_wrap_policy,
    *,
    bucket_numel: int | Literal["auto"] | None = None,
    ignored_modules: Iterable[nn.Module | str] | None = None,
    groups: Iterable[Iterable[str]] | None = None,
    target: FSDPTarget | None = None,
    cost_model: CostModel | None = None,
    world_size: int | None = None,
    memory_budget: int | None = None,
    optimizer: str | None = None,
    mesh: Any = None,
    tp_plan: Mapping[str, Any] | None = None,
    training: TrainingStep | None = None,
    choose: Iterable[str] | None = None,
    group: dist.ProcessGroup | None = None,
    across_ranks: bool | None = None,
) -> WrapPlan:
    """:func:`plan_wrap` without watching the plan (for planners that report
    through their own object, such as ``ParamExecOrderWrapPolicy``)."""
    kwargs: dict[str, Any] = dict(
        bucket_numel=bucket_numel,
        ignored_modules=ignored_modules,
        groups=groups,
        target=target,
        cost_model=cost_model,
        world_size=world_size,
        memory_budget=memory_budget,
        optimizer=optimizer,
        mesh=mesh,
        tp_plan=tp_plan,
        training=training,
        choose=choose,
    )
    auto = isinstance(bucket_numel, str) and bucket_numel == "auto"
    if not (across_ranks or (across_ranks is None and auto)) or not is_distributed(group):
        return _plan_here(model, order, init_policy, **kwargs)
    if auto:  # the one input that differs between ranks: their own compute times
        order = agree_timing(order, group)
    with fail_together("planning", group=group):
        return _plan_here(model, order, init_policy, **kwargs)


def _plan_here(
    model: nn.Module,
    order: ExecutionOrder,
    init_policy: Any,
    *,
    bucket_numel: int | Literal["auto"] | None,
    ignored_modules: Iterable[nn.Module | str] | None,
    groups: Iterable[Iterable[str]] | None,
    target: FSDPTarget | None,
    cost_model: CostModel | None,
    world_size: int | None,
    memory_budget: int | None,
    optimizer: str | None,
    mesh: Any,
    tp_plan: Mapping[str, Any] | None,
    training: TrainingStep | None,
    choose: Iterable[str] | None,
) -> WrapPlan:
    """The plan of ``plan_wrap``, made on this rank alone."""
    bucket_numel = _check_arguments(model, order, bucket_numel)
    if target is not None and target not in _TARGETS:
        raise ValueError(f"plan_wrap: target must be one of {_TARGETS} or None; got {target!r}")
    auto = check_auto_options(
        "plan_wrap",
        bucket_numel,
        cost_model,
        world_size,
        memory_budget,
        optimizer=optimizer,
        mesh=mesh,
        training=training,
        choose=choose,
    )
    if groups is not None and bucket_numel == "auto":
        raise ValueError(
            'plan_wrap: groups= and bucket_numel="auto" cannot be combined yet (the '
            "auto-planner regroups units freely); state the groups with an int bucket_numel "
            "or None, or let the auto-planner choose every group"
        )
    ignored_set = expand_ignored_modules(model, ignored_modules)
    ignored_top = _outermost_ignored(model, ignored_set)
    view = ModelView.build(model, ignored_top)
    check_order_fits(view, order, type(model).__name__)
    stated = check_stated_groups(view, groups)
    names = {id(m): fqn for fqn, m in model.named_modules()}
    policy_fqns = [names[id(m)] for m in policy_unit_modules(model, init_policy, ignored_set)]
    logger.debug("policy %s chose %d unit(s)", policy_name(init_policy), len(policy_fqns))

    candidates = list(dict.fromkeys([*policy_fqns, *(m for g in stated for m in g)]))
    planner = Planner(view, OrderView.build(view, order), candidates, target, stated)
    plan = _bucketed_plan(planner, bucket_numel, stated, policy_name(init_policy), ignored_top)
    plan.order = _fsdp_sizes(model, order, mesh, tp_plan)  # a TP shard's local sizes
    if init_policy is not None and policy_fqns == [""] and not stated and len(view.modules) > 1:
        plan.notes.insert(0, root_only_note(plan.policy_name, type(model).__name__))
        logger.warning("plan_wrap: %s", plan.notes[0])
    if auto is not None:
        plan = _auto_plan(plan, auto, planner)
    else:
        if mesh is not None:
            plan.mesh = MeshShape.parse(mesh, "plan_wrap")
        if training is not None:
            plan.training = check_training(training, "plan_wrap").for_plan(plan)
    if target != "fsdp2":
        _note_fsdp1_splits(plan)
    _check_own_plan(plan, view, type(model).__name__)
    logger.debug("plan: %d unit(s), %d note(s)", len(plan.units), len(plan.notes))
    return plan


def _fsdp_sizes(
    model: nn.Module, order: ExecutionOrder, mesh: Any, tp_plan: Mapping[str, Any] | None
) -> ExecutionOrder:
    """``order``, with the local sizes FSDP shards under a mesh's ``tp`` dimension
    (:func:`~execwrap.planning.tensor_parallel.local_order`)."""
    tp = 1 if mesh is None or isinstance(mesh, str) else MeshShape.parse(mesh, "plan_wrap").tp
    if tp_plan is not None and tp == 1:
        raise ValueError(
            "plan_wrap: tp_plan= sizes tensor-parallel shards, but the mesh has no tp "
            "dimension: pass mesh=(replicate, shard, tp) (or a DeviceMesh with a 'tp' dimension)"
        )
    if tp == 1:
        return order
    from execwrap.planning.tensor_parallel import local_order

    return local_order(order, model, tp=tp, tp_plan=tp_plan)


def _bucketed_plan(
    planner: Planner,
    bucket_numel: Any,
    stated: StatedGroups,
    name: str,
    ignored_top: tuple[str, ...],
) -> WrapPlan:
    """Steps 4 and 5: the atomic units, the stated groups formed, and the runs
    between them bucketed under an int ``bucket_numel``."""
    atomic = planner.build()
    units, fixed = stated_group_units(
        stated, atomic, planner.view, planner.uses, planner.trainable_dtypes
    )
    planner.notes += [stated_group_note(units[i]) for i in sorted(fixed)]
    cap = bucket_numel if isinstance(bucket_numel, int) else None
    if cap:
        units = bucket_between_groups(
            atomic,
            [units[i] for i in sorted(fixed)],
            lambda run: bucket_units(run, cap, planner.trainable_dtypes),
        )
    return WrapPlan(
        units=list(units),
        order=planner.uses.order,
        atomic_units=list(atomic),
        notes=planner.notes,
        bucket_numel=cap,
        policy_name=name,
        policy_fqns=tuple(planner.policy_fqns),
        ignored_modules=ignored_top,
    )


def _auto_plan(plan: WrapPlan, auto: AutoOptions, planner: Planner) -> WrapPlan:
    """Step 5 with ``bucket_numel="auto"``: :func:`~execwrap.planning.auto.mesh.search_mesh`
    within ``memory_budget`` or, without one, the device's memory minus a reserve
    (:func:`~execwrap.cost.device_memory.default_memory_budget`; a note says so); a
    chosen peak over the device's memory is a WARNING and a note."""
    cost_model = auto.cost_model
    default = default_memory_budget(cost_model) if auto.memory_budget is None else None
    if default is not None:
        auto = dataclasses.replace(auto, memory_budget=default[0])
    try:
        plan = search_mesh(plan, auto, trainable_dtypes=planner.trainable_dtypes)
    except MemoryBudgetError as e:
        raise (e if default is None else refused_within_default(e, default[1])) from None
    assert plan.estimate is not None
    over = overshoot_message(int(plan.estimate.peak_memory_bytes), cost_model, "The chosen plan")
    if over is not None:
        logger.warning("plan_wrap: %s (memory_budget is above it)", over)
    plan.notes.extend(n for n in (default and default[1], over) if n)
    return plan


def _check_arguments(model: Any, order: Any, bucket_numel: Any) -> int | Literal["auto"] | None:
    """The types of :func:`plan_wrap`'s arguments; returns ``bucket_numel`` as an ``int``
    (a NumPy integer or a whole float such as ``1e8`` accepted), ``"auto"`` or ``None``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"plan_wrap: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(order, ExecutionOrder):
        raise TypeError(
            f"plan_wrap: order must be an ExecutionOrder, got {type(order).__name__}; capture "
            "one with tracing.capture_execution_order(model, ...)"
        )
    if bucket_numel is None:
        return None
    if isinstance(bucket_numel, str) and bucket_numel == "auto":
        return "auto"
    return check_size(
        bucket_numel,
        "plan_wrap: bucket_numel",
        minimum=1,
        unit="elements",
        hint='; pass None for no bucketing, or "auto" for the auto-planner',
    )


def _outermost_ignored(model: nn.Module, ignored: set[nn.Module]) -> tuple[str, ...]:
    """FQNs of the ignored modules not inside another ignored module."""
    fqns = [fqn for fqn, m in model.named_modules() if m in ignored]
    return tuple(f for f in fqns if not any(o != f and is_within(f, o) for o in fqns))


def root_only_note(policy: str, model_name: str) -> str:
    """The note on a policy that chose no module but the root."""
    return (
        f"The policy {policy} chose no module of {model_name} but the root, so the plan is "
        "one FSDP unit holding every parameter: nothing is gathered per block, and no "
        "all-gather overlaps compute. Check the policy's module classes (do they occur in "
        "this model?) or its size threshold."
    )


def _note_fsdp1_splits(plan: WrapPlan) -> None:
    """Add a note naming the FSDP2 groups that FSDP1 cannot wrap as one module."""
    split = [u for u in plan.units if len(u.module_fqns) > 1 and plan.fsdp1_parent(u) is None]
    if split:
        plan.notes.append(fsdp1_split_note(split, len(plan.units)))


def _check_own_plan(plan: WrapPlan, view: ModelView, model_name: str) -> None:
    """Step 6: :func:`check_plan`, naming the policy if the plan fails it."""
    try:
        check_plan(plan.units, view, model_name)
    except PlanError as e:
        raise PlanError(f"{e} (while checking the plan for policy {plan.policy_name})") from e
