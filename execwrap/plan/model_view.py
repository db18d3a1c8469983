"""The planner's snapshots of its two inputs, keyed by canonical FQN.

* :class:`ModelView`: what the planner needs from the model (modules,
  parameters with their aliases, sizes, dtypes, ``requires_grad``, ignored
  parameters), taken once so that planning and the plan's check never walk
  the model again;
* :class:`OrderView`: what the order says about that model, in the same
  canonical names (calls per module, which modules use each parameter, the
  forward position of each parameter);
* :func:`check_order_fits`: the order must describe this model (a stale or
  foreign order is rejected with the names that differ).

A canonical FQN is the first name ``named_parameters()`` / ``named_modules()``
gives a tensor or module; a tied parameter's other names, and the paths
through a shared module, are its aliases. A module registered under two
parents (``conv1.embed`` and ``conv2.embed`` the same ``nn.Module``) has two
paths; :meth:`ModelView.chain` maps each path to the canonical modules along
it, which is what FSDP's traversal of that path sees.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch.nn as nn

from execwrap.plan.spans import UseSpans
from execwrap.util.text import listed, plural
from tracing.fqn import ancestors, is_within, owner_fqn, quoted
from tracing.order import ExecutionOrder, param_info, shared_param_map

__all__ = ["ModelView", "OrderView", "check_order_fits"]

_RECAPTURE = "capture the order from this model (tracing.capture_execution_order(model, ...))"


@dataclass
class ModelView:
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
    #: the ignored modules (canonical FQNs, outermost only)
    ignored_modules: tuple[str, ...] = ()
    #: canonical parameters outside the ignored modules, in definition order
    params: list[str] = field(default_factory=list)
    #: canonical module -> every path to it (``named_modules(remove_duplicate=False)``), canonical first
    paths_of: dict[str, list[str]] = field(default_factory=dict)
    #: canonical module -> one path per parent it is registered under, for the
    #: modules registered as the child of more than one (parent, attribute)
    registrations: dict[str, list[str]] = field(default_factory=dict)
    _chains: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def chain(self, path: str) -> tuple[str, ...]:
        """The canonical modules along module path ``path``, root first, ``path``'s own last.

        For a path through a shared module (``conv2.embed``) these are the
        modules FSDP's traversal of that path passes (``"", "conv2",
        "conv1.embed"``).
        """
        found = self._chains.get(path)
        if found is None:
            found = tuple(self.module_alias[a] for a in reversed(list(ancestors(path))))
            self._chains[path] = found
        return found

    def owner(self, param_name: str) -> str:
        """Canonical FQN of the module owning parameter name ``param_name``
        (a name through a shared module maps to the module's first name)."""
        return self.module_alias[owner_fqn(param_name)]

    @classmethod
    def build(cls, model: nn.Module, ignored_module_fqns: Iterable[str]) -> ModelView:
        """Snapshot ``model``; ``ignored_module_fqns`` are canonical FQNs."""
        modules = dict(model.named_modules())
        canonical_module = {id(m): fqn for fqn, m in modules.items()}
        id_to_canonical, shared = shared_param_map(model)
        ignored = tuple(ignored_module_fqns)
        ignored_params = {
            id_to_canonical[id(p)]
            for fqn, m in modules.items()
            if any(is_within(fqn, i) for i in ignored)
            for p in m.parameters(recurse=False)
        }
        view = cls(
            modules=modules,
            module_alias={
                fqn: canonical_module[id(m)]
                for fqn, m in model.named_modules(remove_duplicate=False)
            },
            classes={f: type(m).__name__ for f, m in modules.items()},
            def_index={f: i for i, f in enumerate(modules)},
            fqns_of={},
            alias_to_canonical={},
            numel={},
            bytes={},
            dtype={},
            shape={},
            requires_grad={},
            ignored_params=ignored_params,
            ignored_modules=ignored,
        )
        for fqn, p in model.named_parameters():
            view._add_param(fqn, p, shared.get(fqn, []))
        view.params = [p for p in view.fqns_of if p not in ignored_params]
        view._add_paths()
        return view

    def _add_paths(self) -> None:
        """:attr:`paths_of` and :attr:`registrations` from :attr:`module_alias`."""
        parents: dict[str, dict[tuple[str, str], str]] = {}
        for path, canonical in self.module_alias.items():
            self.paths_of.setdefault(canonical, []).append(path)
            if path:
                parent, _, name = path.rpartition(".")
                parents.setdefault(canonical, {}).setdefault(
                    (self.module_alias[parent], name), path
                )
        for canonical, by_parent in parents.items():
            if len(by_parent) > 1:
                self.registrations[canonical] = list(by_parent.values())

    def _add_param(self, fqn: str, param: nn.Parameter, aliases: list[str]) -> None:
        self.fqns_of[fqn] = [fqn, *aliases]
        for name in self.fqns_of[fqn]:
            self.alias_to_canonical[name] = fqn
        info = param_info(param)
        self.numel[fqn] = info.numel
        self.bytes[fqn] = info.bytes
        self.dtype[fqn] = info.dtype
        self.shape[fqn] = info.shape
        self.requires_grad[fqn] = info.requires_grad


@dataclass
class OrderView:
    """What the planner reads from an order, in the model's canonical names.

    Attributes:
        order: the order itself.
        calls: module FQN -> number of forward calls.
        called_at_or_below: modules called themselves or with a call nested
            inside them.
        first_call: module FQN -> index of its first call.
        spans: the order's :class:`~execwrap.plan.spans.UseSpans`.
        users: canonical parameter -> the modules using it (``param_uses``),
            in first-seen order (a dict used as an ordered set).
        param_pos: canonical parameter -> its position in forward use order
            (``param_forward_order``, then ``param_uses``).
    """

    order: ExecutionOrder
    calls: Counter[str]
    called_at_or_below: set[str]
    first_call: dict[str, int]
    spans: UseSpans
    users: dict[str, dict[str, None]]
    param_pos: dict[str, int]

    @classmethod
    def build(cls, view: ModelView, order: ExecutionOrder) -> OrderView:
        """Read ``order`` (checked with :func:`check_order_fits`) against ``view``."""
        calls = Counter(order.module_forward_order)
        canonical = view.alias_to_canonical
        users: dict[str, dict[str, None]] = {p: {} for p in view.fqns_of}
        for use in order.param_uses:
            for p in use.param_fqns:
                users[canonical[p]].setdefault(use.module_fqn, None)
        param_pos: dict[str, int] = {}
        for p in order.param_forward_order:
            if p in canonical:
                param_pos.setdefault(canonical[p], len(param_pos))
        for use in order.param_uses:
            for p in use.param_fqns:
                param_pos.setdefault(canonical[p], len(param_pos))
        return cls(
            order=order,
            calls=calls,
            called_at_or_below={a for c in calls for a in ancestors(c)},
            first_call=order.first_call_index(),
            spans=UseSpans(order),
            users=users,
            param_pos=param_pos,
        )


def check_order_fits(view: ModelView, order: ExecutionOrder, model_name: str) -> None:
    """Check that ``order`` was captured from the model ``view`` snapshots.

    Args:
        view: the model's snapshot.
        order: the order to plan from.
        model_name: the model's class name, for messages.

    Raises:
        ValueError: the order calls a module, or uses a parameter, that the
            model does not have; or its ``params`` table (when not empty)
            lists other parameters, or other numels/shapes, than the model.
    """
    _check_order_params(view, order, model_name)
    for fqn in order.module_forward_order:
        if fqn not in view.modules:
            raise ValueError(
                f"plan_wrap: the order calls module {quoted(fqn)}, which {model_name} does not "
                f"have; {_RECAPTURE}"
            )
    for use in order.param_uses:
        if use.module_fqn not in view.modules:
            raise ValueError(
                f"plan_wrap: the order uses parameters in module {quoted(use.module_fqn)}, which "
                f"{model_name} does not have; {_RECAPTURE}"
            )
        for p in use.param_fqns:
            if p not in view.alias_to_canonical:
                raise ValueError(
                    f"plan_wrap: the order uses parameter {p!r} (in module "
                    f"{quoted(use.module_fqn)}), which {model_name} does not have; {_RECAPTURE}"
                )


def _check_order_params(view: ModelView, order: ExecutionOrder, model_name: str) -> None:
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
    parts = []
    if only_model:
        parts.append(f"in the model but not in the order: {listed(only_model, 3)}")
    if only_order:
        parts.append(f"in the order but not in the model: {listed(only_order, 3)}")
    if mismatched:
        parts.append(f"of another size: {listed(mismatched, 3)}")
    raise ValueError(
        f"plan_wrap: the order's parameters do not match those of {model_name}: "
        f"{plural(n)} differ{'s' if n == 1 else ''} ({'; '.join(parts)}); the order was "
        "captured from a different model (or before the model changed): capture it again, "
        "e.g. tracing.capture_execution_order(model, ...)"
    )
