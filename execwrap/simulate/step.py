"""simulate_step: predicted time and peak memory of one FSDP2 training step of a plan.

A discrete-event model of three streams: compute, all-gather and
reduce-scatter (:mod:`execwrap.simulate.engine`). The program mirrors
torch 2.13's FSDP2 (``_fully_shard/_fsdp_param_group.py``,
``_fsdp_state.py``, ``_fsdp_collectives.py``) for the groups, explicit
prefetch lists and ``reshard_after_forward`` that ``apply_fully_shard``
sets, and nothing else:

* forward, units in plan order, nested units inside their parents: the
  root's pre-forward all-gathers the root, then issues the root's forward
  prefetch list; each unit's pre-forward all-gathers it unless prefetched
  (copy-in of its shard, the all-gather of its padded unsharded bytes),
  waits for it (copy-out of all its bytes on the compute stream) and
  issues its own forward prefetch list (the next ``prefetch`` units with
  parameters, as :func:`execwrap.prefetch_schedule` computes them); then
  its compute runs (the part after its nested units, e.g. the root's head
  and the loss, when they are done); its post-forward frees its unsharded
  parameters if it reshards after forward;
* backward, in reverse post-forward order (units autograd never reaches
  are skipped): pre-backward all-gathers the unit again if it was
  resharded and not prefetched, waits, then issues its backward prefetch
  list, or, where the list is empty, FSDP2's implicit prefetch of the
  group before it in post-forward order; after its backward (and its
  nested units') its post-backward reshards it, waits for the previous
  reduce-scatter (FSDP2 keeps one reduce-scatter input buffer in flight),
  copies its gradients into the reduce-scatter input and reduce-scatters
  it; the root's final callback waits for every reduce-scatter; then the
  optimizer step runs on the sharded parameters;
* costs: collectives from the cost model's curves (all-gather by padded
  unsharded bytes, reduce-scatter by padded trainable bytes), copies from
  its copy curve (the copy-in of the shard and the reduce-scatter's copy-in
  as one buffer each, the copy-out per parameter: FSDP2 copies into one
  unsharded storage per parameter), ``group_overhead_s`` plus ``param_overhead_s`` per
  parameter tensor on the compute stream per collective a group issues, compute from ``compute``, the optimizer from
  ``compute.optimizer_s`` or :meth:`~execwrap.cost.CostModel.optimizer_time`
  (per trainable tensor: ``optimizer_param_overhead_s`` and its shard's
  bytes on the calibrated ``optimizer_curve``, else its passes at the memory
  bandwidth);
* on CPU (``cost_model.synchronous_collectives``) FSDP2's collectives run
  synchronously on the training thread (gloo, ``async_op=False``, no real
  streams), so they never overlap compute and prefetching changes memory,
  not time, and each first waits for the slowest rank: ``sync_wait_time``
  of the compute-stream seconds since the collective before it (none before
  the step's first: the previous step's optimizer is not simulated); on
  CUDA each stream runs its ops in issue order, compute runs at ``overlap``
  of its speed while a collective is in flight, concurrent
  collectives share the link, and the CPU is assumed to run ahead of the
  GPU (a GPU-bound step: issue never waits for the host);
* memory on one rank (categories of ``FSDPMemTracker``; the tensors torch's
  trackers and CUDA's ``memory_allocated`` count, not a backend's own buffers:
  gloo receives an all-gather into, and reduce-scatters from, a buffer of the
  collective's full size that it allocates itself, so a CPU process's
  resident memory peaks up to the largest group's unsharded bytes higher):
  sharded parameters and optimizer state for the whole step; sharded
  gradients from their reduce-scatter on (``zero_grad(set_to_none=True)``
  before forward); each all-gather output from its issue until the end of
  the next group's copy-out in forward (FSDP2's ``all_gather_state``, held
  by ``wait_for_unshard``'s local until it returns), until its own copy-out
  in backward; unsharded parameters from copy-out to reshard; activations
  from the unit's forward to the end of its backward; unsharded gradients
  from the start of its backward until ``foreach_reduce`` returns (``post_backward``
  holds them in a list): on CPU, where the reduce-scatter is synchronous,
  to its end, with its output allocated at its start; on CUDA to the
  reduce-scatter copy-in's end; reduce-scatter inputs until the next
  group's post-backward.
  Allocations count when an op starts, frees when it ends.

The training step around the plan (:class:`~execwrap.TrainingStep`,
each field also a keyword of :func:`simulate_step`):

* precision: all-gathers, unsharded parameters and their gradients in
  ``param_dtype``, reduce-scatters in ``reduce_dtype``, shards, sharded
  gradients and optimizer state in the parameters' dtype, the casts priced in
  the copy-ins (:mod:`execwrap.simulate.unit_spec`); activations and compute
  as the order was captured (capture with ``param_dtype=`` to match);
* activation checkpointing per unit: what each mode keeps from forward to
  backward, and the forward run again before the unit's backward with what it
  makes again, each with checkpointing's host work per region and per op
  (``cost_model.checkpoint_overhead``; :mod:`execwrap.simulate.unit_work`);
* CPU offload: no shards, sharded gradients or optimizer state in device
  memory; a host-to-device copy of each shard on the all-gather stream before
  its copy-in, a device-to-host copy of each gradient shard on the
  reduce-scatter stream after its reduction, the optimizer step at the host's
  rate (:class:`~execwrap.cost.host_link.HostLink`);
* micro-batches: the forward and backward run once per micro-batch, the
  optimizer once; with ``gradient_sync="last"`` the micro-batches before the
  last keep their unsharded gradients in ``reduce_dtype`` (and, without
  ``reshard_after_backward``, their unsharded parameters) until the last
  micro-batch reduce-scatters them.

Transient memory (what a unit's forward or backward has alive beyond what it
saves, the loss's logits among it) counts when the capture recorded it
(estimated timing). ``reserved_memory_bytes`` adds up the peaks of the
streams' allocator pools (all-gather buffers on the all-gather stream,
reduce-scatter buffers and sharded gradients on the reduce-scatter stream, the
rest on the compute stream), which is what a CUDA process reserves.

HSDP (``mesh=(replicate, shard)``, FSDP2's 2-D mesh: ``_fsdp_collectives.py``'s
``foreach_reduce``): parameters are padded and sharded over the shard group
(memory from its size), all-gathers and reduce-scatters run over it, and after
each reduce-scatter its output (the gradient shard, in ``reduce_dtype``) is
all-reduced in place across the replicate group: on CUDA on an all-reduce stream
of its own (on the network's link when the shard group is inside a node, so it
does not share the NVLink's bandwidth), on CPU on the training thread; the
root's final callback waits for the last all-reduce. The cost model prices each
group (:meth:`~execwrap.cost.CostModel.for_mesh`). With tensor parallelism
(``mesh=(replicate, shard, tp)``) the plan's order must hold the local shards'
sizes; TP's own collectives and sequence parallelism are not modelled.

Not modelled: model buffers and inputs, allocator fragmentation inside a
pool, FSDP2's ``output_dtype`` cast, HSDP's reduce-dtype all-reduce buffer held
until the group's next post-backward (when ``reduce_dtype`` differs from the
parameters'), a unit called several times per forward (simulated as one call
with the total compute; FSDP2 gathers it per call), the CPU-bound regime on GPUs.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from execwrap.cost.device_memory import overshoot_message
from execwrap.cost.model import CostModel
from execwrap.plan.estimate import MemoryBreakdown, StepEstimate, StreamEvent
from execwrap.simulate.compute import UnitCompute
from execwrap.simulate.engine import EngineResult, run_ops
from execwrap.simulate.facts import PlanFacts, SimulationFacts, padded_bytes
from execwrap.simulate.schedule import StepProgram, UnitSpec
from execwrap.simulate.step_inputs import (
    checked_compute,
    checked_facts,
    cost_model_for_mesh,
    own_choices,
    reshard_flags,
)
from execwrap.simulate.training import (
    Precision,
    TrainingStep,
    check_priceable,
    resolve_training,
)
from execwrap.simulate.unit_work import UnitWork, unit_work
from tracing.checks import check_int, check_integral

if TYPE_CHECKING:
    from execwrap.plan.wrap_plan import WrapPlan

__all__ = ["OPTIMIZERS", "Optimizer", "padded_bytes", "simulate_step"]

logger = logging.getLogger(__name__)

Optimizer = Literal["adamw", "adam", "sgd", "sgd_momentum", "none"]
#: Optimizer -> (state tensors per parameter, bytes moved per parameter byte in one step).
#: AdamW/Adam: exp_avg and exp_avg_sq; the step reads param, grad, both states and writes
#: param and both states (7 passes). SGD with momentum: one buffer (5 passes); plain SGD: 3.
OPTIMIZERS: dict[str, tuple[int, int]] = {
    "adamw": (2, 7),
    "adam": (2, 7),
    "sgd": (0, 3),
    "sgd_momentum": (1, 5),
    "none": (0, 0),
}


def simulate_step(
    plan: WrapPlan,
    cost_model: CostModel,
    *,
    world_size: int,
    prefetch: int | None = None,
    reshard_after_forward: bool | Sequence[bool] | None = None,
    optimizer: str = "adamw",
    compute: UnitCompute | None = None,
    facts: SimulationFacts | None = None,
    training: TrainingStep | None = None,
    precision: Precision | None = None,
    checkpointing: str | None = None,
    offload: str | None = None,
    micro_batches: int | None = None,
    gradient_sync: str | None = None,
    mesh: Any = None,
) -> StepEstimate:
    """Predict one FSDP2 training step of ``plan`` as ``apply_fully_shard`` sets it up.

    A discrete-event model of FSDP2's compute, all-gather, reduce-scatter (and
    HSDP's all-reduce) streams running torch 2.13's hooks for the plan's groups,
    explicit prefetch lists and ``reshard_after_forward``; memory per rank follows
    FSDP2's allocations. The model and what it leaves out: :mod:`execwrap.simulate.step`.

    Args:
        plan: the plan (units in execution order); its order's timing gives
            the compute unless ``compute`` is passed.
        cost_model: the cluster's cost model, for ``world_size`` ranks.
        world_size: data-parallel ranks (the shard factor): an int or a NumPy integer.
        prefetch: explicit prefetch depth (``0``: FSDP2's implicit
            prefetching only); ``None``: an auto plan's ``plan.prefetch``, else 1.
        reshard_after_forward: per ``fully_shard`` call: ``None`` (an auto
            plan's ``plan.reshard_after_forward``, else FSDP2's default: all but
            the root reshard), ``True``/``False`` (every group, the root too),
            or one bool per plan unit. Both ``None``: an auto plan as chosen.
        optimizer: ``"adamw"``, ``"adam"``, ``"sgd"``, ``"sgd_momentum"`` or ``"none"``.
        compute: per-unit compute (default: :func:`unit_compute` of ``plan``).
        facts: ``SimulationFacts(plan.order, world_size)``, kept by a caller
            that simulates many plans of one order (default: computed here).
        training: the training step (:class:`~execwrap.TrainingStep`;
            default: ``plan.training``, the step a plan was planned for or given, else
            float32, no checkpointing, no offload, one micro-batch).
        precision, checkpointing, offload, micro_batches, gradient_sync: each
            given one replaces that field of ``training``.
        mesh: HSDP / tensor parallelism over the ``world_size`` ranks: a ``(replicate,
            shard[, tp])`` tuple, a :class:`~execwrap.util.mesh.MeshShape` or a ``DeviceMesh``
            (default: ``plan.mesh``; ``None``: FSDP over every rank), priced by ``for_mesh``.

    Returns:
        A :class:`StepEstimate`; a peak over ``cost_model.device_memory_bytes``
        logs one WARNING naming the overshoot.

    Raises:
        ValueError: the cost model is for another world size or device, the compute
            for another device, ``reshard_after_forward`` or ``compute`` of a wrong length,
            an unknown optimizer, no timing and no ``compute``, ``facts`` of another order
            or world size; a training step invalid or not priceable; a mesh not of
            ``world_size`` ranks, or not priceable (a flat calibration with replicas).
        TypeError: ``world_size`` is not an integer or ``prefetch`` not an int.

    Example:
        >>> est = simulate_step(plan, CostModel.preset("h100-nvlink-8"), world_size=8)  # doctest: +SKIP
        >>> est.step_time_s, est.peak_memory_bytes, est.memory.dominant  # doctest: +SKIP
    """
    keywords = {k: v for k, v in locals().items() if k not in ("plan", "cost_model")}
    estimate = step_estimate(plan, cost_model, **keywords)  # every keyword, as given
    over = overshoot_message(int(estimate.peak_memory_bytes), cost_model, "simulate_step: the plan")
    if over is not None:
        logger.warning("%s", over)
    return estimate


def step_estimate(
    plan: WrapPlan,
    cost_model: CostModel,
    *,
    world_size: int,
    prefetch: int | None = None,
    reshard_after_forward: bool | Sequence[bool] | None = None,
    optimizer: str = "adamw",
    compute: UnitCompute | None = None,
    facts: SimulationFacts | None = None,
    training: TrainingStep | None = None,
    precision: Precision | None = None,
    checkpointing: str | None = None,
    offload: str | None = None,
    micro_batches: int | None = None,
    gradient_sync: str | None = None,
    mesh: Any = None,
    detail: bool = True,
) -> StepEstimate:
    """:func:`simulate_step` without the WARNING of a peak over the device's memory:
    for the auto-planner's candidates, most of which may not fit, and for callers
    that say so in their own words. ``detail=False`` leaves the estimate's
    ``timeline`` and ``memory_timeline`` empty (every other field is the same): what a
    search that keeps many estimates and shows one needs."""
    world_size = check_integral(world_size, "simulate_step: world_size", minimum=1, unit="ranks")
    prefetch, reshard_after_forward = own_choices(plan, prefetch, reshard_after_forward)
    check_int(prefetch, "simulate_step: prefetch", minimum=0, unit="groups ahead")
    cost_model.check_compatible(world_size=world_size, device_type=cost_model.device_type)
    cost_model, world_size = cost_model_for_mesh(plan, cost_model, world_size, mesh)
    _check_optimizer(optimizer)
    given = _given(precision, checkpointing, offload, micro_batches, gradient_sync)
    step = resolve_training(plan.training if training is None else training, **given)
    check_priceable(plan, cost_model, step, given_compute=compute is not None)
    compute = checked_compute(plan, cost_model, compute)
    facts = checked_facts(plan, world_size, facts)
    reshard = reshard_flags(plan, reshard_after_forward)
    return _simulate(plan, cost_model, facts, compute, prefetch, reshard, optimizer, step, detail)


def _check_optimizer(optimizer: str) -> None:
    if optimizer not in OPTIMIZERS:
        raise ValueError(
            f"simulate_step: optimizer must be one of {sorted(OPTIMIZERS)}, got {optimizer!r}"
        )


def _given(
    precision: Precision | None,
    checkpointing: str | None,
    offload: str | None,
    micro_batches: int | None,
    gradient_sync: str | None,
) -> dict[str, Any]:
    """The training-step keywords of :func:`simulate_step`, by name."""
    return {
        "precision": precision,
        "checkpointing": checkpointing,
        "offload": offload,
        "micro_batches": micro_batches,
        "gradient_sync": gradient_sync,
    }


def _simulate(
    plan: WrapPlan,
    cost_model: CostModel,
    facts: SimulationFacts,
    compute: UnitCompute,
    prefetch: int,
    reshard: list[bool],
    optimizer: str,
    step: TrainingStep,
    detail: bool = True,
) -> StepEstimate:
    """The checked inputs' program, run (see :func:`simulate_step`; ``detail``: see
    :func:`step_estimate`)."""
    world_size = facts.world_size
    kept = facts.plan(plan)
    specs = kept.unit_specs(reshard, step.precision, world_size)
    work = unit_work(
        compute,
        step.checkpoint_modes(plan),
        [s.label for s in specs],
        cost_model.checkpoint_overhead,
    )
    program = _program(plan, kept, specs, compute, cost_model, prefetch, facts, work, step)
    offloaded = step.offload == "cpu"
    optimizer_s = _add_optimizer(
        program, compute, cost_model, optimizer, kept.trainable_shards, offloaded
    )
    base = {
        "sharded_params": 0 if offloaded else sum(s.shard_bytes for s in specs),
        "optimizer_state": 0
        if offloaded
        else OPTIMIZERS[optimizer][0] * sum(kept.trainable_shards),
    }
    pools = None if cost_model.synchronous_collectives else _POOLS
    result = run_ops(
        program.ops, overlap=cost_model.overlap, base_memory=base, pools=pools, timeline=detail
    )
    estimate = _estimate(program, result, prefetch, reshard, world_size, optimizer_s, step, detail)
    if cost_model.mesh is None:
        return estimate
    mesh = cost_model.mesh
    return dataclasses.replace(
        estimate, world_size=mesh.world_size, mesh=mesh, all_reduces=program.all_reduces
    )


#: Memory category -> the stream whose CUDA allocator pool holds it (FSDP2 allocates the
#: all-gather input and output on the all-gather copy-in stream, the reduce-scatter input
#: and output, whose views are the sharded gradients, on the reduce-scatter stream; HSDP's
#: all-reduce works in place on the latter).
_POOLS = {
    "all_gather_buffers": "all_gather",
    "reduce_scatter_buffers": "reduce_scatter",
    "sharded_grads": "reduce_scatter",
}


def _add_optimizer(
    program: StepProgram,
    compute: UnitCompute,
    cost_model: CostModel,
    optimizer: str,
    shards: list[int],
    offloaded: bool,
) -> float:
    """Add the optimizer step over trainable shards of ``shards`` bytes to ``program``;
    its seconds (``compute.optimizer_s``, else the cost model's, on the host when
    ``offloaded``)."""
    optimizer_s = compute.optimizer_s
    passes = OPTIMIZERS[optimizer][1]
    if optimizer_s is None and offloaded and cost_model.host is not None:
        optimizer_s = cost_model.host.optimizer_time(passes, shards)
    if optimizer_s is None:
        optimizer_s = cost_model.optimizer_time(passes, shards)
    program.optimizer(optimizer_s)
    return optimizer_s


def _program(
    plan: WrapPlan,
    kept: PlanFacts,
    specs: list[UnitSpec],
    compute: UnitCompute,
    cost_model: CostModel,
    prefetch: int,
    facts: SimulationFacts,
    work: UnitWork,
    step: TrainingStep,
) -> StepProgram:
    """The forward and backward ops of every micro-batch of the step (the optimizer is
    added by the caller)."""
    fwd_lists, bwd_lists = kept.prefetch_lists(plan, facts, prefetch)
    program = StepProgram(
        specs,
        compute,
        cost_model,
        facts.world_size,
        plan.root_index,
        kept.forward_order,
        fwd_lists,
        bwd_lists,
        work=work,
        offload=step.offload == "cpu",
    )
    for mb in range(step.micro_batches):
        last = mb == step.micro_batches - 1
        program.reduce_grads = last or step.gradient_sync == "every"
        program.reshard_after_backward = last or step.reshard_after_backward
        program.forward()
        program.backward()
    return program


def _estimate(
    program: StepProgram,
    result: EngineResult,
    prefetch: int,
    reshard: list[bool],
    world_size: int,
    optimizer_s: float,
    step: TrainingStep,
    detail: bool = True,
) -> StepEstimate:
    ops = program.ops
    compute_s = overhead_s = comm_s = 0.0
    forward_end = backward_end = -math.inf
    for i, op in enumerate(ops):
        kind = op.kind
        if kind == "compute" or kind == "optimizer":
            compute_s += op.work_s
        elif kind == "comm":
            comm_s += op.work_s
        elif op.stream == "compute" and (kind == "copy" or kind == "overhead"):
            overhead_s += op.work_s
        if op.phase == "forward" and op.stream == "compute":
            forward_end = max(forward_end, result.end[i])
        elif op.phase == "backward":
            backward_end = max(backward_end, result.end[i])
    forward_end = 0.0 if forward_end == -math.inf else forward_end
    backward_end = forward_end if backward_end == -math.inf else backward_end
    timeline: tuple[StreamEvent, ...] = ()
    if detail:
        timeline = tuple(
            sorted(
                (
                    StreamEvent(op.stream, op.label, result.start[i], result.end[i])
                    for i, op in enumerate(ops)
                    if result.end[i] > result.start[i]
                ),
                key=lambda e: (e.start_s, e.end_s),
            )
        )
    memory = MemoryBreakdown(**{k: int(v) for k, v in result.peak_breakdown.items()})
    return StepEstimate(
        step_time_s=result.makespan,
        compute_time_s=compute_s,
        exposed_comm_s=max(0.0, result.makespan - compute_s - overhead_s),
        peak_memory_bytes=result.peak_bytes,
        memory=memory,
        timeline=timeline,
        overhead_time_s=overhead_s,
        optimizer_time_s=optimizer_s,
        comm_time_s=comm_s,
        all_gathers=program.all_gathers,
        reduce_scatters=program.reduce_scatters,
        peak_time_s=result.peak_time,
        peak_phase=result.peak_phase,
        prefetch=prefetch,
        reshard_after_forward=tuple(reshard),
        world_size=world_size,
        memory_timeline=tuple(result.memory_timeline) if detail else (),
        forward_end_s=forward_end,
        backward_end_s=max(forward_end, backward_end),
        reserved_memory_bytes=sum(result.pool_peaks.values()) or result.peak_bytes,
        micro_batches=step.micro_batches,
    )
