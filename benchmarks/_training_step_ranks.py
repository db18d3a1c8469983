"""The rank side of ``benchmarks/training_step.py``: calibrate, capture, plan, time, track memory.

:func:`spawn` runs the whole job on fresh rank processes and returns rank 0's result.
Per model: the orders the plans are made from (the unsharded model's, with measured
compute, ``record_execution_order(..., timing=True, param_dtype=...)`` after warm-up
steps, the precisions taking turns :data:`ORDER_ROUNDS` times on every rank, the median
of all kept); each step of :func:`benchmarks._training_step_grid.grid` (the auto plan
chosen on those orders) applied to its own copy of the model (``apply_fully_shard`` with
the step's ``mp_policy`` and ``checkpointing``; the auto plan as it is, its step taken
from ``plan.training``), trained with ``accumulate_gradients``, timed interleaved (in
an order shuffled per round, each turn an untimed step then a timed one of the same
plan; the baseline has three copies (:data:`COPIES`), the fallback and the auto plan
two, each copy taking one turn per round, every other step one; two more turns of each
timed round record the unsharded model's order again, one per precision), predicted
with ``simulate_step`` on the median of the orders recorded between the timed steps (so
the compute the prediction is built from was measured while the machine ran as fast as
during the steps; the prediction from the orders recorded before is kept as
``predicted_upfront_s``), and its peak tracked over one optimizer step.
"""

from __future__ import annotations

import copy
import gc
import random
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from benchmarks._autoplan_models import MODELS, ModelSpec
from benchmarks._bench import median
from benchmarks._ranks import barrier, rank_main, spawn_ranks
from benchmarks._training_step_grid import AUTO, BASELINE, FALLBACK, StepSpec, grid

__all__ = ["spawn"]

_BF16 = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}


def _step(spec: StepSpec) -> Any:
    from execwrap import Precision, TrainingStep

    precision = Precision(**_BF16) if spec.precision == "bf16" else Precision()
    return TrainingStep(
        precision=precision,
        checkpointing=spec.checkpointing,
        micro_batches=spec.micro_batches,
        gradient_sync=spec.sync if spec.micro_batches > 1 else "every",
    )


def _loss(spec: ModelSpec, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The model's loss in float32 (logits cast first, as torchtitan does)."""
    return spec.loss(out.float(), y)


#: Orders recorded per precision and rank (the precisions taking turns); of all ranks'
#: the one with the median step time is kept. On a shared 2-vCPU machine the speed drifts
#: by tens of percent over minutes and the 3 timed steps of one recording spread up to
#: 4.6x: 3 recordings per precision, taking turns, rank 0's median, still moved the
#: predicted bfloat16 / float32 ratio of the same GPT from 1.06 to 1.51 between two runs,
#: and with it every predicted ratio between the precisions.
ORDER_ROUNDS = 9


def _record(spec: ModelSpec, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
            precision: str) -> Any:  # fmt: skip
    """One order of the unsharded ``model`` with measured compute in ``precision``."""
    from tracing import record_execution_order

    return record_execution_order(
        model,
        x,
        timing=True,
        param_dtype=torch.bfloat16 if precision == "bf16" else None,
        loss_fn=lambda out: _loss(spec, out, y),
    )


def _median_orders(recorded: dict[str, list[Any]]) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Per precision, of every rank's recordings the one with the median step time (on
    every rank), and all the recordings' step times (seconds, every rank's)."""
    from tracing import ExecutionOrder

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {p: [o.to_dict() for o in got] for p, got in recorded.items()})
    orders, seconds = {}, {}
    for p in recorded:
        every = sorted(
            (d for g in gathered for d in g[p]), key=lambda d: d["backward_end_s"] or 0.0
        )
        orders[p] = ExecutionOrder.from_dict(every[len(every) // 2])
        seconds[p] = [float(d["backward_end_s"] or 0.0) for d in every]
    return orders, seconds


def _orders(
    spec: ModelSpec, model: nn.Module, x: torch.Tensor, y: torch.Tensor, rounds: int
) -> dict[str, Any]:
    """The orders the plans are made from: per precision, ``rounds`` recordings side by
    side (the precisions take turns, the first alternating), the median of every rank's."""
    recorded: dict[str, list[Any]] = {"fp32": [], "bf16": []}
    for r in range(rounds):
        for p in ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32"):
            recorded[p].append(_record(spec, model, x, y, p))
    return _median_orders(recorded)[0]


