"""The grid of ``benchmarks/training_step.py``: the training steps measured, and the claims.

Per model (:data:`benchmarks._autoplan_models.MODELS`' ``gpt`` and ``llama``), per-block
plans (``ModuleWrapPolicy({block})``, prefetch 1) under every combination of

* precision: float32, or bfloat16 parameters with float32 gradient reduction
  (FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``);
* activation checkpointing of every block: none, full, selective;
* micro-batches: one; four with a reduce-scatter after each; four with the gradient
  sync on the last only;

and the joint auto plan (float32, four micro-batches: groups, prefetch, resharding,
checkpointing per group and the accumulation mode chosen together) under a budget
that the per-block plan without checkpointing exceeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from benchmarks._autoplan_metrics import spearman

__all__ = ["AUTO", "BASELINE", "FALLBACK", "StepSpec", "claims", "grid"]


@dataclass(frozen=True)
class StepSpec:
    """One training step of the grid.

    Attributes:
        name: table name.
        precision: ``"fp32"`` or ``"bf16"`` (bfloat16 parameters, float32 reduction).
        checkpointing: ``"none"``, ``"full"`` or ``"selective"`` for every block.
        micro_batches: micro-batches per optimizer step.
        sync: ``"every"`` or ``"last"``.
        auto: the joint auto plan (its checkpointing and sync are chosen).
    """

    name: str
    precision: str = "fp32"
    checkpointing: str = "none"
    micro_batches: int = 1
    sync: str = "every"
    auto: bool = False


#: The baseline every ratio is to, the fallback the auto plan must beat, the auto plan.
BASELINE = "fp32, none, 1 mb"
FALLBACK = "fp32, full, 4 mb every"
AUTO = "auto (fp32, 4 mb), under the budget"


def grid() -> list[StepSpec]:
    """The steps measured per model, baseline first, the auto plan last."""
    out = []
    for precision in ("fp32", "bf16"):
        for mode in ("none", "full", "selective"):
            for mb, sync in ((1, "every"), (4, "every"), (4, "last")):
                accumulation = "1 mb" if mb == 1 else f"{mb} mb {sync}"
                name = f"{precision}, {mode}, {accumulation}"
                out.append(StepSpec(name, precision, mode, mb, sync))
    out.append(StepSpec(AUTO, "fp32", "none", 4, "every", auto=True))
    return out


def claims(rows: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Issue 31's claims for one model's rows (``name``, ``predicted_s``, ``measured_s``,
    ``predicted_peak``, ``measured_peak``).

    Returns:
        ``peak_within``: rows whose predicted peak is within 10% of the tracker's, and
        ``peak_worst`` (the largest relative error); ``spearman`` of predicted vs
        measured step time; ``ratio_within`` / ``ratio_worst``: rows (the baseline
        aside) whose predicted ratio to the baseline is within 10% of the measured
        one; ``auto_fits`` (measured peak / budget), ``auto_vs_fallback`` and
        ``auto_vs_best`` (measured time ratios) with ``best_name``; ``all_met``.
    """
    by = {r["name"]: r for r in rows}
    base = by[BASELINE]
    peak_err = {r["name"]: r["predicted_peak"] / r["measured_peak"] - 1 for r in rows}
    ratio_err = {
        r["name"]: (r["predicted_s"] / base["predicted_s"]) / (r["measured_s"] / base["measured_s"])
        - 1
        for r in rows
        if r["name"] != BASELINE
    }
    auto = by[AUTO]
    spec = {s.name: s for s in grid()}
    same = [
        r
        for r in rows
        if not spec[r["name"]].auto
        and spec[r["name"]].precision == "fp32"
        and spec[r["name"]].micro_batches == 4
        and r["measured_peak"] <= budget
    ]
    best = min(same, key=lambda r: r["measured_s"]) if same else None
    out = {
        "peak_within": sum(1 for e in peak_err.values() if abs(e) <= 0.10),
        "peak_worst": max(peak_err.items(), key=lambda kv: abs(kv[1])),
        "spearman": spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]),
        "ratio_within": sum(1 for e in ratio_err.values() if abs(e) <= 0.10),
        "ratio_worst": max(ratio_err.items(), key=lambda kv: abs(kv[1])),
        "ratios": len(ratio_err),
        "rows": len(rows),
        "auto_fits": auto["measured_peak"] / budget,
        "auto_vs_fallback": auto["measured_s"] / by[FALLBACK]["measured_s"],
        "auto_vs_best": auto["measured_s"] / best["measured_s"] if best else math.nan,
        "best_name": best["name"] if best else "-",
    }
    out["all_met"] = (
        out["peak_within"] == len(rows)
        and out["spearman"] >= 0.9
        and out["ratio_within"] == out["ratios"]
        and out["auto_fits"] <= 1.0
        and out["auto_vs_fallback"] <= 0.9
        and out["auto_vs_best"] <= 1.03
    )
    return out
