"""One call from a transformers model id, folder or config to its FSDP plan in execwrap.

``AutoModelForCausalLM.from_pretrained(name, distributed_config=DistributedConfig(fsdp_size=8))``
is how a transformers 5 user meets FSDP2. :func:`plan_from_pretrained` answers, for
the same arguments and before any GPU is involved, "what will that build, and what
will it cost?": it reads only the config (``config.json``), builds the model on the
meta device (no weights), captures its order with a batch of token ids (estimated
compute times when ``timing`` is given), and returns transformers' own plan
(:func:`~execwrap.integrations.transformers.load_fsdp_plan`) with the model and the
order, ready for :func:`execwrap.simulate_step`, :func:`execwrap.compare_plans` and
:func:`execwrap.plan_wrap` (execwrap's own plan of the same order).
:func:`plan_from_config` does the same from a config object.

The ``distributed_config``'s mesh is the plan's (:func:`config_mesh`): with
``dp_replicate_size`` (HSDP: transformers' advice for several nodes is the number
of nodes) the plan shards over ``fsdp_size`` ranks and all-reduces across the
replicas, and :func:`execwrap.simulate_step` prices it so; with ``tp_size`` the
order holds the local sizes the model's own tensor-parallel plan leaves
(:func:`~execwrap.planning.tensor_parallel.local_order`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig
from transformers.distributed import DistributedConfig

from execwrap.integrations.transformers.fsdp_plan import load_fsdp_plan, model_order
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.tensor_parallel import local_order
from execwrap.util.mesh import MeshShape
from tracing.order import ExecutionOrder
from tracing.rates import ComputeRates

__all__ = ["TransformersPlan", "config_mesh", "plan_from_config", "plan_from_pretrained"]


@dataclass
class TransformersPlan:
    """transformers' FSDP plan of a model, with the meta model and order it was read on.

    Attributes:
        model: the model on the meta device (no weights).
        order: its order (:func:`~execwrap.integrations.transformers.model_order`;
            global sizes, as captured).
        plan: transformers' own plan as an execwrap plan; ``plan.mesh``: the
            ``distributed_config``'s (:func:`config_mesh`), ``plan.order`` the local
            sizes under its ``tp_size``.
    """

    model: nn.Module
    order: ExecutionOrder
    plan: WrapPlan


def plan_from_config(
    config: PretrainedConfig,
    *,
    distributed_config: DistributedConfig | None = None,
    model_class: Any = AutoModelForCausalLM,
    example_kwargs: dict[str, Any] | None = None,
    sequence_length: int = 128,
    timing: ComputeRates | None = None,
) -> TransformersPlan:
    """transformers' FSDP plan for a model built from ``config`` on the meta device.

    Args:
        config: the model's config.
        distributed_config: what ``from_pretrained`` would get (its ``fsdp_plan``
            overrides, its mesh: :func:`config_mesh`); ``None``: the model's own plan.
        model_class: an auto class (``AutoModelForCausalLM``, the default) or a model
            class.
        example_kwargs: inputs of one forward on the meta device; ``None``: token ids
            ``[1, sequence_length]`` when the model's main input is ``input_ids``, else
            no inputs (an order without calls: the plan can be exported and applied,
            not simulated).
        sequence_length: tokens of the default example (``>= 1``).
        timing: compute rates to estimate the order's times with
            (``CostModel.preset(...).compute``), so that the plan can be simulated.

    Returns:
        A :class:`TransformersPlan`.

    Raises:
        ValueError: ``sequence_length`` below 1; transformers cannot build the model
            from ``config`` (its message, with the class); and what
            :func:`~execwrap.integrations.transformers.load_fsdp_plan` raises.

    Example:
        >>> found = plan_from_config(LlamaConfig(num_hidden_layers=2), timing=cm.compute)  # doctest: +SKIP
        >>> simulate_step(found.plan, cm, world_size=8).step_time_s  # doctest: +SKIP
    """
    if not isinstance(sequence_length, int) or sequence_length < 1:
        raise ValueError(f"plan_from_config: sequence_length must be >= 1, got {sequence_length!r}")
    model = _meta_model(config, model_class)
    if example_kwargs is None and getattr(model, "main_input_name", None) == "input_ids":
        ids = torch.zeros(1, sequence_length, dtype=torch.long, device="meta")
        example_kwargs = {"input_ids": ids}
    order = model_order(model, example_kwargs, timing=timing)
    plan = load_fsdp_plan(model, distributed_config=distributed_config, order=order)
    mesh = config_mesh(distributed_config)
    if mesh is not None:
        plan.mesh = mesh
        if mesh.tp > 1:  # FSDP shards what the model's own tensor-parallel plan leaves
            tp_plan = getattr(model, "tp_plan", None) or {}
            plan.order = local_order(order, model, tp=mesh.tp, tp_plan=tp_plan)
    return TransformersPlan(model=model, order=order, plan=plan)


def config_mesh(distributed_config: DistributedConfig | None) -> MeshShape | None:
    """The mesh a ``DistributedConfig`` makes transformers build, as FSDP sees it:
    ``MeshShape(dp_replicate_size, fsdp_size, tp_size)`` (transformers' mesh dimensions
    ``dp_replicate``, ``fsdp`` and ``tp``); ``None`` without replicas or tensor
    parallelism (FSDP over every data-parallel rank, the plan's default).

    Example:
        >>> config_mesh(DistributedConfig(dp_replicate_size=2, fsdp_size=8))
        MeshShape(replicate=2, shard=8, tp=1)
        >>> config_mesh(DistributedConfig(fsdp_size=8)) is None
        True
    """
    if distributed_config is None:
        return None
    replicate = distributed_config.dp_replicate_size or 1
    shard = distributed_config.fsdp_size or 1
    tp = distributed_config.tp_size or 1
    if replicate == 1 and tp == 1:
        return None
    return MeshShape(replicate, shard, tp)


def plan_from_pretrained(
    name_or_path: str,
    *,
    distributed_config: DistributedConfig | None = None,
    model_class: Any = AutoModelForCausalLM,
    example_kwargs: dict[str, Any] | None = None,
    sequence_length: int = 128,
    timing: ComputeRates | None = None,
    **config_kwargs: Any,
) -> TransformersPlan:
    """:func:`plan_from_config` of ``AutoConfig.from_pretrained(name_or_path, **config_kwargs)``.

    Only the config is read (a folder's ``config.json``, or the Hub's when online);
    no weights are loaded.

    Raises:
        OSError: the config cannot be found (transformers' message: offline, a
            model id needs its ``config.json`` in the cache; pass a local folder).
    """
    config = AutoConfig.from_pretrained(name_or_path, **config_kwargs)
    return plan_from_config(
        config,
        distributed_config=distributed_config,
        model_class=model_class,
        example_kwargs=example_kwargs,
        sequence_length=sequence_length,
        timing=timing,
    )


def _meta_model(config: PretrainedConfig, model_class: Any) -> nn.Module:
    try:
        with torch.device("meta"):
            if hasattr(model_class, "_model_mapping"):  # an auto class
                return model_class.from_config(config)
            return model_class(config)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        name = getattr(model_class, "__name__", repr(model_class))
        raise ValueError(
            f"plan_from_config: transformers cannot build {name} from this "
            f"{type(config).__name__}: {type(exc).__name__}: {exc}"
        ) from exc
