"""One walk over a model's module tree, shared by everything a capture prepares.

Symbolic capture needs the module tree several times before the trace
starts: the precondition checks (lazy modules, FSDP/DDP wrappers), the
recorder's name tables and the snapshot of every module's attributes. Each
used to walk ``named_modules()`` on its own, a recursive generator whose every
name passes up through one generator frame per level. :func:`walk_modules`
walks once, with a loop, and hands every user the list it needs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.nn as nn

__all__ = ["ModuleWalk", "walk_modules"]

_NAMED_MODULES = nn.Module.named_modules


class ModuleWalk(NamedTuple):
    """A model's module tree, walked once.

    Attributes:
        named: ``(FQN, module)`` for every name of every module, exactly as
            ``model.named_modules(remove_duplicate=False)`` yields them (a
            module reachable under two names appears twice, its subtree too).
        modules: every module once, in the order of ``model.modules()``.
        first_names: each module's first FQN in ``named`` (the name
            ``named_modules()`` gives it), aligned with ``modules``.
    """

    named: list[tuple[str, nn.Module]]
    modules: list[nn.Module]
    first_names: list[str]


def walk_modules(model: nn.Module) -> ModuleWalk:
    """Walk ``model``'s module tree once.

    The walk is a pre-order loop over ``_modules``, the same order as
    ``nn.Module.named_modules(remove_duplicate=False)``; when a class in the
    tree overrides ``named_modules``, the model's own
    ``named_modules(remove_duplicate=False)`` is used instead. ``modules``
    keeps each module at its first name, which is the order of
    ``model.modules()``: a pre-order walk that skips a module seen before (and
    its subtree, whose modules were reached under that module's first name
    already) visits every module first where the full walk does.

    Args:
        model: the root module.

    Returns:
        The :class:`ModuleWalk`.

    Example:
        >>> lin = nn.Linear(2, 2)
        >>> walk = walk_modules(nn.Sequential(lin, lin))
        >>> [fqn for fqn, _ in walk.named], len(walk.modules), walk.first_names
        (['', '0', '1'], 2, ['', '0'])
    """
    named, modules, first_names, classes = _preorder(model)
    if any(cls.named_modules is not _NAMED_MODULES for cls in classes):
        return _from_named(list(model.named_modules(remove_duplicate=False)))
    return ModuleWalk(named, modules, first_names)


def _preorder(
    model: nn.Module,
) -> tuple[list[tuple[str, nn.Module]], list[nn.Module], list[str], set[type[nn.Module]]]:
    """The walk in the order of ``named_modules(remove_duplicate=False)``, with the
    classes met (to check that none overrides ``named_modules``)."""
    named: list[tuple[str, nn.Module]] = []
    modules: list[nn.Module] = []
    first_names: list[str] = []
    seen: set[int] = set()
    classes: set[type[nn.Module]] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        entry = stack.pop()
        named.append(entry)
        prefix, module = entry
        if id(module) not in seen:
            seen.add(id(module))
            modules.append(module)
            first_names.append(prefix)
            classes.add(type(module))
        children = module._modules
        if children:
            dot = prefix + "." if prefix else ""
            below = [(dot + name, child) for name, child in children.items() if child is not None]
            below.reverse()
            stack += below
    return named, modules, first_names, classes


def _from_named(named: list[tuple[str, nn.Module]]) -> ModuleWalk:
    """The walk from ``named_modules(remove_duplicate=False)``'s own list."""
    modules: list[nn.Module] = []
    first_names: list[str] = []
    seen: set[int] = set()
    for prefix, module in named:
        if id(module) not in seen:
            seen.add(id(module))
            modules.append(module)
            first_names.append(prefix)
    return ModuleWalk(named, modules, first_names)
