"""Auto-planning: predicted vs measured step time and peak memory of a grid of FSDP2 plans.

Spawns ``--world-size`` ranks (default 2; gloo on CPU with one intra-op thread
per rank, or NCCL with ``--device cuda``, one GPU per rank). In the same rank
processes, in this order:

1. ``CostModel.calibrate(repeat=--calibration-repeat)`` on the live process
   group (rank 0's numbers, broadcast), so predictions use this machine,
   measured in this run; then the reference of a speed probe
   (:mod:`benchmarks._autoplan_drift`: a fixed workload, timed again once per
   round of step 4, so each model's result says how much slower or faster the
   machine ran during its steps than at the calibration);
2. per model of :data:`benchmarks._autoplan_models.MODELS` (a
   communication-heavy wide MLP, a GPT, a Llama): a few warm-up steps of the
   unsharded model, then its order with compute times
   (``record_execution_order(..., timing=True)``; rank 0's order is
   broadcast so every rank plans alike);
3. the grid of plans (:func:`benchmarks._autoplan_models.grid`: per-block
   with prefetch 0/1/2, buckets of 2/3/4/all blocks, always-wrap units, no
   reshard after forward, and the auto plan with no budget and under a
   budget), each predicted with ``execwrap.simulate_step`` (the auto plans
   carry their own estimate);
4. every plan applied to its own copy of the model (same initial weights)
   with ``apply_fully_shard``, AdamW; the plans take turns step by step (in
   an order shuffled per round, so no plan always follows the same one),
   each turn an untimed step and then, after a barrier, a timed one of the
   same plan (``--no-paired``: the timed step alone); a step's time is the
   slowest rank's; medians (and quartiles) over ``--steps`` steps after
   ``--warmup`` rounds;
5. the peak memory of one step of each plan under
   ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker`` (max over
   ranks; on CUDA also ``torch.cuda.max_memory_allocated``), or, for a plan with
   a group of several modules, under torch's generic
   ``torch.distributed._tools.mem_tracker.MemTracker``: FSDPMemTracker replaces
   every module's FSDP hooks with its own, which breaks ``fully_shard([m1, m2])``
   groups (resharded and all-gathered again after each module: its peak of a
   one-bucket plan was 13-21% above the plan's real one, torch 2.13).

The calibrated cost model is written beside the result file
(``<result>.cost.json``, ``CostModel.load`` reads it), so that a run's plans
can be re-predicted from it later. ``--calibrate-per-model`` calibrates again
before each model after the first (each written as ``<result>.<model>.cost.json``
and named under the model's table).
``--cost-model FILE`` predicts with a saved cost model (such as an earlier run's
``<result>.cost.json``) instead of calibrating: the same plans, steps and tables, less
the minute of calibration (the tests' smoke run uses it), with predictions from the
machine as it was when that model was measured.

Printed per model: the table of predicted and measured step time and peak
memory side by side, and the claims of issue 11: Spearman rank correlation of
predicted vs measured step time (>= 0.9), median absolute error (<= 10%), the
auto plan against the best measured plan of the grid (<= 1.03x) and against
per-block and always-wrap (lower), predicted peak within 10% of the tracker
for at least 3 plans, and the budgeted auto plan's measured peak within its
budget.

Usage::

    python -m benchmarks.autoplan                 # CPU, 2 gloo ranks (about 14 minutes)
    python -m benchmarks.autoplan --quick         # tiny models, 2 steps (< 1 minute)
    python -m benchmarks.autoplan --calibration-repeat 4  # a 4x longer calibration
    python -m benchmarks.autoplan --cost-model benchmarks/results/RUN.cost.json  # no calibration
    python -m benchmarks.autoplan --device cuda   # 2 GPUs, NCCL
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
import torch

from benchmarks._autoplan_drift import describe
from benchmarks._autoplan_metrics import claims, steal_share
from benchmarks._autoplan_models import MODELS, grid
from benchmarks._autoplan_ranks import PHASES, spawn
from benchmarks._bench import (
    add_output_args,
    fmt_bytes,
    fmt_ratio,
    markdown_table,
    median,
    publish,
)
from benchmarks.charts import draw_for_result

__all__ = ["main"]


def _with_spread(row: dict[str, Any]) -> str:
    """``"250.3 [241.0, 262.5]"``: the median step and its quartiles, ms."""
    text = f"{row['measured_s'] * 1e3:.1f}"
    if row.get("spread_s"):
        low, high = row["spread_s"]
        text += f" [{low * 1e3:.1f}, {high * 1e3:.1f}]"
    return text


def _repeat(job: dict[str, Any]) -> str:
    """``" with repeat=4"`` for a calibration with more runs than the default, else ``""``."""
    n = job["calibration_repeat"]
    return f" with `repeat={n}`" if n > 1 else ""


def _host_steal(cm: dict[str, Any]) -> str:
    """``", host steal 0.3% of the CPU time"``: the calibration's, as its source names it."""
    found = re.search(r"host steal ([0-9.]+%)", str(cm.get("source", "")))
    return f", host steal {found.group(1)} of the CPU time" if found else ""


