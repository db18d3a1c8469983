"""Evaluate an FSDP auto-wrap policy exactly as FSDP1 does, without wrapping.

FSDP1 (``FullyShardedDataParallel(model, auto_wrap_policy=...)``) decides its
units in ``torch/distributed/fsdp/_wrap_utils.py::_auto_wrap``:

* a ``_Policy`` instance (``ModuleWrapPolicy``, ``CustomPolicy``) is asked once,
  ``policy._run_policy(root, ignored_modules, root_kwargs)``, and the keys of the
  returned ``{module: kwargs}`` are the units;
* a callable goes through ``torch/distributed/fsdp/wrap.py::_recursive_wrap``:
  ``policy(module=m, recurse=True, nonwrapped_numel=n)`` decides whether to
  descend into ``m``'s children, then ``policy(module=m, recurse=False,
  nonwrapped_numel=remainder)`` whether to wrap ``m`` itself, where
  ``remainder`` is ``m``'s numel minus what its children wrapped. The root is
  visited with ``only_wrap_children=True`` (FSDP wraps the root itself).

:func:`policy_unit_modules` replays both paths without wrapping anything.

Nothing here imports ``torch.distributed.fsdp``: an object can only be a
``_Policy`` once ``torch.distributed.fsdp.wrap`` has been imported (by whoever
built it), so :func:`is_fsdp_policy` looks the class up in ``sys.modules``;
and the default policy, :func:`always_wrap_policy`, is our own copy of
torch's.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch.nn as nn

__all__ = [
    "always_wrap_policy",
    "expand_ignored_modules",
    "is_fsdp_policy",
    "policy_name",
    "policy_unit_modules",
]

logger = logging.getLogger(__name__)

_NEW_NUMEL_ARG = "nonwrapped_numel"
_OLD_NUMEL_ARG = "unwrapped_params"  # torch 1.12 / 1.13, the original API
_FSDP_WRAP_MODULE = "torch.distributed.fsdp.wrap"


def always_wrap_policy(*args: Any, **kwargs: Any) -> bool:
    """Wrap every module: the default ``init_policy`` of the planner.

    Behaves exactly like ``torch.distributed.fsdp.wrap.always_wrap_policy``
    (it returns ``True`` for every call) and has the same name in reports
    (:func:`policy_name` gives ``"always_wrap_policy"``), but planning with it
    does not import ``torch.distributed.fsdp``.
    """
    return True


def is_fsdp_policy(policy: Any) -> bool:
    """Whether ``policy`` is a torch ``_Policy`` (``ModuleWrapPolicy``,
    ``CustomPolicy``, ``ParamExecOrderWrapPolicy``, ...).

    Never imports FSDP: an object can only be an instance of
    ``torch.distributed.fsdp.wrap._Policy`` if that module was imported.
    """
    wrap = sys.modules.get(_FSDP_WRAP_MODULE)
    return wrap is not None and isinstance(policy, wrap._Policy)


def expand_ignored_modules(
    model: nn.Module, ignored_modules: Iterable[nn.Module | str] | None
) -> set[nn.Module]:
    """Every module in the subtrees of ``ignored_modules``, as FSDP1's
    ``_get_ignored_modules`` expands them.

    Args:
        model: the root module.
        ignored_modules: an iterable of submodules of ``model``, given as
            ``nn.Module`` objects or module FQN strings (``"blocks.1"``,
            resolved with ``model.get_submodule``), or ``None``.

    Raises:
        TypeError: ``ignored_modules`` is a single module or a single string
            rather than an iterable of them, or an entry is neither an
            ``nn.Module`` nor a ``str``.
        ValueError: an entry is not part of ``model`` (an FQN names no
            submodule: the message lists the closest existing names), or is
            ``model`` itself.
    """
    if ignored_modules is None:
        return set()
    if isinstance(ignored_modules, (nn.Module, str)):
        what = (
            f"a single str {ignored_modules!r}"
            if isinstance(ignored_modules, str)
            else f"a single {type(ignored_modules).__name__}"
        )
        raise TypeError(
            "ignored_modules must be an iterable of nn.Module or module FQN str "
            f"(e.g. [model.lm_head] or ['lm_head']), got {what}; wrap it in a list"
        )
    in_model = {id(m) for m in model.modules()}
    out: set[nn.Module] = set()
    for entry in ignored_modules:
        if isinstance(entry, str):
            m = _resolve_fqn(model, entry)
        elif isinstance(entry, nn.Module):
            m = entry
        else:
            raise TypeError(
                "ignored_modules must hold nn.Module objects or module FQN strings, got "
                f"{type(entry).__name__}: {entry!r}"
            )
        if m is model:
            raise ValueError(
                "ignored_modules must not contain the root module itself; "
                "ignore submodules instead (FSDP raises the same way)"
            )
        if id(m) not in in_model:
            raise ValueError(
                f"ignored_modules holds a {type(m).__name__} that is not a submodule of "
                f"the model ({type(model).__name__}); pass modules of this model"
            )
        out.update(m.modules())
    return out


def _resolve_fqn(model: nn.Module, fqn: str) -> nn.Module:
    """``model.get_submodule(fqn)``, with a ValueError naming close FQNs."""
    try:
        return model.get_submodule(fqn)
    except AttributeError as e:
        names = [name for name, _ in model.named_modules() if name]
        close = difflib.get_close_matches(fqn, names, n=3, cutoff=0.6)
        hint = (
            f"closest existing names: {', '.join(repr(c) for c in close)}"
            if close
            else f"its top-level modules are: {', '.join(repr(n) for n, _ in model.named_children())}"
        )
        raise ValueError(
            f"ignored_modules names module {fqn!r}, which the model ({type(model).__name__}) "
            f"does not have; {hint}"
        ) from e


def _numel_arg_name(policy: Callable[..., Any]) -> str:
    """Which keyword carries the non-wrapped numel for this policy callable."""
    try:
        params = inspect.signature(policy).parameters
    except (TypeError, ValueError):  # builtins, some C callables
        return _NEW_NUMEL_ARG
    if _NEW_NUMEL_ARG in params:
        return _NEW_NUMEL_ARG
    if _OLD_NUMEL_ARG in params:
        return _OLD_NUMEL_ARG
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return _NEW_NUMEL_ARG
    raise TypeError(
        f"init_policy {policy_name(policy)} takes ({', '.join(params)}); an auto-wrap "
        "policy callable must accept the keywords (module, recurse, nonwrapped_numel) "
        "(or unwrapped_params, as in torch 1.12), or be a ModuleWrapPolicy / CustomPolicy"
    )


def policy_unit_modules(
    model: nn.Module,
    policy: Any,
    ignored_modules: set[nn.Module],
) -> list[nn.Module]:
    """The modules FSDP1 would wrap for ``policy``, in definition order.

    Args:
        model: the root module (not wrapped yet).
        policy: ``None`` (no auto wrapping), a ``_Policy`` instance, or a policy
            callable with the signature ``(module, recurse, nonwrapped_numel)``
            or ``(module, recurse, unwrapped_params)``; numel counts elements.
        ignored_modules: the expanded ignored set (:func:`expand_ignored_modules`).

    Returns:
        ``[model, *wrapped]``: the root always comes first (FSDP wraps it
        itself); each shared module appears at most once.

    Raises:
        TypeError: ``policy`` is neither a ``_Policy`` nor a callable.
    """
    if policy is None:
        return [model]
    if is_fsdp_policy(policy):
        return _run_policy_units(model, policy, ignored_modules)
    if not callable(policy):
        raise TypeError(
            f"init_policy must be a policy callable (e.g. always_wrap_policy, "
            f"functools.partial(size_based_auto_wrap_policy, min_num_params=...)) or a "
            f"ModuleWrapPolicy / CustomPolicy instance, got {type(policy).__name__}"
        )
    chosen = _RecursiveWrap(model, policy, ignored_modules).run()
    position = {id(m): i for i, m in enumerate(model.modules())}
    return sorted(chosen, key=lambda m: position[id(m)])


def _run_policy_units(
    model: nn.Module, policy: Any, ignored_modules: set[nn.Module]
) -> list[nn.Module]:
    """The targets of a ``_Policy``'s ``_run_policy``, root first."""
    chosen: list[nn.Module] = [model]
    seen: set[int] = {id(model)}
    target = policy._run_policy(model, ignored_modules, {})
    # FSDP applies the targets in post-order (_post_order_apply); report
    # them in definition (named_modules) order for determinism.
    for m in model.modules():
        if m in target and id(m) not in seen:
            seen.add(id(m))
            chosen.append(m)
    return chosen


