"""transformers' ``fsdp_plan`` <-> execwrap's :class:`~execwrap.WrapPlan`.

* :func:`load_fsdp_plan`: a model's own plan (``base_model_fsdp_plan`` + ``_fsdp_plan``
  + ``DistributedConfig.fsdp_plan``, resolved by transformers' own code:
  :mod:`~execwrap.integrations.transformers.resolve`) as a plan whose units are the
  groups transformers builds, with transformers' styles and no explicit prefetching,
  so that :func:`execwrap.simulate_step` and :func:`execwrap.compare_plans` see the
  step transformers would run.
* :func:`to_fsdp_plan`: a plan as a transformers ``fsdp_plan`` dict: one rule per
  group (wildcards where every layer is its own group with one style), multi-module
  groups as tuples, ``reshard_after_forward`` as the two styles. Written the way
  transformers reads it back: the pair of a final norm and the embedding/head that
  transformers groups itself is written as two plain rules, and a tied embedding kept
  unsharded is written under the head's name (transformers drops the embedding's own
  rule for tied weights). What the format cannot hold: explicit prefetching (apply
  it after loading with :func:`~execwrap.integrations.transformers.set_prefetch`)
  and anything per group other than the style (``mp_policy``, checkpointing).
* :func:`distributed_config_for`: the ``DistributedConfig`` that makes transformers
  itself build exactly the plan's groups, checked with transformers' own
  resolution; refused, saying why, where the format or the override rules cannot
  (then apply with :func:`~execwrap.integrations.transformers.applying_plan`).
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from transformers.distributed import DistributedConfig

from execwrap.integrations.transformers.resolve import (
    check_transformers_model,
    resolve_fsdp_plan,
    with_fsdp_plan,
)
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.given_groups import plan_from_groups, tables_order
from execwrap.planning.rules import group_rules, style_of
from tracing.capture import capture_execution_order
from tracing.order import ExecutionOrder
from tracing.rates import ComputeRates
from tracing.runtime import record_execution_order

__all__ = ["distributed_config_for", "load_fsdp_plan", "model_order", "to_fsdp_plan"]

#: ``policy_name`` of the plans :func:`load_fsdp_plan` returns.
TRANSFORMERS_PLAN = "transformers fsdp_plan"


def model_order(
    model: nn.Module,
    example_kwargs: dict[str, Any] | None = None,
    *,
    timing: ComputeRates | None = None,
) -> ExecutionOrder:
    """The order a plan of ``model`` is built on.

    Args:
        model: the model.
        example_kwargs: inputs of one forward (``{"input_ids": ids}``; meta tensors on
            a meta model); ``None``: an order without calls (the model's parameter
            and module tables only: enough to apply and export a plan, not to simulate it).
        timing: compute rates to estimate each call's time with
            (``CostModel.preset(...).compute``), for :func:`execwrap.simulate_step`.

    Returns:
        The captured order (:func:`tracing.capture_execution_order`'s ladder, or one
        recording with estimated times when ``timing`` is given).
    """
    if example_kwargs is None:
        return tables_order(model)
    if timing is not None:
        return record_execution_order(model, timing=timing, **example_kwargs)
    return capture_execution_order(model, example_kwargs=example_kwargs)


def load_fsdp_plan(
    model: nn.Module,
    *,
    distributed_config: DistributedConfig | None = None,
    order: ExecutionOrder | None = None,
) -> WrapPlan:
    """The model's own transformers FSDP plan as an execwrap plan.

    Args:
        model: a transformers 5 model (the meta device is fine).
        distributed_config: the ``DistributedConfig`` it would be loaded with
            (its ``fsdp_plan`` overrides); ``None``: the model's own plan.
        order: the model's order (:func:`model_order`; with compute times to
            simulate the plan); ``None``: :func:`model_order` without inputs.

    Returns:
        A plan with one unit per ``fully_shard`` call transformers makes and the
        root's; ``reshard_after_forward`` per unit from the styles (the root
        ``False``, FSDP2's default for it); ``prefetch`` 0 (transformers sets no
        explicit prefetching); notes on the rules that name nothing and on
        parameters two groups both gather (a tied embedding).

    Raises:
        TypeError: not a transformers 5 model.
        ValueError: from :func:`~execwrap.integrations.transformers.resolve_fsdp_plan`.

    Example:
        >>> plan = load_fsdp_plan(model, order=model_order(model, {"input_ids": ids}))  # doctest: +SKIP
        >>> plan.groups  # doctest: +SKIP
        [[''], ['model.embed_tokens'], ['model.layers.0'], ['model.layers.1'], ['model.norm', 'lm_head']]
    """
    resolved = resolve_fsdp_plan(model, distributed_config)
    notes = [
        f"transformers' fsdp_plan rule {key!r} names no module of {type(model).__name__}: "
        "transformers warns and applies nothing for it"
        for key in resolved.unmatched
    ]
    return plan_from_groups(
        model,
        order if order is not None else model_order(model),
        [fqns for fqns, _ in resolved.groups],
        reshard_after_forward=[reshard for _, reshard in resolved.groups],
        prefetch=0,
        policy_name=TRANSFORMERS_PLAN,
        notes=notes,
    )


def to_fsdp_plan(plan: WrapPlan, model: nn.Module) -> dict[str | tuple[str, ...], str]:
    """``plan`` as a transformers ``fsdp_plan`` (see the module docstring).

    Args:
        plan: a plan for ``model``.
        model: the model (for wildcards, the tied embedding and the norm/head pair).

    Returns:
        Module FQN (``*`` for layer numbers) or tuple of FQNs -> ``"free_full_weight"``
        / ``"keep_full_weight"``; the root is left out (transformers always shards it
        last with FSDP2's defaults).

    Raises:
        TypeError: ``model`` is not a transformers 5 model.
        ValueError: the plan names a module ``model`` does not have.

    Example:
        >>> to_fsdp_plan(load_fsdp_plan(model), model)  # doctest: +SKIP
        {'model.embed_tokens': 'free_full_weight', 'model.layers.*': 'free_full_weight',
         'model.norm': 'keep_full_weight', 'lm_head': 'keep_full_weight'}
    """
    check_transformers_model(model, "to_fsdp_plan")
    names = [n for n, _ in model.named_modules()]
    known = set(names)
    flags = plan.reshard_after_forward or tuple(not u.is_root for u in plan.units)
    groups: list[tuple[tuple[str, ...], bool]] = []
    for unit, flag in zip(plan.units, flags, strict=True):
        missing = [m for m in unit.module_fqns if m not in known]
        if missing:
            raise ValueError(
                f"to_fsdp_plan: the plan names module {missing[0]!r}, which "
                f"{type(model).__name__} does not have; was it made for another model?"
            )
        if not unit.is_root:
            groups.append((unit.module_fqns, bool(flag)))
    return group_rules(_as_transformers_reads(groups, model), names)


def distributed_config_for(plan: WrapPlan, model: nn.Module, **kwargs: Any) -> DistributedConfig:
    """A ``DistributedConfig`` whose ``fsdp_plan`` makes transformers build ``plan``'s groups.

    Args:
        plan: a plan for ``model``.
        model: the model (meta is fine).
        **kwargs: the other ``DistributedConfig`` fields (``fsdp_size=8``, ...).

    Returns:
        ``DistributedConfig(fsdp_plan=to_fsdp_plan(plan, model), **kwargs)``, checked:
        transformers' own resolution of it gives exactly the plan's groups and styles.
        Explicit prefetching is not in it: call
        :func:`~execwrap.integrations.transformers.set_prefetch` after loading.

    Raises:
        ValueError: transformers would build other groups, naming the first that
            differs and why (a group of several modules: transformers 5.25 documents
            tuple rules but refuses them; a rule of the model's own that the plan
            does not have: an override cannot remove a rule); then apply the plan
            with :func:`~execwrap.integrations.transformers.applying_plan`.
    """
    fsdp_plan = to_fsdp_plan(plan, model)
    tuples = [k for k in fsdp_plan if isinstance(k, tuple)]
    if tuples:
        raise ValueError(
            f"distributed_config_for: the plan's group {list(tuples[0])} is a tuple rule, which "
            "transformers documents but does not apply (DistributedConfig refuses it as "
            "'match nothing', a model's own tuple rule is skipped); apply the plan with "
            "`with applying_plan(plan): Model.from_pretrained(..., distributed_config=...)`"
        )
    config = with_fsdp_plan(DistributedConfig(**kwargs), dict(fsdp_plan))
    got = {frozenset(fqns): (fqns, r) for fqns, r in resolve_fsdp_plan(model, config).groups}
    want = {
        frozenset(u.module_fqns): (u.module_fqns, f) for u, f in _unit_flags(plan) if not u.is_root
    }
    for key, (fqns, reshard) in want.items():
        if key not in got or got[key][1] != reshard:
            raise ValueError(
                f"distributed_config_for: transformers would not build the plan's group "
                f"{list(fqns)} ({style_of(reshard)}) from this fsdp_plan; "
                f"{_why(key, reshard, got)}; apply the plan with `with applying_plan(plan): ...`"
            )
    extra = [fqns for key, (fqns, _) in got.items() if key not in want]
    if extra:
        raise ValueError(
            f"distributed_config_for: transformers would also shard {list(extra[0])} as a "
            "group of its own: the model's own fsdp_plan has a rule for it, and "
            "DistributedConfig(fsdp_plan=...) overrides rules but never removes one; apply "
            "the plan with `with applying_plan(plan): ...`"
        )
    return config


def _unit_flags(plan: WrapPlan) -> list[tuple[Any, bool]]:
    flags = plan.reshard_after_forward or tuple(not u.is_root for u in plan.units)
    return [(u, bool(f)) for u, f in zip(plan.units, flags, strict=True)]


def _why(
    key: frozenset[str], reshard: bool, got: dict[frozenset[str], tuple[tuple[str, ...], bool]]
) -> str:
    if key in got:
        return f"transformers gives it {style_of(got[key][1])}"
    split = [list(fqns) for k, (fqns, _) in got.items() if k & key]
    if not split:
        return "transformers leaves its modules to the root's group"
    return f"transformers builds {split} instead"


def _embeddings(model: nn.Module) -> tuple[str | None, str | None, bool]:
    """FQNs of the input embedding and the output head, and whether transformers
    treats them as tied (``_resolve_tied_embed_lm_head_plan``'s condition)."""
    names = {id(m): n for n, m in model.named_modules()}
    embed, head = _module(model, "get_input_embeddings"), _module(model, "get_output_embeddings")
    embed_name = names.get(id(embed)) if embed is not None else None
    head_name = names.get(id(head)) if head is not None else None
    tied = bool(getattr(model, "all_tied_weights_keys", None)) and None not in (
        embed_name,
        head_name,
    )
    return embed_name, head_name, tied


def _module(model: nn.Module, getter: str) -> nn.Module | None:
    """``model.get_input_embeddings()`` / ``get_output_embeddings()``, ``None`` where the
    model has none (many vision and audio models raise ``NotImplementedError``)."""
    try:
        found = getattr(model, getter)() if hasattr(model, getter) else None
    except NotImplementedError:
        return None
    return found if isinstance(found, nn.Module) else None


def _as_transformers_reads(
    groups: list[tuple[tuple[str, ...], bool]], model: nn.Module
) -> list[tuple[tuple[str, ...], bool]]:
    """``groups`` rewritten where transformers writes them otherwise (module docstring)."""
    embed, head, tied = _embeddings(model)
    heads = {embed, head} - {None}

    def renamed(fqn: str, reshard: bool) -> str:
        return head if tied and fqn == embed and not reshard and head is not None else fqn

    keep = [g for g in groups if not g[1]]
    out: list[tuple[tuple[str, ...], bool]] = []
    for fqns, reshard in groups:
        is_pair = (
            not reshard
            and len(keep) == 1
            and len(fqns) == 2
            and any(f == "norm" or f.endswith(".norm") for f in fqns)
            and any(f in heads for f in fqns)
        )
        if is_pair:
            out.extend(((renamed(f, reshard),), reshard) for f in fqns)
        else:
            out.append((tuple(renamed(f, reshard) for f in fqns), reshard))
    return out
