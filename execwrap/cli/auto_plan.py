"""``execwrap report --bucket-size auto``: the cost model, the auto plan, the baselines' estimates.

:func:`load_cost_model` reads ``--cost-model`` (a JSON file written by
``execwrap calibrate`` / ``CostModel.save``, or a preset name),
:func:`plan_auto` runs ``plan_wrap(..., bucket_numel="auto")`` with
``--world-size`` and ``--memory-budget``, and :func:`estimate_baselines`
simulates the report's baseline plans with the same cost model, so the
candidates chart can place them. Every failure is one
:class:`~execwrap.cli.errors.CLIError` naming the option; where the library's
message would advise a Python call (``CostModel.preset(name, world_size=N)``,
``optimizer="sgd"``, ``record_execution_order(..., timing=True)``), the command
line says what to do with its own options instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import execwrap.planning.auto.space as search_space
import execwrap.planning.planner as planning
from execwrap.cli.errors import CLIError, CLIFinding
from execwrap.cli.options import ReportOptions
from execwrap.cli.text import shorten
from execwrap.cost import PRESETS, CostModel
from execwrap.errors import MemoryBudgetError, PlanError
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.simulate import UnitCompute, unit_compute
from execwrap.simulate.compute import NO_COMPUTE_TIMES
from execwrap.simulate.step import step_estimate
from execwrap.util.text import plural
from tracing.order import ExecutionOrder
from tracing.runtime import record_execution_order

__all__ = ["estimate_baselines", "load_cost_model", "plan_auto", "timed_order"]

logger = logging.getLogger(__name__)

_RANKS = "plan for more ranks (--world-size N, with a cost model for N ranks)"
_FINER = "wrap smaller modules (a finer --policy: transformer:CLASS of a smaller block, or size:N)"
#: How to shrink each part of the smallest peak (a ``MemoryBreakdown`` field), in CLI terms.
_BUDGET_REMEDIES = {
    "sharded_params": f"{_RANKS}, or build the model in a lower-precision dtype (--model)",
    "sharded_grads": f"{_RANKS}, or freeze parameters in the --model factory",
    "optimizer_state": f"{_RANKS}; the command line prices AdamW's state (for an optimizer "
    'with less state, plan in Python: plan_wrap(..., optimizer="sgd"))',
    "unsharded_params": _FINER,
    "unsharded_grads": _FINER,
    "all_gather_buffers": _FINER,
    "reduce_scatter_buffers": _FINER,
    "activations": "use a smaller batch or sequence in --input, or activation checkpointing",
    "temporaries": "use a smaller batch or sequence in --input",
}
#: The auto-planner's WARNING for an order without compute times, in CLI terms.
_NO_COMPUTE_TIMES = (
    "the auto-planner has no compute times, so it weighs communication and parameter memory "
    "only (no compute to overlap, no activations): pass --input SPEC (one forward and "
    "backward on those inputs times the compute, or estimates it with a GPU cost model's rates)"
)


def load_cost_model(text: str, world_size: int | None) -> CostModel:
    """The ``--cost-model`` value: a saved cost model file, else a preset name.

    Raises:
        CLIError: the file is not a cost model or is for another world size
            than ``--world-size`` (checked here, before any timing), or no
            preset has that name (the message lists them), or the preset has
            no such world size.
    """
    path = Path(text)
    if path.is_file():
        try:
            cm = CostModel.load(path)
        except (OSError, ValueError) as exc:
            raise CLIError(f"--cost-model {text!r}: {shorten(exc, 400)}") from exc
        if world_size is not None and world_size != cm.world_size:
            preset = (
                f"pass a preset that describes them (--cost-model PRESET --world-size "
                f"{world_size}; presets: {', '.join(sorted(PRESETS))}), "
                if world_size >= 2  # presets describe 2 or more GPUs
                else ""
            )
            raise CLIError(
                f"--cost-model {text!r} does not fit world size {world_size} (this cost model is "
                f"for {plural(cm.world_size, 'rank')}): calibrate on the target's {plural(world_size, 'rank')} "
                f"(`execwrap calibrate` under torchrun), {preset}or leave --world-size out to "
                f"plan for {plural(cm.world_size, 'rank')}"
            )
        return cm
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
        CLIError: the cost model cannot be loaded, or does not fit the world
            size or device.
        CLIFinding: no plan fits ``--memory-budget`` (exit 1; the remedy in terms of
            the command's options).
    """
    assert options.cost_model is not None  # checked by report_options
    cm = load_cost_model(options.cost_model, options.world_size)
    try:
        with _cli_warnings():
            plan = planning.plan_wrap(
                model,
                order,
                init_policy,
                bucket_numel="auto",
                cost_model=cm,
                world_size=options.world_size,
                memory_budget=options.memory_budget,
            )
    except MemoryBudgetError as exc:
        remedy = _BUDGET_REMEDIES.get(exc.part)
        hint = f"to fit, raise --memory-budget{f', or {remedy}' if remedy else ''}"
        raise CLIFinding(f"--memory-budget: {shorten(exc.finding, 400)}; {hint}") from exc
    except PlanError as exc:
        raise CLIError(f"planning failed: {shorten(exc, 400)}") from exc
    except ValueError as exc:
        # the whole message: it ends with the remedy (calibrate on N ranks, or a preset)
        raise CLIError(f"--cost-model {options.cost_model!r}: {shorten(exc, 800)}") from exc
    return plan, cm


@contextlib.contextmanager
def _cli_warnings() -> Iterator[None]:
    """While planning, the planner's WARNING about missing compute times says what to
    pass on the command line instead of which Python call to make."""

    def reword(record: logging.LogRecord) -> bool:
        if record.msg == NO_COMPUTE_TIMES:
            record.msg, record.args = _NO_COMPUTE_TIMES, ()
        return True

    search_space.logger.addFilter(reword)
    try:
        yield
    finally:
        search_space.logger.removeFilter(reword)


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
        estimate = step_estimate(base, cm, world_size=ranks, prefetch=prefetch, compute=compute)
        out[name] = dataclasses.replace(base, estimate=estimate)
    return out
