"""Published GPU training runs, predicted from their public description on the meta device.

Each row is a run whose configuration and results are public (the sources are
in :data:`ROWS`): the model is built from its published shape on the meta
device (:mod:`benchmarks._titan_llama`, torchtitan's Llama 3 as it ran), its
step is captured "as if" in the run's ``param_dtype`` with the cost model's
compute rates (``record_execution_order(..., timing=cost_model.compute,
param_dtype=torch.bfloat16)``: nothing is allocated), planned as the framework
sharded it (one FSDP2 group per transformer block, the rest in the root;
torchtitan does not reshard the last block after forward), and simulated with
the run's :class:`~execwrap.simulate.TrainingStep` on a preset cluster of the
run's GPU model (:mod:`execwrap.cost.gpus`). Predicted tokens/s/GPU
(``micro_batches * batch * sequence / step time``) and peak memory (the
memory the CUDA caching allocator reserves, which is what torchtitan reports:
``reserved_bytes.all.peak``) are printed next to the published numbers.

Constants: every rate comes from a datasheet or paper named in
:mod:`execwrap.cost.gpus` and :mod:`execwrap.cost.presets`, except the one
efficiency factor per GPU model in :data:`execwrap.cost.gpus.FITTED_EFFICIENCY`,
fitted on the rows marked ``fit`` (``--fit`` recomputes it). The other rows
are predictions; their median error is printed. Nothing here runs on a GPU.

Usage::

    python -m benchmarks.published            # every row
    python -m benchmarks.published --quick    # torchtitan's two H100 rows only
    python -m benchmarks.published --fit      # refit the factor on the fit rows
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._bench import add_output_args, markdown_table, median, publish

__all__ = ["ROWS", "Prediction", "PublishedRun", "main", "predict"]

_TITAN_DOC = (
    "https://github.com/pytorch/torchtitan/blob/9dec370ad26b5f8e9a7333a0e36165018262644b/"
    "docs/performance.md (now benchmarks/llama3_h100_202412_torchtitan.md)"
)
_TITAN_A100 = (
    "https://github.com/pytorch/torchtitan/blob/f38766edb/docs/performance.md (2024-04-24; "
    "configs in train_configs/ of that commit)"
)
#: The A100 cluster's network is not published; these rows assume 400 Gb/s InfiniBand per GPU.
_A100_NET = "network not published: 400 Gb/s per GPU assumed"
_FMS = (
    "https://github.com/foundation-model-stack/fms-fsdp/blob/"
    "0d319983c4b3b7f7b3b5e2c5e7f746746b6f73a9/README.md (IBM's FSDP1 Llama 2 pre-training; "
    "configs: docs/configurations.md, pretraining/config/training.py, "
    "pretraining/policies/mixed_precision.py)"
)


@dataclass(frozen=True)
class PublishedRun:
    """One published run and what it reported.

    Attributes:
        name: the row's name.
        source: where the configuration and the numbers are published.
        model: a key of :data:`MODELS`.
        gpus: data-parallel ranks (FSDP over all of them).
        preset: the cluster preset (:data:`execwrap.cost.PRESETS`).
        gpu: the GPU model (:data:`execwrap.cost.gpus.GPUS`).
        batch: local batch size (sequences per micro-batch per GPU).
        seq: sequence length.
        checkpointing: the activation-checkpointing mode of every block.
        checkpoint_every: checkpoint every n-th block (torchtitan's per-layer option).
        tokens_per_s: published tokens/s per GPU.
        memory_gib: published peak memory (GiB, the allocator's reserved peak).
        fit: whether the GPU model's efficiency factor is fitted on this row.
        outcome: ``"OOM"`` when the run was published as out of memory (then
            ``tokens_per_s`` is 0 and the prediction should exceed the GPU's memory).
        notes: assumptions the row needs.
        shard: HSDP's shard group size (``None``: FSDP over all ``gpus``).
        reduce_dtype: the gradient reduction dtype (``param_dtype`` is bfloat16).
        keep_last: whether the last block is kept after forward (torchtitan does;
            FSDP1 reshards every unit but the root).
    """

    name: str
    source: str
    model: str
    gpus: int
    preset: str
    gpu: str
    batch: int
    seq: int
    checkpointing: str
    checkpoint_every: int = 1
    tokens_per_s: float = 0.0
    memory_gib: float | None = None
    fit: bool = False
    outcome: str = ""
    notes: str = field(default="")
    shard: int | None = None
    reduce_dtype: str = "float32"
    keep_last: bool = True


#: The rows, with their sources. Table 1 and Table 3 of torchtitan's December 2024
#: benchmark: Llama 3.1 8B, FSDP2 with bf16 parameters and fp32 reduction (torchtitan's
#: defaults then: ``mixed_precision_param = "bfloat16"``, ``mixed_precision_reduce =
#: "float32"``), selective op-level activation checkpointing, AdamW, no torch.compile,
#: no Float8; H100 SXM with 96 GB HBM2e at 500 W (Grand Teton), NVLink within a host,
#: 400 Gb/s RDMA per GPU between hosts. The rows with torch.compile or Float8 are not
#: predicted (neither is modelled).
ROWS: tuple[PublishedRun, ...] = (
    PublishedRun(
        "torchtitan T1 FSDP",
        _TITAN_DOC + ", Table 1, row FSDP",
        "llama3-8b",
        8,
        "h100-nvlink-8",
        "h100-hbm2e-96gb",
        2,
        8192,
        "selective",
        tokens_per_s=5762,
        memory_gib=82.4,
        fit=True,
    ),
    PublishedRun(
        "torchtitan T3 FSDP",
        _TITAN_DOC + ", Table 3, row FSDP",
        "llama3-8b",
        128,
        "h100-ib-400g",
        "h100-hbm2e-96gb",
        2,
        8192,
        "selective",
        tokens_per_s=5605,
        memory_gib=67.0,
    ),
    *(
        PublishedRun(
            f"torchtitan A100 Llama 3 8B {name}",
            _TITAN_A100 + ", Llama 3 table",
            "llama3-8b-2404",
            64,
            "h100-ib-400g",
            "a100-sxm4-80gb",
            1,
            8192,
            mode,
            every,
            tokens_per_s=tps,
            notes=_A100_NET,
        )
        for name, mode, every, tps in (
            ("selective layer", "full", 2, 2904),
            ("selective op", "selective", 1, 2973),
        )
    ),
    PublishedRun(
        "torchtitan A100 Llama 3 70B full",
        _TITAN_A100 + ", Llama 3 table",
        "llama3-70b-2404",
        64,
        "h100-ib-400g",
        "a100-sxm4-80gb",
        1,
        8192,
        "full",
        tokens_per_s=331,
        notes=_A100_NET,
    ),
    *(
        PublishedRun(
            f"torchtitan A100 Llama 2 {size} b{batch} {name}",
            _TITAN_A100 + ", Llama 2 table",
            f"llama2-{size.lower()}-2404",
            64,
            "h100-ib-400g",
            "a100-sxm4-80gb",
            batch,
            4096,
            mode,
            every,
            tokens_per_s=tps,
            outcome="OOM" if tps == 0 else "",
            notes=_A100_NET,
        )
        for size, batch, name, mode, every, tps in (
            ("13B", 2, "no AC", "none", 1, 2162),
            ("13B", 2, "selective layer", "full", 2, 1914),
            ("13B", 2, "selective op", "selective", 1, 1904),
            ("70B", 2, "selective layer", "full", 2, 0),
            ("70B", 2, "selective op", "selective", 1, 0),
            ("70B", 1, "selective op", "selective", 1, 355),
            ("70B", 2, "full", "full", 1, 353),
        )
    ),
    # IBM's fms-fsdp on 128 A100 80GB (16 nodes of 8): FSDP1, bf16 parameters *and*
    # reduction (bfSixteen), HSDP sharding within a node (sharding_group_size 8) or FSDP
    # over all 128, full checkpointing of every block when on, sequence 4096, AdamW.
    *(
        PublishedRun(
            f"fms-fsdp Llama 2 {size} {'HSDP' if shard else 'FSDP'}",
            _FMS + ", throughput table",
            f"llama2-{size.lower()}-fms",
            128,
            "h100-ib-400g",
            "a100-sxm4-80gb",
            batch,
            4096,
            mode,
            tokens_per_s=tps,
            notes=_A100_NET,
            shard=shard,
            reduce_dtype="bfloat16",
            keep_last=False,
        )
        for size, shard, mode, batch, tps in (
            ("7B", 8, "none", 2, 3760),
            ("13B", 8, "none", 1, 1700),
            ("34B", None, "full", 8, 772),
            ("70B", None, "full", 6, 380),
        )
    ),
)


def _titan(args_name: str, **changes: Any) -> Callable[[], Any]:
    def build() -> Any:
        import dataclasses

        import torch

        from benchmarks import _titan_llama as t

        with torch.device("meta"):
            return t.TitanLlama(dataclasses.replace(getattr(t, args_name), **changes))

    return build


#: GPU model -> its memory in GiB (the nominal capacity: the HBM stacks' binary gigabytes).
GPU_MEMORY_GIB = {
    "h100-sxm5-80gb": 80.0,
    "h100-hbm2e-96gb": 96.0,
    "h200-sxm-141gb": 141.0,
    "a100-sxm4-80gb": 80.0,
}

#: Model name -> (builder on the meta device, block class name to shard by).
MODELS: dict[str, tuple[Callable[[], Any], str]] = {
    "llama3-8b": (_titan("LLAMA3_8B"), "TitanBlock"),
    "llama3-8b-2404": (_titan("LLAMA3_8B", float_output=True), "TitanBlock"),
    "llama3-70b-2404": (_titan("LLAMA3_70B", float_output=True), "TitanBlock"),
    "llama2-13b-2404": (_titan("LLAMA2_13B"), "TitanBlock"),
    "llama2-70b-2404": (_titan("LLAMA2_70B"), "TitanBlock"),
    "llama2-7b-fms": (_titan("LLAMA2_7B"), "TitanBlock"),
    "llama2-13b-fms": (_titan("LLAMA2_13B", float_output=False), "TitanBlock"),
    "llama2-34b-fms": (_titan("LLAMA2_34B"), "TitanBlock"),
    "llama2-70b-fms": (_titan("LLAMA2_70B", float_output=False), "TitanBlock"),
}


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicts for one row."""

    run: PublishedRun
    tokens_per_s: float
    memory_gib: float
    step_time_s: float
    allocated_gib: float


def _capture(run: PublishedRun, cost_model: Any) -> tuple[Any, Any]:
    """The model and its order, captured on meta in bf16 with the cost model's rates."""
    import torch
    import torch.nn.functional as F

    from tracing import record_execution_order

    model = MODELS[run.model][0]()
    tokens = torch.zeros(run.batch, run.seq, dtype=torch.long, device="meta")
    labels = torch.zeros(run.batch, run.seq, dtype=torch.long, device="meta")

    def loss(out: torch.Tensor) -> torch.Tensor:  # torchtitan's: cross entropy in float32
        return F.cross_entropy(out.flatten(0, 1).float(), labels.flatten())

    order = record_execution_order(
        model, tokens, timing=cost_model.compute, param_dtype=torch.bfloat16, loss_fn=loss
    )
    return model, order


def predict(run: PublishedRun, cache: dict[Any, Any] | None = None) -> Prediction:
    """Predict ``run`` (captures are shared through ``cache`` by model, batch, rates)."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from benchmarks import _titan_llama
    from execwrap import CostModel, plan_wrap
    from execwrap.simulate import Precision, TrainingStep, simulate_step

    cost_model = CostModel.preset(run.preset, world_size=run.gpus, gpu=run.gpu)
    key = (run.model, run.batch, run.seq, repr(cost_model.compute))
    cache = {} if cache is None else cache
    if key not in cache:
        cache[key] = _capture(run, cost_model)
    model, order = cache[key]
    block = getattr(_titan_llama, MODELS[run.model][1])
    plan = plan_wrap(model, order, ModuleWrapPolicy({block}))
    last = f"layers.{model.args.n_layers - 1}"  # torchtitan keeps the last block after forward
    if run.keep_last:  # as torchtitan passes it: the root too, the last block not
        reshard = [u.is_root or u.label != last for u in plan.units]
    else:  # FSDP1 FULL_SHARD / HYBRID_SHARD: every unit but the root
        reshard = [not u.is_root for u in plan.units]
    step = TrainingStep(
        precision=Precision(param_dtype="bfloat16", reduce_dtype=run.reduce_dtype),
        checkpointing=run.checkpointing,
        checkpoint_every=run.checkpoint_every,
    )
    mesh = None if run.shard is None else (run.gpus // run.shard, run.shard)
    est = simulate_step(
        plan,
        cost_model,
        world_size=run.gpus,
        training=step,
        reshard_after_forward=reshard,
        mesh=mesh,
    )
    tokens = step.micro_batches * run.batch * run.seq
    return Prediction(
        run,
        tokens / est.step_time_s,
        est.reserved_memory_bytes / 2**30,
        est.step_time_s,
        est.peak_memory_bytes / 2**30,
    )


def fit(rows: tuple[PublishedRun, ...]) -> dict[str, float]:
    """The efficiency factor per GPU model that predicts its fit rows' mean tokens/s
    exactly (bisection; tokens/s grows with the factor)."""
    from execwrap.cost import gpus

    factors: dict[str, float] = {}
    for gpu in sorted({r.gpu for r in rows if r.fit}):
        fit_rows = [r for r in rows if r.fit and r.gpu == gpu]
        target = sum(r.tokens_per_s for r in fit_rows) / len(fit_rows)
        low, high = 0.2, 1.5
        saved = gpus.FITTED_EFFICIENCY.get(gpu)
        try:
            for _ in range(14):
                mid = (low + high) / 2
                gpus.FITTED_EFFICIENCY[gpu] = mid
                got = sum(predict(r).tokens_per_s for r in fit_rows) / len(fit_rows)
                low, high = (mid, high) if got < target else (low, mid)
        finally:
            if saved is None:
                gpus.FITTED_EFFICIENCY.pop(gpu, None)
            else:
                gpus.FITTED_EFFICIENCY[gpu] = saved
        factors[gpu] = (low + high) / 2
    return factors


def _step_text(r: PublishedRun) -> str:
    ac = r.checkpointing + ("" if r.checkpoint_every == 1 else f" every {r.checkpoint_every}")
    mesh = "" if r.shard is None else f", HSDP {r.gpus // r.shard}x{r.shard}"
    return f"b{r.batch} s{r.seq}, {ac} AC{mesh}"


def _table(predictions: list[Prediction]) -> str:
    rows = []
    for p in predictions:
        r = p.run
        capacity = GPU_MEMORY_GIB[r.gpu]
        if r.outcome == "OOM":
            tps, tps_ratio = "OOM", "n/a"
            mem, mem_ratio = (
                f"OOM (> {capacity:.0f})",
                "ok" if p.memory_gib > capacity else "MISSED",
            )
        else:
            tps = f"{r.tokens_per_s:,.0f}"
            tps_ratio = f"{p.tokens_per_s / r.tokens_per_s:.3f}"
            mem = "n/a" if r.memory_gib is None else f"{r.memory_gib:.1f}"
            mem_ratio = "n/a" if r.memory_gib is None else f"{p.memory_gib / r.memory_gib:.3f}"
            if r.memory_gib is None:  # it ran: it fit in the GPU's memory
                mem = f"fits (< {capacity:.0f})"
                mem_ratio = "ok" if p.memory_gib <= capacity else "MISSED"
        rows.append(
            [
                r.name + (" (fit)" if r.fit else ""),
                f"{r.gpus}x {r.gpu}",
                _step_text(r),
                f"{p.tokens_per_s:,.0f}",
                tps,
                tps_ratio,
                f"{p.memory_gib:.1f} ({p.allocated_gib:.1f})",
                mem,
                mem_ratio,
                r.notes,
            ]
        )
    header = [
        "run",
        "GPUs",
        "step",
        "predicted tok/s/GPU",
        "published",
        "ratio",
        "predicted GiB reserved (allocated)",
        "published GiB",
        "ratio",
        "assumed",
    ]
    return markdown_table(header, rows)


def _summary(predictions: list[Prediction]) -> str:
    held = [p for p in predictions if not p.run.fit and p.run.outcome != "OOM"]
    lines = []
    if held:
        errors = [p.tokens_per_s / p.run.tokens_per_s - 1 for p in held]
        mems = [abs(p.memory_gib / p.run.memory_gib - 1) for p in held if p.run.memory_gib]
        mem = f"{100 * median(mems):.1f}% over {len(mems)}" if mems else "n/a"
        lines.append(
            f"Rows not fitted on: {len(held)} with throughput; median |error| of tokens/s/GPU "
            f"{100 * median([abs(e) for e in errors]):.1f}% (signed median "
            f"{100 * median(errors):+.1f}%); median |error| of peak memory {mem}."
        )
    fits = [p for p in predictions if p.run.memory_gib is None or p.run.outcome == "OOM"]
    right = sum(
        (p.memory_gib > GPU_MEMORY_GIB[p.run.gpu]) == (p.run.outcome == "OOM") for p in fits
    )
    lines.append(f"Fits / out of memory predicted right for {right} of {len(fits)} rows.")
    from execwrap.cost.gpus import FITTED_EFFICIENCY

    fitted = ", ".join(f"{k} {v:.3f}" for k, v in sorted(FITTED_EFFICIENCY.items())) or "none"
    fit_rows = ", ".join(p.run.name for p in predictions if p.run.fit)
    lines.append(
        f"Fitted efficiency factors (execwrap.cost.gpus.FITTED_EFFICIENCY): {fitted}; fitted "
        f"on: {fit_rows}."
    )
    sources = dict.fromkeys(
        r.source.split(", Table")[0].split(", Llama")[0].split(", throughput")[0] for r in ROWS
    )
    lines.append("Sources: " + "; ".join(sources) + ".")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    parser.add_argument(
        "--fit", action="store_true", help="refit the efficiency factor on the fit rows"
    )
    args = parser.parse_args(argv)
    if args.fit:
        for gpu, factor in fit(ROWS).items():
            print(f"{gpu}: fitted efficiency factor {factor:.4f}")
        return 0
    cache: dict[Any, Any] = {}
    rows = ROWS[:2] if args.quick else ROWS  # --quick: torchtitan's H100 rows (one capture)
    predictions = [predict(r, cache) for r in rows]
    note = (
        "# Published GPU runs: predicted vs published\n\n"
        "Predicted on the meta device from each run's public configuration "
        "(`python -m benchmarks.published`); no GPU ran.\n\n" + _summary(predictions)
    )
    publish("published", note, _table(predictions) + "\n\n" + _summary(predictions), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