class _Trainer:
    """One step of the grid applied to its own copy of the model."""

    def __init__(self, model_spec: ModelSpec, size: dict[str, int], plan: Any, spec: StepSpec,
                 batch: Any, mesh: Any) -> None:  # fmt: skip
        from execwrap import apply_fully_shard

        torch.manual_seed(0)
        self.spec = model_spec
        self.model = model_spec.build(size)
        if spec.auto:  # everything from the plan: groups, prefetch, precision, checkpointing
            apply_fully_shard(self.model, plan, mesh=mesh, prefetch="auto")
            self.step_of = plan.training
        else:
            self.step_of = _step(spec)
            kwargs: dict[str, Any] = {}
            if spec.precision == "bf16":
                kwargs["mp_policy"] = self.step_of.precision.fsdp_policy()
            checkpointing = None if spec.checkpointing == "none" else spec.checkpointing
            apply_fully_shard(self.model, plan, mesh=mesh, checkpointing=checkpointing, **kwargs)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x, self.y = batch
        self.loss = float("nan")

    def step(self, between: Any = None) -> None:
        """One optimizer step over the step's micro-batches (each the captured batch);
        ``between()`` runs before each micro-batch but the first."""
        from execwrap import accumulate_gradients

        s = self.step_of
        n = s.micro_batches
        self.opt.zero_grad(set_to_none=True)
        batches = [self.x] * n
        for k, x in enumerate(
            accumulate_gradients(
                self.model,
                batches,
                sync=s.gradient_sync,
                reshard_after_backward=s.reshard_after_backward,
            )
        ):
            if k and between is not None:
                between()
            loss = _loss(self.spec, self.model(x), self.y) / n
            loss.backward()
        self.opt.step()
        self.loss = float(loss.detach()) * n


def _tracked_peak(trainer: _Trainer, grouped: bool) -> int:
    """Peak bytes of one optimizer step under FSDPMemTracker (torch's generic
    MemTracker for a plan with a group of several modules, which FSDPMemTracker breaks);
    the trackers' module statistics are reset before each micro-batch but the first
    (they refuse a module's second forward otherwise), their peak over all tensors is
    kept across the reset."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    gc.collect()
    dist.barrier()
    if grouped:
        tracker: Any = MemTracker()
        tracker.track_external(trainer.model, trainer.opt, trainer.x)
    else:
        tracker = FSDPMemTracker(trainer.model, trainer.opt)
        tracker.track_inputs((trainer.x,))
    with tracker:  # the trackers refuse a second forward of a module unless reset
        trainer.step(between=tracker.reset_mod_stats)
    peak = tracker.get_tracker_snapshot("peak")
    return max(int(v.get("Total", 0)) for v in peak.values())


#: Copies of the steps the claims divide by, each taking one turn per round (every other
#: step has one copy): every ratio is to the baseline, so its median's noise moves all 18
#: ratios of a model at once (a run's first and second halves put the same steps' ratios
#: up to 15% apart, mostly through the baseline's median); the auto plan is compared with
#: the fallback. Copies, not more turns of one model, so that every model takes as many
#: optimizer steps and the steps' last losses stay comparable.
COPIES = {BASELINE: 3, FALLBACK: 2, AUTO: 2}


def _time_interleaved(
    trainers: dict[str, list[_Trainer]], job: dict[str, Any], record: Any
) -> tuple[dict[str, list[float]], dict[str, list[Any]]]:
    """Seconds of each step's timed optimizer steps (all its copies'), and the orders
    recorded between them (see the module docstring): ``record(precision)`` is one more
    turn of every timed round, per precision, in the round's shuffled order."""
    turns: list[tuple[str, int]] = [(n, k) for n, copies in trainers.items()
                                    for k in range(len(copies))]  # fmt: skip
    recorded: dict[str, list[Any]] = {"fp32": [], "bf16": []}
    turns += [(precision, -1) for precision in recorded]  # a recording: copy index -1
    times: dict[str, list[float]] = {n: [] for n in trainers}
    device = torch.device("cpu")
    for r in range(job["warmup"] + job["steps"]):
        for n, k in random.Random(r).sample(turns, len(turns)):
            if k < 0:
                if r >= job["warmup"]:
                    recorded[n].append(record(n))
                continue
            trainer = trainers[n][k]
            trainer.step()  # untimed: the timed step follows one of its own plan
            barrier(device)
            start = time.perf_counter()
            trainer.step()
            if r >= job["warmup"]:
                times[n].append(time.perf_counter() - start)
    return times, recorded


def _priced(plan: Any, order: Any, cm: Any, world: int, training: Any) -> Any:
    """``plan`` (groups, prefetch, resharding, step kept) predicted on ``order``."""
    from execwrap import simulate_step

    plan = copy.copy(plan)  # the plan that was applied stays as it was
    plan.order = order
    return simulate_step(plan, cm, world_size=world, training=training)


