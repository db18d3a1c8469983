"""Plan quality: units, all-gathers and unsharded memory of execwrap plans vs FSDP's policies.

Two models built on the meta device (nothing is run; the numbers are the
plans' predicted cost from :meth:`execwrap.WrapPlan.stats`, prefetch 1,
reshard after forward):

* GPT-2 small shape: ``execwrap.demo_models.GPT`` with 12 blocks, dim 768,
  12 heads, vocab 50257, 1024 positions, tied input/output embedding;
* Llama at 32 layers with Llama-3-70B widths (dim 8192, 64 heads, MLP 28672,
  vocab 128256).

Rows: ``always_wrap_policy``, ``size_based_auto_wrap_policy`` at its default
``min_num_params`` (1e8) and at 1e7, ``ModuleWrapPolicy({Block})`` (or
``{LlamaBlock}``), then execwrap plans: the same transformer policy bucketed
in execution order at ``bucket_numel`` 1e7, 2.5e7 and 1e8 (and 2e9 for Llama,
whose blocks are larger than the other caps), and ``always_wrap_policy``
bucketed at the same caps (the finest atomic units). Every row goes through
``plan_wrap`` so all share one cost model and the same safety corrections
(never-called containers dropped, tied weights kept in one unit).

Lower bound per cap: the fewest groups any contiguous grouping of the same
atomic units (in execution order) can have with each group at most the cap,
:func:`execwrap.min_contiguous_groups`, counting groups that all-gather
(units holding parameters), with the root unit alone (FSDP2 shards the root
by its own ``fully_shard`` call). Target: execwrap's count of
parameter-holding groups equals the lower bound.

Usage::

    python -m benchmarks.plans            # both models
    python -m benchmarks.plans --quick    # the same (planning on meta is fast)
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn as nn

from benchmarks._bench import add_output_args, fmt_bytes, markdown_table, publish
from execwrap import (
    ModuleWrapPolicy,
    WrapPlan,
    always_wrap_policy,
    min_contiguous_groups,
    plan_wrap,
    policy_units,
    size_based_auto_wrap_policy,
)
from execwrap.demo_models import GPT, Block, GPTConfig, Llama, LlamaBlock, LlamaConfig
from tracing import trace_execution_order

__all__ = ["gathering_groups", "lower_bound", "main", "model_rows"]

CAPS = (10_000_000, 25_000_000, 100_000_000)
LLAMA_EXTRA_CAPS = (2_000_000_000,)


def lower_bound(plan: WrapPlan, cap: int) -> int:
    """Fewest all-gathering groups any contiguous grouping of ``plan.atomic_units`` can have.

    Groups are runs of consecutive atomic units (execution order) holding
    parameters, each at most ``cap`` elements (a larger unit alone), plus the
    root unit alone. Units without parameters all-gather nothing and are left
    out (they could join any group).
    """
    sizes = [u.numel for u in plan.atomic_units if not u.is_root and u.numel > 0]
    has_root = any(u.is_root for u in plan.atomic_units)
    return min_contiguous_groups(sizes, cap) + int(has_root)


def gathering_groups(plan: WrapPlan) -> int:
    """Units of ``plan`` that all-gather: those holding parameters, and the root."""
    return sum(1 for u in plan.units if u.numel > 0 or u.is_root)


def _models(quick: bool) -> list[tuple[str, nn.Module, type[nn.Module], tuple[int, ...]]]:
    with torch.device("meta"):
        gpt = GPT(GPTConfig(vocab_size=50257, max_seq_len=1024, dim=768, n_heads=12, n_blocks=12))
        llama = Llama(
            LlamaConfig(dim=8192, n_heads=64, mlp_hidden=28672, vocab_size=128256, n_layers=32)
        )
    return [
        ("GPT-2 small (12 blocks, dim 768, tied)", gpt, Block, CAPS),
        ("Llama 32 layers (dim 8192, MLP 28672)", llama, LlamaBlock, CAPS + LLAMA_EXTRA_CAPS),
    ]


def _cap(cap: int) -> str:
    return f"{cap:.1e}".replace("e+0", "e").replace(".0e", "e")


def model_rows(
    model: nn.Module, block: type[nn.Module], caps: tuple[int, ...]
) -> list[dict[str, Any]]:
    """One row per plan for ``model``: counts, bytes, and the lower bound for bucketed rows."""
    order = trace_execution_order(model)
    block_policy = ModuleWrapPolicy({block})
    baselines: list[tuple[str, Any]] = [
        ("always_wrap_policy", always_wrap_policy),
        ("size_based_auto_wrap_policy (min_num_params 1e8, default)", size_based_auto_wrap_policy),
        (
            "size_based_auto_wrap_policy (min_num_params 1e7)",
            functools.partial(size_based_auto_wrap_policy, min_num_params=10_000_000),
        ),
        (f"ModuleWrapPolicy({{{block.__name__}}})", block_policy),
    ]
    rows: list[dict[str, Any]] = []

    def add(name: str, policy: Any, cap: int | None) -> None:
        plan = plan_wrap(model, order, policy, bucket_numel=cap)
        st = plan.stats(prefetch=1)
        row = {
            "plan": name,
            "fsdp1_units": len(policy_units(model, policy)) if cap is None else None,
            "units": st.num_units,
            "gathering": gathering_groups(plan),
            "all_gathers": st.all_gathers_per_step,
            "largest": st.largest_unit_bytes,
            "peak": st.peak_unsharded_bytes,
            "cap": cap,
            "lower_bound": lower_bound(plan, cap) if cap is not None else None,
            "atomic_units": len(plan.atomic_units),
        }
        rows.append(row)

    for name, policy in baselines:
        add(name, policy, None)
    for atomic_name, policy in (
        (f"{block.__name__} units", block_policy),
        ("always_wrap units", always_wrap_policy),
    ):
        for cap in caps:
            add(f"execwrap, {atomic_name}, bucket_numel {_cap(cap)}", policy, cap)
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    header = [
        "plan",
        "units (FSDP1 policy alone)",
        "units",
        "units holding parameters",
        "all-gathers / step",
        "largest unit",
        "peak unsharded (prefetch 1)",
        "lower bound (units)",
        "= lower bound?",
    ]
    out = []
    for r in rows:
        lb = r["lower_bound"]
        out.append(
            [
                r["plan"],
                "" if r["fsdp1_units"] is None else r["fsdp1_units"],
                r["units"],
                r["gathering"],
                r["all_gathers"],
                fmt_bytes(r["largest"]),
                fmt_bytes(r["peak"]),
                "" if lb is None else lb,
                ""
                if lb is None
                else ("yes" if r["gathering"] == lb else f"no (+{r['gathering'] - lb})"),
            ]
        )
    return markdown_table(header, out)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; prints tables and writes a dated result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_args(parser)
    args = parser.parse_args(argv)
    parts: list[str] = []
    misses: list[str] = []
    for title, model, block, caps in _models(args.quick):
        rows = model_rows(model, block, caps)
        n_params = sum(p.numel() for p in model.parameters())
        parts.append(f"### {title}: {n_params / 1e6:,.0f}M parameters, fp32\n")
        parts.append(_table(rows) + "\n")
        for r in rows:
            if r["lower_bound"] is not None and r["gathering"] != r["lower_bound"]:
                misses.append(
                    f"- {title}, {r['plan']}: {r['gathering']} groups holding parameters vs "
                    f"lower bound {r['lower_bound']} ({r['atomic_units']} atomic units)"
                )
    if misses:
        parts.append("Rows above the lower bound:\n\n" + "\n".join(misses) + "\n")
    else:
        parts.append("Every execwrap plan equals its lower bound.\n")
    body = "\n".join(parts)
    note = (
        "Predicted cost per training step (`WrapPlan.stats(prefetch=1)`, reshard after forward, "
        "fp32 bytes) of plans built with `execwrap.plan_wrap` on meta-device models from a "
        'symbolic order. "units (FSDP1 policy alone)": modules FSDP1\'s auto-wrap itself '
        "would wrap for the policy (`policy_units`), before plan_wrap drops never-called "
        "containers and keeps tied weights in one unit. Lower bound: "
        "`min_contiguous_groups` over the sizes of the same atomic units holding parameters, "
        "in execution order, under the cap, plus the root unit alone; compared with the "
        "plan's units holding parameters (units without parameters all-gather nothing).\n"
    )
    publish("plans", note, body, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
