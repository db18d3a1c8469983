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
from tracing.order import ExecutionOrder
from tracing.rates import ComputeRates

__all__ = ["TransformersPlan", "plan_from_config", "plan_from_pretrained"]


@dataclass
class TransformersPlan:
    """transformers' FSDP plan of a model, with the meta model and order it was read on.

    Attributes:
        model: the model on the meta device (no weights).
        order: its order (:func:`~execwrap.integrations.transformers.model_order`).
        plan: transformers' own plan as an execwrap plan.
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
            overrides); ``None``: the model's own plan.
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
    return TransformersPlan(model=model, order=order, plan=plan)


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