class _RecursiveWrap:
    """Replays ``torch.distributed.fsdp.wrap._recursive_wrap`` for a policy
    callable, recording the modules it would wrap instead of wrapping them."""

    def __init__(
        self, model: nn.Module, policy: Callable[..., Any], ignored_modules: set[nn.Module]
    ) -> None:
        self.model = model
        self.policy = policy
        self.numel_arg = _numel_arg_name(policy)
        self.ignored_modules = ignored_modules
        self.ignored_param_ids = {
            id(p) for m in ignored_modules for p in m.parameters(recurse=False)
        }
        self.wrapped_numel_of: dict[int, int] = {}
        # Parameters inside a module already wrapped. FSDP1 shards them at once,
        # so when a tied weight is met again under a later module, torch counts
        # only its local shard (which depends on world size and rank); it is
        # counted as 0 here, which agrees whenever that shard is below the
        # policy's threshold.
        self.wrapped_param_ids: set[int] = set()
        self.chosen: list[nn.Module] = [model]
        self.seen: set[int] = {id(model)}

    def run(self) -> list[nn.Module]:
        """The root, then every module wrapped, in visiting order."""
        self._visit(self.model, True)
        return self.chosen

    def _ask(self, module: nn.Module, recurse: bool, numel: int) -> bool:
        return bool(self.policy(module=module, recurse=recurse, **{self.numel_arg: numel}))

    def _visit(self, module: nn.Module, only_wrap_children: bool) -> int:
        # Mirrors torch.distributed.fsdp.wrap._recursive_wrap line by line.
        nonwrapped_numel = sum(
            p.numel()
            for p in module.parameters()
            if id(p) not in self.ignored_param_ids and id(p) not in self.wrapped_param_ids
        )
        if not self._ask(module, True, nonwrapped_numel):
            return 0
        total_wrapped_numel = 0
        for _, child in module.named_children():
            if child in self.ignored_modules:
                continue
            if id(child) in self.wrapped_numel_of:
                # A shared module is visited once (as _post_order_apply and
                # named_modules do); later parents count what it wrapped.
                total_wrapped_numel += self.wrapped_numel_of[id(child)]
                continue
            self.wrapped_numel_of[id(child)] = 0
            n = self._visit(child, False)
            self.wrapped_numel_of[id(child)] = n
            total_wrapped_numel += n
        remainder = nonwrapped_numel - total_wrapped_numel
        if not only_wrap_children and self._ask(module, False, remainder):
            if id(module) not in self.seen:
                self.seen.add(id(module))
                self.chosen.append(module)
            self.wrapped_param_ids.update(id(p) for p in module.parameters())
            return nonwrapped_numel
        return total_wrapped_numel


def policy_name(policy: Any) -> str:
    """A deterministic, readable name for a policy (used in reports).

    >>> from torch.distributed.fsdp.wrap import always_wrap_policy
    >>> policy_name(always_wrap_policy)
    'always_wrap_policy'
    """
    if policy is None:
        return "None"
    if isinstance(policy, functools.partial):
        args = [repr(a) for a in policy.args]
        args += [f"{k}={_short(v)}" for k, v in sorted(policy.keywords.items())]
        return f"{policy_name(policy.func)}({', '.join(args)})"
    if is_fsdp_policy(policy):
        classes = getattr(policy, "_module_classes", None)
        if isinstance(classes, (set, frozenset)):
            names = sorted(c.__name__ for c in classes)
            return f"{type(policy).__name__}({{{', '.join(names)}}})"
        return type(policy).__name__
    name = getattr(policy, "__qualname__", None) or getattr(policy, "__name__", None)
    return str(name) if name else type(policy).__name__


def _short(value: Any) -> str:
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(getattr(v, "__name__", repr(v)) for v in value)) + "}"
    if isinstance(value, type):
        return value.__name__
    return getattr(value, "__name__", None) or repr(value)
