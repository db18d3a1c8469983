"""The rank side of ``benchmarks/autoplan.py``: calibrate, plan, time, track memory.

:func:`spawn` runs the whole job on fresh rank processes (one spawn: the cost
model is calibrated once and used for every model) and returns rank 0's
result. See the docstring of ``benchmarks/autoplan.py`` for what is measured.
"""

from __future__ import annotations

import gc
import itertools
import random
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from benchmarks._autoplan_drift import SpeedProbe
from benchmarks._autoplan_models import MODELS, ModelSpec, PlanSpec, block_numel, grid
from benchmarks._bench import median
from benchmarks._ranks import barrier, rank_main, spawn_ranks
from execwrap.cost.host import clean_samples, steal_seconds

__all__ = ["PHASES", "spawn"]


# ------------------------------------------------------------------ planning
def _budget_between(plan: Any) -> int:
    """A budget that binds: halfway between the smallest peak any candidate of the
    free auto plan reached and the free auto plan's own peak (5% above the
    smallest when they are that close)."""
    search = plan.search
    smallest = min(c.peak_memory_bytes for c in search.candidates)
    chosen = search.best.peak_memory_bytes
    if chosen > 1.05 * smallest:
        return int(smallest + 0.5 * (chosen - smallest))
    return int(1.05 * smallest)


def _make_plan(
    spec: ModelSpec, p: PlanSpec, model: nn.Module, order: Any, cm: Any, world: int, budget: int
) -> Any:
    from execwrap import ModuleWrapPolicy, always_wrap_policy, plan_wrap

    policy = always_wrap_policy if p.policy == "always" else ModuleWrapPolicy({spec.block})
    if p.auto != "none":
        return plan_wrap(
            model,
            order,
            policy,
            bucket_numel="auto",
            cost_model=cm,
            world_size=world,
            memory_budget=budget if p.auto == "budget" else None,
        )
    bucket = None
    if p.bucket_blocks > 0:
        bucket = p.bucket_blocks * block_numel(model, spec.block)
    elif p.bucket_blocks < 0:
        bucket = sum(q.numel() for q in model.parameters())
    return plan_wrap(model, order, policy, bucket_numel=bucket)


def _predict(plan: Any, p: PlanSpec, cm: Any, world: int) -> Any:
    from execwrap.simulate import simulate_step

    if p.auto != "none":
        return plan.estimate
    # What _Trainer passes to apply_fully_shard: nothing for the default (the root keeps its
    # parameters), False for every group and the root alike.
    return simulate_step(
        plan,
        cm,
        world_size=world,
        prefetch=int(p.prefetch),
        reshard_after_forward=None if p.reshard in (None, True) else False,
    )


