"""Order-drift monitor overhead: a training step with and without ``execwrap.OrderMonitor``.

Runs ``execwrap.demo_models.GPT`` (24 blocks by default) on CPU: one step is a
forward, a sum loss and a backward. The monitored step runs with an
``OrderMonitor(model, order)`` attached (its forward pre-hook on every module
hashes the call sequence and compares it with the captured order); the plain
step runs on the same model with no hooks, and a third variant puts a no-op
forward pre-hook on every module (what any hook costs in torch's module
call path, the floor for the monitor). Attaching and removing the monitor
happen outside the timed region (in training it is attached once), so the
ratio is the per-step cost of the hooks alone. The variants take
turns (the first one rotates each round), on one torch thread by default; medians of the repeats.
Target: ratio <= 1.02.

Usage::

    python -m benchmarks.monitor_overhead            # full run
    python -m benchmarks.monitor_overhead --quick    # < 30 s
    python benchmarks/monitor_overhead.py --blocks 24 --dim 256 --seq 128
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from benchmarks._bench import (
    add_output_args,
    fmt_ratio,
    interleaved,
    markdown_table,
    median,
    publish,
)
from execwrap import OrderMonitor
from execwrap.demo_models import GPT, GPTConfig
from tracing import trace_execution_order

__all__ = ["main", "run"]

TARGET_RATIO = 1.02


def run(
    *, blocks: int, dim: int, heads: int, batch: int, seq: int, repeats: int, warmup: int
) -> dict[str, Any]:
    """Time plain vs monitored steps, interleaved; return medians (s), ratios, events."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_blocks=blocks, dim=dim, n_heads=heads, max_seq_len=seq))
    idx = torch.randint(0, model.config.vocab_size, (batch, seq))
    order = trace_execution_order(model)
    monitors: list[OrderMonitor] = []
    noop_handles: list[torch.utils.hooks.RemovableHandle] = []

    def step() -> None:
        model(idx).sum().backward()
        model.zero_grad(set_to_none=True)

    def noop_hook(module: torch.nn.Module, args: Any) -> None:
        return None

    def attach(name: str) -> None:
        if name == "monitored":
            monitors.append(OrderMonitor(model, order))
        elif name == "noop-hooks":
            noop_handles.extend(m.register_forward_pre_hook(noop_hook) for m in model.modules())

    def detach(name: str) -> None:
        if name == "monitored":
            monitors[-1].remove()
        elif name == "noop-hooks":
            for handle in noop_handles:
                handle.remove()
            noop_handles.clear()

    # Every variant runs the same step; they differ only in the hooks that
    # attach/detach put on the model, untimed, around each call.
    timings = interleaved(
        {"plain": step, "monitored": step, "noop-hooks": step},
        repeats=repeats,
        warmup=warmup,
        before=attach,
        after=detach,
    )
    p, m = median(timings.wall["plain"]), median(timings.wall["monitored"])
    n = median(timings.wall["noop-hooks"])
    pc, mc = median(timings.cpu["plain"]), median(timings.cpu["monitored"])
    events = sum(len(mon.events) for mon in monitors)
    return {
        "plain_s": p,
        "monitored_s": m,
        "noop_s": n,
        "ratio": m / p,
        "ratio_cpu": mc / pc,
        "noop_ratio": n / p,
        "modules": len(dict(model.named_modules())),
        "monitored_steps": len(monitors),
        "events": events,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints a table and writes a dated result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--blocks", type=int, default=24)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=None, help="default 128 (quick: 32)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a busy machine, more threads stall "
        "at OpenMP barriers and swamp the difference being measured)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    repeats = args.repeats or (5 if args.quick else 31)
    args.seq = args.seq or (32 if args.quick else 128)
    warmup = 1 if args.quick else 3
    res = run(
        blocks=args.blocks,
        dim=args.dim,
        heads=args.heads,
        batch=args.batch,
        seq=args.seq,
        repeats=repeats,
        warmup=warmup,
    )
    shape = f"GPT {args.blocks} blocks ({res['modules']} modules), dim {args.dim}, batch {args.batch}x{args.seq}"
    table = markdown_table(
        [
            "model",
            "repeats",
            "plain fwd+bwd (ms)",
            "monitored fwd+bwd (ms)",
            f"ratio (target <= {TARGET_RATIO}x)",
            "ratio, CPU time",
            "no-op hooks / plain",
            "drift events",
        ],
        [
            [
                shape,
                repeats,
                f"{res['plain_s'] * 1e3:.1f}",
                f"{res['monitored_s'] * 1e3:.1f}",
                fmt_ratio(res["ratio"]),
                fmt_ratio(res["ratio_cpu"]),
                fmt_ratio(res["noop_ratio"]),
                res["events"],
            ]
        ],
    )
    note = (
        "One forward+backward (sum loss) of `execwrap.demo_models.GPT` on CPU, plain vs with an "
        "`execwrap.OrderMonitor` attached (attach/remove untimed), and with a no-op forward "
        "pre-hook on every module (the floor any per-module hook pays in "
        "`nn.Module._call_impl`), interleaved, medians of wall time (and of process CPU "
        f"time); {args.threads} torch thread(s). Drift events must be 0: the order never "
        "changes.\n"
    )
    publish("monitor_overhead", note, table, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
