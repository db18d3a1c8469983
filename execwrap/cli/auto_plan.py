"""``execwrap report --bucket-size auto``: the cost model, the auto plan, the baselines' estimates.

:func:`load_cost_model` reads ``--cost-model`` (a JSON file written by
``execwrap calibrate`` / ``CostModel.save``, or a preset name),
:func:`plan_auto` runs ``plan_wrap(..., bucket_numel="auto")`` with
``--world-size`` and ``--memory-budget``, and :func:`estimate_baselines`
simulates the report's baseline plans with the same cost model, so the
candidates chart can place them. Every failure is one
:class:`~execwrap.cli.errors.CLIError` naming the option.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import execwrap.planner as planning
from execwrap.cli.errors import CLIError
from execwrap.cli.options import ReportOptions
from execwrap.cli.text import shorten
from execwrap.cost import PRESETS, CostModel
from execwrap.errors import PlanError
from execwrap.plan import WrapPlan
from execwrap.simulate import UnitCompute, simulate_step, unit_compute
from tracing.order import ExecutionOrder
from tracing.runtime import record_execution_order

__all__ = ["estimate_baselines", "load_cost_model", "plan_auto", "timed_order"]

logger = logging.getLogger(__name__)


def load_cost_model(text: str, world_size: int | None) -> CostModel:
    """The ``--cost-model`` value: a saved cost model file, else a preset name.

    Raises:
        CLIError: the file is not a cost model, or no preset has that name
            (the message lists them), or the preset has no such world size.
    """
    path = Path(text)
    if path.is_file():
        try:
            return CostModel.load(path)
        except (OSError, ValueError) as exc:
            raise CLIError(f"--cost-model {text!r}: {shorten(exc, 400)}") from exc
    if text not in PRESETS:
        raise CLIError(
            f"--cost-model {text!r}: no such file and no such preset; presets: "
            f"{', '.join(sorted(PRESETS))} (or write one with 'execwrap calibrate')"
        )
    try:
        return CostModel.preset(text, world_size=world_size)
    except ValueError as exc:
        raise CLIError(f"--cost-model {text!r}: {shorten(exc, 400)}") from exc


def timed_order(
    model: nn.Module,
    order: ExecutionOrder,
    example: tuple[tuple[Any, ...], dict[str, Any]] | None,
    cm: CostModel,
    meta_model: Callable[[], nn.Module],
) -> ExecutionOrder:
    """``order`` with compute times, for the planner: measured on this CPU when the
    cost model is for CPU and the model has weights, else estimated with the cost
    model's compute rates (``timing=cm.compute``) on ``meta_model()`` (the factory's
    model built on the meta device: moving a model to meta would untie its tied
    weights). Without example inputs, or when recording fails (one WARNING),
    ``order`` as it is.
    """
    if order.has_timing or example is None:
        return order
    args, kwargs = example
    on_meta = any(p.is_meta for p in model.parameters())
    timing: Any = True
    if cm.device_type != "cpu" or on_meta:
        timing = cm.compute
        if not on_meta:
            model = meta_model()
        args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    try:
        return record_execution_order(model, *args, timing=timing, **kwargs)
    except Exception as exc:  # the plan can still weigh communication and memory
        logger.warning(
            "recording compute times for the auto-planner failed (%s: %s); planning without them",
            type(exc).__name__,
            shorten(exc, 160),
        )
        return order


def plan_auto(
    model: nn.Module, order: ExecutionOrder, init_policy: Any, options: ReportOptions
) -> tuple[WrapPlan, CostModel]:
    """The auto plan of ``model`` (and the cost model it was planned with).

    Raises:
        CLIError: the cost model cannot be loaded, does not fit the world
            size or device, or no plan fits ``--memory-budget``.
    """
    assert options.cost_model is not None  # checked by report_options
    cm = load_cost_model(options.cost_model, options.world_size)
    try:
        plan = planning.plan_wrap(
            model,
            order,
            init_policy,
            bucket_numel="auto",
            cost_model=cm,
            world_size=options.world_size,
            memory_budget=options.memory_budget,
        )
    except PlanError as exc:
        raise CLIError(f"--memory-budget: {shorten(exc, 400)}") from exc
    except ValueError as exc:
        # the whole message: it ends with the remedy (calibrate on N ranks, or a preset)
        raise CLIError(f"--cost-model {options.cost_model!r}: {shorten(exc, 800)}") from exc
    return plan, cm


def estimate_baselines(
    baselines: dict[str, WrapPlan], cm: CostModel, world_size: int | None, prefetch: int
) -> dict[str, WrapPlan]:
    """The baselines, each with its predicted step (``plan.estimate``) at ``prefetch``."""
    ranks = cm.world_size if world_size is None else world_size
    out: dict[str, WrapPlan] = {}
    for name, base in baselines.items():
        compute = (
            unit_compute(base) if base.order.has_timing else UnitCompute.zeros(len(base.units))
        )
        estimate = simulate_step(base, cm, world_size=ranks, prefetch=prefetch, compute=compute)
        out[name] = dataclasses.replace(base, estimate=estimate)
    return out
