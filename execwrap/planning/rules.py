"""FSDP plan rules: module paths (``*`` for a layer number) or groups of them, each with a style.

The rule format is transformers 5's ``fsdp_plan`` (``base_model_fsdp_plan`` on a
config, ``_fsdp_plan`` on a model, ``DistributedConfig(fsdp_plan=...)``), read
without transformers:

* a key is a module FQN, where ``*`` stands for a layer number (a component of
  digits between dots: ``"model.layers.*"`` is every ``model.layers.<n>``), or a
  tuple of module FQNs: the modules of one ``fully_shard`` call (one group);
* a value is a style: ``"free_full_weight"`` (reshard after forward: the
  all-gathered weights are freed and gathered again for backward) or
  ``"keep_full_weight"`` (keep them unsharded from forward until backward).

A single key matches a module when the key equals the module's FQN, or equals its
:func:`layer_pattern` (every layer number replaced by ``*``, exactly as
transformers' ``replace_layer_number_by_wildcard`` writes it); each matched module
is one group. The root is never named: it is always a group of its own.

:func:`expand_rules` turns rules into the groups they name in one model (checked:
the first rule that names no module is named in the error); :func:`group_rules`
writes groups back as rules, one wildcard rule wherever every module of a pattern
is its own group with one style.

Source: ``transformers/distributed/parallel_utils.py`` (``replace_layer_number_by_wildcard``,
``_get_parameter_plan``) and ``transformers/configuration_utils.py``
(``base_model_fsdp_plan``), transformers 5.25.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from execwrap.util.text import fqn_and_list
from tracing.fqn import is_within, quoted

__all__ = [
    "FREE_FULL_WEIGHT",
    "KEEP_FULL_WEIGHT",
    "STYLES",
    "RuleGroup",
    "Rules",
    "expand_rules",
    "group_rules",
    "layer_pattern",
    "style_of",
]

#: Reshard after forward (FSDP2 ``reshard_after_forward=True``).
FREE_FULL_WEIGHT = "free_full_weight"
#: Keep the unsharded weights until backward (``reshard_after_forward=False``).
KEEP_FULL_WEIGHT = "keep_full_weight"
#: Style -> ``reshard_after_forward``.
STYLES: dict[str, bool] = {FREE_FULL_WEIGHT: True, KEEP_FULL_WEIGHT: False}

#: A rule set: module FQN (``*`` for layer numbers) or tuple of module FQNs -> style.
Rules = Mapping[str | tuple[str, ...], str]

_LAYER_NUMBER = re.compile(r"\.\d+(\.|$)")


def layer_pattern(fqn: str) -> str:
    """``fqn`` with each layer number (digits between dots, or after the last dot) as ``*``.

    The same substitution as transformers' ``replace_layer_number_by_wildcard``
    (non-overlapping, so in ``"a.0.1"`` only the first number is replaced).

    Example:
        >>> layer_pattern("model.layers.3.mlp.experts.12")
        'model.layers.*.mlp.experts.*'
    """
    return _LAYER_NUMBER.sub(lambda m: ".*" + m.group(1), fqn)


def style_of(reshard_after_forward: bool) -> str:
    """The style of a group that does (``"free_full_weight"``) or does not reshard after forward."""
    return FREE_FULL_WEIGHT if reshard_after_forward else KEEP_FULL_WEIGHT


@dataclass(frozen=True)
class RuleGroup:
    """One group a rule names in a model: one ``fully_shard`` call.

    Attributes:
        modules: module FQNs of the group (a tuple rule's in its order).
        reshard_after_forward: the rule's style as FSDP2's flag.
        rule: the key that named the group.
    """

    modules: tuple[str, ...]
    reshard_after_forward: bool
    rule: str | tuple[str, ...]


def expand_rules(
    module_names: Sequence[str], rules: Rules, *, where: str = "rules", model_name: str = "model"
) -> list[RuleGroup]:
    """The groups ``rules`` name among ``module_names``, in the modules' order.

    Args:
        module_names: every module FQN of the model (``named_modules()`` order).
        rules: the rules (see the module docstring).
        where: who reads the rules, for messages (a file name, ``"fsdp_plan"``).
        model_name: the model's class name, for messages.

    Returns:
        One :class:`RuleGroup` per matched module of a single rule and per tuple
        rule, sorted by the position of the group's first module in ``module_names``.

    Raises:
        TypeError: a key is neither a string nor a tuple of strings, or a style
            is not a string.
        ValueError: an unknown style; a rule (the first, in ``rules`` order) names
            no module of the model; a rule names the root; a module is named by
            two rules; a tuple names a module twice or one inside another.
    """
    position = {name: i for i, name in enumerate(module_names)}
    by_pattern: dict[str, list[str]] = {}
    for name in module_names:
        by_pattern.setdefault(layer_pattern(name), []).append(name)
    groups: list[RuleGroup] = []
    owner: dict[str, str | tuple[str, ...]] = {}
    for key, style in rules.items():
        reshard = _style(key, style, where)
        if isinstance(key, tuple):
            members = _tuple_members(key, position, where, model_name)
        else:
            found = [key] if key in position and "*" not in key else by_pattern.get(key, [])
            if not found:
                raise ValueError(_no_match(key, module_names, where, model_name))
            members = found
        for m in members:
            if m == "":
                raise ValueError(
                    f"{where}: rule {key!r} names the root module; the root is always a group "
                    "of its own (leave it out)"
                )
            if m in owner:
                raise ValueError(
                    f"{where}: module {quoted(m)} is named by rule {owner[m]!r} and by rule "
                    f"{key!r}; a module belongs to one group only"
                )
            owner[m] = key
        if isinstance(key, tuple):
            groups.append(RuleGroup(tuple(members), reshard, key))
        else:
            groups.extend(RuleGroup((m,), reshard, key) for m in members)
    groups.sort(key=lambda g: position[g.modules[0]])
    return groups


def group_rules(
    groups: Sequence[tuple[Sequence[str], bool]], module_names: Sequence[str]
) -> dict[str | tuple[str, ...], str]:
    """Rules that name exactly ``groups``: the inverse of :func:`expand_rules`.

    A single-module group is written as a wildcard rule (its :func:`layer_pattern`)
    when every module of the model with that pattern is a single-module group of
    the same style, else under its own FQN; a group of several modules is a tuple
    rule. The root (``""``) is left out.

    Args:
        groups: ``(module FQNs, reshard_after_forward)`` per group.
        module_names: every module FQN of the model (``named_modules()`` order).

    Returns:
        The rules, in the order of each rule's first module in ``module_names``.

    Example:
        >>> group_rules([(["h.0"], True), (["h.1"], True), (["n", "o"], False)],
        ...             ["", "h", "h.0", "h.1", "n", "o"])
        {'h.*': 'free_full_weight', ('n', 'o'): 'keep_full_weight'}
    """
    position = {name: i for i, name in enumerate(module_names)}
    by_pattern: dict[str, list[str]] = {}
    for name in module_names:
        by_pattern.setdefault(layer_pattern(name), []).append(name)
    single = {fqns[0]: reshard for fqns, reshard in groups if len(fqns) == 1 and fqns[0] != ""}
    keyed: list[tuple[int, str | tuple[str, ...], bool]] = []
    written: set[str] = set()
    for fqn, reshard in single.items():
        if fqn in written:
            continue
        pattern = layer_pattern(fqn)
        same = by_pattern.get(pattern, [fqn])
        if "*" in pattern and all(single.get(m) is reshard for m in same):
            keyed.append((position.get(same[0], len(position)), pattern, reshard))
            written.update(same)
        else:
            keyed.append((position.get(fqn, len(position)), fqn, reshard))
            written.add(fqn)
    for fqns, reshard in groups:
        if len(fqns) > 1:
            first = min(position.get(f, len(position)) for f in fqns)
            keyed.append((first, tuple(fqns), reshard))
    keyed.sort(key=lambda k: k[0])
    return {key: style_of(reshard) for _, key, reshard in keyed}


def _style(key: object, style: object, where: str) -> bool:
    if not isinstance(key, (str, tuple)) or (
        isinstance(key, tuple) and not all(isinstance(k, str) for k in key)
    ):
        raise TypeError(
            f"{where}: a rule's key must be a module FQN or a tuple of module FQNs; got "
            f"{type(key).__name__} {key!r}"
        )
    if not isinstance(style, str):
        raise TypeError(f"{where}: rule {key!r}: the style must be a string; got {style!r}")
    if style not in STYLES:
        raise ValueError(
            f"{where}: rule {key!r} has style {style!r}; use one of {', '.join(STYLES)}"
        )
    return STYLES[style]


def _tuple_members(
    key: tuple[str, ...], position: Mapping[str, int], where: str, model_name: str
) -> list[str]:
    if not key:
        raise ValueError(f"{where}: an empty tuple rule; list the modules of the group")
    for m in key:
        if m not in position:
            raise ValueError(
                f"{where}: rule {key!r} names module {quoted(m)}, which {model_name} does not "
                "have (a tuple lists module FQNs, no wildcards); was the plan made for "
                "another model?"
            )
    if len(set(key)) != len(key):
        raise ValueError(f"{where}: rule {key!r} names a module twice")
    for a in key:
        for b in key:
            if a != b and is_within(b, a):
                raise ValueError(
                    f"{where}: rule {key!r} lists {quoted(a)} and {quoted(b)}, which is inside "
                    f"it; one fully_shard group cannot hold both: list {quoted(a)} alone, or "
                    "its parts"
                )
    return list(key)


def _no_match(key: str, module_names: Sequence[str], where: str, model_name: str) -> str:
    head = key.split(".")[0]
    near = [n for n in module_names if n.split(".")[0] == head and n][:5]
    hint = (
        f"modules starting with {head!r}: {fqn_and_list(near)}"
        if near
        else f"its top-level modules: {fqn_and_list([n for n in module_names if n and '.' not in n])}"
    )
    return (
        f"{where}: rule {key!r} names no module of {model_name} ({hint}); was the plan made "
        "for another model?"
    )
