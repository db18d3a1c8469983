"""``execwrap.fit``: will a model's training step fit a cluster, from its config alone.

The Python side of ``execwrap fit``: a transformers model id, ``config.json`` or config
(:mod:`execwrap.integrations.transformers.fit_source`, which imports transformers), a
model factory ``"module:function"``, a factory or an ``nn.Module`` built on the meta
device (:func:`execwrap.sizing.blocks.module_target`), sized by
:func:`execwrap.sizing.job.size_job`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from execwrap.cost import CostModel
from execwrap.plan.training_step import Precision
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.sizing.blocks import module_target
from execwrap.sizing.cluster import Cluster
from execwrap.sizing.job import SizingModel, size_job
from execwrap.sizing.result import FitResult

__all__ = ["fit", "fit_target"]


def fit(
    model: str | os.PathLike[str] | nn.Module | Callable[[], nn.Module] | Any,
    *,
    cluster: str | Path | CostModel | Cluster = "h100-nvlink-8",
    nodes: int = 1,
    sequence_length: int = 4096,
    micro_batch: int = 1,
    precision: str | Precision | None = None,
    memory_budget: int | None = None,
    plan: WrapPlan | None = None,
    optimizer: str = "adamw",
) -> FitResult:
    """Whether ``model``'s training step fits ``cluster``, its fastest plan, and more.

    Args:
        model: a transformers model id (only its ``config.json`` is fetched), a
            ``config.json`` or the folder holding it, a transformers ``PretrainedConfig``,
            a factory ``"module:function"``, a callable returning the model, or the model
            (built on the meta device: no weights are needed).
        cluster: a preset, a calibrated cost model file or a cost model.
        nodes: nodes of the job (one flat mesh over their GPUs).
        sequence_length: tokens per sequence.
        micro_batch: sequences per GPU per step.
        precision: ``"bf16"``, ``"bf16-reduce"``, ``"fp32"`` or a :class:`~execwrap.Precision`;
            ``None``: the given plan's own precision, else ``"bf16"``. A given plan is
            priced in this precision.
        memory_budget: bytes per GPU (``None``: the device's memory minus a reserve).
        plan: a plan to price instead of searching (checked against the model).
        optimizer: the optimizer priced.

    Returns:
        A :class:`~execwrap.sizing.result.FitResult` (``.fits``, ``.plan``,
        ``.step_time_s``, ``.tokens_per_s_per_gpu``, ``.memory``,
        ``.largest_micro_batch``; recipes by :func:`execwrap.sizing.recipes.recipe`).

    Raises:
        ValueError: a model id offline (the message says that only ``config.json`` is
            needed and how to pass a local one); a config transformers cannot build; a
            plan for another model (the first module that differs); a bad cluster,
            precision or size.
        TypeError: ``model`` of another kind.

    Example:
        >>> result = execwrap.fit("config.json", sequence_length=8192, micro_batch=2)  # doctest: +SKIP
        >>> result.fits, result.largest_micro_batch  # doctest: +SKIP
        (True, 13)
    """
    return size_job(
        fit_target(model),
        cluster=cluster,
        nodes=nodes,
        sequence_length=sequence_length,
        micro_batch=micro_batch,
        precision=precision,
        memory_budget=memory_budget,
        plan=plan,
        optimizer=optimizer,
    )


def fit_target(model: Any) -> SizingModel:
    """The :class:`~execwrap.sizing.job.SizingModel` of what :func:`fit` accepts."""
    if isinstance(model, SizingModel):
        return model
    if isinstance(model, nn.Module):
        return module_target(model)
    if isinstance(model, str) and _is_factory(model):
        module_name, _, attr = model.partition(":")
        factory = getattr(importlib.import_module(module_name), attr)
        return _built(factory, {"kind": "factory", "factory": model})
    if isinstance(model, (str, os.PathLike)) or _is_config(model):
        try:
            from execwrap.integrations.transformers.fit_source import transformers_target
        except ModuleNotFoundError as e:
            if e.name != "transformers":
                raise
            raise ImportError(
                f"fit: {str(model)!r} is read as a transformers model id or config.json, and "
                "building a model from it needs transformers, which is not installed: "
                "pip install 'transformers>=5.0' (or pip install -e '.[integrations]'); "
                "or pass a factory 'module:function' that returns your nn.Module"
            ) from None
        return transformers_target(model)
    if callable(model):
        name = getattr(model, "__qualname__", "factory")
        return _built(model, {"kind": "factory", "factory": f"{model.__module__}:{name}"})
    raise TypeError(
        "fit: model must be a transformers model id or config.json path, a config, a "
        f"'module:function' factory, a callable or an nn.Module; got {type(model).__name__}"
    )


def _built(factory: Callable[[], Any], source: dict[str, str]) -> SizingModel:
    with torch.device("meta"):
        module = factory()
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"fit: factory {source['factory']} returned {type(module).__name__}, not an nn.Module"
        )
    return module_target(
        module, name=f"{type(module).__name__} ({source['factory']})", source=source
    )


def _is_factory(text: str) -> bool:
    """``pkg.module:function`` (not a Windows drive, not an existing path)."""
    head, sep, tail = text.partition(":")
    return (
        bool(sep)
        and head.replace(".", "").replace("_", "").isalnum()
        and tail.isidentifier()
        and not Path(text).exists()
    )


def _is_config(obj: Any) -> bool:
    return any(c.__name__.lower() == "pretrainedconfig" for c in type(obj).__mro__)
