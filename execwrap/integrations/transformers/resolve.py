"""transformers' own FSDP2 plan of a model, resolved as transformers resolves it.

transformers 5 (``from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=...))``)
shards a model in ``apply_fully_sharded_data_parallelism`` from a plan it builds in
``PreTrainedModel._resolve_parallel_plans``:

1. the rules: the model class's ``_fsdp_plan``, the config's ``base_model_fsdp_plan``
   (on the base model) and every child model's plan under its prefix
   (``init_parallel_plans``: ``model.fsdp_plan``), then ``DistributedConfig.fsdp_plan``
   over them (it overrides rules and adds rules; it never removes one);
2. tied input embedding and output head: the embedding's rule is dropped and, when
   the head's rule is ``"keep_full_weight"``, the embedding takes it in the head's place;
3. modules holding parameters kept in float32 (``_keep_in_fp32_modules``) get a
   ``"free_full_weight"`` rule of their own unless one names them;
4. wildcards are expanded against the model's modules, and the rules sorted deepest first;
5. ``fully_shard`` is called for each ``"free_full_weight"`` module, then the
   ``"keep_full_weight"`` modules: as one group when they are exactly a final norm and
   the embedding or head (``is_norm_and_head_pair``), else one by one; then the root,
   with FSDP2's defaults (no explicit prefetching).

:func:`resolve_fsdp_plan` runs steps 1-4 with transformers' own code (on any model,
the meta device included; no process group needed) and step 5's grouping with
transformers' own ``is_norm_and_head_pair``, so what it returns is what transformers
would build, for the installed version. Rules that name no module are listed:
transformers warns about them and applies nothing for them.

Source: ``transformers/distributed/mixin.py`` (``init_parallel_plans``,
``_resolve_parallel_plans``) and ``transformers/distributed/fsdp.py``
(``_resolve_tied_embed_lm_head_plan``, ``is_norm_and_head_pair``,
``apply_fully_sharded_data_parallelism``), transformers 5.25.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch.nn as nn
from transformers.distributed import DistributedConfig
from transformers.distributed.fsdp import is_norm_and_head_pair

from execwrap.planning.rules import KEEP_FULL_WEIGHT, STYLES, layer_pattern

__all__ = ["ResolvedFsdpPlan", "check_transformers_model", "resolve_fsdp_plan"]

_PLAN_ATTRIBUTES = ("_fsdp_plan", "_tp_plan", "_ep_plan")


@dataclass(frozen=True)
class ResolvedFsdpPlan:
    """What transformers' FSDP2 step builds for one model and ``DistributedConfig``.

    Attributes:
        rules: the model's rules as given (``model.fsdp_plan`` with the config's
            overrides), wildcards kept.
        resolved: module FQN -> style, as transformers applies them (steps 2-4 of the
            module docstring), deepest first.
        groups: ``(module FQNs, reshard_after_forward)`` of each ``fully_shard`` call
            before the root's, in transformers' order.
        unmatched: the keys of :attr:`rules` that name no module (transformers warns
            and applies nothing for them).
    """

    rules: dict[Any, str]
    resolved: dict[str, str]
    groups: list[tuple[tuple[str, ...], bool]]
    unmatched: tuple[Any, ...]


def check_transformers_model(model: Any, where: str) -> None:
    """Refuse what is not a transformers model with FSDP plans (transformers 5).

    Raises:
        TypeError: ``model`` is not a ``transformers.PreTrainedModel``, or its
            transformers has no ``fsdp_plan`` (before 5.0).
    """
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"{where}: expected a transformers PreTrainedModel, got {type(model).__name__}; "
            "for any other model use execwrap.plan_wrap / apply_fully_shard"
        )
    if not hasattr(model, "_resolve_parallel_plans") or not hasattr(model, "fsdp_plan"):
        import transformers

        raise TypeError(
            f"{where}: transformers {transformers.__version__} has no FSDP plans "
            "(PreTrainedModel.fsdp_plan, DistributedConfig(fsdp_size=...)); install "
            "transformers>=5.0"
        )


def resolve_fsdp_plan(
    model: nn.Module, distributed_config: DistributedConfig | None = None
) -> ResolvedFsdpPlan:
    """The groups transformers' ``from_pretrained(..., distributed_config=...)`` shards ``model`` into.

    Args:
        model: a transformers model (the meta device is fine; nothing is sharded).
        distributed_config: the ``DistributedConfig`` it is loaded with (its
            ``fsdp_plan`` overrides, its dtype, its sizes); ``None``: the model's own
            plan (as ``DistributedConfig(fsdp_size=2)``, sizes do not change the plan).

    Returns:
        A :class:`ResolvedFsdpPlan`. The model is left as it was (transformers'
        resolution stores overrides on the model; they are put back).

    Raises:
        TypeError: ``model`` is not a transformers 5 model.
        ValueError: the config shards nothing (``dp_replicate_size * fsdp_size``
            is 1: transformers applies no FSDP); transformers' own resolution fails
            (a model with tied weights and no input embeddings); expert parallelism
            (``ep_size > 1``: experts are sharded on another mesh, not modelled
            here); and what transformers raises (an override naming nothing in the
            model, a size without a plan).
    """
    check_transformers_model(model, "resolve_fsdp_plan")
    config = (
        distributed_config if distributed_config is not None else DistributedConfig(fsdp_size=2)
    )
    if config.dp_size <= 1:
        raise ValueError(
            f"resolve_fsdp_plan: the DistributedConfig shards nothing (dp_replicate_size "
            f"{config.dp_replicate_size} x fsdp_size {config.fsdp_size} = 1): transformers "
            "applies FSDP only when their product is above 1; pass fsdp_size=<ranks>"
        )
    if (config.ep_size or 1) > 1:
        raise ValueError(
            f"resolve_fsdp_plan: ep_size={config.ep_size}: transformers shards the dispatched "
            "experts on their own mesh (efsdp), which execwrap does not model; plan with ep_size=1"
        )
    model_: Any = model
    saved = {a: getattr(model_, a, None) for a in _PLAN_ATTRIBUTES}
    saved = {a: dict(v) if isinstance(v, dict) else v for a, v in saved.items()}
    try:
        _, _, resolved = model_._resolve_parallel_plans(config)
        rules = dict(model_.fsdp_plan)
        groups = _groups(model, resolved)
    except NotImplementedError as e:
        raise ValueError(
            f"resolve_fsdp_plan: transformers' own FSDP plan resolution fails for "
            f"{type(model).__name__}: {e} (it asks a model with tied weights for its input "
            "embeddings, which this model does not define; from_pretrained(..., "
            "distributed_config=DistributedConfig(fsdp_size>1)) fails the same way); shard it "
            "with execwrap.apply_fully_shard(model, plan) instead"
        ) from e
    finally:
        for attribute, value in saved.items():
            setattr(model_, attribute, value)
    return ResolvedFsdpPlan(
        rules=rules,
        resolved=dict(resolved),
        groups=groups,
        unmatched=_unmatched(model, rules),
    )


def _groups(model: nn.Module, resolved: dict[str, str]) -> list[tuple[tuple[str, ...], bool]]:
    """``apply_fully_sharded_data_parallelism``'s calls before the root's, in its order."""
    free = [name for name, style in resolved.items() if style != KEEP_FULL_WEIGHT]
    keep = [
        (name, model.get_submodule(name)) for name, s in resolved.items() if s == KEEP_FULL_WEIGHT
    ]
    groups: list[tuple[tuple[str, ...], bool]] = [((name,), True) for name in free]
    if is_norm_and_head_pair(keep, model):
        groups.append((tuple(name for name, _ in keep), False))
    else:
        groups.extend(((name,), False) for name, _ in keep)
    return groups


def _unmatched(model: nn.Module, rules: dict[Any, str]) -> tuple[Any, ...]:
    names = {n for n, _ in model.named_modules()}
    patterns = {layer_pattern(n) for n in names}
    return tuple(
        key
        for key, style in rules.items()
        if style in STYLES
        and not (isinstance(key, str) and key in patterns)
        and not (isinstance(key, tuple) and set(key) <= names)
    )


def with_fsdp_plan(config: DistributedConfig, fsdp_plan: dict[Any, str]) -> DistributedConfig:
    """A copy of ``config`` with ``fsdp_plan`` (``DistributedConfig`` is a dataclass)."""
    return dataclasses.replace(config, fsdp_plan=fsdp_plan)
