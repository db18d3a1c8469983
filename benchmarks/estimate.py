"""Estimated compute (meta device, roofline per op) vs measured compute, per FSDP unit.

For each model, the same step (forward, cross-entropy loss, backward) is
captured twice in one process: measured on CPU (``record_execution_order(...,
timing=True)``: the median of three timed steps after a warm-up) and estimated
on a meta copy of the model (``timing=rates``, the roofline of
:mod:`tracing.runtime.estimate`) with rates measured in this process
(:func:`execwrap.cost.calibrate.measure_compute_rates`). Both are split per
unit of a block-level plan (:func:`execwrap.unit_compute`) and compared:
estimated / measured forward and backward time of the whole step, and the
median absolute error per unit. Rounds alternate measured and estimated
captures so drift hits both; the table reports the median over rounds.

torch's own ``RuntimeEstimator`` is tried first in its roofline mode; on a
CPU-only torch 2.13 it refuses (it reads CUDA device capabilities), which the
notes record.

Usage::

    python -m benchmarks.estimate            # 4 models
    python -m benchmarks.estimate --quick    # one small model (< 30 s)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmarks._bench import add_output_args, markdown_table, publish
from benchmarks.charts import draw_for_result
from execwrap import ModuleWrapPolicy, plan_wrap, unit_compute
from execwrap.cost.calibrate import measure_compute_rates
from execwrap.demo_models import GPT, Block, GPTConfig, Llama, LlamaBlock, LlamaConfig
from tracing import record_execution_order
from tracing.rates import ComputeRates

__all__ = ["MODELS", "main", "run_model"]

#: name -> (factory, block class, batch, seq, vocab)
MODELS: dict[str, tuple[Callable[[], nn.Module], type[nn.Module], int, int, int]] = {
    "GPT 8x256": (
        lambda: GPT(GPTConfig(vocab_size=2048, max_seq_len=128, dim=256, n_heads=8, n_blocks=8)),
        Block,
        2,
        128,
        2048,
    ),
    "GPT 4x512": (
        lambda: GPT(GPTConfig(vocab_size=2048, max_seq_len=128, dim=512, n_heads=8, n_blocks=4)),
        Block,
        2,
        128,
        2048,
    ),
    "GPT 12x128, batch 8": (
        lambda: GPT(GPTConfig(vocab_size=1024, max_seq_len=64, dim=128, n_heads=4, n_blocks=12)),
        Block,
        8,
        64,
        1024,
    ),
    "Llama 4x256": (
        lambda: Llama(LlamaConfig(vocab_size=2048, dim=256, n_heads=8, n_layers=4, mlp_hidden=704)),
        LlamaBlock,
        2,
        128,
        2048,
    ),
}
QUICK = {"GPT 2x64": (lambda: GPT(GPTConfig(n_blocks=2)), Block, 2, 32, 256)}


_PROBE = """
import torch, torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.runtime_estimator import RuntimeEstimator
with FakeTensorMode():
    lin, x = nn.Linear(8, 8), torch.randn(2, 8)
    try:
        with RuntimeEstimator()("operator-level-cost-model"):
            lin(x)
    except Exception as e:
        print("raised", type(e).__name__, e)
    else:
        print("ran")
"""


def _runtime_estimator_note() -> str:
    """What torch's RuntimeEstimator (roofline mode) does here, probed in a child process
    (on a CPU-only torch 2.13 its CUDA assertion, raised inside the dispatcher under
    FakeTensorMode, aborts the process)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=120
    )
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode == 0:
        return f"torch's `RuntimeEstimator` roofline mode here: {last}."
    err = " ".join(proc.stderr.strip().splitlines()[:2])
    return (
        f"torch's `RuntimeEstimator` roofline mode here: the process died (exit "
        f"{proc.returncode}: `{err}`): its CUDA assertion is raised inside the dispatcher "
        "under FakeTensorMode."
    )


