"""Joint planning time: the 80-layer Llama-70B shape planned with the joint auto-planner.

Issue 31 asks that planning the 80-layer Llama-70B shape on the meta device with the
joint search (groups, prefetch, resharding, checkpointing per group, offload and the
accumulation mode chosen together) take under 2 s. In one process:

1. ``execwrap.demo_models.Llama`` at Llama-3-70B widths (dim 8192, 64 heads, MLP 28672,
   vocab 128256; ``--layers``, default 80) built under ``torch.device("meta")`` in
   bfloat16;
2. its order recorded on the meta device with estimated compute
   (``record_execution_order(model, tokens, timing=cm.compute)``, tokens of shape
   (1, ``--seq``)) on the ``h100-nvlink-8`` preset (not timed here: capture is
   ``benchmarks/scale.py``'s);
3. side by side, in turns, ``--repeats`` times each (after an untimed ``gc.collect()``):
   ``plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock}), bucket_numel="auto",
   cost_model=cm, training=TrainingStep(micro_batches=--micro-batches))`` with
   ``choose=()`` (groups, prefetch and resharding only: the auto-planner before the
   joint search) and with the default ``choose`` (the joint search), each within the
   preset's device memory less the reserve (no ``memory_budget``).

Printed: wall seconds (``time.perf_counter``) and the process's CPU seconds
(``time.process_time``: what a busy machine does not inflate), medians, the joint
search's ratio to the groups-only search, the candidates simulated and the plan each
chose.

Usage::

    python -m benchmarks.joint_plan              # 80 layers, 3 repeats
    python -m benchmarks.joint_plan --quick      # 8 layers, one repeat
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._bench import add_output_args, fmt_bytes, fmt_ratio, markdown_table, median, publish

__all__ = ["main"]

#: Llama-3-70B's widths (as ``benchmarks/scale.py``).
LLAMA_70B = {"dim": 8192, "n_heads": 64, "mlp_hidden": 28672, "vocab_size": 128256}
#: Issue 31's target for the joint search at 80 layers, in seconds.
TARGET_SECONDS = 2.0


def _plan(model: Any, order: Any, cm: Any, step: Any, choose: Any) -> tuple[float, float, Any]:
    """Wall and CPU seconds of one search, and its plan (or the refusal: a search that
    finds nothing within the budget has searched all the same)."""
    from execwrap import MemoryBudgetError, ModuleWrapPolicy, plan_wrap
    from execwrap.demo_models import LlamaBlock

    gc.collect()  # untimed
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        plan: Any = plan_wrap(
            model,
            order,
            ModuleWrapPolicy({LlamaBlock}),
            bucket_numel="auto",
            cost_model=cm,
            training=step,
            choose=choose,
        )
    except MemoryBudgetError as e:
        plan = e
    return time.perf_counter() - wall, time.process_time() - cpu, plan


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints the table and writes a dated result."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--layers", type=int, default=None, help="Llama layers (default 80)")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length (default 4096)")
    parser.add_argument("--micro-batches", type=int, default=4, help="per step (default 4)")
    parser.add_argument("--repeats", type=int, default=None, help="runs each (default 3)")
    args = parser.parse_args(argv)
    layers = args.layers or (8 if args.quick else 80)
    repeats = args.repeats or (1 if args.quick else 3)

    import torch

    from execwrap import CostModel, TrainingStep
    from execwrap.demo_models import Llama, LlamaConfig
    from tracing import record_execution_order

    cm = CostModel.preset("h100-nvlink-8")
    with torch.device("meta"):
        model = Llama(LlamaConfig(n_layers=layers, **LLAMA_70B)).to(torch.bfloat16)
        tokens = torch.zeros(1, args.seq, dtype=torch.long)
    order = record_execution_order(model, tokens, timing=cm.compute)
    step = TrainingStep(micro_batches=args.micro_batches)
    searches = {"groups only (choose=())": (), "joint (default choose)": None}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in searches}
    plans: dict[str, Any] = {}
    for _ in range(repeats):  # in turns, so both see the same load
        for name, choose in searches.items():
            wall, cpu, plans[name] = _plan(model, order, cm, step, choose)
            runs[name].append((wall, cpu))
    rows = []
    base_wall = median([w for w, _ in runs["groups only (choose=())"]])
    for name, times in runs.items():
        plan = plans[name]
        wall, cpu = median([w for w, _ in times]), median([c for _, c in times])
        if isinstance(plan, Exception):  # refused: what it says instead of a plan
            found = str(plan).split(": the smallest peak any candidate reaches is ")[-1]
            chosen = [f"none fits: smallest peak {found.split(' (')[0]}", "-", "-", "-"]
        else:
            chosen = [
                len(plan.search.candidates),
                plan.search.best.label,
                f"{plan.estimate.step_time_s:.3f}",
                fmt_bytes(int(plan.estimate.peak_memory_bytes)),
            ]
        rows.append([name, f"{wall:.3f}", f"{cpu:.3f}", fmt_ratio(wall / base_wall), *chosen])
    header = [
        "search",
        f"wall (s) (target < {TARGET_SECONDS:.0f} at 80 layers)",
        "CPU (s)",
        "wall / groups only",
        "candidates",
        "chosen",
        "predicted step (s)",
        "predicted peak per rank",
    ]
    params = sum(p.numel() for p in model.parameters())
    note = (
        f"`execwrap.demo_models.Llama` at Llama-3-70B widths, {layers} layers "
        f"({params / 1e9:.1f}e9 parameters), bfloat16 on the meta device, sequence "
        f"{args.seq}, {args.micro_batches} micro-batches per step, preset h100-nvlink-8 "
        "(8 ranks), within the device's memory less the reserve. Medians of "
        f"{repeats} run(s) each, in turns; wall and process CPU seconds of `plan_wrap`.\n"
    )
    publish("joint_plan", note, markdown_table(header, rows), args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
