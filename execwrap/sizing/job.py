"""Will a training step fit, and how fast does its best plan run: :func:`size_job`.

The model is built without weights (the meta device), its order recorded with
estimated compute times for the cluster's GPUs (:func:`tracing.record_execution_order`
with ``timing=cost_model.compute``) at micro-batches of 1 and 2 sequences, and every
other micro-batch's order scaled from those two (:func:`execwrap.planning.micro_batch.scaled_order`).
Then:

1. the fastest plan at the asked micro-batch: the joint auto-planner
   (:func:`execwrap.plan_wrap` with ``bucket_numel="auto"`` and a
   :class:`~execwrap.TrainingStep` in the asked precision: groups, prefetch, resharding,
   checkpointing per group, offload) within the memory budget; or, for a given plan,
   that plan priced as it is;
2. the largest micro-batch that fits (:mod:`execwrap.sizing.largest`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from execwrap.cost import CostModel
from execwrap.cost.device_memory import default_memory_budget
from execwrap.errors import MemoryBudgetError
from execwrap.plan.pinned import check_plan_fits
from execwrap.plan.training_step import Precision, TrainingStep
from execwrap.plan.wrap_plan import WrapPlan
from execwrap.planning.micro_batch import scaled_order
from execwrap.planning.planner import plan_wrap_unwatched
from execwrap.simulate import simulate_step
from execwrap.sizing.cluster import Cluster, cluster_of
from execwrap.sizing.largest import largest_fitting, least_memory_peak
from execwrap.sizing.precision import precision_of
from execwrap.sizing.result import FitResult
from tracing import record_execution_order
from tracing.checks import check_int
from tracing.order import ExecutionOrder

__all__ = ["SizingModel", "size_job"]

logger = logging.getLogger(__name__)

#: ``inputs(micro_batch, sequence_length) -> (args, kwargs)`` of one forward.
Inputs = Callable[[int, int], tuple[tuple[Any, ...], dict[str, Any]]]


@dataclass(frozen=True)
class SizingModel:
    """A model to size: built without weights, with its units and its inputs.

    Attributes:
        model: the model, on the meta device (parameters in their master dtype).
        name: how to call it in the answer (its class and where it came from).
        init_policy: the FSDP units' policy (its repeated blocks).
        inputs: ``inputs(micro_batch, sequence_length) -> (args, kwargs)``: meta tensors
            of one forward (token ids ``[micro_batch, sequence_length]``).
        loss_fn: maps the output to the loss (``None``: the sum of the floating outputs).
        source: how it was given, for the recipes (:attr:`FitResult.source`).
    """

    model: nn.Module
    name: str
    init_policy: Any
    inputs: Inputs
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    source: dict[str, str] = field(default_factory=lambda: {"kind": "module"})


def size_job(
    target: SizingModel,
    *,
    cluster: str | Path | CostModel | Cluster = "h100-nvlink-8",
    nodes: int = 1,
    sequence_length: int,
    micro_batch: int,
    precision: str | Precision | None = None,
    memory_budget: int | None = None,
    plan: WrapPlan | None = None,
    optimizer: str = "adamw",
    max_micro_batch: int = 1024,
) -> FitResult:
    """Whether ``target``'s training step fits ``cluster``, with its fastest plan.

    Args:
        target: the model, its units and its inputs (:class:`SizingModel`).
        cluster: a preset, a calibrated cost model file or a cost model
            (:func:`~execwrap.sizing.cluster.cluster_of`), or a :class:`Cluster`.
        nodes: nodes of the job (a flat mesh over all their GPUs).
        sequence_length: tokens per sequence (``>= 1``).
        micro_batch: sequences per rank per step (``>= 1``).
        precision: ``"bf16"``, ``"bf16-reduce"``, ``"fp32"``
            (:data:`~execwrap.sizing.precision.PRECISIONS`) or a :class:`~execwrap.Precision`;
            ``None``: the given plan's own, else ``"bf16"`` (a plan is priced in this one).
        memory_budget: bytes per rank (``None``: the device's memory minus a reserve,
            :func:`execwrap.cost.device_memory.default_memory_budget`).
        plan: price this plan (``load_plan(path)``, checked against the model) instead.
        optimizer: the optimizer priced (:data:`execwrap.simulate.OPTIMIZERS`).
        max_micro_batch: the largest micro-batch tried for ``largest_micro_batch``.

    Returns:
        A :class:`~execwrap.sizing.result.FitResult`. When the searched plan fits, its
        ``largest_micro_batch`` is at least ``micro_batch`` (up to ``max_micro_batch``):
        the least-memory plan it is priced from is one the planner can choose.

    Raises:
        ValueError: a bad cluster, precision or size; a plan made for another model
            (naming the first module or parameter that differs); a cost model that
            does not know its device's memory and no ``memory_budget``.
    """
    check_int(sequence_length, "sequence_length", minimum=1, unit="tokens")
    check_int(micro_batch, "micro_batch", minimum=1, unit="sequences")
    name, prec = precision_of(_precision(precision, plan))
    where = cluster if isinstance(cluster, Cluster) else cluster_of(cluster, nodes)
    cm = where.cost_model
    budget = _budget(cm, memory_budget)
    if plan is not None:
        check_plan_fits(plan, target.model, source="the given plan")
    step = TrainingStep(precision=prec)
    order_of = _orders(target, cm, prec, sequence_length)

    def peak_of(size: int) -> int:
        return least_memory_peak(
            target.model, order_of(size), target.init_policy, cost_model=cm,
            world_size=where.world_size, training=step, optimizer=optimizer,
        )  # fmt: skip

    best, reason = _best_plan(target, order_of(micro_batch), where, step, budget, plan, optimizer)
    largest, tried = largest_fitting(peak_of, budget, max_micro_batch=max_micro_batch)
    fits = best is not None and reason is None
    if plan is None and fits:
        _check_largest(min(micro_batch, max_micro_batch), largest, tried)
    return FitResult(
        model=target.name,
        parameters=sum(p.numel() for p in target.model.parameters()),
        cluster=where,
        sequence_length=sequence_length,
        micro_batch=micro_batch,
        precision=name,
        memory_budget=budget,
        fits=fits,
        plan=best,
        largest_micro_batch=largest,
        tried=tried,
        reason=reason,
        source=dict(target.source),
        given_plan=plan is not None,
    )


def _precision(precision: str | Precision | None, plan: WrapPlan | None) -> str | Precision:
    """The asked precision; else the given plan's (priced as it was made); else bf16."""
    if precision is not None:
        return precision
    if plan is not None and plan.training is not None:
        return plan.training.precision
    return "bf16"