def _plans(
    model_spec: ModelSpec, base: nn.Module, orders: dict[str, Any], cm: Any, world: int
) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Each grid step's plan and prediction, and the auto plan's budget: between the
    per-block plan with full checkpointing (fits) and without (does not)."""
    from execwrap import ModuleWrapPolicy, TrainingStep, plan_wrap, simulate_step

    policy = ModuleWrapPolicy({model_spec.block})
    plans: dict[str, Any] = {}
    predicted: dict[str, Any] = {}
    for spec in grid():
        if spec.auto:
            continue
        plan = plan_wrap(base, orders[spec.precision], policy)
        plans[spec.name] = plan
        predicted[spec.name] = simulate_step(plan, cm, world_size=world, training=_step(spec))
    full = predicted[FALLBACK].peak_memory_bytes
    none = predicted["fp32, none, 4 mb every"].peak_memory_bytes
    budget = int(full + 0.4 * (none - full))
    auto = plan_wrap(
        base,
        orders["fp32"],
        policy,
        bucket_numel="auto",
        cost_model=cm,
        world_size=world,
        memory_budget=budget,
        training=TrainingStep(micro_batches=4),
    )
    plans[AUTO], predicted[AUTO] = auto, auto.estimate
    return plans, predicted, budget


def _bench_model(name: str, job: dict[str, Any], cm: Any, mesh: Any) -> dict[str, Any] | None:
    rank, world = dist.get_rank(), dist.get_world_size()
    model_spec = MODELS[name]
    size = job["sizes"][name]
    gen = torch.Generator().manual_seed(1000 + rank)
    x, y = model_spec.inputs(size, gen)
    torch.manual_seed(0)
    base = model_spec.build(size)
    for _ in range(2):  # warm-up of the unsharded model before its orders are timed
        _loss(model_spec, base(x), y).backward()
        base.zero_grad(set_to_none=True)
    orders = _orders(model_spec, base, x, y, 1 if job["quick"] else ORDER_ROUNDS)
    plans, upfront, budget = _plans(model_spec, base, orders, cm, world)
    specs = grid()
    trainers = {
        s.name: [
            _Trainer(model_spec, size, plans[s.name], s, (x, y), mesh)
            for _ in range(COPIES.get(s.name, 1))
        ]
        for s in specs
    }
    times, recorded = _time_interleaved(
        trainers, job, lambda p: _record(model_spec, base, x, y, p)
    )
    # predicted on the orders recorded between the timed steps, i.e. with the compute
    # measured while the machine ran at the speed the steps were measured at
    timed_orders, recording_s = _median_orders(recorded)
    predicted = {
        s.name: _priced(
            plans[s.name], timed_orders[s.precision], cm, world,
            plans[s.name].training if s.auto else _step(s),
        )
        for s in specs
    }  # fmt: skip
    del base
    peaks = {
        n: _tracked_peak(t[0], any(len(u.module_fqns) > 1 for u in plans[n].units))
        for n, t in trainers.items()
    }
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"times": times, "peaks": peaks})
    if rank != 0:
        return None
    rows = []
    for s in specs:
        steps = range(len(times[s.name]))
        slowest = [max(g["times"][s.name][i] for g in gathered) for i in steps]
        est = predicted[s.name]
        plan = plans[s.name]
        rows.append(
            {
                "name": s.name,
                "predicted_s": float(est.step_time_s),
                "predicted_upfront_s": float(upfront[s.name].step_time_s),
                "measured_s": median(slowest),
                "steps_s": slowest,
                "rank_steps_s": [g["times"][s.name] for g in gathered],
                "predicted_peak": int(est.peak_memory_bytes),
                "measured_peak": max(g["peaks"][s.name] for g in gathered),
                "loss": trainers[s.name][0].loss,
                # the first copy's after one more step: the one its peak was tracked over
                "copies_losses": [t.loss for t in trainers[s.name]],
                "label": plan.search.best.label if plan.search is not None else "",
                "step": plan.training.describe() if s.auto and plan.training else "",
            }
        )
    return {"rows": rows, "budget": budget, "recording_s": recording_s}


def _body(rank: int, device: torch.device, mesh: Any, job: dict[str, Any]) -> dict[str, Any]:
    from execwrap.cost import CostModel

    t0 = time.perf_counter()
    cm = CostModel.calibrate(device=device, max_bytes=4 * 2**20 if job["quick"] else None)
    result: dict[str, Any] = {
        "cost_model": cm.to_dict(),
        "calibrate_s": time.perf_counter() - t0,
        "models": {},
    }
    for name in job["models"]:
        result["models"][name] = _bench_model(name, job, cm, mesh)
    return result


def _entry(rank: int, world: int, tmpdir: str, job: dict[str, Any]) -> None:
    rank_main(rank, world, tmpdir, job, _body)


def spawn(job: dict[str, Any], world: int) -> dict[str, Any]:
    """Run ``job`` on ``world`` fresh rank processes; return rank 0's result.

    Raises:
        RuntimeError: a rank failed (its traceback is in the message).
    """
    from benchmarks._training_step_ranks import _entry as entry  # importable by name

    return spawn_ranks(entry, job, world, name="training_step")[0]