def _in_step(cm: dict[str, Any]) -> str:
    """``", in-step factors: ..."``: the factors the calibration's source names, if any."""
    source = str(cm.get("source", ""))
    marker = "in-step factors: "
    return ", " + source[source.index(marker) :] if marker in source else ""


def _tracker_mark(row: dict[str, Any]) -> str:
    """`` †`` where the peak was measured under MemTracker (a plan with grouped modules)."""
    return "" if row.get("peak_tracker", "FSDPMemTracker") == "FSDPMemTracker" else " †"


def _plan_table(rows: list[dict[str, Any]], cuda: bool) -> str:
    header = [
        "plan",
        "groups",
        "prefetch",
        "not resharded",
        "predicted step (ms)",
        "measured step (ms): median [p25, p75]",
        "error",
        "predicted peak",
        "measured peak (tracker)",
        "error",
    ]
    if cuda:
        header.append("max_memory_allocated")
    header.append("last loss")
    out = []
    for r in rows:
        row = [
            r["name"],
            r["groups"],
            r["prefetch"],
            r["kept"],
            f"{r['predicted_s'] * 1e3:.1f}",
            _with_spread(r),
            f"{(r['predicted_s'] / r['measured_s'] - 1) * 100:+.1f}%",
            fmt_bytes(r["predicted_peak"]),
            fmt_bytes(r["measured_peak"]) + _tracker_mark(r),
            f"{(r['predicted_peak'] / r['measured_peak'] - 1) * 100:+.1f}%",
        ]
        if cuda:
            row.append(fmt_bytes(r.get("cuda_peak") or 0))
        row.append(f"{r['loss']:.5f}")
        out.append(row)
    return markdown_table(header, out)


def _phase_table(rows: list[dict[str, Any]]) -> str:
    """Predicted vs measured forward, backward and optimizer time per plan (ms, error)."""
    header = ["plan"]
    for phase in PHASES:
        header += [f"{phase}: predicted / measured (ms)", "error"]
    out = []
    for r in rows:
        row = [r["name"]]
        for phase in PHASES:
            pred, meas = r["predicted_phases_s"][phase], r["measured_phases_s"][phase]
            error = f"{(pred / meas - 1) * 100:+.0f}%" if meas > 0 else "-"
            row += [f"{pred * 1e3:.1f} / {meas * 1e3:.1f}", error]
        out.append(row)
    return markdown_table(header, out)


