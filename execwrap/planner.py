"""Planning: from an init policy and an execution order to a :class:`WrapPlan`.

:func:`plan_wrap` takes these steps:

1. Units come from ``init_policy`` exactly as FSDP1 decides them
   (:func:`policy_units`); the root is always a unit.
2. With a non-empty order: a unit whose module never runs its own forward
   is dropped, since its FSDP hooks would never fire: a container
   (``nn.ModuleList``, a module only iterated) keeps its called children
   as units; a dead module's parameters go to the nearest enclosing unit.
   Without module calls (nothing captured yet), units whose class does not
   implement ``forward`` are dropped instead.
3. Every parameter must be unsharded wherever it is used: the unit
   holding it must enclose every module that uses it (``param_uses``) and
   every name of it (tied weights). If not, the units between the
   parameter and the lowest common ancestor unit that enclose its names
   are dropped, so that ancestor holds it (FSDP gives a parameter to the
   innermost wrapped module, so the parameter cannot move otherwise).
4. Units are ordered by first call (ties by definition order; never-called
   units last, in definition order).
5. With ``bucket_numel``, consecutive units are merged greedily into FSDP2
   groups of at most ``bucket_numel`` elements (:mod:`execwrap.bucketing`;
   greedy is optimal for a contiguous grouping under a cap). Members of a
   group must be called, not nest one another, not be the root, and share
   one trainable dtype (FSDP2 reduce-scatters one dtype per group); a larger
   unit stays alone. With ``bucket_numel="auto"`` the auto-planner
   (:mod:`execwrap.autoplan`) chooses the groups, the prefetch depth and
   ``reshard_after_forward`` per group from a cost model instead.
6. The plan checks itself (:mod:`execwrap.plan_check`).

Every departure from the policy, each tied parameter, units mixing
``requires_grad``, ignored modules, never-called modules with parameters,
and groups FSDP1 cannot realise are explained in ``plan.notes``
(:mod:`execwrap.plan_notes`).

Planning with a policy callable (the default included) does not import
``torch.distributed.fsdp``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch.nn as nn

from execwrap.auto_wrap import (
    always_wrap_policy,
    expand_ignored_modules,
    policy_name,
    policy_unit_modules,
)
from execwrap.autoplan import check_auto_options, search_plan
from execwrap.bucketing import bucket_units
from execwrap.errors import PlanError
from execwrap.model_view import ModelView, OrderView, check_order_fits
from execwrap.plan import WrapPlan
from execwrap.plan_check import check_plan
from execwrap.plan_notes import (
    dead_module_notes,
    dropped_notes,
    fsdp1_split_note,
    ignored_notes,
    mixed_requires_grad_notes,
    no_calls_note,
    relocation_notes,
)
from execwrap.unit import WrapUnit
from tracing.checks import check_int
from tracing.fqn import ancestors, common_ancestor, innermost, is_within, owner_fqn
from tracing.order import ExecutionOrder

if TYPE_CHECKING:
    from execwrap.cost import CostModel

__all__ = ["plan_wrap", "policy_units"]

logger = logging.getLogger(__name__)


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
    cost_model: CostModel | None = None,
    world_size: int | None = None,
    memory_budget: int | None = None,
) -> WrapPlan:
    """Plan FSDP units from an init policy and the model's execution order.

    The steps (policy units, dropping units that never run, keeping each
    parameter in a unit enclosing all its uses and names, ordering by first
    use, bucketing, self-check) are described in :mod:`execwrap.planner`;
    every departure from the policy is explained in ``plan.notes``.

    Args:
        model: the unwrapped root module (the meta device is fine).
        order: its execution order (from ``tracing.capture_execution_order``).
        init_policy: see :func:`policy_units`.
        bucket_numel: FSDP2 group size cap in elements; ``None``: no buckets;
            ``"auto"``: the auto-planner (:mod:`execwrap.autoplan`) chooses the
            groups, the prefetch depth and ``reshard_after_forward`` per group
            (``plan.prefetch``, ``plan.reshard_after_forward``, ``plan.estimate``,
            ``plan.search``).
        ignored_modules: modules FSDP ignores (an iterable of ``nn.Module``
            objects or module FQN strings); their parameters are in no unit.
        cost_model, world_size, memory_budget: for ``"auto"`` only: the
            :class:`execwrap.cost.CostModel`, the ranks (default: the cost
            model's) and the peak bytes per rank to fit (``None``: no limit).

    Returns:
        A :class:`WrapPlan`.

    Raises:
        TypeError: ``model``/``order``/``init_policy``/``bucket_numel``/
            ``ignored_modules`` has the wrong type.
        ValueError: ``bucket_numel`` is not positive; bad auto-planner
            keywords (see :func:`execwrap.autoplan.check_auto_options`), a
            cost model for another world size or device type; an ignored
            module is not part of ``model``; or the order does not fit ``model``: it
            names a module or parameter that ``model`` does not have, or its
            ``params`` table (when not empty) lists other parameters, or other
            numels/shapes, than ``model.named_parameters()`` (a stale order:
            capture it again).
        PlanError: no plan fits ``memory_budget`` (naming the smallest peak
            reached and what dominates it); the plan failed its own check.

    Example:
        >>> from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        >>> from execwrap.demo_models import GPT, GPTConfig, Block
        >>> from tracing import trace_execution_order
        >>> model = GPT(GPTConfig(n_blocks=2))
        >>> plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))
        >>> plan.groups
        [[''], ['blocks.0'], ['blocks.1']]
    """
    _check_arguments(model, order, bucket_numel)
    check_auto_options("plan_wrap", bucket_numel, cost_model, world_size, memory_budget)
    ignored_set = expand_ignored_modules(model, ignored_modules)
    ignored_top = _outermost_ignored(model, ignored_set)
    view = ModelView.build(model, ignored_top)
    check_order_fits(view, order, type(model).__name__)
    names = {id(m): fqn for fqn, m in model.named_modules()}
    policy_fqns = [names[id(m)] for m in policy_unit_modules(model, init_policy, ignored_set)]
    logger.debug("policy %s chose %d unit(s)", policy_name(init_policy), len(policy_fqns))

    planner = _Planner(view, OrderView.build(view, order), policy_fqns)
    plan = _bucketed_plan(planner, bucket_numel, policy_name(init_policy), ignored_top)
    if bucket_numel == "auto":
        plan = _auto_plan(plan, planner, cost_model, world_size, memory_budget)
    _note_fsdp1_splits(plan)
    _check_own_plan(plan, view, type(model).__name__)
    logger.debug("plan: %d unit(s), %d note(s)", len(plan.units), len(plan.notes))
    return plan


def _bucketed_plan(
    planner: _Planner, bucket_numel: Any, name: str, ignored_top: tuple[str, ...]
) -> WrapPlan:
    """Steps 4 and 5: the atomic units, bucketed under an int ``bucket_numel``."""
    atomic = planner.build()
    cap = bucket_numel if isinstance(bucket_numel, int) else None
    units = bucket_units(atomic, cap, planner.trainable_dtypes) if cap else atomic
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


def _auto_plan(
    plan: WrapPlan,
    planner: _Planner,
    cost_model: CostModel | None,
    world_size: int | None,
    memory_budget: int | None,
) -> WrapPlan:
    """Step 5 with ``bucket_numel="auto"``: :func:`execwrap.autoplan.search_plan`."""
    assert cost_model is not None  # check_auto_options
    return search_plan(
        plan,
        cost_model,
        world_size=world_size,
        memory_budget=memory_budget,
        trainable_dtypes=planner.trainable_dtypes,
    )


def _check_arguments(model: Any, order: Any, bucket_numel: Any) -> None:
    """The types of :func:`plan_wrap`'s arguments, and a positive ``bucket_numel``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"plan_wrap: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(order, ExecutionOrder):
        raise TypeError(
            f"plan_wrap: order must be an ExecutionOrder, got {type(order).__name__}; capture "
            "one with tracing.capture_execution_order(model, ...)"
        )
    if bucket_numel is not None and bucket_numel != "auto":
        check_int(
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


def _note_fsdp1_splits(plan: WrapPlan) -> None:
    """Add a note naming the FSDP2 groups that FSDP1 cannot wrap as one module."""
    split = [u for u in plan.units if len(u.module_fqns) > 1 and plan.fsdp1_parent(u) is None]
    if split:
        plan.notes.append(fsdp1_split_note(split, len(plan.units)))


def _check_own_plan(plan: WrapPlan, view: ModelView, model_name: str) -> None:
    """Step 6: :func:`check_plan`, naming the policy if the plan fails it."""
    try:
        check_plan(plan, view, model_name)
    except PlanError as e:
        raise PlanError(f"{e} (while checking the plan for policy {plan.policy_name})") from e


class _Planner:
    """Turns the policy's units into the plan's atomic units (steps 2 to 4).

    The only writer of the decisions: :attr:`units` (the modules still units,
    in policy order), :attr:`holder` (canonical parameter -> its unit),
    :attr:`trainable_dtypes` (unit -> dtypes of its trainable parameters) and
    :attr:`notes`.
    """

    def __init__(self, view: ModelView, uses: OrderView, policy_fqns: Sequence[str]) -> None:
        self.view = view
        self.uses = uses
        self.policy_fqns = list(policy_fqns)
        self.units: dict[str, None] = dict.fromkeys(policy_fqns)
        self.holder: dict[str, str] = {}
        self.trainable_dtypes: dict[str, frozenset[str]] = {}
        self.notes: list[str] = []

    def build(self) -> list[WrapUnit]:
        """The atomic units in execution order; :attr:`notes` says why."""
        view, uses = self.view, self.uses
        has_calls = bool(uses.order.module_forward_order)
        if has_calls:
            dropped = self._drop_uncalled()
        else:
            dropped = self._drop_forwardless()
            self.notes.append(no_calls_note())
        relocations = self._relocate()
        self.holder = {p: innermost(owner_fqn(p), self.units) for p in view.params}
        self.notes += dropped_notes(view, uses, dropped, self.units, self.holder)
        if has_calls:
            self.notes += dead_module_notes(view, uses, self.units, self.policy_fqns)
        self.notes += relocation_notes(view, uses, relocations, self.holder)
        units = self._make_units()
        self.notes += mixed_requires_grad_notes(view, units)
        self.notes += ignored_notes(view)
        return units

    def _drop_forwardless(self) -> list[tuple[str, str]]:
        """Without calls to go by: drop non-root units whose class does not
        implement ``forward`` (``nn.ModuleList``, ``nn.ModuleDict``); FSDP
        hooks on them would never fire and FSDP2 refuses them."""
        dropped: list[tuple[str, str]] = []
        for fqn in list(self.units):
            module = self.view.modules.get(fqn)
            if fqn == "" or module is None or type(module).forward is not nn.Module.forward:
                continue
            del self.units[fqn]
            dropped.append((fqn, "forwardless"))
            logger.debug("dropping unit %r: %s has no forward", fqn, type(module).__name__)
        return dropped

    def _drop_uncalled(self) -> list[tuple[str, str]]:
        """Step 2: drop non-root units whose module never runs its forward."""
        dropped: list[tuple[str, str]] = []
        for fqn in list(self.units):
            if fqn == "" or self.uses.calls[fqn] > 0:
                continue
            called_inside = fqn in self.uses.called_at_or_below  # fqn itself is never called
            kind = "container" if called_inside else "uncalled"
            del self.units[fqn]
            dropped.append((fqn, kind))
            logger.debug("dropping unit %r: never called (%s)", fqn, kind)
        return dropped

    def _relocate(self) -> dict[str, tuple[str, list[str]]]:
        """Step 3: drop units so each parameter's unit encloses all its uses
        and names. Returns canonical param -> (holding unit, dropped units)."""
        events: dict[str, tuple[str, list[str]]] = {}
        changed = True
        while changed:
            changed = False
            for p in self.view.params:
                holder, drops = self._units_splitting(p)
                if drops:
                    for u in drops:
                        del self.units[u]
                        logger.debug("dropping unit %r: parameter %r used outside it", u, p)
                    prev = events.get(p, ("", []))[1]
                    events[p] = (holder, [*prev, *drops])
                    changed = True
        return events

    def _units_splitting(self, p: str) -> tuple[str, list[str]]:
        """The unit that must hold canonical parameter ``p`` (the innermost
        unit enclosing all its names and uses), and the units strictly inside
        it that enclose one of its names (in policy order): those must go."""
        owners = [self.view.owner(n) for n in self.view.fqns_of[p]]
        holder = innermost(common_ancestor([*owners, *self.uses.users[p]]), self.units)
        # walk each owner up to the holder (O(depth), not O(units))
        found: set[str] = set()
        for o in owners:
            for a in ancestors(o):
                if a == holder:
                    break
                if a in self.units:
                    found.add(a)
        return holder, [u for u in self.units if u in found]

    def _make_units(self) -> list[WrapUnit]:
        """Step 4: one :class:`WrapUnit` per remaining unit, by first use."""
        view = self.view
        by_unit: dict[str, list[str]] = {u: [] for u in self.units}
        for p in view.params:
            by_unit[self.holder[p]].append(p)
        n_params = len(view.fqns_of)
        def_pos = {p: i for i, p in enumerate(view.fqns_of)}
        units: list[WrapUnit] = []
        for u, params in by_unit.items():
            params.sort(key=lambda p: self.uses.param_pos.get(p, n_params + def_pos[p]))
            self.trainable_dtypes[u] = frozenset(
                view.dtype[p] for p in params if view.requires_grad[p]
            )
            first_use, last_use = self.uses.spans.span((u,), params)
            units.append(
                WrapUnit(
                    module_fqns=(u,),
                    param_fqns=tuple(params),
                    numel=sum(view.numel[p] for p in params),
                    bytes=sum(view.bytes[p] for p in params),
                    first_use=first_use,
                    last_use=last_use,
                )
            )
        units.sort(
            key=lambda w: (
                w.first_use is None,
                w.first_use if w.first_use is not None else 0,
                view.def_index[w.module_fqns[0]],
            )
        )
        return units
