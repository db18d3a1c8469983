"""``execwrap calibrate``: argument errors without torch, and a real run on 2 ranks under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from execwrap.cli import main
from execwrap.cli.calibrate_args import LAUNCH_HINT
from execwrap.cost import CostModel
from tests._calibrate_phases import assert_phase_lines

REPO = Path(__file__).resolve().parents[2]


def _run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    environ.update(PYTHONPATH=str(REPO), **env)
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "execwrap", *args],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["calibrate"], {}, LAUNCH_HINT),
        (["calibrate", "--out", "."], {"RANK": "0", "WORLD_SIZE": "2"}, "--out '.' is a folder"),
        (["calibrate", "--max-mib", "0"], {"RANK": "0", "WORLD_SIZE": "2"}, "--max-mib must be"),
        (
            ["calibrate", "--threads", "0"],
            {"RANK": "0", "WORLD_SIZE": "2"},
            "--threads must be >= 1",
        ),
        (
            ["calibrate", "--repeat", "0"],
            {"RANK": "0", "WORLD_SIZE": "2"},
            "--repeat must be >= 1, got 0",
        ),
        (["calibrate", "--device", "tpu"], {}, "invalid choice: 'tpu'"),
    ],
)
def test_argument_errors_do_not_import_torch(
    args: list[str], env: dict[str, str], message: str, tmp_path: Path
) -> None:
    proc = _run(args, tmp_path, **env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("execwrap: error:")]
    assert len(errors) == 1 and message in errors[0]
    imported = [ln.split("|")[-1].strip() for ln in proc.stderr.splitlines() if ln.count("|") == 2]
    assert "torch" not in imported


def test_help_mentions_torchrun(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--help"]) == 0
    assert (
        "torchrun --nproc_per_node=2 -m execwrap calibrate --out cost.json"
        in capsys.readouterr().out
    )


@pytest.mark.slow
def test_calibrate_under_torchrun_writes_the_model(tmp_path: Path) -> None:
    """The real launch: ``torchrun ... -m execwrap calibrate`` in a subprocess.

    Slow (a whole calibration, 90-165 s on 2 loaded cores); the default run covers the same
    command, its file, summary and progress lines, and its model on both ranks, in one
    calibration: ``tests/distributed/test_calibrate.py::test_calibrate_two_gloo_ranks``
    (the CLI's ``main`` on 2 spawned ranks). What only this test adds: the group started
    by the command itself from torchrun's environment (``env://``) and destroyed at the end.
    """
    environ = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    environ.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "-m",
            "execwrap",
            "calibrate",
            "--out",
            "cost.json",
            "--max-mib",
            "1",
        ],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,  # 165 s while other processes took 77% of a 2-core machine
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cm = CostModel.load(tmp_path / "cost.json")
    assert (cm.world_size, cm.backend, cm.device_type) == (2, "gloo", "cpu")
    assert proc.stdout.count("wrote cost.json") == 1  # rank 0 only
    assert "fixed cost per group per collective" in proc.stdout
    assert 0.0 <= cm.checkpoint_overhead.selective_forward_op_s < 1e-2  # measured: may clamp to 0
    assert "selective checkpointing, forward / recompute" in proc.stdout
    # progress on stderr, a line per phase (not a terminal), from rank 0 only
    assert_phase_lines(proc.stderr)


def test_summary_shows_the_optimizer_curve() -> None:
    from execwrap.cli.calibrate import summary_rows
    from execwrap.cost import CollectiveCurve, CostModel

    cm = CostModel.preset("h100-nvlink-8")
    assert not any(label.startswith("  AdamW") for label, _ in summary_rows(cm))
    curve = CollectiveCurve.from_samples([2**20, 2**24], [1e-3, 2e-2])
    rows = dict(summary_rows(cm.replace(optimizer_curve=curve)))
    assert rows["  AdamW per tensor of 1 / 16 MiB"] == "1.000 / 20.000 ms"
    assert not any("checkpointing" in label for label, _ in summary_rows(cm))


def test_summary_shows_checkpointing_host_work() -> None:
    from execwrap.cli.calibrate import summary_rows
    from execwrap.cost import CostModel
    from execwrap.cost.checkpoint_overhead import CheckpointOpCost

    ac = CheckpointOpCost(5e-6, 8e-5, 1e-5, 1.2e-4, 3.5e-5, 3.2e-4, 3.3e-5, 6e-5)
    rows = dict(summary_rows(CostModel.preset("h100-nvlink-8").replace(checkpoint_overhead=ac)))
    assert rows["full checkpointing, forward / recompute"] == (
        "5.0 / 10.0 us per op, 80 / 120 us per region"
    )
    assert rows["selective checkpointing, forward / recompute"] == (
        "35.0 / 33.0 us per op, 320 / 60 us per region"
    )