def run_model(name: str, spec: tuple[Any, ...], rates: ComputeRates, rounds: int) -> dict[str, Any]:
    """Measured vs estimated forward/backward seconds of one model (medians over rounds)."""
    factory, block, batch, seq, vocab = spec
    torch.manual_seed(0)
    model = factory()
    with torch.device("meta"):
        meta = factory()
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, vocab, (batch, seq), generator=g)
    tgt = torch.randint(0, vocab, (batch, seq), generator=g)

    def loss(out: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.flatten(0, 1), tgt.to(out.device).flatten())

    rows: list[dict[str, Any]] = []
    for _ in range(rounds):
        measured = record_execution_order(model, idx, loss_fn=loss, timing=True)
        estimated = record_execution_order(meta, idx.to("meta"), loss_fn=loss, timing=rates)
        pm = unit_compute(plan_wrap(model, measured, ModuleWrapPolicy({block})))
        pe = unit_compute(plan_wrap(meta, estimated, ModuleWrapPolicy({block})))
        per_unit = [
            abs((fe + be) / (fm + bm) - 1)
            for fm, bm, fe, be in zip(
                pm.forward_s, pm.backward_s, pe.forward_s, pe.backward_s, strict=True
            )
            if fm + bm > 0
        ]
        rows.append(
            {
                "fwd_m": sum(pm.forward_s),
                "bwd_m": sum(pm.backward_s),
                "fwd_e": sum(pe.forward_s),
                "bwd_e": sum(pe.backward_s),
                "unit_err": statistics.median(per_unit),
                "units": len(pm.forward_s),
            }
        )
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out["params"] = sum(p.numel() for p in model.parameters())
    out["name"] = name
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints a table and writes a dated result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--rounds", type=int, default=None, help="captures per model (3; quick: 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds = args.rounds or (1 if args.quick else 3)
    rates = measure_compute_rates("cpu")
    results = [run_model(n, s, rates, rounds) for n, s in (QUICK if args.quick else MODELS).items()]
    header = [
        "model",
        "params",
        "units",
        "forward measured (ms)",
        "forward estimated (ms)",
        "ratio",
        "backward measured (ms)",
        "backward estimated (ms)",
        "ratio",
        "step ratio",
        "median abs error per unit",
    ]
    table_rows = []
    for r in results:
        step = (r["fwd_e"] + r["bwd_e"]) / (r["fwd_m"] + r["bwd_m"])
        table_rows.append(
            [
                r["name"],
                f"{r['params'] / 1e6:.2f}M",
                int(r["units"]),
                f"{r['fwd_m'] * 1e3:.1f}",
                f"{r['fwd_e'] * 1e3:.1f}",
                f"{r['fwd_e'] / r['fwd_m']:.2f}x",
                f"{r['bwd_m'] * 1e3:.1f}",
                f"{r['bwd_e'] * 1e3:.1f}",
                f"{r['bwd_e'] / r['bwd_m']:.2f}x",
                f"{step:.2f}x",
                f"{r['unit_err'] * 100:.0f}%",
            ]
        )
    table = markdown_table(header, table_rows)
    note = (
        f"One step (forward, cross-entropy, backward) on CPU, {args.threads} intra-op thread(s): "
        "measured with `record_execution_order(timing=True)` (median of 3 timed steps) vs "
        "estimated on a meta copy with `timing=rates` (roofline per aten op: max(FLOPs / "
        "matmul rate, bytes / memory traffic rate) + a fixed cost per op). Rates measured in "
        f"this process: matmul {rates.flops_per_s / 1e9:.1f} GFLOP/s, memory traffic "
        f"{rates.memory_bytes_per_s / 1e9:.1f} GB/s, {rates.op_overhead_s * 1e6:.2f} us per op. "
        f"Units: the block-level plan's (root, then one per block). Medians over {rounds} "
        f"round(s), measured and estimated alternating. {_runtime_estimator_note()}\n"
    )
    path = publish("estimate", note, table, args)
    draw_for_result(path, args.out)  # the chart of docs/benchmarks/estimate.md
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
