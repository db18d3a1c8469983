"""FSDP2 training step: execwrap plan with prefetch vs per-block and always-wrap sharding.

Spawns ``--world-size`` ranks (default 2; gloo on CPU with one intra-op
thread per rank, or NCCL with ``--device cuda``, one GPU per rank) and trains
``execwrap.demo_models.GPT`` (24 blocks by default, sized so one step takes about a
second on one CPU thread) with AdamW, each rank on its own random batch.
Sharding variants, each its own model (same initial weights):

* ``execwrap``: ``plan_wrap(model, trace_execution_order(model),
  ModuleWrapPolicy({Block}))`` applied with ``apply_fully_shard(..., prefetch=1)``
  (explicit forward and backward prefetch from the captured order);
* ``execwrap-bucketed``: the same, bucketed in execution order to
  ``--bucket-blocks`` blocks per FSDP2 group (``bucket_numel``);
* ``per-block``: what ``ModuleWrapPolicy({Block})`` means in FSDP2:
  ``fully_shard`` on each ``Block``, then the root; torch's default
  (implicit) prefetching;
* ``always-wrap``: ``fully_shard`` on every module holding parameters of its
  own (post-order), then the root. The tied embedding/output modules are left
  to the root: FSDP2 cannot shard one tensor in two groups.

Timing: every variant is built in the same rank processes and the variants
take turns step by step (the first one rotates each round), after a barrier;
a step's time is the slowest rank's; medians over ``--steps`` steps after
``--warmup``. All-gathers and reduce-scatters per step are counted in the
rank processes by wrapping ``torch.distributed.all_gather_single`` /
``all_gather_into_tensor`` and ``reduce_scatter_single`` /
``reduce_scatter_tensor`` (what FSDP2 calls). Peak RSS per rank (and peak CUDA
memory with ``--device cuda``) comes from separate spawns that build one
variant each and run a few steps, so each peak belongs to one variant.

Usage::

    python -m benchmarks.fsdp_step                 # CPU, 2 gloo ranks
    python -m benchmarks.fsdp_step --quick         # 4 tiny blocks, 2 steps (< 30 s)
    python -m benchmarks.fsdp_step --device cuda   # 2 GPUs, NCCL
    python benchmarks/fsdp_step.py --dim 384 --steps 20
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from benchmarks._bench import (
    add_output_args,
    fmt_bytes,
    fmt_ratio,
    markdown_table,
    median,
    peak_rss_bytes,
    publish,
)
from benchmarks._ranks import barrier, rank_main, spawn_ranks

__all__ = ["VARIANTS", "main", "run"]

#: Sharding variants, in table order; the first is the reference of the ratios' denominators.
VARIANTS = ("execwrap", "execwrap-bucketed", "per-block", "always-wrap")

_ALL_GATHERS = ("all_gather_single", "all_gather_into_tensor")
_REDUCE_SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor")


# ------------------------------------------------------------ rank side
class _CollectiveCounter:
    """Counts FSDP2's all-gathers and reduce-scatters by wrapping ``torch.distributed``.

    Only the outermost call counts (one collective that calls another through
    ``torch.distributed`` is counted once).
    """

    def __init__(self) -> None:
        self.all_gathers = 0
        self.reduce_scatters = 0
        self._depth = 0
        self._saved: dict[str, Callable[..., Any]] = {}

    def reset(self) -> None:
        self.all_gathers = 0
        self.reduce_scatters = 0

    def install(self) -> None:
        for name in _ALL_GATHERS + _REDUCE_SCATTERS:
            orig = getattr(dist, name, None)
            if orig is None:
                continue
            self._saved[name] = orig
            setattr(
                dist,
                name,
                self._wrap(orig, "all_gathers" if name in _ALL_GATHERS else "reduce_scatters"),
            )

    def remove(self) -> None:
        for name, orig in self._saved.items():
            setattr(dist, name, orig)
        self._saved.clear()

    def _wrap(self, orig: Callable[..., Any], attr: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if self._depth == 0:
                setattr(self, attr, getattr(self, attr) + 1)
            self._depth += 1
            try:
                return orig(*args, **kwargs)
            finally:
                self._depth -= 1

        return wrapper


def _gpt_config(job: dict[str, Any]) -> Any:
    from execwrap.demo_models import GPTConfig

    return GPTConfig(
        vocab_size=job["vocab"],
        max_seq_len=job["seq"],
        dim=job["dim"],
        n_heads=job["heads"],
        n_blocks=job["blocks"],
    )


def _shard(variant: str, model: nn.Module, mesh: Any, job: dict[str, Any]) -> int:
    """Apply ``variant``'s sharding to ``model``; return the number of FSDP groups."""
    from torch.distributed.fsdp import fully_shard

    from execwrap import ModuleWrapPolicy, apply_fully_shard, plan_wrap
    from execwrap.demo_models import Block
    from tracing import trace_execution_order

    blocks = [m for m in model.modules() if isinstance(m, Block)]
    if variant in ("execwrap", "execwrap-bucketed"):
        bucket = None
        if variant == "execwrap-bucketed":
            block_numel = sum(p.numel() for p in blocks[0].parameters())
            bucket = job["bucket_blocks"] * block_numel
        order = trace_execution_order(model)
        plan = plan_wrap(model, order, ModuleWrapPolicy({Block}), bucket_numel=bucket)
        apply_fully_shard(model, plan, mesh=mesh, prefetch=job["prefetch"])
        return len(plan.units)
    if variant == "per-block":
        for block in blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return len(blocks) + 1
    if variant == "always-wrap":
        names: dict[int, int] = {}
        for _, p in model.named_parameters(remove_duplicate=False):
            names[id(p)] = names.get(id(p), 0) + 1
        groups = 0
        for fqn, module in reversed(list(model.named_modules())):
            own = list(module.parameters(recurse=False))
            if fqn and own and all(names[id(p)] == 1 for p in own):
                fully_shard(module, mesh=mesh)
                groups += 1
        fully_shard(model, mesh=mesh)
        return groups + 1
    raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")


