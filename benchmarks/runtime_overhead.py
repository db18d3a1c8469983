"""Overhead of runtime order capture: one forward+backward recorded vs plain.

Runs ``execwrap.demo_models.GPT`` (24 blocks by default) on CPU, alternating a plain
step (forward, sum loss, backward), the same step under a
:class:`tracing.RuntimeRecorder`, and under ``RuntimeRecorder(model,
timing=True)`` (interleaved so drift hits all alike), and reports the medians
and their ratios. Target: the untimed recorder's ratio <= 1.15 (timing adds
its own hooks only when asked for, so it must not move that ratio).

Usage::

    python -m benchmarks.runtime_overhead            # full run
    python -m benchmarks.runtime_overhead --quick    # < 30 s
    python benchmarks/runtime_overhead.py --blocks 24 --dim 256 --seq 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks._bench import add_output_args, interleaved, markdown_table, median, publish
from execwrap.demo_models import GPT, GPTConfig
from tracing import RuntimeRecorder

__all__ = ["main", "run"]

TARGET_RATIO = 1.15


def _step(model: torch.nn.Module, idx: torch.Tensor) -> None:
    model(idx).sum().backward()
    model.zero_grad(set_to_none=True)


def run(
    *, blocks: int, dim: int, heads: int, batch: int, seq: int, repeats: int, warmup: int
) -> dict[str, float]:
    """Time plain vs recorded steps, interleaved; return medians (s) and ratios.

    Returns:
        ``plain_s``/``recorded_s`` (median wall seconds), ``ratio`` (their
        quotient), and the same for process CPU time (``*_cpu_s``,
        ``cpu_ratio``), which a machine shared with other jobs disturbs less.
    """
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_blocks=blocks, dim=dim, n_heads=heads, max_seq_len=seq))
    idx = torch.randint(0, model.config.vocab_size, (batch, seq))

    def recorded() -> None:
        # Installing and removing the recorder is part of the timed step.
        with RuntimeRecorder(model):
            _step(model, idx)

    def timed() -> None:
        with RuntimeRecorder(model, timing=True):
            _step(model, idx)

    # Rounds of the three; which variant goes first rotates from round to round.
    timings = interleaved(
        {"plain": lambda: _step(model, idx), "recorded": recorded, "timed": timed},
        repeats=repeats,
        warmup=warmup,
    )
    p, r, t = (median(timings.wall[k]) for k in ("plain", "recorded", "timed"))
    pc, rc, tc = (median(timings.cpu[k]) for k in ("plain", "recorded", "timed"))
    return {
        "plain_s": p,
        "recorded_s": r,
        "timed_s": t,
        "ratio": r / p,
        "timed_ratio": t / p,
        "plain_cpu_s": pc,
        "recorded_cpu_s": rc,
        "timed_cpu_s": tc,
        "cpu_ratio": rc / pc,
        "timed_cpu_ratio": tc / pc,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints a table and writes a dated result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--dim", type=int, default=256, help="hidden size")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128, help="sequence length")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (21; --quick: 5)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: stable on a shared machine; 0 = torch default)",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    repeats = args.repeats or (5 if args.quick else 21)
    warmup = 1 if args.quick else 2
    res = run(
        blocks=args.blocks,
        dim=args.dim,
        heads=args.heads,
        batch=args.batch,
        seq=args.seq,
        repeats=repeats,
        warmup=warmup,
    )
    shape = f"GPT {args.blocks} blocks, dim {args.dim}, batch {args.batch}x{args.seq}"
    table = markdown_table(
        [
            "model",
            "clock",
            "repeats",
            "plain fwd+bwd (ms)",
            "recorded fwd+bwd (ms)",
            "ratio",
            "target",
            "recorded with timing=True (ms)",
            "ratio",
        ],
        [
            [
                shape,
                clock,
                repeats,
                f"{res['plain' + suffix] * 1e3:.1f}",
                f"{res['recorded' + suffix] * 1e3:.1f}",
                f"{res[ratio]:.3f}x",
                f"<= {TARGET_RATIO}x",
                f"{res['timed' + suffix] * 1e3:.1f}",
                f"{res['timed_' + ratio]:.3f}x",
            ]
            for clock, suffix, ratio in (
                ("wall", "_s", "ratio"),
                ("process CPU", "_cpu_s", "cpu_ratio"),
            )
        ],
    )
    note = (
        "One forward+backward (sum loss) of `execwrap.demo_models.GPT` on CPU, plain vs under "
        "`tracing.RuntimeRecorder` (hooks + TorchFunctionMode + grad hooks, including "
        "install/remove) and under `RuntimeRecorder(model, timing=True)` (also clock reads per "
        "call, a multi-grad hook per call, saved-tensor hooks), interleaved, medians.\n"
    )
    publish("runtime_overhead", note, table, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
