"""The ``fit`` command's arguments, checked before torch is imported: :func:`add_fit_parser`
and :func:`fit_options`.

``execwrap fit MODEL --cluster h100-nvlink-8 --nodes 1 --sequence-length 8192
--micro-batch 2 --precision bf16``: ``MODEL`` is a transformers model id, a
``config.json`` (or the folder holding it), or a factory ``PKG.MODULE:FUNCTION``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execwrap.cli.budget import memory_budget_option
from execwrap.cli.errors import CLIError

__all__ = ["FIT_FRAMEWORKS", "FitOptions", "add_fit_parser", "fit_options"]

#: ``--framework`` choices (:data:`execwrap.sizing.recipes.RECIPE_FRAMEWORKS`, and all).
FIT_FRAMEWORKS = ("fsdp2", "transformers", "torchtitan", "accelerate", "lightning", "all")
_PRECISIONS = ("bf16", "bf16-reduce", "fp32")


@dataclass(frozen=True)
class FitOptions:
    """``execwrap fit`` arguments, checked.

    Attributes:
        model: the model id, ``config.json`` path or ``PKG.MODULE:FUNCTION`` factory.
        cluster: a preset name or a calibrated cost model file.
        nodes: nodes of the job.
        sequence_length: tokens per sequence.
        micro_batch: sequences per rank per step.
        precision: a name of :data:`execwrap.sizing.precision.PRECISIONS`, or ``None``
            (the ``--plan``'s own precision, else bf16).
        memory_budget: bytes per rank, or ``None`` (the device's memory minus a reserve).
        plan: a plan file to price instead of searching, or ``None``.
        framework: which recipe to print (``"all"``: every one).
        json: print the answer as JSON instead of the table and recipe.
        out: folder to write ``plan.json``, ``fit.json``, ``fit.html`` and the recipes in.
        verbose: ``-v`` count.
    """

    model: str
    cluster: str
    nodes: int
    sequence_length: int
    micro_batch: int
    precision: str | None
    memory_budget: int | None
    plan: Path | None
    framework: str
    json: bool
    out: Path | None
    verbose: int = 0


def add_fit_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``fit`` subcommand to ``sub`` (the ``execwrap`` subparsers)."""
    fit = sub.add_parser(
        "fit",
        parents=parents,
        help="will a model's training step fit a cluster: the plan, its speed, a recipe",
        description="Answer from a model's config alone (no weights, no GPU): whether its "
        "training step fits the cluster, the fastest plan that fits (groups, prefetch, "
        "resharding, checkpointing, offload), predicted tokens/s/GPU and step time, the "
        "memory per rank, the largest micro-batch that fits, and a recipe to paste.",
        epilog="example: execwrap fit path/to/config.json --cluster h100-nvlink-8 "
        "--sequence-length 8192 --micro-batch 2 --precision bf16. "
        "exit status: 0 the step fits, 1 it does not (a finding: no plan within the "
        "memory budget, or the --plan over it), 2 bad usage or input",
    )
    fit.add_argument(
        "model",
        metavar="MODEL",
        help="a transformers model id (only its config.json is fetched, when online), a "
        "config.json or its folder, or a factory PKG.MODULE:FUNCTION",
    )
    fit.add_argument(
        "--cluster",
        default="h100-nvlink-8",
        metavar="PRESET|FILE",
        help="a preset such as h100-nvlink-8 or h100-ib-400g (an unknown name lists them "
        "all) or a cost model file from execwrap calibrate (default: h100-nvlink-8)",
    )
    fit.add_argument(
        "--nodes",
        type=int,
        default=1,
        metavar="N",
        help="nodes of the job, one flat FSDP mesh over all GPUs (default: 1)",
    )
    fit.add_argument(
        "--sequence-length",
        type=int,
        default=4096,
        metavar="TOKENS",
        help="tokens per sequence (default: 4096)",
    )
    fit.add_argument(
        "--micro-batch",
        type=int,
        default=1,
        metavar="N",
        help="sequences per GPU per step (default: 1)",
    )
    fit.add_argument(
        "--precision",
        choices=_PRECISIONS,
        default=None,
        help="bf16: bf16 parameters, fp32 master weights and reduction; "
        "bf16-reduce: reduce in bf16 too; fp32 (default: bf16, or with --plan the plan's "
        "own; a --plan is priced in the precision given here)",
    )
    fit.add_argument(
        "--memory-budget",
        default=None,
        metavar="SIZE",
        help="bytes per GPU, e.g. 70GiB (default: the device's memory minus a reserve)",
    )
    fit.add_argument(
        "--plan",
        default=None,
        metavar="PLAN.json",
        help="price this plan file (execwrap.save_plan) instead of searching",
    )
    fit.add_argument(
        "--framework",
        choices=FIT_FRAMEWORKS,
        default="fsdp2",
        help="the recipe to print (default: fsdp2)",
    )
    fit.add_argument("--json", action="store_true", help="print the answer as JSON")
    fit.add_argument("--out", default=None, metavar="DIR",
                     help="write plan.json, fit.json, fit.html and the recipes there")  # fmt: skip


def fit_options(args: argparse.Namespace) -> FitOptions:
    """The checked :class:`FitOptions` of parsed ``fit`` arguments.

    Raises:
        CLIError: a count below 1, a bad ``--memory-budget``, a ``--plan`` file that
            does not exist, an ``--out`` path that is a file.
    """
    for name in ("nodes", "sequence_length", "micro_batch"):
        value = getattr(args, name)
        if value < 1:
            option = "--" + name.replace("_", "-")
            raise CLIError(f"{option} must be >= 1, got {value}")
    budget = None if args.memory_budget is None else memory_budget_option(args.memory_budget)
    plan = None if args.plan is None else Path(args.plan)
    if plan is not None and not plan.is_file():
        raise CLIError(f"--plan {args.plan!r}: no such file (a plan.json from execwrap.save_plan)")
    out = None if args.out is None else Path(args.out)
    if out is not None and out.exists() and not out.is_dir():
        raise CLIError(f"--out {args.out!r} is a file; pass a folder")
    return FitOptions(
        model=args.model,
        cluster=args.cluster,
        nodes=args.nodes,
        sequence_length=args.sequence_length,
        micro_batch=args.micro_batch,
        precision=args.precision,
        memory_budget=budget,
        plan=plan,
        framework=args.framework,
        json=args.json,
        out=out,
        verbose=getattr(args, "verbose", 0),
    )