class _Trainer:
    """One sharded model, its optimizer and this rank's batch."""

    def __init__(
        self, variant: str, job: dict[str, Any], rank: int, device: torch.device, mesh: Any
    ) -> None:
        from execwrap.demo_models import GPT

        torch.manual_seed(0)  # same initial weights for every variant and rank
        with device:
            self.model = GPT(_gpt_config(job))
        self.groups = _shard(variant, self.model, mesh, job)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(1000 + rank)
        shape = (job["batch"], job["seq"])
        self.idx = torch.randint(0, job["vocab"], shape, generator=gen).to(device)
        self.target = torch.randint(0, job["vocab"], shape, generator=gen).to(device)
        self.device = device
        self.loss = float("nan")

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        logits = self.model(self.idx)
        loss = F.cross_entropy(logits.flatten(0, 1), self.target.flatten())
        loss.backward()
        self.opt.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the step's kernels and collectives are done
        self.loss = float(loss.detach())


def _time_variants(
    rank: int, device: torch.device, mesh: Any, job: dict[str, Any]
) -> dict[str, Any]:
    counter = _CollectiveCounter()
    trainers = {v: _Trainer(v, job, rank, device, mesh) for v in job["variants"]}
    names = list(trainers)
    times: dict[str, list[float]] = {v: [] for v in names}
    gathers: dict[str, list[int]] = {v: [] for v in names}
    scatters: dict[str, list[int]] = {v: [] for v in names}
    counter.install()
    try:
        for r in range(job["warmup"] + job["steps"]):
            k = r % len(names)
            for v in names[k:] + names[:k]:
                barrier(device)
                counter.reset()
                start = time.perf_counter()
                trainers[v].step()
                elapsed = time.perf_counter() - start
                if r >= job["warmup"]:
                    times[v].append(elapsed)
                    gathers[v].append(counter.all_gathers)
                    scatters[v].append(counter.reduce_scatters)
    finally:
        counter.remove()
    return {
        "times": times,
        "all_gathers": gathers,
        "reduce_scatters": scatters,
        "groups": {v: t.groups for v, t in trainers.items()},
        "loss": {v: t.loss for v, t in trainers.items()},
    }


def _memory(rank: int, device: torch.device, mesh: Any, job: dict[str, Any]) -> dict[str, Any]:
    (variant,) = job["variants"]
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    trainer = _Trainer(variant, job, rank, device, mesh)
    for _ in range(job["memory_steps"]):
        trainer.step()
    out = {"peak_rss": peak_rss_bytes()}
    if device.type == "cuda":
        out["peak_cuda"] = torch.cuda.max_memory_allocated(device)
    return out


def _body(rank: int, device: torch.device, mesh: Any, job: dict[str, Any]) -> Any:
    fn = _time_variants if job["kind"] == "timing" else _memory
    return fn(rank, device, mesh, job)


def _entry(rank: int, world_size: int, tmpdir: str, job: dict[str, Any]) -> None:
    rank_main(rank, world_size, tmpdir, job, _body)


def _spawn(job: dict[str, Any], world_size: int) -> list[Any]:
    """Run ``job`` on ``world_size`` fresh rank processes; return each rank's result."""
    # Pickle the worker by its importable name, also when this file runs as a script.
    from benchmarks.fsdp_step import _entry as entry

    return spawn_ranks(entry, job, world_size, name="fsdp_step")