def _claims_table(per_model: dict[str, dict[str, Any]]) -> str:
    header = [
        "model",
        "Spearman (>= 0.9)",
        "median abs. error (<= 10%)",
        "auto / best of grid (<= 1.03x)",
        "auto / per-block",
        "auto / always-wrap",
        "peak within 10% of tracker (>= 3 plans)",
        "budget: measured peak / budget (<= 1)",
        "step-time spread (IQR / median, median over plans)",
        "measured vs itself: Spearman of odd vs even steps",
        "host steal during the timed steps; steps without steal per plan",
        "machine during the steps / at the calibration (speed probe)",
        "all met",
    ]
    rows = []
    for name, c in per_model.items():
        rows.append(
            [
                name,
                f"{c['spearman']:.3f}",
                f"{c['median_abs_error'] * 100:.1f}%",
                f"{fmt_ratio(c['auto_vs_best'])} ({c['best_name']})",
                fmt_ratio(c["auto_vs_per_block"]),
                fmt_ratio(c["auto_vs_always"]),
                f"{c['memory_within']} of {c['plans']}",
                f"{fmt_bytes(c['budget_peak'])} / {fmt_bytes(c['budget'])} = "
                f"{c['budget_peak'] / c['budget']:.3f}",
                f"{c['spread'] * 100:.1f}%",
                f"{c['split_half']:.3f}",
                f"{c['steal'] * 100:.1f}%; {c['clean_steps']}",
                describe(c["drift"]),
                "yes" if c["all_met"] else "no",
            ]
        )
    return markdown_table(header, rows)


