"""The ``execwrap`` argument parser: :func:`build_parser`.

One table of subcommands (``report``, ``diff``, ``show``) and their options.
Usage errors are one ``execwrap: error: ...`` line and exit status 2. The
parser only reads strings and ints; :mod:`execwrap.cli.options` checks the
values. Imports no torch, so ``--help`` answers at once.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import NoReturn

from execwrap.cli.calibrate_args import DEFAULT_COST_FILE
from execwrap.cli.errors import EXIT_USAGE, PROG
from execwrap.cli.fit_args import add_fit_parser
from execwrap.cli.input_spec import INPUT_SPEC_HELP
from execwrap.cli.options import (
    DEFAULT_DEMO_BUCKET,
    DEFAULT_DEMO_INPUT,
    DEFAULT_DEMO_POLICY,
    DEFAULT_MODEL,
    DEFAULT_OUT,
    POLICY_HELP,
)
from execwrap.cli.text import terminal_safe
from execwrap.report.files import REPORT_FORMATS

__all__ = ["DEFAULTS_HELP", "build_parser", "version_line"]

DEFAULTS_HELP = f"""\
defaults:         built-in model (no --model)   other models (--model)
  --input         {DEFAULT_DEMO_INPUT:<30}none (symbolic capture only)
  --policy        {DEFAULT_DEMO_POLICY:<30}always
  --bucket-size   {DEFAULT_DEMO_BUCKET:<30}none"""

_REPORT_DESCRIPTION = (
    "Capture a model's execution order (symbolic with torch.fx first; where fx cannot "
    "trace it, one forward/backward with the --input tensors on fake tensors, which "
    "computes nothing; a real one only where the fake run cannot decide), plan FSDP "
    "units, compare "
    "with baseline policies and write the report (report.json, calls.csv, "
    "params.csv, order.graphml, report.html). With no arguments: the built-in "
    "GPT-style model into ./execwrap-report/."
)


def version_line() -> str:
    """``"execwrap 0.1.0 (torch 2.13.0+cpu, Python 3.11.7)"``: the installed versions,
    read from the package metadata (torch is not imported)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    python = ".".join(str(v) for v in sys.version_info[:3])
    return f"{PROG} {installed('execwrap')} (torch {installed('torch')}, Python {python})"


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        hint = f" (see '{self.prog} --help')"
        self.exit(EXIT_USAGE, terminal_safe(f"{PROG}: error: {message}{hint}") + "\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``execwrap`` argument parser (subcommands ``report``, ``diff``, ``show``, ``fit``, ``calibrate``).

    The chosen subcommand is ``args.command`` (``None`` when none was given).
    """
    verbose = _Parser(add_help=False)
    verbose.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log progress (-v: INFO, -vv: DEBUG) to stderr",
    )
    parser = _Parser(
        prog=PROG,
        description="Execution-order FSDP wrap planning: capture, plan, report.",
        epilog="exit status: 0 success, 1 a finding (diff: orders differ; fit: the step does not "
        "fit; report: no plan within --memory-budget), 2 bad usage or input",
        parents=[verbose],
    )
    parser.add_argument(
        "--version", action="version", version=version_line(), help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    report = sub.add_parser(
        "report",
        parents=[verbose],
        help="capture, plan and write a report (default: the built-in GPT model)",
        description=textwrap.fill(_REPORT_DESCRIPTION, width=79, break_on_hyphens=False),
        epilog=INPUT_SPEC_HELP + "\n\n" + POLICY_HELP + "\n\n" + DEFAULTS_HELP + "\n\n"
        "exit status: 0 the report is written, 1 no plan within --memory-budget (a finding,\n"
        "nothing written), 2 bad usage or input",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument(
        "--model",
        metavar="PKG.MODULE:FACTORY",
        help="callable returning an nn.Module (default: the built-in GPT, "
        f"{DEFAULT_MODEL}); modules in the current folder are found",
    )
    report.add_argument(
        "--input",
        metavar="SPEC",
        help=f"example inputs (see below; default: {DEFAULT_DEMO_INPUT} for the built-in "
        "model, none otherwise: symbolic capture only)",
    )
    report.add_argument(
        "--policy",
        metavar="POLICY",
        help=f"wrap policy (see below; default: {DEFAULT_DEMO_POLICY} for the built-in "
        "model, always otherwise)",
    )
    report.add_argument(
        "--bucket-size",
        metavar="N",
        help="merge consecutive units into FSDP2 groups up to N elements (K/M/G suffixes; "
        "'none' disables; 'auto': the auto-planner chooses groups, prefetch and "
        "reshard_after_forward from --cost-model; "
        f"default: {DEFAULT_DEMO_BUCKET} for the built-in model, none otherwise)",
    )
    report.add_argument(
        "--cost-model",
        metavar="FILE|PRESET",
        help="for --bucket-size auto: a cost model JSON written by 'execwrap calibrate', "
        "or a preset name (e.g. h100-nvlink-8)",
    )
    report.add_argument(
        "--world-size",
        type=int,
        metavar="N",
        help="for --bucket-size auto: ranks to plan for (default: the cost model's)",
    )
    report.add_argument(
        "--memory-budget",
        metavar="BYTES",
        help="for --bucket-size auto: peak memory per rank the plan must fit, e.g. 40GiB, "
        "512MiB, 8GB (binary KiB/MiB/GiB/TiB or decimal KB/MB/GB/TB; default: the cost model's device memory minus a reserve)",
    )
    report.add_argument(
        "--plan",
        metavar="FILE",
        help="report the plan in FILE (a plan file: groups by module FQN, written by "
        "execwrap.planning.plan_file.save_plan_file) instead of planning; exit 2 when it "
        "is for another model",
    )
    report.add_argument(
        "--tracer",
        metavar="PKG.MODULE:CLASS",
        help="torch.fx.Tracer subclass for symbolic capture (default: torch.fx.Tracer)",
    )
    report.add_argument(
        "--concrete-arg",
        metavar="NAME=VALUE",
        action="append",
        help="keep forward argument NAME concrete while tracing; VALUE is a Python "
        "literal (repeatable), e.g. use_cache=False",
    )
    report.add_argument(
        "--device",
        choices=("cpu", "meta"),
        default="cpu",
        help="build the model and inputs here; meta allocates no weights (default: cpu)",
    )
    report.add_argument(
        "--prefetch",
        type=int,
        default=None,
        metavar="N",
        help="prefetch depth for the memory prediction (default: 1; with --bucket-size auto "
        "the auto-planner chooses it)",
    )
    report.add_argument(
        "--out", default=DEFAULT_OUT, metavar="DIR", help=f"output folder (default: {DEFAULT_OUT})"
    )
    report.add_argument(
        "--format",
        default=",".join(REPORT_FORMATS),
        metavar="LIST",
        help=f"comma-separated formats out of {','.join(REPORT_FORMATS)} (default: all)",
    )

    diff = sub.add_parser(
        "diff",
        parents=[verbose],
        help="first divergence between two saved orders (exit 1 when they differ)",
        description=(
            "Compare two saved orders (report.json files, report folders or bare "
            "ExecutionOrder JSON): print the first forward call where they part and an "
            "aligned view around it. Exit 1 when they differ, 0 when they are the same."
        ),
    )
    diff.add_argument("a", metavar="A.json")
    diff.add_argument("b", metavar="B.json")
    diff.add_argument(
        "--context", type=int, default=3, metavar="N", help="calls shown each side (default: 3)"
    )

    show = sub.add_parser(
        "show",
        parents=[verbose],
        help="print a saved order and its plan",
        description="Print the order and plan of a saved report.json (or a bare saved "
        "ExecutionOrder JSON, a report folder, or a plan.json of execwrap.save_plan or "
        "execwrap fit --out).",
    )
    show.add_argument("file", metavar="ORDER.json")

    add_fit_parser(sub, [verbose])

    calibrate = sub.add_parser(
        "calibrate",
        parents=[verbose],
        help="measure the cost model of this process group (run under torchrun)",
        description="Measure FSDP2's collective, copy and bookkeeping costs on the process "
        "group this command runs in (every rank, under torchrun) and write the cost model "
        "as JSON on rank 0, for `execwrap report --cost-model FILE` and "
        "CostModel.load. Takes 40-65 s on 2 gloo ranks of a 2-core CPU, longer while the "
        "machine is busy (runs that other processes disturb are left out or repeated); "
        "rank 0 shows each phase on stderr.",
        epilog="example: torchrun --nproc_per_node=2 -m execwrap calibrate --out cost.json",
    )
    calibrate.add_argument(
        "--out",
        default=DEFAULT_COST_FILE,
        metavar="FILE",
        help=f"JSON file to write (default: {DEFAULT_COST_FILE})",
    )
    calibrate.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="device FSDP2 runs on (default: cuda with NCCL when available, else cpu with gloo)",
    )
    calibrate.add_argument(
        "--backend",
        choices=("gloo", "nccl"),
        default=None,
        help="process-group backend when the launcher did not start one (default: by --device)",
    )
    calibrate.add_argument(
        "--max-mib",
        type=int,
        default=None,
        metavar="N",
        help="largest collective of the size sweep, MiB (default: 64 on CPU, 1024 on CUDA)",
    )
    calibrate.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="N times as many runs of the sweep, optimizer loop, overlap and FSDP2 stacks: "
        "about N times the time, medians of N times the samples (default: 1, 40-65 s on "
        "2 CPU ranks)",
    )
    calibrate.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="intra-op threads per rank (default: as launched; torchrun sets 1 per process)",
    )
    calibrate.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print nothing on success: no progress (shown on stderr by default, a bar on "
        "a terminal) and no summary",
    )
    return parser
