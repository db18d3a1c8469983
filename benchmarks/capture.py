"""Symbolic capture cost: ``trace_execution_order`` vs a bare fx trace vs torch's tracer.

For GPT-style models (``execwrap.demo_models.GPT``, GPT-2-small width: dim 768,
12 heads, vocab 50257) with 12, 48 and 192 blocks, built on the meta device
(no weight memory, same graph), times three ways of tracing the same model,
interleaved round by round (the first variant rotates), medians (and, for
the ratio to the bare trace, minima) of the repeats:

* ``bare``: ``torch.fx.Tracer().trace(model)``, the floor any fx-based capture
  pays;
* ``execwrap``: ``tracing.trace_execution_order(model, TracingConfig())``
  (the same trace plus recording module calls and parameter uses);
* ``torch``: torch's private ``torch.distributed.fsdp._trace_utils._ExecOrderTracer``
  (the 2022 ``ParamExecOrderWrapPolicy`` tracer) through its
  ``patch_tracer(tracer, root_module)`` context manager around
  ``tracer.trace(model)``, when the installed torch still has it.

Each call gets a fresh ``torch.fx.Tracer``; ``gc.collect()`` runs untimed
before every call. Targets: execwrap <= 1.10x bare, and <= 1.00x torch.

Three ratios to the bare trace are given: of the medians of wall time, of
the medians of process CPU time, and of the minima of process CPU time. On a
loaded machine the medians move by a few percent from run to run (other
processes take the core and the caches in the middle of a call); the minimum
over many interleaved rounds is the call that ran least disturbed, the
closest a shared machine gets to the work itself.

Usage::

    python -m benchmarks.capture            # 12, 48, 192 blocks
    python -m benchmarks.capture --quick    # 12 blocks, few repeats (< 30 s)
    python benchmarks/capture.py --blocks 12 48 --repeats 9
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.fx

from benchmarks._bench import (
    add_output_args,
    fmt_ratio,
    interleaved,
    markdown_table,
    median,
    publish,
)
from execwrap.demo_models import GPT, GPTConfig
from tracing import TracingConfig, trace_execution_order

__all__ = ["build_gpt", "main", "run", "torch_exec_order_tracer"]

TARGET_VS_BARE = 1.10
TARGET_VS_TORCH = 1.00


def build_gpt(n_blocks: int) -> GPT:
    """GPT-2-small-wide GPT with ``n_blocks`` blocks, on the meta device."""
    with torch.device("meta"):
        return GPT(
            GPTConfig(vocab_size=50257, max_seq_len=1024, dim=768, n_heads=12, n_blocks=n_blocks)
        )


def torch_exec_order_tracer() -> type | None:
    """torch's private ``_ExecOrderTracer`` class, or ``None`` if this torch lacks it."""
    try:
        from torch.distributed.fsdp._trace_utils import _ExecOrderTracer
    except ImportError:
        return None
    if not hasattr(_ExecOrderTracer, "patch_tracer"):
        return None
    return _ExecOrderTracer


def _variants(model: torch.nn.Module) -> dict[str, Callable[[], Any]]:
    def bare() -> Any:
        return torch.fx.Tracer().trace(model)

    def execwrap() -> Any:
        return trace_execution_order(model, TracingConfig())

    variants: dict[str, Callable[[], Any]] = {"bare": bare, "execwrap": execwrap}
    exec_order_tracer = torch_exec_order_tracer()
    if exec_order_tracer is not None:

        def torch_tracer() -> Any:
            recorder = exec_order_tracer()
            tracer = torch.fx.Tracer()
            with recorder.patch_tracer(tracer, model):
                tracer.trace(model)
            return recorder.exec_info

        variants["torch"] = torch_tracer
    return variants