def _timed_order(spec: ModelSpec, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Any:
    """Warm up, then record the order with compute times; rank 0's, on every rank."""
    from tracing import ExecutionOrder, record_execution_order

    for _ in range(2):
        spec.loss(model(x), y).backward()
        model.zero_grad(set_to_none=True)
    order = record_execution_order(model, x, timing=True, loss_fn=lambda out: spec.loss(out, y))
    box = [order.to_dict()]
    dist.broadcast_object_list(box, src=0)
    return ExecutionOrder.from_dict(box[0])


# ------------------------------------------------------------------ training
class _Trainer:
    """One plan applied to its own copy of the model, its optimizer and batch."""

    def __init__(
        self, spec: ModelSpec, size: dict[str, int], plan: Any, p: PlanSpec, batch: Any, mesh: Any
    ) -> None:
        from execwrap import apply_fully_shard

        self.spec = spec
        self.model = _build(spec, size, batch[0].device)
        kwargs: dict[str, Any] = (
            {} if p.reshard in (None, True) else {"reshard_after_forward": False}
        )
        apply_fully_shard(self.model, plan, mesh=mesh, prefetch=p.prefetch, **kwargs)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x, self.y = batch
        self.loss = float("nan")

    def step(self) -> tuple[float, ...]:
        """One training step; returns its forward (with ``zero_grad``), backward and
        optimizer seconds (CUDA events on GPU, read after the step's synchronisation)."""
        clock = _PhaseClock(self.x.device)
        self.opt.zero_grad(set_to_none=True)
        loss = self.spec.loss(self.model(self.x), self.y)
        clock.mark()
        loss.backward()
        clock.mark()
        self.opt.step()
        clock.mark()
        if self.x.device.type == "cuda":
            torch.cuda.synchronize(self.x.device)
        self.loss = float(loss.detach())
        return clock.phases()


class _PhaseClock:
    """Marks phase boundaries of one step (``perf_counter`` on CPU, CUDA events on GPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []
        self.mark()

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def phases(self) -> tuple[float, ...]:
        """Seconds between consecutive marks (on CUDA: after the device synchronised)."""
        pairs = itertools.pairwise(self.marks)
        if self.cuda:
            return tuple(a.elapsed_time(b) / 1e3 for a, b in pairs)
        return tuple(b - a for a, b in pairs)


def _build(spec: ModelSpec, size: dict[str, int], device: torch.device) -> nn.Module:
    torch.manual_seed(0)  # the same initial weights for every plan and rank
    with device:
        return spec.build(size)


def _time_interleaved(
    trainers: dict[str, _Trainer], job: dict[str, Any], device: torch.device, probe: SpeedProbe
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[tuple[float, ...]]]]:
    """Seconds of each plan's timed steps, the host's steal during each (CPU
    seconds over all CPUs, :func:`execwrap.cost.host.steal_seconds`), and each timed
    step's forward, backward and optimizer seconds (:meth:`_Trainer.step`).

    Every plan runs once per round, in an order shuffled per round (the same on every
    rank: seeded by the round). A plan's fresh allocations land on the memory the plan
    before it just freed; with a fixed rotation each plan would always follow the same
    one, and that neighbour's footprint would bias its time. With ``job["paired"]`` each
    turn is an untimed step and then a timed one of the same plan, so the timed step
    finds the allocator as the plan's own previous step left it, as in a training loop.
    After each timed round, ``probe`` times its workload once (:meth:`SpeedProbe.record`).
    (Unpaired, *llama*'s one group of all blocks, the plan with the largest buffers,
    measured slower than its 4-block buckets in most runs, and faster when the plans ran
    one at a time; its prediction looked 10-23% short.)"""
    names = list(trainers)
    times: dict[str, list[float]] = {n: [] for n in names}
    steals: dict[str, list[float]] = {n: [] for n in names}
    phases: dict[str, list[tuple[float, ...]]] = {n: [] for n in names}
    for r in range(job["warmup"] + job["steps"]):
        for n in random.Random(r).sample(names, len(names)):
            if job["paired"]:
                trainers[n].step()  # untimed: the timed step follows one of its own plan
            barrier(device)
            steal0 = steal_seconds()
            start = time.perf_counter()
            split = trainers[n].step()
            elapsed = time.perf_counter() - start
            if r >= job["warmup"]:
                times[n].append(elapsed)
                steals[n].append(steal_seconds() - steal0)
                phases[n].append(split)
        if r >= job["warmup"]:
            probe.record()
    return times, steals, phases


def _tracked_peak(trainer: _Trainer, device: torch.device, grouped: bool) -> tuple[int, int | None]:
    """Peak bytes of one step under torch's memory tracker (and CUDA's own peak).

    ``FSDPMemTracker`` where every FSDP2 group is one module; torch's generic
    ``MemTracker`` (the same accounting of tensors, without FSDP's categories) for a
    plan with a group of several modules (``grouped``): FSDPMemTracker replaces each
    module's FSDP hooks with its own and so breaks ``fully_shard([m1, m2, ...])``
    groups, which it reshards and all-gathers again after every module (torch 2.13:
    25 all-gathers instead of 11 in a step of a one-bucket plan of 8 blocks, and a
    peak 13-21% above the plan's, measured under MemTracker, on the three models).
    """
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    gc.collect()  # no reference cycle of an earlier step holds a buffer into this one
    barrier(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if grouped:
        tracker: Any = MemTracker()
        tracker.track_external(trainer.model, trainer.opt, trainer.x)
    else:
        tracker = FSDPMemTracker(trainer.model, trainer.opt)
        tracker.track_inputs((trainer.x,))
    with tracker:
        trainer.step()
    peak = tracker.get_tracker_snapshot("peak")
    total = max(int(v.get("Total", 0)) for v in peak.values())
    cuda = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return total, cuda


def _grouped(plan: Any) -> bool:
    """Whether a unit of ``plan`` is a group of several modules."""
    return any(len(u.module_fqns) > 1 for u in plan.units)


# ------------------------------------------------------------------ one model
def _bench_model(
    name: str, job: dict[str, Any], cm: Any, mesh: Any, device: torch.device, probe: SpeedProbe
) -> list[dict[str, Any]] | None:
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = MODELS[name]
    size = job["sizes"][name]
    gen = torch.Generator().manual_seed(1000 + rank)
    x, y = (t.to(device) for t in spec.inputs(size, gen))
    base = _build(spec, size, device)
    order = _timed_order(spec, base, x, y)
    specs = [p for p in grid() if p.name in job["plans"]]
    plans: dict[str, Any] = {}
    free = _make_plan(spec, next(p for p in specs if p.auto == "free"), base, order, cm, world, 0)
    budget = _budget_between(free)
    for p in specs:
        plans[p.name] = (
            free if p.auto == "free" else _make_plan(spec, p, base, order, cm, world, budget)
        )
    predicted = {p.name: _predict(plans[p.name], p, cm, world) for p in specs}
    del base
    trainers = {p.name: _Trainer(spec, size, plans[p.name], p, (x, y), mesh) for p in specs}
    times, steals, phases = _time_interleaved(trainers, job, device, probe)
    peaks = {n: _tracked_peak(t, device, _grouped(plans[n])) for n, t in trainers.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(
        gathered, {"times": times, "peaks": peaks, "steals": steals, "phases": phases}
    )
    if rank != 0:
        return None
    rows = []
    for p in specs:
        steps = range(job["steps"])
        every_step = [max(g["times"][p.name][i] for g in gathered) for i in steps]
        # the most any rank's host took (one host here: the same counter on every rank)
        stolen = [max(g["steals"][p.name][i] for g in gathered) for i in steps]
        per_step = clean_samples(every_step, stolen)
        # the same steps, as indices
        clean_steps = [int(i) for i in clean_samples([float(i) for i in steps], stolen)]
        plan, estimate = plans[p.name], predicted[p.name]
        flags = getattr(plan, "reshard_after_forward", None)
        kept = (
            sum(1 for u, f in zip(plan.units, flags, strict=True) if not f and not u.is_root)
            if flags is not None
            else (0 if p.reshard in (None, True) else len(plan.units) - 1)
        )
        cuda_peaks = [g["peaks"][p.name][1] for g in gathered]
        rows.append(
            {
                "name": p.name,
                "groups": len(plan.units),
                "prefetch": plan.prefetch if p.prefetch == "auto" else p.prefetch,
                "kept": kept,
                "predicted_s": float(estimate.step_time_s),
                "measured_s": median(per_step),
                "measured_all_s": median(every_step),
                "clean_steps": sum(1 for x in stolen if x <= 0.0),
                "steps_s": every_step,
                "steals_s": stolen,
                "spread_s": _quartiles(per_step),
                "halves_s": (median(per_step[0::2]), median(per_step[1::2]))
                if len(per_step) >= 2
                else None,
                "predicted_phases_s": estimate.phase_times_s(),
                "measured_phases_s": _slowest_phases(gathered, p.name, clean_steps),
                "predicted_peak": int(estimate.peak_memory_bytes),
                "measured_peak": max(g["peaks"][p.name][0] for g in gathered),
                "peak_tracker": "MemTracker" if _grouped(plan) else "FSDPMemTracker",
                "cuda_peak": max(cuda_peaks) if cuda_peaks[0] is not None else None,
                "loss": trainers[p.name].loss,
                "budget": budget if p.auto == "budget" else None,
                "label": plan.search.best.label if plan.search is not None else p.name,
            }
        )
    return rows


def _slowest_phases(gathered: list[Any], name: str, kept: list[int]) -> dict[str, float]:
    """Median forward, backward and optimizer seconds of plan ``name`` over the steps
    ``kept``, each step's phases those of its slowest rank."""
    split = []
    for i in kept:
        slowest = max(gathered, key=lambda g: g["times"][name][i])
        split.append(slowest["phases"][name][i])
    return {k: median([s[j] for s in split]) for j, k in enumerate(PHASES)}


#: The phases of a step, as :meth:`execwrap.simulate.StepEstimate.phase_times_s` names them.
PHASES = ("forward", "backward", "optimizer")


def _quartiles(values: list[float]) -> tuple[float, float]:
    """The 25th and 75th percentiles of ``values`` (inclusive method; both the value
    when there is one)."""
    if len(values) < 2:
        return (values[0], values[0])
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[0], q[2])


# ------------------------------------------------------------------ processes
def _body(rank: int, device: torch.device, mesh: Any, job: dict[str, Any]) -> dict[str, Any]:
    """One rank's job: calibrate, then benchmark every model (with
    ``job["calibrate_per_model"]``, each model after the first on a cost model
    calibrated again just before it: ``result["model_costs"]``). The speed probe's
    reference is taken right after each calibration; ``result["drift"]`` holds each
    model's :meth:`SpeedProbe.drift` (rank 0's)."""
    probe = SpeedProbe(device)
    cm, seconds = _calibrate(device, job, probe)
    result: dict[str, Any] = {
        "cost_model": cm.to_dict(),
        "calibrate_s": seconds,
        "models": {},
        "model_costs": {},
        "drift": {},
    }
    for i, name in enumerate(job["models"]):
        if i > 0 and job.get("calibrate_per_model"):
            cm, seconds = _calibrate(device, job, probe)
            result["model_costs"][name] = {"cost_model": cm.to_dict(), "calibrate_s": seconds}
        result["models"][name] = _bench_model(name, job, cm, mesh, device, probe)
        result["drift"][name] = probe.drift()
    return result


def _calibrate(device: torch.device, job: dict[str, Any], probe: SpeedProbe) -> tuple[Any, float]:
    """``CostModel.calibrate`` as the job says, and its seconds (the job's saved model
    instead, if it has one: 0 s); then the probe's reference (median of 15 runs, not
    counted in the seconds)."""
    from execwrap.cost import CostModel

    if job.get("cost_model") is not None:
        probe.set_reference(15)
        return CostModel.from_dict(job["cost_model"]), 0.0
    t0 = time.perf_counter()
    cm = CostModel.calibrate(
        device=device,
        max_bytes=4 * 2**20 if job["quick"] else None,
        repeat=job["calibration_repeat"],
    )
    seconds = time.perf_counter() - t0
    probe.set_reference(15)
    return cm, seconds


def _entry(rank: int, world: int, tmpdir: str, job: dict[str, Any]) -> None:
    rank_main(rank, world, tmpdir, job, _body)


def spawn(job: dict[str, Any], world: int) -> dict[str, Any]:
    """Run ``job`` on ``world`` fresh rank processes; return rank 0's result.

    Raises:
        RuntimeError: a rank failed (its traceback is in the message).
    """
    from benchmarks._autoplan_ranks import _entry as entry  # importable by name

    return spawn_ranks(entry, job, world, name="autoplan")[0]