def _planning_time(quick: bool) -> tuple[str, dict[str, Any]]:
    """Time ``plan_wrap(..., bucket_numel="auto")`` on a Llama-70B-shaped model on the
    meta device (this process, no ranks): 80 layers (quick: 8), dim 8192, 64 heads,
    MLP 28672, vocab 128256, one sequence of 256 tokens, compute estimated with the
    cost model's rates (``record_execution_order(..., timing=cm.compute)``), the
    ``h100-ib-400g`` preset for 64 ranks, an 80 GiB budget; median of 3 runs."""
    from execwrap import ModuleWrapPolicy, plan_wrap
    from execwrap.cost import CostModel
    from execwrap.demo_models import Llama, LlamaBlock, LlamaConfig
    from tracing import record_execution_order

    layers = 8 if quick else 80
    cm = CostModel.preset("h100-ib-400g", world_size=64)
    with torch.device("meta"):
        config = LlamaConfig(
            dim=8192, n_heads=64, n_layers=layers, mlp_hidden=28672, vocab_size=128256
        )
        model = Llama(config)
        tokens = torch.zeros(1, 256, dtype=torch.long)
    t0 = time.perf_counter()
    order = record_execution_order(model, tokens, timing=cm.compute)
    capture_s = time.perf_counter() - t0
    seconds = []
    plan: Any = None
    for _ in range(3):
        t0 = time.perf_counter()
        plan = plan_wrap(
            model,
            order,
            ModuleWrapPolicy({LlamaBlock}),
            bucket_numel="auto",
            cost_model=cm,
            memory_budget=80 * 2**30,
        )
        seconds.append(time.perf_counter() - t0)
    n_params = sum(p.numel() for p in model.parameters())
    row = {
        "layers": layers,
        "params": n_params,
        "capture_s": capture_s,
        "plan_s": median(seconds),
        "candidates": len(plan.search.candidates),
        "chosen": plan.search.best.label,
        "step_s": plan.estimate.step_time_s,
        "peak": plan.estimate.peak_memory_bytes,
    }
    table = markdown_table(
        [
            "layers",
            "parameters",
            "runtime capture on meta, estimated compute (s)",
            "plan_wrap(bucket_numel='auto') (s, median of 3; target < 2 at 80)",
            "candidates simulated",
            "chosen",
            "predicted step",
            "predicted peak / rank",
        ],
        [
            [
                layers,
                f"{n_params / 1e9:.1f}e9",
                f"{capture_s:.2f}",
                f"{row['plan_s']:.2f}",
                row["candidates"],
                row["chosen"],
                f"{row['step_s']:.2f} s",
                fmt_bytes(row["peak"]),
            ]
        ],
    )
    return table, row


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints the tables and writes a dated result."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 40)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed rounds (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument(
        "--calibration-repeat",
        type=int,
        default=1,
        metavar="N",
        help="CostModel.calibrate(repeat=N): N times as many calibration runs (default 1)",
    )
    parser.add_argument(
        "--calibrate-per-model",
        action="store_true",
        help="calibrate again before each model after the first (on a machine whose speed "
        "drifts, the cost model then describes the minutes the model's steps run in)",
    )
    parser.add_argument(
        "--cost-model",
        metavar="FILE",
        default=None,
        help="predict with this saved cost model (CostModel.load; e.g. a run's "
        "<result>.cost.json) instead of calibrating in this run",
    )
    parser.add_argument(
        "--paired",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before each timed step, one untimed step of the same plan, so that the "
        "allocator holds what the plan's own previous step left, as in a training loop "
        "(default; --no-paired: every step timed, after another plan's)",
    )
    args = parser.parse_args(argv)
    if args.calibration_repeat < 1:
        parser.error(f"--calibration-repeat must be >= 1, got {args.calibration_repeat}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        parser.error(f"--models: unknown {unknown}; choose from {','.join(MODELS)}")
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        parser.error(
            f"--device cuda needs {args.world_size} GPUs (--world-size); "
            f"found {torch.cuda.device_count()}"
        )
    saved = _saved_cost_model(parser, args)
    quick = args.quick
    job = {
        "device": args.device,
        "models": models,
        "sizes": {m: (MODELS[m].quick if quick else MODELS[m].full) for m in models},
        "plans": [p.name for p in grid()],
        "steps": args.steps or (2 if quick else 40),
        "warmup": args.warmup if args.warmup is not None else (1 if quick else 3),
        "threads": args.threads,
        "quick": quick,
        "calibration_repeat": args.calibration_repeat,
        "paired": args.paired,
        "calibrate_per_model": args.calibrate_per_model,
        "cost_model": saved,
        "timeout_s": 900,
    }
    result = spawn(job, args.world_size)
    cuda = args.device == "cuda"
    sections = []
    per_model: dict[str, dict[str, Any]] = {}
    for name in models:
        rows = result["models"][name]
        per_model[name] = claims(rows)
        per_model[name]["steal"] = steal_share(rows, psutil.cpu_count() or 1)
        clean = [r["clean_steps"] for r in rows]
        per_model[name]["clean_steps"] = f"{min(clean)}-{max(clean)} of {job['steps']}"
        per_model[name]["drift"] = result["drift"][name]
        size = ", ".join(f"{k} {v}" for k, v in job["sizes"][name].items())
        sections.append(
            f"### {name}: {MODELS[name].description} ({size})\n\n"
            + _plan_table(rows, cuda)
            + _own_calibration(result["model_costs"].get(name))
            + f"\n\nbudget of the budgeted auto plan: {fmt_bytes(per_model[name]['budget'])}"
            + "\n\nWhere the time goes: each phase predicted (`StepEstimate.phase_times_s()`) "
            "and measured (median over the same steps; each step's phases those of its "
            "slowest rank)\n\n" + _phase_table(rows)
        )
    planning_table, _ = _planning_time(quick)
    table = (
        _claims_table(per_model)
        + "\n\n"
        + "\n\n".join(sections)
        + "\n\n### Planning time: Llama-70B shape on the meta device, 64 ranks (h100-ib-400g "
        + "preset)\n\n"
        + planning_table
    )
    cm = result["cost_model"]
    backend = (
        "NCCL, one GPU per rank" if cuda else f"gloo on CPU, {job['threads']} thread(s) per rank"
    )
    note = (
        f"{args.world_size} ranks, {backend}. {_calibration(args.cost_model, result, job)} "
        "(overlap "
        f"{cm['overlap']:.2f}, fixed "
        f"cost per collective {cm['group_overhead_s'] * 1e6:.0f} µs per group + "
        f"{cm.get('param_overhead_s', 0.0) * 1e6:.1f} µs per parameter tensor, large copies "
        f"{cm['copy_bytes_per_s'] / 1e9:.2f} GB/s{_in_step(cm)}). Orders with compute times from "
        "`record_execution_order(..., timing=True)` after warm-up steps (rank 0's, broadcast). "
        "Plans take turns step by step (order shuffled per round"
        f"{'; each turn an untimed step, then the timed one of the same plan' if job['paired'] else ''}"
        "); step time = slowest rank, "
        f"median of the {job['steps']} timed "
        f"steps after {job['warmup']} warm-up rounds, over those during which the host gave none "
        "of this machine's CPU time to other guests (no steal, `execwrap.cost.host`) when they "
        "are at least half, else over all, with the quartiles of those steps in brackets "
        "(the spread column: how large a difference between plans is noise); the plans' medians "
        "over the odd-numbered steps ranked against those over the even-numbered ones give "
        "the run's agreement with itself (what the Spearman of predictions can be judged against); AdamW. "
        "Speed probe (`benchmarks/_autoplan_drift.py`): a fixed workload (matmuls, 400 "
        "small ops, a 2 MiB all-gather) timed 15 times right after the calibration and once "
        "per round of timed steps; each part's median during a model's steps over its median "
        "at the calibration the model was predicted with (> 1x: the machine ran slower than "
        "when it was calibrated; it changes no prediction). "
        "Peak memory: one step under "
        "`FSDPMemTracker` (max over ranks); † under torch's generic `MemTracker` (the same "
        "accounting of tensors), for plans with a group of several modules, which "
        "FSDPMemTracker breaks (it reshards and all-gathers such a group again after each "
        "of its modules). Predicted: `execwrap.simulate_step` (the auto "
        "plans: their own `plan.estimate`). Equal last losses show every plan trains the "
        "same model.\n"
    )
    path = publish("autoplan", note, table, args)
    if path is not None:
        _save_cost_model(cm, path)
        for name, own in result["model_costs"].items():
            _save_cost_model(own["cost_model"], path, f".{name}")
    draw_for_result(path, args.out)  # the charts of docs/benchmarks/autoplan.md
    return 0


def _saved_cost_model(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """``--cost-model``'s model as a dict (``None`` without it); a file that does not load,
    or a model of another world size, device type or with ``--calibrate-per-model``, is an
    argument error."""
    if args.cost_model is None:
        return None
    from execwrap.cost import CostModel

    if args.calibrate_per_model:
        parser.error("--cost-model and --calibrate-per-model exclude each other")
    try:
        cm = CostModel.load(args.cost_model)
    except (OSError, ValueError) as e:
        parser.error(f"--cost-model {args.cost_model}: {e}")
    if (cm.world_size, cm.device_type) != (args.world_size, args.device):
        parser.error(
            f"--cost-model {args.cost_model} describes {cm.world_size} {cm.device_type} "
            f"ranks; this run has {args.world_size} {args.device} ranks"
        )
    return cm.to_dict()


def _calibration(saved: str | None, result: dict[str, Any], job: dict[str, Any]) -> str:
    """Where the run's cost model came from, for the note."""
    if saved is not None:
        return f"Cost model loaded from `{saved}` (`--cost-model`; not calibrated in this run)"
    return (
        "Cost model calibrated in this run on the same process group in "
        f"{result['calibrate_s']:.1f} s{_repeat(job)}{_host_steal(result['cost_model'])}"
    )


def _own_calibration(own: dict[str, Any] | None) -> str:
    """The line under a model's table naming the calibration made just before it (``""``
    when the model used the run's first one)."""
    if own is None:
        return ""
    cm = own["cost_model"]
    return (
        f"\n\nCalibrated again just before this model (`--calibrate-per-model`) in "
        f"{own['calibrate_s']:.1f} s{_host_steal(cm)}: fixed cost per collective "
        f"{cm['group_overhead_s'] * 1e6:.0f} µs per group, large copies "
        f"{cm['copy_bytes_per_s'] / 1e9:.2f} GB/s{_in_step(cm)}."
    )


def _save_cost_model(data: dict[str, Any], result: Path, model: str = "") -> None:
    """Write a calibrated cost model of the run beside its result (``<result>.cost.json``;
    a model's own, ``<result>.<model>.cost.json``; ``CostModel.save``), so that the run's
    plans can be re-predicted later from it."""
    from execwrap.cost import CostModel

    target = result.with_suffix(f"{model}.cost.json")
    CostModel.from_dict(data).save(target)
    print(f"wrote {target}")


if __name__ == "__main__":
    raise SystemExit(main())
