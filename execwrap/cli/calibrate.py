"""``execwrap calibrate``: measure the cost model on this process group and write it as JSON.

Runs on every rank under ``torchrun`` (the environment gives rank and world
size): initialises the process group if the launcher did not (``env://``),
calls :meth:`execwrap.cost.CostModel.calibrate`, and on rank 0 writes the
model (atomically) and prints a summary. The group it initialised is
destroyed at the end.
"""

from __future__ import annotations

import gc
import logging
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from execwrap.cli.calibrate_args import CalibrateOptions
from execwrap.cli.errors import EXIT_OK, CLIError
from execwrap.cli.owned_files import check_replaceable_file
from execwrap.cli.progress import ProgressHandler
from execwrap.cli.text import print_table
from execwrap.cost import CostModel
from execwrap.cost.model import COST_MODEL_KIND
from execwrap.util.formatting import format_bytes

__all__ = ["run_calibrate", "summary_rows"]


def run_calibrate(options: CalibrateOptions) -> int:
    """Calibrate, write ``options.out`` on rank 0, print the summary there. Returns 0.

    Raises:
        CLIError: ``--device cuda`` without CUDA, or the process group cannot start.
    """
    if options.device == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device cuda: CUDA is not available here; use --device cpu (gloo)")
    check_replaceable_file(  # before a minute of measuring, on every rank
        Path(options.out), lambda d: isinstance(d, dict) and d.get("kind") == COST_MODEL_KIND,
        "a cost model",
    )  # fmt: skip
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    cuda = options.device == "cuda" or (options.device is None and torch.cuda.is_available())
    created = False
    if not dist.is_initialized():
        backend = options.backend or ("nccl" if cuda else "gloo")
        if cuda:
            torch.cuda.set_device(_local_rank())
        try:
            dist.init_process_group(backend)
        except (RuntimeError, ValueError) as e:
            raise CLIError(f"cannot start the {backend} process group: {e}") from e
        created = True
    show = dist.get_rank() == 0 and not options.quiet
    progress = _attach_progress() if show and options.verbose == 0 else None
    level = _CALIBRATE_LOG.level
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        model = CostModel.calibrate(
            device=device, max_bytes=options.max_bytes, repeat=options.repeat
        )
        if dist.get_rank() == 0:
            model.save(options.out)
        if show:
            print(f"{model.source}")
            print_table(summary_rows(model))
            print(f"wrote {options.out}")
    finally:
        if progress is not None:
            _CALIBRATE_LOG.removeHandler(progress)
            _CALIBRATE_LOG.setLevel(level)
        gc.collect()  # release what holds the group before destroying it (gloo teardown)
        if created:
            dist.destroy_process_group()
    return EXIT_OK


#: The logger calibration reports its phases to (:mod:`execwrap.cost.calibrate`).
_CALIBRATE_LOG = logging.getLogger("execwrap.cost.calibrate")


def _attach_progress() -> ProgressHandler:
    """Show calibration's phases on stderr (a bar on a terminal, a line per phase
    otherwise): the handler, attached to calibration's logger at INFO."""
    handler = ProgressHandler(sys.stderr, "calibrating")
    _CALIBRATE_LOG.addHandler(handler)
    if _CALIBRATE_LOG.getEffectiveLevel() > logging.INFO:
        _CALIBRATE_LOG.setLevel(logging.INFO)
    return handler


def summary_rows(model: CostModel) -> list[tuple[str, str]]:
    """The summary: collective times at a few sizes (as priced inside a training step: the
    sweep times the in-step factors) and the scalar fields."""
    rows = [
        (
            f"in a step: all-gather / reduce-scatter {nbytes // 2**20} MiB",
            f"{model.all_gather_time(nbytes) * 1e3:.3f} / "
            f"{model.reduce_scatter_time(nbytes) * 1e3:.3f} ms",
        )
        for nbytes in (2**20, 16 * 2**20, 256 * 2**20)
    ]
    rows += [
        ("copy bandwidth", f"{model.copy_bytes_per_s / 1e9:.2f} GB/s"),
        (
            "copy into a new buffer, 1 / 16 / 256 MiB",
            " / ".join(f"{model.copy_time(n) * 1e3:.3f}" for n in (2**20, 2**24, 2**28)) + " ms",
        ),
        ("fixed cost per group per collective", f"{model.group_overhead_s * 1e6:.1f} us"),
        ("  and per parameter tensor", f"{model.param_overhead_s * 1e6:.1f} us"),
        ("overlap (compute speed beside a collective)", f"{model.overlap:.2f}"),
        ("matmul rate", f"{model.compute.flops_per_s / 1e9:.1f} GFLOP/s"),
        ("cost per op", f"{model.compute.op_overhead_s * 1e6:.2f} us"),
        ("optimizer cost per parameter tensor", f"{model.optimizer_param_overhead_s * 1e6:.1f} us"),
        (
            "device memory per rank",
            "-" if model.device_memory_bytes is None else format_bytes(model.device_memory_bytes),
        ),
    ]
    if model.optimizer_curve is not None:
        rows.append(
            (
                "  AdamW per tensor of 1 / 16 MiB",
                " / ".join(f"{model.optimizer_curve.time(n) * 1e3:.3f}" for n in (2**20, 2**24))
                + " ms",
            )
        )
    ac = model.checkpoint_overhead
    if not ac.is_zero:
        for mode in ("full", "selective"):
            rows.append(
                (
                    f"{mode} checkpointing, forward / recompute",
                    f"{getattr(ac, f'{mode}_forward_op_s') * 1e6:.1f} / "
                    f"{getattr(ac, f'{mode}_recompute_op_s') * 1e6:.1f} us per op, "
                    f"{getattr(ac, f'{mode}_forward_region_s') * 1e6:.0f} / "
                    f"{getattr(ac, f'{mode}_recompute_region_s') * 1e6:.0f} us per region",
                )
            )
    return rows


def _local_rank() -> int:
    import os

    return int(os.environ.get("LOCAL_RANK", "0"))
