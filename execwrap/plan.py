"""Wrap plans: FSDP units in execution order, FSDP2 groups, and their cost.

:func:`plan_wrap` decides which modules become FSDP units from an auto-wrap
policy (exactly as FSDP1 decides it), corrects what the execution order shows
to be unsafe or useless (containers that never run, parameters used outside
their unit, tied parameters split across units), orders the units by first
use, and optionally merges consecutive units into size-capped FSDP2 groups.
The resulting :class:`WrapPlan` predicts its cost (:meth:`WrapPlan.stats`) and
its unsharded memory over a step (:meth:`WrapPlan.unsharded_timeline`).

Sizes: ``numel`` and ``bucket_numel`` count elements; ``bytes`` count bytes
(numel times each dtype's element size).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import torch.nn as nn
from torch.distributed.fsdp.wrap import always_wrap_policy

from execwrap.auto_wrap import expand_ignored_modules, policy_name, policy_unit_modules
from execwrap.errors import PlanError
from execwrap.spans import UseSpans, first_trainable_use, order_requires_grad
from tracing.fqn import ROOT_NAME, owner_fqn
from tracing.order import ExecutionOrder, param_info, shared_param_map

__all__ = [
    "PLAN_SCHEMA_VERSION",
    "PlanStats",
    "TimelineStep",
    "WrapPlan",
    "WrapUnit",
    "compare_plans",
    "min_contiguous_groups",
    "min_groups_lower_bound",
    "plan_wrap",
    "policy_units",
]

logger = logging.getLogger(__name__)

#: Version of the layout written by :meth:`WrapPlan.to_dict`.
PLAN_SCHEMA_VERSION = 1


# ---------------------------------------------------------------- FQN helpers
def _is_within(fqn: str, ancestor: str) -> bool:
    """Whether module/param ``fqn`` is ``ancestor`` or lies in its subtree."""
    return ancestor == "" or fqn == ancestor or fqn.startswith(ancestor + ".")


def _ancestors(fqn: str) -> Iterator[str]:
    """``fqn``, then each enclosing module FQN up to the root ``""``."""
    while True:
        yield fqn
        if not fqn:
            return
        fqn = fqn.rpartition(".")[0]


def _lca(fqns: Iterable[str]) -> str:
    """Deepest module FQN that is ancestor-or-self of every FQN given."""
    parts: list[str] | None = None
    for fqn in fqns:
        p = fqn.split(".") if fqn else []
        if parts is None:
            parts = p
            continue
        n = 0
        while n < min(len(parts), len(p)) and parts[n] == p[n]:
            n += 1
        parts = parts[:n]
    return ".".join(parts or [])


def _innermost(fqn: str, units: Iterable[str] | dict[str, Any] | set[str]) -> str:
    """The innermost unit module that contains module ``fqn`` (root at worst)."""
    for anc in _ancestors(fqn):
        if anc in units:
            return anc
    return ""


def _name(fqn: str) -> str:
    return f"'{fqn}'" if fqn else ROOT_NAME


def _plural(n: int, word: str = "parameter") -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _count(params: Sequence[str], numel: dict[str, int]) -> str:
    return f"{_plural(len(params))}, {sum(numel[p] for p in params)} elements"


def _and(fqns: Iterable[str], limit: int = 8) -> str:
    """``'a'``, ``'a' and 'b'``, ``'a', 'b' and 'c'`` (``<root>`` for ``""``)."""
    items = [_name(f) for f in fqns]
    if len(items) > limit:
        return ", ".join(items[:limit]) + f" and {len(items) - limit} more"
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _modules(fqns: Sequence[str]) -> str:
    """``module 'a'`` / ``modules 'a' and 'b'``."""
    return f"module{'s' if len(fqns) != 1 else ''} {_and(fqns)}"


def _names(fqns: Iterable[str], limit: int = 8) -> str:
    items = [_name(f) for f in fqns]
    if len(items) > limit:
        return ", ".join(items[:limit]) + f", ... ({len(items) - limit} more)"
    return ", ".join(items)


# ------------------------------------------------------------- data model
@dataclass(frozen=True)
class WrapUnit:
    """One FSDP unit (FSDP1) or one ``fully_shard`` group (FSDP2).

    Attributes:
        module_fqns: the module(s) of the unit: one module, or several for a
            merged FSDP2 group (``fully_shard([m1, m2])``), in execution order.
        param_fqns: canonical FQNs of the parameters this unit manages (its
            modules' parameters not managed by a nested unit), in forward order.
        numel: elements over ``param_fqns``.
        bytes: bytes over ``param_fqns`` (numel times each dtype's size).
        first_use: the first call index (in ``order.module_forward_order``) of
            any of the unit's modules (``None`` if none is ever called).
        last_use: the last call index at which the unit is still active: the
            last call of any of its modules or of any module nested inside
            them (the range of calls a unit's forward spans), or the last
            ``order.param_uses`` entry using one of its parameters (a
            parameter used from elsewhere), whichever is later. For the root
            unit this is the last call of the whole forward. ``None`` exactly
            when ``first_use`` is ``None``.
    """

    module_fqns: tuple[str, ...]
    param_fqns: tuple[str, ...]
    numel: int
    bytes: int
    first_use: int | None
    last_use: int | None

    @property
    def label(self) -> str:
        """``"+"``-joined module FQNs, the root written ``<root>``."""
        return "+".join(m or ROOT_NAME for m in self.module_fqns)

    @property
    def is_root(self) -> bool:
        """Whether this unit is the root module's."""
        return "" in self.module_fqns

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (lists instead of tuples)."""
        return {
            "module_fqns": list(self.module_fqns),
            "param_fqns": list(self.param_fqns),
            "numel": self.numel,
            "bytes": self.bytes,
            "first_use": self.first_use,
            "last_use": self.last_use,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WrapUnit:
        """Inverse of :meth:`to_dict`."""
        return cls(
            module_fqns=tuple(str(m) for m in data["module_fqns"]),
            param_fqns=tuple(str(p) for p in data["param_fqns"]),
            numel=int(data["numel"]),
            bytes=int(data["bytes"]),
            first_use=None if data.get("first_use") is None else int(data["first_use"]),
            last_use=None if data.get("last_use") is None else int(data["last_use"]),
        )


@dataclass(frozen=True)
class PlanStats:
    """Predicted cost of a plan for one training step (see :meth:`WrapPlan.stats`).

    Attributes:
        num_units: units (FSDP2 groups) in the plan.
        all_gathers_per_step: parameter all-gathers per step with reshard after
            forward (the default of FSDP1 ``FULL_SHARD`` and FSDP2).
        all_gathers_per_step_no_reshard: the same without reshard after forward
            (FSDP1 ``SHARD_GRAD_OP``, FSDP2 ``reshard_after_forward=False``).
        reduce_scatters_per_step: gradient reduce-scatters per step.
        bytes_per_all_gather: unsharded bytes each unit all-gathers, one entry
            per unit in unit order (``0``: the unit has no parameters and
            issues no all-gather).
        largest_unit_bytes: the largest entry of ``bytes_per_all_gather``.
        peak_unsharded_bytes: peak unsharded parameter bytes over the step at
            this prefetch depth, with reshard after forward.
        prefetch: the prefetch depth the peak was computed for.
        total_bytes: bytes over all units (the unsharded model, ignored
            parameters excluded).
        peak_unsharded_bytes_no_reshard: the peak without reshard after forward.
    """

    num_units: int
    all_gathers_per_step: int
    all_gathers_per_step_no_reshard: int
    reduce_scatters_per_step: int
    bytes_per_all_gather: tuple[int, ...]
    largest_unit_bytes: int
    peak_unsharded_bytes: int
    prefetch: int
    total_bytes: int = 0
    peak_unsharded_bytes_no_reshard: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples as lists)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


class TimelineStep(NamedTuple):
    """One step of :meth:`WrapPlan.unsharded_timeline`.

    Attributes:
        step: position in the timeline (forward steps first, then backward).
        phase: ``"forward"`` or ``"backward"``.
        unit: the running unit's :attr:`WrapUnit.label`.
        unsharded_bytes: parameter bytes unsharded while that unit runs.
    """

    step: int
    phase: str
    unit: str
    unsharded_bytes: int


# ------------------------------------------------------------ model snapshot
@dataclass
class _ModelView:
    """What the planner needs from the model, keyed by canonical FQN."""

    modules: dict[str, nn.Module]
    module_alias: dict[str, str]  # every module path (shared modules too) -> canonical FQN
    classes: dict[str, str]
    def_index: dict[str, int]
    fqns_of: dict[str, list[str]]  # canonical param -> [canonical, *aliases]
    alias_to_canonical: dict[str, str]
    numel: dict[str, int]
    bytes: dict[str, int]
    dtype: dict[str, str]
    shape: dict[str, tuple[int, ...]]
    requires_grad: dict[str, bool]
    ignored_params: set[str]

    def owner(self, param_name: str) -> str:
        """Canonical FQN of the module owning parameter name ``param_name``
        (a name through a shared module maps to the module's first name)."""
        return self.module_alias[owner_fqn(param_name)]

    @classmethod
    def build(cls, model: nn.Module, ignored_module_fqns: Iterable[str]) -> _ModelView:
        """Snapshot ``model``; ``ignored_module_fqns`` are canonical FQNs."""
        modules = dict(model.named_modules())
        canonical_module = {id(m): fqn for fqn, m in modules.items()}
        module_alias = {
            fqn: canonical_module[id(m)] for fqn, m in model.named_modules(remove_duplicate=False)
        }
        id_to_canonical, shared = shared_param_map(model)
        ignored = tuple(ignored_module_fqns)
        ignored_params = {
            id_to_canonical[id(p)]
            for fqn, m in modules.items()
            if any(_is_within(fqn, i) for i in ignored)
            for p in m.parameters(recurse=False)
        }
        fqns_of: dict[str, list[str]] = {}
        alias: dict[str, str] = {}
        numel: dict[str, int] = {}
        nbytes: dict[str, int] = {}
        dtype: dict[str, str] = {}
        shape: dict[str, tuple[int, ...]] = {}
        rg: dict[str, bool] = {}
        for fqn, p in model.named_parameters():
            fqns_of[fqn] = [fqn, *shared.get(fqn, [])]
            for name in fqns_of[fqn]:
                alias[name] = fqn
            info = param_info(p)
            numel[fqn] = info.numel
            nbytes[fqn] = info.bytes
            dtype[fqn] = info.dtype
            shape[fqn] = info.shape
            rg[fqn] = info.requires_grad
        return cls(
            modules=modules,
            module_alias=module_alias,
            classes={f: type(m).__name__ for f, m in modules.items()},
            def_index={f: i for i, f in enumerate(modules)},
            fqns_of=fqns_of,
            alias_to_canonical=alias,
            numel=numel,
            bytes=nbytes,
            dtype=dtype,
            shape=shape,
            requires_grad=rg,
            ignored_params=ignored_params,
        )


# ------------------------------------------------------------------- plan
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
            :func:`plan_wrap`.
    """

    units: list[WrapUnit]
    order: ExecutionOrder
    atomic_units: list[WrapUnit] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bucket_numel: int | None = None
    policy_name: str = ""
    policy_fqns: tuple[str, ...] = ()
    ignored_modules: tuple[str, ...] = ()

    # ------------------------------------------------------------ lookups
    @property
    def groups(self) -> list[list[str]]:
        """Module FQNs of each unit: the argument lists for ``fully_shard``."""
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
        for anc in _ancestors(fqn):
            if anc in by_module:
                return by_module[anc]
        return None

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

    def _ancestor_units(self) -> list[set[int]]:
        """For each unit, the units whose modules enclose one of its modules.

        Walks each module FQN up to the root (O(units x depth)), instead of
        comparing every pair of units.
        """
        unit_of: dict[str, int] = {}
        for i, unit in enumerate(self.units):
            for fqn in unit.module_fqns:
                unit_of[fqn] = i
        out: list[set[int]] = []
        for i, unit in enumerate(self.units):
            anc: set[int] = set()
            for fqn in unit.module_fqns:
                for a in _ancestors(fqn):
                    if a == fqn:
                        continue
                    j = unit_of.get(a)
                    if j is not None and j != i:
                        anc.add(j)
            out.append(anc)
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
        notes = [
            *self.notes,
            f"Order recorded during the first step ({order.method}); units kept as applied "
            "and re-ordered by first use.",
        ]
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
            parent = self._fsdp1_parent(unit)
            out.extend([parent] if parent is not None else unit.module_fqns)
        return out

    def _fsdp1_parent(self, group: WrapUnit) -> str | None:
        members = set(group.module_fqns)
        atomic = {m for u in (self.atomic_units or self.units) for m in u.module_fqns}
        called = set(self.order.module_forward_order)
        cand = _lca(group.module_fqns)
        while cand != "":
            if cand in atomic:
                return None
            if {m for m in atomic if _is_within(m, cand)} != members:
                return None
            if cand in called:
                for unit in self.units:
                    if unit is group:
                        continue
                    for p in unit.param_fqns:
                        for name in (p, *self.order.shared_params.get(p, [])):
                            if _is_within(owner_fqn(name), cand):
                                return None
                return cand
            cand = cand.rpartition(".")[0]
        return None

    # ---------------------------------------------------------------- cost
    def runs_backward(self) -> list[bool]:
        """For each unit, whether autograd runs backward through it.

        A unit does not when every module call in its span (see
        :attr:`WrapUnit.last_use`) happens before the first forward use of
        any trainable (``requires_grad``) parameter, as recorded in
        ``order.param_uses`` and ``order.params``: assuming the model's input
        needs no grad, its outputs then do not require grad, so FSDP's
        pre-backward hook never fires and the unit is not all-gathered in
        backward. Spans are computed from :attr:`order`, not read from the
        units. A unit never called in forward, and every unit when the order
        records no parameter uses, counts as running backward.

        Returns:
            One bool per unit, in :attr:`units` order.
        """
        first_trainable = first_trainable_use(self.order)
        if first_trainable is None:
            return [True] * len(self.units)
        spans = UseSpans(self.order)
        out: list[bool] = []
        for unit in self.units:
            _, last = spans.span(unit.module_fqns, unit.param_fqns)
            out.append(last is None or last >= first_trainable)
        return out

    def unsharded_timeline(
        self, prefetch: int = 1, *, reshard_after_forward: bool = True
    ) -> list[TimelineStep]:
        """Unsharded parameter bytes at each unit step of one training step.

        Model of the step (FSDP's unshard/reshard schedule: FSDP2's
        ``FSDPParamGroup.pre_forward``/``post_forward``/``pre_backward``/
        ``post_backward`` and explicit prefetching; FSDP1's ``_pre_forward_unshard``
        / ``_post_forward_reshard`` with ``forward_prefetch`` and
        ``BACKWARD_PRE``):

        * forward visits the units in :attr:`units` order; while unit ``j``
          runs, unsharded are: unit ``j``, the next ``prefetch`` units (their
          all-gathers were issued early), every unit enclosing ``j`` (its
          forward is still running), and the root unit (never resharded after
          forward). Without ``reshard_after_forward`` every unit gathered so
          far stays unsharded;
        * backward visits the units in reverse; while unit ``j`` runs,
          unsharded are: unit ``j``, the ``prefetch`` units before it, every
          unit enclosing ``j`` (its post-backward waits for its children) and
          the root. Without ``reshard_after_forward`` units ``0..j`` are
          unsharded (later ones were freed after their gradients);
        * units that autograd never runs backward through
          (:meth:`runs_backward`: they run before any trainable parameter is
          used) are not all-gathered in backward: with reshard after forward
          they are left out of every backward step (their own step shows what
          stays unsharded meanwhile) and are not counted among the
          ``prefetch`` units; without it they stay unsharded through all of
          backward (their post-backward, which would free them, never runs).

        Only parameter bytes count (no gradients, activations, or padding); a
        group spanning modules in several subtrees counts the enclosing units
        of all of them (an upper bound).

        Args:
            prefetch: units prefetched ahead (``>= 0``).
            reshard_after_forward: FSDP1 ``FULL_SHARD`` / FSDP2 default
                (``True``), or ``SHARD_GRAD_OP`` / ``False``.

        Returns:
            ``2 * len(units)`` :class:`TimelineStep` tuples ``(step, phase,
            unit, unsharded_bytes)``, forward then backward.

        Raises:
            ValueError: ``prefetch`` is negative or not an int.
        """
        _check_prefetch(prefetch)
        if not self.units:
            return []
        return self._timeline(
            prefetch, reshard_after_forward, self._ancestor_units(), self.runs_backward()
        )

    def _timeline(
        self,
        prefetch: int,
        reshard_after_forward: bool,
        anc: list[set[int]],
        active: list[bool],
    ) -> list[TimelineStep]:
        """:meth:`unsharded_timeline` given the enclosing units of each unit
        and :meth:`runs_backward` (computed once by :meth:`stats` for both
        reshard settings)."""
        n = len(self.units)
        nbytes = [u.bytes for u in self.units]
        root = self.root_index
        steps: list[TimelineStep] = []
        for j in range(n):
            if reshard_after_forward:
                live = {j, root, *anc[j], *range(j + 1, min(n, j + 1 + prefetch))}
            else:
                live = {root, *anc[j], *range(0, min(n, j + 1 + prefetch))}
            steps.append(
                TimelineStep(
                    len(steps), "forward", self.units[j].label, sum(nbytes[i] for i in live)
                )
            )
        skipped = {i for i in range(n) if not active[i]}
        for j in range(n - 1, -1, -1):
            if reshard_after_forward:
                before = [i for i in range(j - 1, -1, -1) if active[i]][:prefetch]
                live = {i for i in (j, *anc[j], *before) if active[i]} | {root}
            else:
                live = {root, *anc[j], *range(0, j + 1), *skipped}
            steps.append(
                TimelineStep(
                    len(steps), "backward", self.units[j].label, sum(nbytes[i] for i in live)
                )
            )
        return steps

    def stats(self, prefetch: int = 1) -> PlanStats:
        """Predicted collectives and memory for one training step.

        Model of the step (FSDP1 ``FULL_SHARD`` and FSDP2 defaults):

        * all-gathers: each unit with parameters is all-gathered once per
          forward activation (a unit whose module is called ``c`` times is
          resharded and gathered ``c`` times) and, with reshard after forward,
          once more per activation in backward; the root unit is not
          resharded after forward (FSDP1 and FSDP2 both keep it), so it is
          gathered in forward only. Without reshard after forward each unit
          is gathered once;
        * frozen prefix: autograd never runs backward through a unit whose
          whole span (every module call of it, see :attr:`WrapUnit.last_use`)
          comes before the first forward use of any trainable parameter,
          assuming the input needs no grad: its outputs do not require grad,
          so FSDP's pre-backward hook never fires and the unit has no backward
          all-gather (:meth:`runs_backward`). FSDP1 agrees even with
          ``BACKWARD_PRE`` prefetch (it skips handles whose
          ``_needs_pre_backward_unshard`` is unset); FSDP2's implicit backward
          prefetch, or an explicit list naming such a unit, still gathers it;
        * reduce-scatters: one per unit with a trainable parameter (none for
          a unit whose parameters are all frozen);
        * peak unsharded bytes: the maximum of :meth:`unsharded_timeline`.

        Args:
            prefetch: units prefetched ahead (``>= 0``), forward and backward.

        Returns:
            A :class:`PlanStats`.

        Raises:
            ValueError: ``prefetch`` is negative or not an int.

        Example:
            >>> plan.stats(prefetch=1).all_gathers_per_step  # doctest: +SKIP
            9
        """
        _check_prefetch(prefetch)
        root = self.root_index
        gathers = 0
        gathers_no_reshard = 0
        reduce_scatters = 0
        backward = self.runs_backward()
        calls = Counter(self.order.module_forward_order)
        for i, unit in enumerate(self.units):
            if unit.numel <= 0:
                continue
            acts = max(1, max(calls.get(m, 0) for m in unit.module_fqns))
            gathers += acts if i == root or not backward[i] else 2 * acts
            gathers_no_reshard += 1
            if any(self._requires_grad(p) for p in unit.param_fqns):
                reduce_scatters += 1
        per_gather = tuple(u.bytes for u in self.units)
        anc = self._ancestor_units()
        timeline = self._timeline(prefetch, True, anc, backward) if self.units else []
        timeline_nr = self._timeline(prefetch, False, anc, backward) if self.units else []
        return PlanStats(
            num_units=len(self.units),
            all_gathers_per_step=gathers,
            all_gathers_per_step_no_reshard=gathers_no_reshard,
            reduce_scatters_per_step=reduce_scatters,
            bytes_per_all_gather=per_gather,
            largest_unit_bytes=max(per_gather, default=0),
            peak_unsharded_bytes=max((s.unsharded_bytes for s in timeline), default=0),
            prefetch=prefetch,
            total_bytes=sum(per_gather),
            peak_unsharded_bytes_no_reshard=max(
                (s.unsharded_bytes for s in timeline_nr), default=0
            ),
        )

    def _requires_grad(self, fqn: str) -> bool:
        return order_requires_grad(self.order, fqn)

    # ---------------------------------------------------------------- lint
    def check(self, model: nn.Module) -> None:
        """Check the plan against ``model``, like ``torch.fx.Graph.lint()``.

        Checks: every module and parameter FQN exists in ``model``; every
        canonical parameter (ignored ones excepted) is in exactly one unit;
        each parameter's unit is the innermost unit enclosing every name of
        it (so FSDP, which gives a parameter to the innermost wrapped module,
        builds exactly these units, and tied parameters are never split); no
        group nests one of its modules in another; numel and bytes add up.

        Raises:
            PlanError: naming the FQN, what was expected and what was found.
        """
        self._check(_ModelView.build(model, self.ignored_modules), type(model).__name__)

    def _check(self, view: _ModelView, model_name: str) -> None:
        """:meth:`check` against a snapshot of the model."""
        by_module: dict[str, int] = {}
        for i, unit in enumerate(self.units):
            for m in unit.module_fqns:
                if m not in view.modules:
                    raise PlanError(
                        f"plan unit {unit.label}: module {_name(m)} does not exist in the "
                        f"model ({model_name}); was the plan built for another model?"
                    )
                if m in by_module:
                    raise PlanError(
                        f"module {_name(m)} is in two units ({self.units[by_module[m]].label} "
                        f"and {unit.label})"
                    )
                by_module[m] = i
            for a in unit.module_fqns:
                for b in unit.module_fqns:
                    if a != b and _is_within(b, a):
                        raise PlanError(
                            f"group {unit.label} nests {_name(b)} inside {_name(a)}; "
                            "fully_shard groups must not overlap"
                        )
        if "" not in by_module:
            raise PlanError("the plan has no root unit (module '') ")
        holder: dict[str, int] = {}
        for i, unit in enumerate(self.units):
            for p in unit.param_fqns:
                if p not in view.fqns_of:
                    raise PlanError(
                        f"plan unit {unit.label}: parameter {p!r} is not a canonical parameter "
                        f"of the model ({model_name})"
                    )
                if p in holder:
                    raise PlanError(
                        f"parameter {p!r} is in two units: {self.units[holder[p]].label} and "
                        f"{unit.label}"
                    )
                if p in view.ignored_params:
                    raise PlanError(f"parameter {p!r} is ignored but in unit {unit.label}")
                holder[p] = i
            numel = sum(view.numel[p] for p in unit.param_fqns)
            nbytes = sum(view.bytes[p] for p in unit.param_fqns)
            if (numel, nbytes) != (unit.numel, unit.bytes):
                raise PlanError(
                    f"plan unit {unit.label}: numel/bytes {unit.numel}/{unit.bytes} do not match "
                    f"its parameters ({numel}/{nbytes})"
                )
        for p, names in view.fqns_of.items():
            if p in view.ignored_params:
                continue
            if p not in holder:
                raise PlanError(f"parameter {p!r} is in no unit of the plan")
            for name in names:
                want = by_module[_innermost(view.owner(name), by_module)]
                if want != holder[p]:
                    tied = (
                        f" (tied with {', '.join(repr(n) for n in names if n != p)})"
                        if len(names) > 1
                        else ""
                    )
                    raise PlanError(
                        f"parameter {p!r}{tied} is in unit {self.units[holder[p]].label}, but "
                        f"FSDP would give its name {name!r} to unit {self.units[want].label}, "
                        "the innermost unit enclosing it"
                    )

    # ---------------------------------------------------------- serialising
    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable dict: units, atomic units, notes, bucket size,
        policy, FSDP1 modules, and stats at prefetch 1 (the order is not
        included; reports store it next to the plan)."""
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
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], order: ExecutionOrder) -> WrapPlan:
        """Rebuild a plan from :meth:`to_dict` output and its order.

        Raises:
            ValueError: ``data`` is of another schema version or malformed.
        """
        if not isinstance(data, dict):
            raise ValueError(f"WrapPlan.from_dict expects a dict, got {type(data).__name__}")
        version = data.get("schema_version", PLAN_SCHEMA_VERSION)
        if version != PLAN_SCHEMA_VERSION:
            raise ValueError(
                f"unsupported WrapPlan schema_version {version!r} (this execwrap reads "
                f"{PLAN_SCHEMA_VERSION}); build the plan again with plan_wrap"
            )
        try:
            units = [WrapUnit.from_dict(u) for u in data["units"]]
            atomic = [WrapUnit.from_dict(u) for u in data.get("atomic_units", [])]
            bucket = data.get("bucket_numel")
            return cls(
                units=units,
                order=order,
                atomic_units=atomic or list(units),
                notes=[str(n) for n in data.get("notes", [])],
                bucket_numel=None if bucket is None else int(bucket),
                policy_name=str(data.get("policy_name", "")),
                policy_fqns=tuple(str(f) for f in data.get("policy_fqns", [])),
                ignored_modules=tuple(str(f) for f in data.get("ignored_modules", [])),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed WrapPlan dict: {e!r}") from e


def _check_prefetch(prefetch: int) -> None:
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an int >= 0 (units ahead), got {prefetch!r}")


# --------------------------------------------------------------- planning
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
    bucket_numel: int | None = None,
    ignored_modules: Iterable[nn.Module | str] | None = None,
) -> WrapPlan:
    """Plan FSDP units from an init policy and the model's execution order.

    Steps:

    1. Units come from ``init_policy`` exactly as FSDP1 decides them
       (:func:`policy_units`); the root is always a unit.
    2. With a non-empty order: a unit whose module never runs its own forward
       is dropped, since its FSDP hooks would never fire: a container
       (``nn.ModuleList``, a module only iterated) keeps its called children
       as units; a dead module's parameters go to the nearest enclosing unit.
    3. Every parameter must be unsharded wherever it is used: the unit
       holding it must enclose every module that uses it (``param_uses``) and
       every name of it (tied weights). If not, the units between the
       parameter and the lowest common ancestor unit that enclose its names
       are dropped, so that ancestor holds it (FSDP gives a parameter to the
       innermost wrapped module, so the parameter cannot move otherwise).
    4. Units are ordered by first call (ties by definition order; never-called
       units last, in definition order).
    5. With ``bucket_numel``, consecutive units are merged greedily into FSDP2
       groups of at most ``bucket_numel`` elements (see
       :func:`min_contiguous_groups`; greedy is optimal for a contiguous
       grouping under a cap). Members of a group must be called, not nest one
       another, not be the root, and share one trainable dtype (FSDP2
       reduce-scatters one dtype per group); a larger unit stays alone.
    6. The plan checks itself (:meth:`WrapPlan.check`).

    Every departure from the policy, each tied parameter, units mixing
    ``requires_grad``, ignored modules, never-called modules with parameters,
    and groups FSDP1 cannot realise are explained in ``plan.notes``.

    Args:
        model: the unwrapped root module (the meta device is fine).
        order: its execution order (from ``tracing.capture_execution_order``).
        init_policy: see :func:`policy_units`.
        bucket_numel: FSDP2 group size cap in elements, or ``None``.
        ignored_modules: modules FSDP ignores (an iterable of ``nn.Module``
            objects or module FQN strings); their parameters are in no unit.

    Returns:
        A :class:`WrapPlan`.

    Raises:
        TypeError: ``model``/``order``/``init_policy``/``bucket_numel``/
            ``ignored_modules`` has the wrong type.
        ValueError: ``bucket_numel`` is not positive; an ignored module is
            not part of ``model``; or the order does not fit ``model``: it
            names a module or parameter that ``model`` does not have, or its
            ``params`` table (when not empty) lists other parameters, or other
            numels/shapes, than ``model.named_parameters()`` (a stale order:
            capture it again).
        PlanError: the plan failed its own check (a bug; please report).

    Example:
        >>> from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        >>> from execwrap.demo_models import GPT, GPTConfig, Block
        >>> from tracing import trace_execution_order
        >>> model = GPT(GPTConfig(n_blocks=2))
        >>> plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))
        >>> plan.groups
        [[''], ['blocks.0'], ['blocks.1']]
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"plan_wrap: model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(order, ExecutionOrder):
        raise TypeError(
            f"plan_wrap: order must be an ExecutionOrder, got {type(order).__name__}; capture "
            "one with tracing.capture_execution_order(model, ...)"
        )
    if bucket_numel is not None:
        if isinstance(bucket_numel, bool) or not isinstance(bucket_numel, int):
            raise TypeError(
                f"plan_wrap: bucket_numel must be an int (elements) or None, got "
                f"{type(bucket_numel).__name__}"
            )
        if bucket_numel <= 0:
            raise ValueError(
                f"plan_wrap: bucket_numel must be > 0 elements, got {bucket_numel}; pass None "
                "for no bucketing"
            )
    ignored_set = expand_ignored_modules(model, ignored_modules)
    names = {id(m): fqn for fqn, m in model.named_modules()}
    ignored_fqns = [fqn for fqn, m in model.named_modules() if m in ignored_set]
    ignored_top = tuple(
        f for f in ignored_fqns if not any(o != f and _is_within(f, o) for o in ignored_fqns)
    )
    view = _ModelView.build(model, ignored_top)
    _check_order_matches(view, order, type(model).__name__)
    policy_fqns = [names[id(m)] for m in policy_unit_modules(model, init_policy, ignored_set)]
    logger.debug("policy %s chose %d unit(s)", policy_name(init_policy), len(policy_fqns))

    builder = _Planner(view, order, policy_fqns, ignored_top)
    atomic = builder.build()
    units = (
        _bucket(atomic, bucket_numel, builder.trainable_dtypes) if bucket_numel else list(atomic)
    )
    plan = WrapPlan(
        units=units,
        order=order,
        atomic_units=list(atomic),
        notes=builder.notes,
        bucket_numel=bucket_numel,
        policy_name=policy_name(init_policy),
        policy_fqns=tuple(policy_fqns),
        ignored_modules=ignored_top,
    )
    split = [u for u in units if len(u.module_fqns) > 1 and plan._fsdp1_parent(u) is None]
    if split:
        plan.notes.append(
            f"FSDP1 wraps single modules: {len(split)} of {len(units)} FSDP2 groups have no "
            "module that holds exactly their units and runs its own forward, so "
            "fsdp1_modules() wraps their members separately: "
            + "; ".join("[" + ", ".join(_name(m) for m in u.module_fqns) + "]" for u in split)
            + "."
        )
    try:
        plan._check(view, type(model).__name__)
    except PlanError as e:
        raise PlanError(f"{e} (while checking the plan for policy {plan.policy_name})") from e
    logger.debug("plan: %d unit(s), %d note(s)", len(plan.units), len(plan.notes))
    return plan


# -------------------------------------------------------------- bucketing
def _can_group(
    members: Sequence[WrapUnit], cap: int, trainable_dtypes: dict[str, frozenset[str]]
) -> bool:
    """Whether ``members`` (consecutive atomic units) may form one FSDP2 group.

    A single unit always may. Several may when: none is the root, all are
    called, none of their modules encloses another's (``fully_shard`` groups
    must not overlap), their numel adds up to at most ``cap``, and their
    trainable parameters share one dtype (FSDP2 reduce-scatters a group in
    one dtype). Every sub-run of an allowed run is allowed, which makes the
    greedy grouping optimal.
    """
    if len(members) <= 1:
        return True
    if any(u.is_root or u.first_use is None for u in members):
        return False
    if sum(u.numel for u in members) > cap:
        return False
    fqns = [m for u in members for m in u.module_fqns]
    for i, a in enumerate(fqns):
        for b in fqns[i + 1 :]:
            if _is_within(a, b) or _is_within(b, a):
                return False
    dtypes: set[str] = set()
    for u in members:
        for m in u.module_fqns:
            dtypes |= trainable_dtypes.get(m, frozenset())
    return len(dtypes) <= 1


def _merge(members: Sequence[WrapUnit]) -> WrapUnit:
    if len(members) == 1:
        return members[0]
    firsts = [u.first_use for u in members if u.first_use is not None]
    lasts = [u.last_use for u in members if u.last_use is not None]
    return WrapUnit(
        module_fqns=tuple(m for u in members for m in u.module_fqns),
        param_fqns=tuple(p for u in members for p in u.param_fqns),
        numel=sum(u.numel for u in members),
        bytes=sum(u.bytes for u in members),
        first_use=min(firsts) if firsts else None,
        last_use=max(lasts) if lasts else None,
    )


def _bucket(
    atomic: Sequence[WrapUnit], cap: int, trainable_dtypes: dict[str, frozenset[str]]
) -> list[WrapUnit]:
    """Greedy contiguous grouping of ``atomic`` (in execution order) under ``cap``.

    Units that hold no parameters (e.g. a block whose children are all units
    under ``always_wrap_policy``) all-gather nothing: they stay alone and do
    not interrupt the group being filled, so the groups of parameter-holding
    units are the greedy (optimal) grouping of that sequence.
    """
    groups: list[list[WrapUnit]] = []
    filling: list[WrapUnit] | None = None
    for unit in atomic:
        if unit.numel == 0 and not unit.is_root:
            groups.append([unit])
            continue
        if filling is not None and _can_group([*filling, unit], cap, trainable_dtypes):
            filling.append(unit)
        else:
            filling = [unit]
            groups.append(filling)
    logger.debug(
        "bucketing %d unit(s) under %d elements: %d group(s)", len(atomic), cap, len(groups)
    )
    merged = [_merge(g) for g in groups]
    # Keep execution order by first use (paramless units may have been emitted
    # while an earlier group was still filling).
    merged.sort(key=lambda u: (u.first_use is None, u.first_use or 0))
    return merged


def min_contiguous_groups(sizes: Sequence[int], cap: int) -> int:
    """Fewest groups of consecutive items with each group's sum at most ``cap``.

    An item larger than ``cap`` forms a group alone. The greedy scan (extend
    the current group while it fits) is optimal: after ``k`` groups it has
    covered at least as many items as any valid grouping into ``k`` groups,
    because a sub-run of a run that fits also fits. This is the least number
    of all-gathers per forward that any contiguous bucketing of these unit
    sizes can reach under the cap.

    Args:
        sizes: unit sizes in execution order (elements, ``>= 0``).
        cap: group size cap (elements, ``> 0``).

    Returns:
        The number of groups (``0`` for no sizes).

    Raises:
        ValueError: ``cap <= 0`` or a negative size.

    Example:
        >>> min_contiguous_groups([4, 4, 4, 9, 1], cap=8)
        4
    """
    if isinstance(cap, bool) or not isinstance(cap, int) or cap <= 0:
        raise ValueError(f"min_contiguous_groups: cap must be an int > 0 (elements), got {cap!r}")
    groups = 0
    current: int | None = None
    for i, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"min_contiguous_groups: sizes[{i}] is negative ({size})")
        if current is not None and current + size <= cap:
            current += size
        else:
            groups += 1
            current = size
    return groups


#: Alias of :func:`min_contiguous_groups` (the name used by the benchmarks).
min_groups_lower_bound = min_contiguous_groups


def compare_plans(plans: dict[str, WrapPlan], *, prefetch: int = 1) -> list[dict[str, Any]]:
    """One row of predicted cost per plan, for reports and benchmarks.

    Args:
        plans: name -> plan; rows follow this mapping's order.
        prefetch: prefetch depth for the peak (``>= 0``).

    Returns:
        Dicts with ``name``, ``units`` (count), ``all_gathers_per_step``,
        ``all_gathers_per_step_no_reshard``, ``reduce_scatters_per_step``,
        ``largest_unit_bytes``, ``peak_unsharded_bytes``, ``total_bytes`` and
        ``notes`` (count).

    Raises:
        TypeError: a value is not a :class:`WrapPlan`.
        ValueError: ``prefetch`` is negative.

    Example:
        >>> rows = compare_plans({"blocks": plan_a, "bucketed": plan_b})  # doctest: +SKIP
        >>> [r["all_gathers_per_step"] for r in rows]  # doctest: +SKIP
        [9, 5]
    """
    _check_prefetch(prefetch)
    rows: list[dict[str, Any]] = []
    for name, plan in plans.items():
        if not isinstance(plan, WrapPlan):
            raise TypeError(
                f"compare_plans: {name!r} is a {type(plan).__name__}, expected a WrapPlan "
                "(build one with plan_wrap)"
            )
        st = plan.stats(prefetch)
        rows.append(
            {
                "name": str(name),
                "units": st.num_units,
                "all_gathers_per_step": st.all_gathers_per_step,
                "all_gathers_per_step_no_reshard": st.all_gathers_per_step_no_reshard,
                "reduce_scatters_per_step": st.reduce_scatters_per_step,
                "largest_unit_bytes": st.largest_unit_bytes,
                "peak_unsharded_bytes": st.peak_unsharded_bytes,
                "total_bytes": st.total_bytes,
                "notes": len(plan.notes),
            }
        )
    return rows


def _check_order_matches(view: _ModelView, order: ExecutionOrder, model_name: str) -> None:
    _check_order_params(view, order, model_name)
    hint = "capture the order from this model (tracing.capture_execution_order(model, ...))"
    for fqn in order.module_forward_order:
        if fqn not in view.modules:
            raise ValueError(
                f"plan_wrap: the order calls module {_name(fqn)}, which {model_name} does not "
                f"have; {hint}"
            )
    for use in order.param_uses:
        if use.module_fqn not in view.modules:
            raise ValueError(
                f"plan_wrap: the order uses parameters in module {_name(use.module_fqn)}, which "
                f"{model_name} does not have; {hint}"
            )
        for p in use.param_fqns:
            if p not in view.alias_to_canonical:
                raise ValueError(
                    f"plan_wrap: the order uses parameter {p!r} (in module "
                    f"{_name(use.module_fqn)}), which {model_name} does not have; {hint}"
                )


def _check_order_params(view: _ModelView, order: ExecutionOrder, model_name: str) -> None:
    """The order's ``params`` table must list the model's canonical parameters
    with the same numel and shape; an empty table (a hand-built order) is not
    checked."""
    if not order.params:
        return
    only_order: list[str] = []
    mismatched: list[str] = []
    for fqn, info in order.params.items():
        if fqn not in view.numel:
            only_order.append(repr(fqn))
            continue
        shape = view.shape[fqn]
        recorded = tuple(info.shape)
        if info.numel != view.numel[fqn] or (recorded and recorded != shape):
            was = recorded if recorded else f"{info.numel} elements"
            mismatched.append(f"{fqn!r} ({was} in the order, {shape} in the model)")
    only_model = [repr(fqn) for fqn in view.numel if fqn not in order.params]
    n = len(only_order) + len(only_model) + len(mismatched)
    if n == 0:
        return

    def few(items: list[str], limit: int = 3) -> str:
        more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
        return ", ".join(items[:limit]) + more

    parts = []
    if only_model:
        parts.append(f"in the model but not in the order: {few(only_model)}")
    if only_order:
        parts.append(f"in the order but not in the model: {few(only_order)}")
    if mismatched:
        parts.append(f"of another size: {few(mismatched)}")
    raise ValueError(
        f"plan_wrap: the order's parameters do not match those of {model_name}: "
        f"{_plural(n)} differ{'s' if n == 1 else ''} ({'; '.join(parts)}); the order was captured from a different "
        "model (or before the model changed): capture it again, e.g. "
        "tracing.capture_execution_order(model, ...)"
    )


class _Planner:
    """Turns the policy's units into the plan's atomic units (steps 2 to 4)."""

    def __init__(
        self,
        view: _ModelView,
        order: ExecutionOrder,
        policy_fqns: Sequence[str],
        ignored_top: tuple[str, ...],
    ) -> None:
        self.view = view
        self.order = order
        self.policy_fqns = list(policy_fqns)
        self.units: dict[str, None] = dict.fromkeys(policy_fqns)
        self.ignored_top = ignored_top
        self.notes: list[str] = []
        self.calls = Counter(order.module_forward_order)
        # modules called themselves or with a call nested inside them
        self.called_at_or_below = {a for c in self.calls for a in _ancestors(c)}
        self.first_call = order.first_call_index()
        self.spans = UseSpans(order)
        # canonical param -> modules using it, first-seen order
        self.users: dict[str, dict[str, None]] = {p: {} for p in view.fqns_of}
        for use in order.param_uses:
            for p in use.param_fqns:
                self.users[view.alias_to_canonical[p]].setdefault(use.module_fqn, None)
        # canonical param -> position in forward use order
        self.param_pos: dict[str, int] = {}
        for p in order.param_forward_order:
            if p in view.alias_to_canonical:
                self.param_pos.setdefault(view.alias_to_canonical[p], len(self.param_pos))
        for use in order.param_uses:
            for p in use.param_fqns:
                self.param_pos.setdefault(view.alias_to_canonical[p], len(self.param_pos))
        self.params = [p for p in view.fqns_of if p not in view.ignored_params]
        self.holder: dict[str, str] = {}
        self.trainable_dtypes: dict[str, frozenset[str]] = {}

    # -------------------------------------------------------------- steps
    def build(self) -> list[WrapUnit]:
        has_calls = bool(self.order.module_forward_order)
        if has_calls:
            dropped = self._drop_uncalled()
        else:
            dropped = self._drop_forwardless()
            self.notes.append(
                "The order has no module calls (nothing captured yet), so units come from "
                "the init policy alone, in definition order; plan again once an order is "
                "captured."
            )
        relocations = self._relocate()
        self.holder = {p: _innermost(owner_fqn(p), self.units) for p in self.params}
        self._note_dropped(dropped)
        self._note_dead_modules(has_calls)
        self._note_relocations(relocations)
        units = self._make_units()
        self._note_mixed_requires_grad(units)
        self._note_ignored()
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
            if fqn == "" or self.calls[fqn] > 0:
                continue
            called_inside = fqn in self.called_at_or_below  # fqn itself is never called
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
            for p in self.params:
                owners = [self.view.owner(n) for n in self.view.fqns_of[p]]
                lca_unit = _innermost(_lca([*owners, *self.users[p]]), self.units)
                # units strictly inside lca_unit that enclose one of the names:
                # walk each owner up to lca_unit (O(depth), not O(units))
                found: set[str] = set()
                for o in owners:
                    for a in _ancestors(o):
                        if a == lca_unit:
                            break
                        if a in self.units:
                            found.add(a)
                drops = [u for u in self.units if u in found] if found else []
                if drops:
                    for u in drops:
                        del self.units[u]
                        logger.debug("dropping unit %r: parameter %r used outside it", u, p)
                    prev = events.get(p, ("", []))[1]
                    events[p] = (lca_unit, [*prev, *drops])
                    changed = True
        return events

    def _make_units(self) -> list[WrapUnit]:
        by_unit: dict[str, list[str]] = {u: [] for u in self.units}
        for p in self.params:
            by_unit[self.holder[p]].append(p)
        n_params = len(self.view.fqns_of)
        def_pos = {p: i for i, p in enumerate(self.view.fqns_of)}
        units: list[WrapUnit] = []
        for u, params in by_unit.items():
            params.sort(key=lambda p: self.param_pos.get(p, n_params + def_pos[p]))
            self.trainable_dtypes[u] = frozenset(
                self.view.dtype[p] for p in params if self.view.requires_grad[p]
            )
            first_use, last_use = self.spans.span((u,), params)
            units.append(
                WrapUnit(
                    module_fqns=(u,),
                    param_fqns=tuple(params),
                    numel=sum(self.view.numel[p] for p in params),
                    bytes=sum(self.view.bytes[p] for p in params),
                    first_use=first_use,
                    last_use=last_use,
                )
            )
        units.sort(
            key=lambda w: (
                w.first_use is None,
                w.first_use if w.first_use is not None else 0,
                self.view.def_index[w.module_fqns[0]],
            )
        )
        return units

    # -------------------------------------------------------------- notes
    def _direct_params_of(self, fqn: str) -> list[str]:
        """Canonical params that module ``fqn`` holds directly (one of their
        names is ``fqn.<name>``), not through a submodule."""
        return [
            p for p in self.params if any(self.view.owner(n) == fqn for n in self.view.fqns_of[p])
        ]

    def _never_called(self) -> str:
        """How a module that the order never calls is described: a symbolic
        trace sees every path of ``forward``, a runtime capture only one."""
        if self.order.method == "runtime":
            return (
                "is never called with the example inputs (runtime capture sees one forward: "
                "another input may take another branch; execwrap.OrderMonitor warns if it does)"
            )
        return "is never called in forward"

    def _note_dropped(self, dropped: list[tuple[str, str]]) -> None:
        dropped_fqns = [f for f, _ in dropped]
        for fqn, kind in dropped:
            if any(o != fqn and _is_within(fqn, o) for o, k in dropped if k == "uncalled"):
                continue  # covered by the enclosing uncalled module's note
            cls = self.view.classes.get(fqn, "?")
            target = _innermost(fqn, self.units)
            if kind in ("container", "forwardless"):
                params = self._direct_params_of(fqn)
                holders = list(dict.fromkeys(self.holder[p] for p in params))
                where = (
                    f", and its own parameters ({_count(params, self.view.numel)}) go to unit"
                    f"{'s' if len(holders) > 1 else ''} {_names(holders)}"
                    if params
                    else ""
                )
                children = sorted(
                    (u for u in self.units if u != fqn and _is_within(u, fqn)),
                    key=lambda u: self.first_call.get(u, math.inf),
                )
                why = (
                    "does not implement forward"
                    if kind == "forwardless"
                    else "never runs its own forward (only modules inside it are called)"
                )
                self.notes.append(
                    f"Module {_name(fqn)} ({cls}) {why}, so it cannot be an FSDP unit: its "
                    "hooks would never fire. "
                    f"Not wrapped; the units inside it stay ({_names(children) or 'none'})"
                    f"{where}."
                )
                continue
            nested = [o for o in dropped_fqns if o != fqn and _is_within(o, fqn)]
            moved = [p for p in self.params if _is_within(owner_fqn(p), fqn)]
            users = sorted(
                {m for p in moved for m in self.users[p] if not _is_within(m, fqn)},
                key=lambda m: self.first_call.get(m, math.inf),
            )
            runtime_dead = not users and self.order.method == "runtime"
            if users:
                why = f"never runs its own forward (its parameters are used by {_names(users)})"
            elif runtime_dead:
                why = f"{self._never_called()} and its parameters are never used"
            else:
                why = "is never called in forward and its parameters are never used (dead code)"
            if runtime_dead:
                # another input may call it: say what the plan does, not that it cannot work
                verdict = "so the plan does not make it an FSDP unit"
                extra = f" (nor the units inside it: {_names(nested)})" if nested else ""
                tail = f"{extra}."
            else:
                verdict = "so it cannot be an FSDP unit"
                extra = f" (nor can the units inside it: {_names(nested)})" if nested else ""
                tail = f"{extra}: its hooks would never fire."
            self.notes.append(
                f"Module {_name(fqn)} ({cls}) {why}, {verdict}{tail} Its parameters "
                f"({_count(moved, self.view.numel)}) stay in unit {_name(target)}."
            )

    def _note_dead_modules(self, has_calls: bool) -> None:
        """Modules with parameters that are neither called nor used, and were
        not policy units (those are noted as dropped)."""
        if not has_calls:
            return
        noted: list[str] = []
        for fqn in self.view.modules:
            if fqn == "" or any(_is_within(fqn, n) for n in noted):
                continue
            if any(_is_within(fqn, i) for i in self.ignored_top):
                continue
            if fqn in self.called_at_or_below:
                continue
            params = [p for p in self.params if _is_within(owner_fqn(p), fqn)]
            if not params or any(self.users[p] for p in params):
                continue
            if any(_is_within(u, fqn) for u in self.policy_fqns if u not in self.units):
                continue
            noted.append(fqn)
            dead = "" if self.order.method == "runtime" else " (dead code)"
            self.notes.append(
                f"Module {_name(fqn)} ({self.view.classes.get(fqn, '?')}) {self._never_called()} "
                f"and its parameters ({_count(params, self.view.numel)}) are never used{dead}; "
                f"they stay in unit {_name(_innermost(fqn, self.units))}."
            )

    def _note_relocations(self, events: dict[str, tuple[str, list[str]]]) -> None:
        for p in self.params:
            names = self.view.fqns_of[p]
            users = list(self.users[p])
            holder = self.holder[p]
            tied = len(names) > 1
            subject = (
                f"Tied parameter {p!r} (also {_names(names[1:])})" if tied else f"Parameter {p!r}"
            )
            used = f"is used by {_modules(users)}" if users else "is not used in forward"
            owners = {self.view.owner(n) for n in names}
            if users and owners <= set(users):
                encloses = {1: "it", 2: "both"}.get(len(users), "all of them")
            else:
                encloses = "every name and use of it" if tied else "every use of it"
            if p not in events:
                if tied:
                    self.notes.append(
                        f"{subject} {used}; it stays in unit {_name(holder)}, which encloses "
                        f"{encloses}."
                    )
                continue
            dropped = events[p][1]
            verb = "is" if len(dropped) == 1 else "are"
            others = [
                q
                for q in self.params
                if q != p
                and self.holder[q] == holder
                and any(_is_within(owner_fqn(q), d) for d in dropped)
            ]
            rest = (
                f"; {'its' if len(dropped) == 1 else 'their'} other parameters "
                f"({_count(others, self.view.numel)}) go to {_name(holder)} too"
                if others
                else ""
            )
            policy_units = f"the policy's unit{'s' if len(dropped) > 1 else ''} {_and(dropped)}"
            if tied:
                self.notes.append(
                    f"{subject} {used}; FSDP must never split a tied tensor and needs it "
                    f"unsharded at every use, so it goes to unit {_name(holder)}, which encloses "
                    f"{encloses}: {policy_units} {verb} not wrapped because of the tie{rest}."
                )
            else:
                outside = [m for m in users if not any(_is_within(m, d) for d in dropped)]
                self.notes.append(
                    f"{subject} {used}; {_and(outside)} run{'s' if len(outside) == 1 else ''} "
                    f"outside unit{'s' if len(dropped) > 1 else ''} {_and(dropped)}, where FSDP "
                    f"has resharded it, so it goes to unit {_name(holder)}, which encloses "
                    f"{encloses}: {policy_units} {verb} not wrapped{rest}."
                )

    def _note_mixed_requires_grad(self, units: list[WrapUnit]) -> None:
        for unit in units:
            frozen = [p for p in unit.param_fqns if not self.view.requires_grad[p]]
            trainable = [p for p in unit.param_fqns if self.view.requires_grad[p]]
            if frozen and trainable:
                self.notes.append(
                    f"Unit {_names(unit.module_fqns)} mixes requires_grad=True "
                    f"({_plural(len(trainable))}) and requires_grad=False "
                    f"({_plural(len(frozen))}: {', '.join(repr(p) for p in frozen[:5])}"
                    f"{', ...' if len(frozen) > 5 else ''}): FSDP1 needs use_orig_params=True for "
                    "it (FSDP2 accepts it); wrap the frozen parameters' modules separately to "
                    "avoid it."
                )

    def _note_ignored(self) -> None:
        if not self.ignored_top:
            return
        params = sorted(self.view.ignored_params)
        self.notes.append(
            f"Ignored modules {_names(self.ignored_top)}: their parameters "
            f"({_count(params, self.view.numel)}) are in no unit; FSDP leaves them unsharded "
            "on every rank."
        )