def run(*, n_blocks: int, repeats: int, warmup: int) -> dict[str, Any]:
    """Time the variants on one model size; return medians (s), counts and ratios."""
    model = build_gpt(n_blocks)
    order = trace_execution_order(model)
    variants = _variants(model)
    times = interleaved(variants, repeats=repeats, warmup=warmup, before=lambda _: gc.collect())
    med = {name: median(ts) for name, ts in times.wall.items()}
    cpu = {name: median(ts) for name, ts in times.cpu.items()}
    out: dict[str, Any] = {
        "blocks": n_blocks,
        "modules": len(dict(model.named_modules())),
        "calls": len(order.module_forward_order),
        "repeats": repeats,
        **{f"{k}_s": v for k, v in med.items()},
        "vs_bare": med["execwrap"] / med["bare"],
        "vs_bare_cpu": cpu["execwrap"] / cpu["bare"],
        "vs_bare_min_cpu": min(times.cpu["execwrap"]) / min(times.cpu["bare"]),
    }
    if "torch" in med:
        out["vs_torch"] = med["execwrap"] / med["torch"]
        out["vs_torch_cpu"] = cpu["execwrap"] / cpu["torch"]
        out["torch_vs_bare"] = med["torch"] / med["bare"]
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    has_torch = "torch_s" in rows[0]
    header = ["GPT blocks", "modules", "repeats", "bare fx (ms)", "execwrap (ms)"]
    if has_torch:
        header += ["torch _ExecOrderTracer (ms)"]
    header += [
        f"execwrap / bare (<= {TARGET_VS_BARE}x)",
        "same, CPU time",
        "same, min CPU time",
    ]
    if has_torch:
        header += [
            "torch / bare",
            f"execwrap / torch (<= {TARGET_VS_TORCH:.2f}x)",
            "same, CPU time",
        ]
    table_rows = []
    for r in rows:
        row: list[Any] = [
            r["blocks"],
            r["modules"],
            r["repeats"],
            f"{r['bare_s'] * 1e3:.1f}",
            f"{r['execwrap_s'] * 1e3:.1f}",
        ]
        if has_torch:
            row.append(f"{r['torch_s'] * 1e3:.1f}")
        row += [
            fmt_ratio(r["vs_bare"]),
            fmt_ratio(r["vs_bare_cpu"]),
            fmt_ratio(r["vs_bare_min_cpu"]),
        ]
        if has_torch:
            row += [
                fmt_ratio(r["torch_vs_bare"]),
                fmt_ratio(r["vs_torch"]),
                fmt_ratio(r["vs_torch_cpu"]),
            ]
        table_rows.append(row)
    return markdown_table(header, table_rows)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints a table and writes a dated result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--blocks", type=int, nargs="+", default=None)
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    sizes = args.blocks or ([12] if args.quick else [12, 48, 192])
    rows = []
    for n in sizes:
        repeats = args.repeats or (5 if args.quick else (31 if n <= 12 else 21 if n <= 48 else 15))
        rows.append(run(n_blocks=n, repeats=repeats, warmup=1))
        print(f"  {n} blocks done", flush=True)
    table = _table(rows)
    torch_note = (
        "torch's `_ExecOrderTracer` is present in this torch and timed."
        if torch_exec_order_tracer() is not None
        else "torch's `_ExecOrderTracer` is absent from this torch; its column is left out."
    )
    note = (
        "Symbolic capture of `execwrap.demo_models.GPT` (dim 768, 12 heads, vocab 50257, tied, "
        "built on the meta device): a bare `torch.fx.Tracer().trace`, "
        "`tracing.trace_execution_order`, and torch's private `_ExecOrderTracer` "
        "(`patch_tracer` + `trace`), interleaved round by round, fresh tracer per call, "
        "`gc.collect()` untimed before each call, medians of wall time (ratios also from "
        "medians of process CPU time, which other processes on the machine inflate less, "
        "and from minima of process CPU time: the least disturbed call of each). "
        + torch_note
        + "\n"
    )
    publish("capture", note, table, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
