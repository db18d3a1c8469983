"""What the command line says while it works: ``-v`` logs the phases of a report,
calibration shows its progress (:class:`execwrap.cli.progress.ProgressHandler`),
``--quiet`` silences it, ``--version``; and calibration sees other processes
(:mod:`execwrap.cost.host`)."""

from __future__ import annotations

import io
import logging
import re
import subprocess
import sys
import time
from importlib.metadata import version

import psutil

from execwrap.cli import main
from execwrap.cli.calibrate_args import CalibrateOptions
from execwrap.cli.progress import ProgressHandler
from execwrap.cost.host import (
    StealMeter,
    disturbance,
    disturbance_reading,
    other_process_seconds,
    own_processes,
)


def test_version(capsys) -> None:
    assert main(["--version"]) == 0
    python = ".".join(str(v) for v in sys.version_info[:3])
    assert capsys.readouterr().out == (
        f"execwrap {version('execwrap')} (torch {version('torch')}, Python {python})\n"
    )


def test_verbose_report_logs_its_phases(tmp_path, capsys) -> None:
    out = tmp_path / "r"
    assert main(["report", "-v", "--out", str(out), "--format", "json"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "execwrap.cli.report" in ln]
    patterns = [
        r"building the model execwrap\.demo_models:build_demo_model on cpu",
        r"capturing the execution order of GPT \(symbolic trace, inputs long:2x16\)",
        r"captured 40 module calls, 52 parameters \(symbolic\) in \d+\.\d\d s",
        r"planning with policy transformer:Block, bucket size 100000",
        r"planned 3 groups and 2 baseline\(s\) in \d+\.\d\d s",
        rf"wrote {re.escape(str(out / 'report.json'))} in \d+\.\d\d s",
    ]
    assert len(lines) == len(patterns), lines
    for line, pattern in zip(lines, patterns, strict=True):
        assert re.fullmatch(rf"INFO execwrap\.cli\.report: {pattern}", line), line


def _with_progress(msg: str, progress: tuple[int, int, str]) -> logging.LogRecord:
    record = logging.LogRecord(
        "execwrap.cost.calibrate", logging.INFO, __file__, 1, msg, None, None
    )
    record.progress = progress
    return record


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_line_per_phase_in_a_pipe_and_a_bar_on_a_terminal() -> None:
    pipe = io.StringIO()
    handler = ProgressHandler(pipe, "calibrating")
    handler.emit(_with_progress("calibrate: 1/4 compute rates (0 s)", (0, 4, "compute rates")))
    handler.emit(logging.LogRecord("x", logging.INFO, __file__, 1, "no progress", None, None))
    handler.emit(_with_progress("calibrate: measured in 3 s", (4, 4, "done")))
    assert pipe.getvalue() == "calibrate: 1/4 compute rates (0 s)\ncalibrate: measured in 3 s\n"
    tty = _Terminal()
    handler = ProgressHandler(tty, "calibrating")
    handler.emit(_with_progress("", (1, 4, "the optimizer step")))
    handler.emit(_with_progress("", (4, 4, "done")))
    assert tty.getvalue() == (
        "\rcalibrating [######..................] 2/4 the optimizer step (0 s)\x1b[K"
        "\rcalibrating [########################] done (0 s)\x1b[K\n"
    )


def test_calibrate_options_carry_quiet_and_verbose(monkeypatch, tmp_path) -> None:
    from execwrap.cli.calibrate_args import calibrate_options
    from execwrap.cli.parser import build_parser

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = build_parser().parse_args(["calibrate", "--quiet", "--out", str(tmp_path / "c.json")])
    options = calibrate_options(args)
    assert (options.quiet, options.verbose) == (True, 0)
    assert isinstance(options, CalibrateOptions)
    args = build_parser().parse_args(["calibrate", "-v", "--out", str(tmp_path / "c.json")])
    assert (calibrate_options(args).quiet, calibrate_options(args).verbose) == (False, 1)


_SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n"


def test_another_process_busy_during_a_measurement_is_seen() -> None:
    """A child that burns 0.5 s of CPU while this process waits: counted as another
    process's time once this process is registered as the measurement's own (and
    the sample is disturbed), never outside that (steal alone)."""
    with own_processes([psutil.Process().pid]):
        meter = StealMeter()
        before, t0 = disturbance_reading(), time.perf_counter()
        with meter:
            subprocess.run([sys.executable, "-c", _SPIN], check=True)
        after, wall = disturbance_reading(), time.perf_counter() - t0
    assert after[1] - before[1] >= 0.4  # the child's 0.5 s, less a tick at each end
    assert meter.others_s >= 0.4 and meter.others_share() > 0.0
    if wall * (psutil.cpu_count() or 1) * 0.25 < 0.4:  # the sample's CPU time, a quarter
        assert disturbance(before, after, wall) >= 0.4
    assert other_process_seconds() == 0.0  # nothing registered outside the block
