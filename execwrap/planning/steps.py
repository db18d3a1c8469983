"""The planner's steps 2 to 4 on one model: :class:`Planner`.

From the policy's unit candidates to the atomic units in execution order:
drop units that cannot work (registered under two parents, never called, no
``forward``), move each parameter to a unit that encloses all its uses and
names (tied weights, every path through a shared module), and make one
:class:`~execwrap.plan.unit.WrapUnit` per remaining unit, ordered by first use;
the notes say why at every step. :func:`execwrap.planning.planner.plan_wrap` drives it
and describes the whole algorithm.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

import torch.nn as nn

from execwrap.plan.model_view import ModelView, OrderView
from execwrap.plan.notes import (
    bypassed_notes,
    dead_module_notes,
    dropped_notes,
    ignored_notes,
    mixed_requires_grad_notes,
    no_calls_note,
    relocation_notes,
    scalar_param_notes,
)
from execwrap.plan.unit import WrapUnit
from tracing.fqn import ancestors, innermost, owner_fqn

__all__ = ["FSDPTarget", "Planner"]

logger = logging.getLogger(__name__)

#: What the plan is for: its notes speak of that target only (``None``: both).
FSDPTarget = Literal["fsdp1", "fsdp2"]


class Planner:
    """Turns the policy's units into the plan's atomic units (steps 2 to 4).

    The only writer of the decisions: :attr:`units` (the modules still units,
    in policy order), :attr:`holder` (canonical parameter -> its unit),
    :attr:`trainable_dtypes` (unit -> dtypes of its trainable parameters) and
    :attr:`notes`.
    """

    def __init__(
        self,
        view: ModelView,
        uses: OrderView,
        policy_fqns: Sequence[str],
        target: FSDPTarget | None = None,
        stated: Sequence[Sequence[str]] = (),
    ) -> None:
        self.view = view
        self.uses = uses
        self.target = target
        #: stated-group member -> its group (a tie inside one group stays there)
        self.stated = {m: tuple(g) for g in stated for m in g}
        self.policy_fqns = list(policy_fqns)
        self.units: dict[str, None] = dict.fromkeys(policy_fqns)
        self.holder: dict[str, str] = {}
        self.trainable_dtypes: dict[str, frozenset[str]] = {}
        self.notes: list[str] = []

    def build(self) -> list[WrapUnit]:
        """The atomic units in execution order; :attr:`notes` says why."""
        view, uses = self.view, self.uses
        has_calls = bool(uses.order.module_forward_order)
        dropped = self._drop_shared()
        if has_calls:
            dropped += self._drop_uncalled()
        else:
            dropped += self._drop_forwardless()
            self.notes.append(no_calls_note())
        relocations = self._relocate()
        bypassed = self._drop_bypassed() if has_calls else {}
        self.holder = {p: innermost(owner_fqn(p), self.units) for p in view.params}
        self.notes += dropped_notes(view, uses, dropped, self.units, self.holder)
        self.notes += bypassed_notes(view, uses, bypassed, self.holder)
        if has_calls:
            self.notes += dead_module_notes(view, uses, self.units, self.policy_fqns)
        self.notes += relocation_notes(view, uses, relocations, self.holder, self.stated)
        units = self._make_units()
        self.notes += mixed_requires_grad_notes(view, units, self.target)
        self.notes += ignored_notes(view)
        self.notes += scalar_param_notes(view)
        return units

    def _drop_shared(self) -> list[tuple[str, str]]:
        """Step 2: drop units whose module is registered under two parents
        (FSDP1 wraps it under its first name only)."""
        dropped: list[tuple[str, str]] = []
        for fqn in list(self.units):
            if fqn and fqn in self.view.registrations:
                del self.units[fqn]
                dropped.append((fqn, "shared"))
                logger.debug(
                    "dropping unit %r: registered as %s", fqn, self.view.registrations[fqn]
                )
        return dropped

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
        unit enclosing all its names and uses, on every path to them), and
        the units strictly inside it that enclose one of its names (in policy
        order): those must go."""
        view = self.view
        owners = [view.chain(owner_fqn(n)) for n in view.fqns_of[p]]
        if self._in_one_stated_group([c[-1] for c in owners] + list(self.uses.users[p])):
            return "", []  # the group holds every name and use of it
        users = [view.chain(q) for u in self.uses.users[p] for q in view.paths_of.get(u, [u])]
        holder = _deepest_common_unit([*owners, *users], self.units)
        # walk each owner's path up to the holder (O(depth), not O(units))
        found: set[str] = set()
        for chain in owners:
            for a in reversed(chain):
                if a == holder:
                    break
                if a in self.units:
                    found.add(a)
        return holder, [u for u in self.units if u in found]

    def _drop_bypassed(self) -> dict[str, tuple[str, int]]:
        """Step 3b: drop units whose parameters are used by a call that runs
        outside every call of the unit's module (and of the other members of
        its stated group): FSDP gathers a unit's parameters when its module's
        forward starts and frees them when it ends, so such a call (``b0.a``
        called from the root after ``b0`` returned) would see them sharded.
        Needs the order's :attr:`~tracing.ExecutionOrder.module_call_depths`;
        without them nothing is dropped. Returns dropped unit -> (canonical
        parameter, call index) of the first such use."""
        order = self.uses.order
        parents = order.enclosing_calls()
        if not parents:
            return {}
        calls = order.module_forward_order
        canonical = self.view.alias_to_canonical
        chains: dict[int, set[str]] = {}

        def chain(i: int) -> set[str]:  # the modules whose calls are running at call i
            if i not in chains:
                chains[i] = {calls[i]} | (chain(parents[i]) if parents[i] >= 0 else set())
            return chains[i]

        bypassed: dict[str, tuple[str, int]] = {}
        holder = {p: innermost(owner_fqn(p), self.units) for p in self.view.params}
        changed = True
        while changed:
            changed = False
            for use in order.param_uses:
                for q in use.param_fqns:
                    unit = holder.get(canonical.get(q, q), "")
                    if unit == "" or unit not in self.units:
                        continue
                    running = chain(use.call_index)
                    if not any(m in running for m in self.stated.get(unit, (unit,))):
                        del self.units[unit]
                        bypassed[unit] = (canonical.get(q, q), use.call_index)
                        for p, h in holder.items():  # its parameters move up
                            if h == unit:
                                holder[p] = innermost(owner_fqn(p), self.units)
                        logger.debug(
                            "dropping unit %r: used outside its calls by call %d",
                            unit,
                            use.call_index,
                        )
                        changed = True
        return bypassed

    def _in_one_stated_group(self, fqns: Sequence[str]) -> bool:
        """Whether every module of ``fqns`` is inside members of one stated group
        whose members are all still units."""
        groups = set()
        for fqn in fqns:
            member = next((a for a in ancestors(fqn) if a in self.stated), None)
            if member is None:
                return False
            groups.add(self.stated[member])
        return len(groups) == 1 and all(m in self.units for m in next(iter(groups)))

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


def _deepest_common_unit(chains: Sequence[Sequence[str]], units: dict[str, None]) -> str:
    """The innermost unit on every one of ``chains`` (module paths, root
    first); the root when there is no other."""
    common = set(chains[0]).intersection(*chains[1:]) if chains else {""}
    for module in reversed(chains[0] if chains else ()):
        if module in common and module in units:
            return module
    return ""