def _check_largest(micro_batch: int, largest: int, tried: tuple[tuple[int, int], ...]) -> None:
    """The planner fitted ``micro_batch``, so its least-memory plan, which the planner can
    choose, fits it too: the largest micro-batch is at least ``micro_batch``."""
    assert largest >= micro_batch, (
        f"size_job: the planner fits micro-batch {micro_batch} but the least-memory "
        f"plans give a largest micro-batch of {largest} (tried {tried})"
    )


def _budget(cost_model: CostModel, memory_budget: int | None) -> int:
    if memory_budget is not None:
        return check_int(memory_budget, "memory_budget", minimum=1, unit="bytes")
    default = default_memory_budget(cost_model)
    if default is None:
        raise ValueError(
            "the cost model does not know its device's memory; pass memory_budget "
            "(--memory-budget) in bytes per rank"
        )
    return default[0]


def _orders(
    target: SizingModel, cost_model: CostModel, precision: Precision, sequence_length: int
) -> Callable[[int], ExecutionOrder]:
    """``order_of(size)``: recorded at 1 and 2, scaled from them for larger sizes."""
    orders: dict[int, ExecutionOrder] = {}
    dtype = getattr(torch, precision.param_dtype) if precision.param_dtype else None

    def order_of(size: int) -> ExecutionOrder:
        if size not in orders:
            if size > 2:
                orders[size] = scaled_order(order_of(1), order_of(2), size)
            else:
                args, kwargs = target.inputs(size, sequence_length)
                logger.info("fit: recording the step of %d sequence(s) on meta", size)
                orders[size] = record_execution_order(
                    target.model, *args, timing=cost_model.compute, param_dtype=dtype,
                    loss_fn=target.loss_fn, **kwargs,
                )  # fmt: skip
        return orders[size]

    return order_of


def _best_plan(
    target: SizingModel,
    order: ExecutionOrder,
    cluster: Cluster,
    step: TrainingStep,
    budget: int,
    given: WrapPlan | None,
    optimizer: str,
) -> tuple[WrapPlan | None, str | None]:
    """The fastest plan within ``budget`` (or the given plan, priced), and why none fits."""
    cm, world = cluster.cost_model, cluster.world_size
    if given is not None:
        # the plan's groups, prefetch, resharding and step, priced for the asked step: its
        # own order was captured at the size and in the dtype it was planned for, which
        # may be others, so it is priced on ``order`` in the asked precision
        given = copy.copy(given)  # the caller's plan stays as it was
        given.order = order
        training = step
        if given.training is not None:
            training = dataclasses.replace(given.training, precision=step.precision)
        given.training = training
        estimate = simulate_step(
            given, cm, world_size=world, optimizer=optimizer, training=training
        )
        given.estimate = estimate
        over = int(estimate.peak_memory_bytes) > budget
        return given, (
            "the given plan's predicted peak is over the memory budget" if over else None
        )
    try:
        return plan_wrap_unwatched(
            target.model, order, target.init_policy, bucket_numel="auto", cost_model=cm,
            world_size=world, memory_budget=budget, optimizer=optimizer, training=step,
        ), None  # fmt: skip
    except MemoryBudgetError as exc:
        return None, str(exc)