def run(
    job: dict[str, Any], *, world_size: int, memory_variants: tuple[str, ...]
) -> dict[str, Any]:
    """Time every variant interleaved in one spawn, then measure memory per variant.

    Returns:
        Per variant: median step seconds (slowest rank per step), all-gathers
        and reduce-scatters per step (median over steps, rank 0), FSDP groups,
        the last loss, and peak RSS (max over ranks; ``None`` if not measured).
    """
    ranks = _spawn({**job, "kind": "timing"}, world_size)
    out: dict[str, Any] = {}
    for v in job["variants"]:
        per_step = [max(r["times"][v][i] for r in ranks) for i in range(job["steps"])]
        out[v] = {
            "step_s": median(per_step),
            "all_gathers": int(median(ranks[0]["all_gathers"][v])),
            "reduce_scatters": int(median(ranks[0]["reduce_scatters"][v])),
            "groups": ranks[0]["groups"][v],
            "loss": ranks[0]["loss"][v],
            "peak_rss": None,
            "peak_cuda": None,
        }
    for v in memory_variants:
        mem = _spawn({**job, "kind": "memory", "variants": [v]}, world_size)
        out[v]["peak_rss"] = max(m["peak_rss"] for m in mem)
        if "peak_cuda" in mem[0]:
            out[v]["peak_cuda"] = max(m["peak_cuda"] for m in mem)
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints a table and writes a dated result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=None, help="default 24 (quick: 4)")
    parser.add_argument("--dim", type=int, default=None, help="default 256 (quick: 64)")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=None, help="per rank; default 2")
    parser.add_argument("--seq", type=int, default=None, help="default 128 (quick: 32)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 12)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 2)")
    parser.add_argument("--prefetch", type=int, default=1)
    parser.add_argument("--bucket-blocks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument(
        "--skip-memory", action="store_true", help="skip the per-variant peak-memory spawns"
    )
    args = parser.parse_args(argv)

    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        parser.error(
            f"--device cuda needs {args.world_size} GPUs (--world-size); "
            f"found {torch.cuda.device_count()}"
        )
    quick = args.quick
    job = {
        "device": args.device,
        "blocks": args.blocks or (4 if quick else 24),
        "dim": args.dim or (64 if quick else 256),
        "heads": args.heads,
        "vocab": args.vocab if not quick else min(args.vocab, 512),
        "batch": args.batch or 2,
        "seq": args.seq or (32 if quick else 128),
        "steps": args.steps or (2 if quick else 12),
        "warmup": args.warmup if args.warmup is not None else (1 if quick else 2),
        "prefetch": args.prefetch,
        "bucket_blocks": args.bucket_blocks,
        "threads": args.threads,
        "variants": list(VARIANTS),
        "memory_steps": 2 if quick else 3,
        "timeout_s": 600,
    }
    # Quick mode measures memory for one variant only, to keep the smoke test short.
    memory_variants: tuple[str, ...] = ("execwrap",) if quick else VARIANTS
    if args.skip_memory:
        memory_variants = ()
    res = run(job, world_size=args.world_size, memory_variants=memory_variants)

    ref = res[VARIANTS[0]]
    cuda = args.device == "cuda"
    header = [
        "sharding",
        "FSDP groups",
        "step (ms, median)",
        "step / execwrap",
        "all-gathers / step",
        "reduce-scatters / step",
        "peak RSS / rank",
    ]
    if cuda:
        header.append("peak CUDA memory / rank")
    header.append("last loss")
    rows = []
    for v in VARIANTS:
        r = res[v]
        row = [
            v,
            r["groups"],
            f"{r['step_s'] * 1e3:.0f}",
            fmt_ratio(r["step_s"] / ref["step_s"]),
            r["all_gathers"],
            r["reduce_scatters"],
            "n/a" if r["peak_rss"] is None else fmt_bytes(r["peak_rss"]),
        ]
        if cuda:
            row.append("n/a" if r["peak_cuda"] is None else fmt_bytes(r["peak_cuda"]))
        row.append(f"{r['loss']:.5f}")
        rows.append(row)
    table = markdown_table(header, rows)
    n_params = _count_params(job)
    shape = (
        f"GPT {job['blocks']} blocks, dim {job['dim']}, {job['heads']} heads, vocab "
        f"{job['vocab']}, tied ({n_params / 1e6:.1f}M parameters), batch {job['batch']}x"
        f"{job['seq']} per rank"
    )
    backend = (
        "NCCL, one GPU per rank" if cuda else f"gloo on CPU, {job['threads']} thread(s) per rank"
    )
    note = (
        f"{args.world_size} ranks, {backend}; {shape}; AdamW; cross-entropy loss. "
        f"Variants take turns step by step; step time = slowest rank, median of "
        f"{job['steps']} steps after {job['warmup']} warm-up rounds. Collectives counted per "
        "step on rank 0 by wrapping `torch.distributed` all-gather/reduce-scatter. "
        f"execwrap: `ModuleWrapPolicy({{Block}})` plan, `apply_fully_shard(prefetch={job['prefetch']})`; "
        f"bucketed: `bucket_numel` = {job['bucket_blocks']} blocks. Peak RSS per rank from "
        f"separate spawns running {job['memory_steps']} steps of one variant each (max over "
        "ranks; includes the Python and torch runtime). Equal last losses show the variants "
        "train the same model.\n"
    )
    publish("fsdp_step", note, table, args)
    return 0


def _count_params(job: dict[str, Any]) -> int:
    from execwrap.demo_models import GPT

    with torch.device("meta"):
        return sum(p.numel() for p in GPT(_gpt_config(job)).parameters())


if __name__ == "__main__":
    raise SystemExit(main())
