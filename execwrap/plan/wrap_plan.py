"""Wrap plans: FSDP units in execution order, their notes, and the order behind them.

A :class:`WrapPlan` is what :func:`~execwrap.planning.planner.plan_wrap` returns: the
units (:class:`~execwrap.plan.unit.WrapUnit`; with a bucket size, the merged FSDP2
groups) in execution order, the single-module units before bucketing, the
notes on every decision that departs from the policy, and the order they came
from. It answers lookups (which unit holds a module or parameter, the root's
unit, the groups for ``fully_shard``, the backward order of units, the
modules FSDP1 must wrap), predicts its cost (:meth:`WrapPlan.stats`,
:meth:`WrapPlan.unsharded_timeline`: the model is in
:mod:`execwrap.plan.stats`), checks itself against a model
(:meth:`WrapPlan.check`: :mod:`execwrap.plan.check`) and round-trips through
JSON (:meth:`WrapPlan.to_dict` / :meth:`WrapPlan.from_dict`).

Sizes: ``numel`` and ``bucket_numel`` count elements; ``bytes`` count bytes
(numel times each dtype's element size).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from execwrap.errors import PlanError
from execwrap.plan.check import check_plan
from execwrap.plan.consistency import check_derived
from execwrap.plan.fields import PLAN_SCHEMA_VERSION, plan_fields
from execwrap.plan.figures import plan_summary
from execwrap.plan.model_view import ModelView
from execwrap.plan.notes import reordered_note
from execwrap.plan.search_record import PlanSearch
from execwrap.plan.spans import UseSpans
from execwrap.plan.stats import (
    PlanStats,
    TimelineStep,
    plan_stats,
    runs_backward,
    unsharded_timeline,
)
from execwrap.plan.training_step import TrainingStep
from execwrap.plan.unit import WrapUnit
from execwrap.util.mesh import MeshShape
from tracing.fqn import ancestors, common_ancestor, innermost, is_within, owner_fqn
from tracing.order import ExecutionOrder
from tracing.schema import SchemaError, field_path

if TYPE_CHECKING:
    import torch.nn as nn

    from execwrap.plan.estimate import StepEstimate

__all__ = ["PLAN_SCHEMA_VERSION", "WrapPlan"]


@dataclass
class WrapPlan:
    """Units in execution order, with notes and the order they came from.

    Attributes:
        units: :class:`WrapUnit` objects in execution order (by first use;
            never-called units last in definition order). With
            ``bucket_numel`` these are the merged FSDP2 groups.
        order: the execution order the plan was built from.
        atomic_units: the single-module units before bucketing (equal to
            ``units`` without ``bucket_numel``).
        notes: human sentences on every decision that departs from the
            policy, tied parameters, frozen/trainable mixes, ignored modules.
        bucket_numel: the group size cap in elements, or ``None``.
        policy_name: a readable name of the init policy.
        policy_fqns: the module FQNs the policy alone chose (what FSDP1 would
            wrap for it), root first.
        ignored_modules: FQNs of the ignored modules passed to
            :func:`~execwrap.planning.planner.plan_wrap` (outermost only).
        prefetch: the prefetch depth chosen by the auto-planner
            (``bucket_numel="auto"``; ``apply_fully_shard(..., prefetch="auto")``
            uses it), else ``None``.
        reshard_after_forward: one flag per unit (in :attr:`units` order):
            whether ``fully_shard`` reshards that group after forward (the
            root group never does, whatever its flag). ``None``: FSDP2's
            default for every group.
        estimate: the predicted step (an :class:`execwrap.simulate.StepEstimate`:
            step time, exposed communication, peak memory and its breakdown,
            per-stream timeline) at :attr:`prefetch` and
            :attr:`reshard_after_forward`, when a cost model was given.
        search: what the auto-planner compared (:class:`~execwrap.plan.search_record.PlanSearch`).
        mesh: the mesh the plan is for (:class:`~execwrap.util.mesh.MeshShape`: HSDP's
            replicas and shard group, tensor parallelism), chosen by the auto-planner
            (``mesh="auto"``) or stated (``plan_wrap(..., mesh=...)``);
            ``apply_fully_shard`` builds it when no mesh is given. ``None``: FSDP over
            every rank.
        training: the training step the plan is for
            (:class:`~execwrap.plan.training_step.TrainingStep`: precision, checkpointing
            per unit, offload, micro-batches and gradient sync), its checkpointing written
            out per unit (:meth:`TrainingStep.for_plan`); ``apply_fully_shard`` and the
            FSDP1 policy apply its precision, offload and checkpointing. ``None``: none
            stated (float32, nothing checkpointed or offloaded, one micro-batch).
    """

    units: list[WrapUnit]
    order: ExecutionOrder
    atomic_units: list[WrapUnit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bucket_numel: int | None = None
    policy_name: str = ""
    policy_fqns: tuple[str, ...] = ()
    ignored_modules: tuple[str, ...] = ()
    prefetch: int | None = None
    reshard_after_forward: tuple[bool, ...] | None = None
    estimate: StepEstimate | None = None
    search: PlanSearch | None = None
    mesh: MeshShape | None = None
    training: TrainingStep | None = None

    # ------------------------------------------------------------ lookups
    @property
    def groups(self) -> list[list[str]]:
        """Module FQNs of each unit, the argument lists for ``fully_shard``."""
        return [list(u.module_fqns) for u in self.units]

    @property
    def root_index(self) -> int:
        """Index in :attr:`units` of the root's unit."""
        for i, unit in enumerate(self.units):
            if unit.is_root:
                return i
        raise PlanError("the plan has no root unit; build it with plan_wrap")

    def unit_of_module(self, fqn: str) -> int | None:
        """Index of the unit that manages module ``fqn``: the unit naming it,
        else the unit of its nearest ancestor (``None`` if there is none)."""
        by_module = self._unit_index_by_module()
        return by_module.get(innermost(fqn, by_module))

    def unit_of_param(self, fqn: str) -> int | None:
        """Index of the unit holding canonical parameter ``fqn`` (``None`` if
        the parameter is ignored or unknown)."""
        for i, unit in enumerate(self.units):
            if fqn in unit.param_fqns:
                return i
        return None

    def _unit_index_by_module(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for i, unit in enumerate(self.units):
            for m in unit.module_fqns:
                out.setdefault(m, i)
        return out

    def reordered(self, order: ExecutionOrder) -> WrapPlan:
        """The same units (as already applied), ordered by first use in ``order``.

        Used when the units had to be applied before any order existed (a
        policy with nothing to capture): after the first step records the
        order, the plan keeps its units and takes the new order's first/last
        use spans and sequence (never-called units last, in their previous
        order). A note says so.

        Args:
            order: the order recorded for this model.

        Returns:
            A new :class:`WrapPlan`; this one is not changed.
        """
        spans = UseSpans(order)
        units = []
        for u in self.units:
            first_use, last_use = spans.span(u.module_fqns, u.param_fqns)
            units.append(dataclasses.replace(u, first_use=first_use, last_use=last_use))
        position = {id(u): i for i, u in enumerate(units)}
        units.sort(key=lambda u: (u.first_use is None, u.first_use or 0, position[id(u)]))
        notes = [*self.notes, reordered_note(order.method)]
        return dataclasses.replace(self, units=units, order=order, notes=notes)

    def backward_unit_order(self) -> list[int]:
        """Unit indices in the order their backward is expected to run.

        With a recorded gradient order (``order.param_backward_order``, runtime
        capture), units are sorted by the position of their first ready
        gradient; units without a recorded gradient, and every unit when there
        is no gradient order, follow the reverse forward order. This is the
        order FSDP2 backward prefetching should follow.
        """
        n = len(self.units)
        reverse_rank = {i: n - 1 - i for i in range(n)}
        pos = {fqn: k for k, fqn in enumerate(self.order.param_backward_order)}
        if not pos:
            return list(range(n - 1, -1, -1))
        first_ready: dict[int, float] = {}
        for i, unit in enumerate(self.units):
            ks = [pos[p] for p in unit.param_fqns if p in pos]
            first_ready[i] = min(ks) if ks else math.inf
        return sorted(range(n), key=lambda i: (first_ready[i], reverse_rank[i]))

    def kept_unsharded(self) -> list[int]:
        """Indices of the non-root units that do not reshard after forward
        (``reshard_after_forward`` ``False``), in unit order; ``[]`` without
        per-unit choices."""
        flags = self.reshard_after_forward or ()
        return [
            i
            for i, (u, f) in enumerate(zip(self.units, flags, strict=False))
            if not f and not u.is_root
        ]

    def checkpoint_modes(self) -> tuple[str, ...]:
        """Each unit's activation checkpointing (in :attr:`units` order) under
        :attr:`training`: ``"none"``, ``"full"`` or ``"selective"`` (all ``"none"``
        without a training step)."""
        if self.training is None:
            return ("none",) * len(self.units)
        return self.training.checkpoint_modes(self)

    # ----------------------------------------------------------- FSDP1 view
    def fsdp1_modules(self) -> list[str]:
        """Module FQNs FSDP1 should wrap to realise this plan, in unit order.

        FSDP1 wraps single modules. A multi-module group is realised by
        wrapping one enclosing module ``P`` when that gives exactly the group:
        ``P`` is not the root and not a unit, runs its own forward, its subtree
        holds exactly the group's units, and no parameter of ``P``'s subtree
        belongs to another unit. Otherwise the group's modules are wrapped one
        by one (the group stays split; :attr:`notes` names it).

        Returns:
            FQNs, root (``""``) first; pass them to FSDP1 through a ``_Policy``
            (FSDP wraps the root itself).
        """
        out: list[str] = []
        for unit in self.units:
            if len(unit.module_fqns) == 1:
                out.append(unit.module_fqns[0])
                continue
            parent = self.fsdp1_parent(unit)
            out.extend([parent] if parent is not None else unit.module_fqns)
        return out

    def fsdp1_parent(self, group: WrapUnit) -> str | None:
        """The module FSDP1 can wrap to realise multi-module ``group`` as one
        unit (see :meth:`fsdp1_modules`), or ``None`` if there is none."""
        members = set(group.module_fqns)
        atomic = {m for u in (self.atomic_units or self.units) for m in u.module_fqns}
        called = set(self.order.module_forward_order)
        for cand in ancestors(common_ancestor(group.module_fqns)):
            if cand == "" or cand in atomic:
                return None
            if {m for m in atomic if is_within(m, cand)} != members:
                return None
            if cand in called:
                return None if self._holds_other_units_params(group, cand) else cand
        return None

    def _holds_other_units_params(self, group: WrapUnit, fqn: str) -> bool:
        """Whether a parameter of a unit other than ``group`` has a name in
        module ``fqn``'s subtree."""
        for unit in self.units:
            if unit is group:
                continue
            for p in unit.param_fqns:
                for name in (p, *self.order.shared_params.get(p, [])):
                    if is_within(owner_fqn(name), fqn):
                        return True
        return False

    # ---------------------------------------------------------------- cost
    def runs_backward(self) -> list[bool]:
        """For each unit, whether autograd runs backward through it.

        A unit does not when every module call in its span (see
        :attr:`WrapUnit.last_use`) happens before the first forward use of
        any trainable (``requires_grad``) parameter: assuming the model's
        input needs no grad, its outputs then do not require grad, so FSDP's
        pre-backward hook never fires (the frozen prefix of
        :mod:`execwrap.plan.stats`). A unit never called in forward, and every
        unit when the order records no parameter uses, counts as running
        backward.

        Returns:
            One bool per unit, in :attr:`units` order.
        """
        return runs_backward(self)

    def unsharded_timeline(
        self, prefetch: int = 1, *, reshard_after_forward: bool | Sequence[bool] = True
    ) -> list[TimelineStep]:
        """Unsharded parameter bytes at each unit step of one training step.

        Forward visits the units in :attr:`units` order, backward in reverse;
        at each step the running unit, the ``prefetch`` units after it
        (before it, in backward), the units enclosing it and the root are
        unsharded. The full model of the step (FSDP1's and FSDP2's
        unshard/reshard schedule, units autograd skips in backward) is in
        :mod:`execwrap.plan.stats`. Only parameter bytes count.

        Args:
            prefetch: units prefetched ahead (``>= 0``).
            reshard_after_forward: FSDP1 ``FULL_SHARD`` / FSDP2 default
                (``True``), or ``SHARD_GRAD_OP`` / ``False``; or one flag per
                unit (FSDP2 per group: :attr:`reshard_after_forward` of an
                auto plan). A unit that does not reshard stays unsharded
                from its forward to its backward.

        Returns:
            ``2 * len(units)`` :class:`TimelineStep` tuples ``(step, phase,
            unit, unsharded_bytes)``, forward then backward.

        Raises:
            TypeError: ``prefetch`` is not an int.
            ValueError: ``prefetch`` is negative; a flag list of another length
                than :attr:`units`.
        """
        return unsharded_timeline(self, prefetch, reshard_after_forward=reshard_after_forward)

    def stats(self, prefetch: int = 1) -> PlanStats:
        """Predicted collectives and memory for one training step.

        FSDP1 ``FULL_SHARD`` and FSDP2 defaults: each unit with parameters is
        all-gathered once per forward activation and, with reshard after
        forward, once more per activation in backward (not the root, and not
        the units autograd never runs backward through:
        :meth:`runs_backward`); one reduce-scatter per unit with a trainable
        parameter; the peak is the maximum of :meth:`unsharded_timeline`. The
        full model is in :mod:`execwrap.plan.stats`.

        Args:
            prefetch: units prefetched ahead (``>= 0``), forward and backward.

        Returns:
            A :class:`PlanStats`.

        Raises:
            TypeError: ``prefetch`` is not an int.
            ValueError: ``prefetch`` is negative.

        Example:
            >>> plan.stats(prefetch=1).all_gathers_per_step  # doctest: +SKIP
            9
        """
        return plan_stats(self, prefetch)

    def summary(self, prefetch: int = 1) -> str:
        """A few lines: groups, prefetch and resharding, collectives and the
        unsharded peak per step, the predicted step and peak, the notes (the
        figures every report shows: :mod:`execwrap.plan.figures`).

        Args:
            prefetch: the prefetch depth of a plan that chose none (an auto plan's wins).

        Example:
            >>> print(plan.summary())  # doctest: +SKIP
            WrapPlan of GPT: 3 FSDP groups from 5 policy units (policy ..., bucket size 100K)
              prefetch 1, every group but the root resharded after forward
              per step: 5 all-gathers, 3 reduce-scatters, peak unsharded parameters 861.50 KiB
              2 notes (0 warnings) in plan.notes; first: Tied parameter 'wte.weight' ...
        """
        return plan_summary(self, prefetch)

    def __str__(self) -> str:
        """:meth:`summary` (``print(plan)``)."""
        return self.summary()

    def __repr__(self) -> str:
        """One short line (the whole plan is :meth:`to_dict`; a readable one :meth:`summary`)."""
        model = self.order.module_classes.get("", "") or "?"
        extra = "" if self.prefetch is None else f", prefetch {self.prefetch}"
        return (
            f"WrapPlan({model}, policy {self.policy_name or '-'}, {len(self.units)} groups"
            f"{extra}, {len(self.notes)} notes)"
        )

    # ---------------------------------------------------------------- lint
    def check(self, model: nn.Module) -> None:
        """Check the plan against ``model``, like ``torch.fx.Graph.lint()``.

        Checks: every module and parameter FQN exists in ``model``; every
        canonical parameter (ignored ones excepted) is in exactly one unit;
        each parameter's unit is the innermost unit enclosing every name of
        it (so FSDP, which gives a parameter to the innermost wrapped module,
        builds exactly these units, and tied parameters are never split); no
        group nests one of its modules in another; numel and bytes add up
        (:mod:`execwrap.plan.check`).

        Raises:
            PlanError: naming the FQN, what was expected and what was found.
        """
        check_plan(self.units, ModelView.build(model, self.ignored_modules), type(model).__name__)

    # ---------------------------------------------------------- serialising
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict: units, atomic units, notes, bucket size,
        policy, FSDP1 modules, stats at prefetch 1, and the auto-planner's
        choices, estimate and search, and the training step (``null`` when not planned
        so; the order
        is not included; reports store it next to the plan)."""
        return {
            "schema_version": PLAN_SCHEMA_VERSION,
            "policy_name": self.policy_name,
            "bucket_numel": self.bucket_numel,
            "policy_fqns": list(self.policy_fqns),
            "ignored_modules": list(self.ignored_modules),
            "units": [u.to_dict() for u in self.units],
            "atomic_units": [u.to_dict() for u in self.atomic_units],
            "groups": self.groups,
            "fsdp1_modules": self.fsdp1_modules(),
            "notes": list(self.notes),
            "stats": self.stats(1).to_dict(),
            "prefetch": self.prefetch,
            "reshard_after_forward": (
                None if self.reshard_after_forward is None else list(self.reshard_after_forward)
            ),
            "estimate": None if self.estimate is None else self.estimate.to_dict(),
            "search": None if self.search is None else self.search.to_dict(),
            **({} if self.mesh is None else {"mesh": self.mesh.to_dict()}),
            "training": None if self.training is None else self.training.to_dict(),
        }

    @classmethod
    def from_dict(
        cls, data: Any, order: ExecutionOrder, *, source: str = "<dict>", prefix: str = ""
    ) -> WrapPlan:
        """Rebuild a plan from :meth:`to_dict` output and its order, checked field by field.

        Every field is checked against :data:`PLAN_FIELDS` in one pass (the
        units against :data:`~execwrap.plan.unit.UNIT_FIELDS`), and against
        ``order``: every unit's modules and parameters are ones the order has
        (when it lists them) and its calls are calls of the order. Then the
        fields against each other (:mod:`execwrap.plan.consistency`): each
        module and parameter in at most one unit, a root unit, each unit's
        ``numel``, ``bytes``, ``first_use`` and ``last_use`` what its
        parameters and the order give, units the unions of ``atomic_units``,
        ``policy_fqns`` / ``ignored_modules`` modules of the order. ``groups``,
        ``fsdp1_modules`` and ``stats`` are derived from the units and not read;
        when present they must equal what the units give.

        Args:
            data: the dict (parsed JSON).
            order: the order the plan was built from.
            source: the file ``data`` came from, for messages.
            prefix: where ``data`` sits in that file (``"plan"`` in a report).

        Reads layout versions 1 to 3 (a version-1 plan has no auto-planner
        fields, a version-2 plan no training step: they stay ``None``).

        Raises:
            ValueError: ``data`` is of another schema version or malformed; the
                one-line message names ``source`` and the field.
        """
        plan = cls(order=order, **plan_fields(data, order, source=source, prefix=prefix))
        check_derived(plan, data, source=source, prefix=prefix)
        if plan.training is not None:  # its per-unit checkpointing names units of this plan
            try:
                plan.training.checkpoint_modes(plan)
            except ValueError as e:
                raise SchemaError(
                    field_path(prefix, "training"), str(e), source, "WrapPlan"
                ) from None
        return plan
