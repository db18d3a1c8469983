"""The ``calibrate`` command's arguments, checked before torch is imported.

:func:`calibrate_options` turns the parsed arguments into a
:class:`CalibrateOptions` and rejects what can be seen without torch: an
output path that is a folder or sits in an unwritable one, a sweep limit out
of range, thread counts below 1, and a launch outside ``torchrun`` (the
command measures the process group it runs in, so it must run on every rank).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from execwrap.cli.errors import CLIError

__all__ = ["DEFAULT_COST_FILE", "LAUNCH_HINT", "CalibrateOptions", "calibrate_options"]

DEFAULT_COST_FILE = "cost-model.json"

#: How to launch the command (shown when it is run without torchrun).
LAUNCH_HINT = (
    "execwrap calibrate measures the process group it runs in, on every rank: launch it "
    "with torchrun, e.g. `torchrun --nproc_per_node=2 -m execwrap calibrate --out cost.json` "
    "(N processes = your data-parallel size; --nnodes/--rdzv-endpoint across machines)"
)


@dataclass(frozen=True)
class CalibrateOptions:
    """``execwrap calibrate`` arguments, checked.

    Attributes:
        out: the JSON file rank 0 writes.
        device: ``"cpu"``, ``"cuda"`` or ``None`` (CUDA with NCCL when available).
        backend: the process-group backend to initialise (``None``: nccl on
            CUDA, gloo otherwise).
        max_bytes: largest collective of the sweep, bytes (``None``: the default).
        threads: intra-op threads per rank (``None``: leave torch's setting).
        repeat: how many times as many runs each measurement takes (``>= 1``).
        quiet: print nothing on success (no progress, no summary).
        verbose: ``-v`` count (with ``-v`` the log shows the phases, not the progress).
    """

    out: Path
    device: str | None
    backend: str | None
    max_bytes: int | None
    threads: int | None
    repeat: int = 1
    quiet: bool = False
    verbose: int = 0


def calibrate_options(args: argparse.Namespace) -> CalibrateOptions:
    """Check the ``calibrate`` arguments.

    Raises:
        CLIError: not launched by torchrun, ``--out`` unusable, a bad number.
    """
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        raise CLIError(LAUNCH_HINT)
    out = Path(args.out)
    if out.is_dir():
        raise CLIError(f"--out {str(out)!r} is a folder; give the JSON file to write")
    folder = out.parent
    probe = folder
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise CLIError(f"--out {str(out)!r}: folder {str(probe)!r} is not writable")
    if args.max_mib is not None and not 1 <= args.max_mib <= 1 << 20:
        raise CLIError(f"--max-mib must be within 1..1048576 (MiB), got {args.max_mib}")
    if args.threads is not None and args.threads < 1:
        raise CLIError(f"--threads must be >= 1, got {args.threads}")
    if args.repeat < 1:
        raise CLIError(f"--repeat must be >= 1, got {args.repeat}")
    return CalibrateOptions(
        out=out,
        device=args.device,
        backend=args.backend,
        max_bytes=None if args.max_mib is None else args.max_mib * 2**20,
        threads=args.threads,
        repeat=args.repeat,
        quiet=bool(getattr(args, "quiet", False)),
        verbose=int(getattr(args, "verbose", 0) or 0),
    )
