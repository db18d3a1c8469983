"""``execwrap report --bucket-size auto --cost-model FILE|PRESET --world-size N --memory-budget SIZE``.

In-process through :func:`execwrap.cli.main` (the argument checks need no
torch; the test that spawns ``python -m execwrap`` for argument errors checks
that torch is not imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from execwrap.cli import main
from execwrap.cli.budget import parse_bytes
from execwrap.cost import PRESETS
from execwrap.report.html_page import NO_CHARTS_LINE
from tests.execwrap.autoplan_cases import cost_model

#: The presets as the command line lists them.
_PRESETS = ", ".join(sorted(PRESETS))

REPO = Path(__file__).resolve().parents[2]


def _err_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("execwrap: error: ")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "text, nbytes",
    [
        ("40GiB", 40 * 2**30),
        ("8GB", 8 * 10**9),
        ("512mib", 512 * 2**20),
        ("1.5KiB", 1536),
        ("4096", 4096),
        ("4096B", 4096),
        (" 2 TiB ", 2 * 2**40),
        ("40e9", 40 * 10**9),  # as in Python, where plan_wrap takes memory_budget=40e9
        ("2.5e3MiB", 2500 * 2**20),
    ],
)
def test_parse_bytes(text: str, nbytes: int) -> None:
    assert parse_bytes(text) == nbytes


@pytest.mark.parametrize(
    "text, match",
    [
        ("40G", r"'G' is ambiguous: write GiB \(powers of 1024\) or GB \(powers of 1000\)"),
        ("lots", r"invalid size 'lots': expected a number of bytes with an optional unit"),
        ("1.5B", r"invalid size '1.5B': not a whole number of bytes"),
    ],
)
def test_parse_bytes_refuses(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_bytes(text)


def test_cost_model_folder_is_named_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "calibrations"
    folder.mkdir()
    args = ["--bucket-size", "auto", "--cost-model", f"{folder}/"]
    assert main(["report", "--out", str(tmp_path / "r"), *args]) == 2
    assert f"--cost-model '{folder}/': a folder, not a cost model file" in _err_line(capsys)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bucket-size", "auto"], "--bucket-size auto needs --cost-model FILE|PRESET"),
        (["--cost-model", "h100-nvlink-8"], "--cost-model only applies with --bucket-size auto"),
        (
            ["--memory-budget", "1GiB", "--world-size", "8"],
            "--world-size, --memory-budget only apply with --bucket-size auto",
        ),
        (
            ["--bucket-size", "auto", "--cost-model", "missing/cost.json"],
            "--cost-model 'missing/cost.json': no such file",
        ),
        (
            ["--bucket-size", "auto", "--cost-model", "h100-nvlink-8", "--memory-budget", "40G"],
            "--memory-budget: invalid size '40G'",
        ),
        (
            ["--bucket-size", "auto", "--cost-model", "h100-nvlink-8", "--memory-budget", "0"],
            "--memory-budget '0': must be > 0 bytes per rank, got 0; leave --memory-budget out "
            "to plan within the device's memory",
        ),
        (
            ["--bucket-size", "auto", "--cost-model", "h100-nvlink-8", "--memory-budget", "4e5"],
            "--memory-budget '4e5' is 400000 bytes, below 1 MiB per rank, too little for a "
            "training step: write the unit, e.g. 40GiB or 40GB (a bare number is bytes)",
        ),
        (
            ["--bucket-size", "auto", "--cost-model", ""],
            "--cost-model '' is empty: pass a cost model file from 'execwrap calibrate' or a "
            f"preset ({_PRESETS})",
        ),
        (
            ["--bucket-size", "auto", "--cost-model", "h100-nvlink-8", "--memory-budget", "65536"],
            "--memory-budget '65536' is 65536 bytes, below 1 MiB per rank, too little for a "
            "training step: write the unit, e.g. 40GiB or 40GB (a bare number is bytes)",
        ),
        (
            ["--bucket-size", "auto", "--cost-model", "h100-nvlink-8", "--memory-budget", "40"],
            "--memory-budget '40' is 40 bytes, below 1 MiB per rank, too little for a training "
            "step: write the unit, e.g. 40GiB or 40GB (a bare number is bytes)",
        ),
        (
            ["--bucket-size", "auto", "--cost-model", "h100-nvlink-8", "--world-size", "0"],
            "--world-size must be >= 1, got 0",
        ),
        (
            ["--bucket-size", "auto", "--cost-model", "no-such-preset"],
            "--cost-model 'no-such-preset': no such file and no such preset; presets: " + _PRESETS,
        ),
    ],
)
def test_auto_options_are_checked(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--out", str(tmp_path / "r"), *args]) == 2
    assert message in _err_line(capsys)


@pytest.mark.parametrize("budget", [["--memory-budget", "-5GiB"], ["--memory-budget=-5GiB"]])
def test_negative_memory_budget_is_named(
    budget: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not argparse's "expected one argument": the library's rule and advice, as options."""
    args = ["report", "--bucket-size", "auto", "--cost-model", "h100-nvlink-8", *budget]
    assert main([*args, "--out", str(tmp_path / "r")]) == 2
    text = budget[-1].split("=")[-1]
    assert _err_line(capsys) == (
        f"execwrap: error: --memory-budget {text!r}: must be > 0 bytes per rank, got "
        "-5368709120; leave --memory-budget out to plan within the device's memory"
    )


def test_file_named_like_a_preset_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file ./h100-ib-400g no longer wins silently over the preset: both are named."""
    monkeypatch.chdir(tmp_path)
    cost_model().save(tmp_path / "h100-ib-400g")
    args = ["report", "--bucket-size", "auto", "--out", "r", "--format", "json"]
    assert main([*args, "--cost-model", "h100-ib-400g"]) == 2
    assert _err_line(capsys) == (
        "execwrap: error: --cost-model 'h100-ib-400g' names both the preset h100-ib-400g and "
        "the file ./h100-ib-400g in the current folder: pass --cost-model ./h100-ib-400g for "
        "the file, or rename or move the file for the preset"
    )
    assert main([*args, "--cost-model", "./h100-ib-400g"]) == 0  # the file: 2 ranks, not 16
    assert (
        json.loads((tmp_path / "r" / "report.json").read_text())["plan"]["search"]["world_size"]
        == 2
    )


def test_argument_errors_import_no_torch(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = ["report", "--bucket-size", "auto", "--cost-model", "x.json", "--memory-budget", "9G"]
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "execwrap", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    imported = {
        line.split("|")[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "execwrap.cli.parser" in imported
    assert not any(m == "torch" or m.startswith("torch.") for m in imported)
    assert "execwrap: error: --cost-model 'x.json': no such file" in proc.stderr


def test_report_with_a_cost_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cm_path = cost_model().save(tmp_path / "cost.json")
    out = tmp_path / "r"
    args = ["report", "--bucket-size", "auto", "--cost-model", str(cm_path), "--out", str(out)]
    assert main([*args, "--memory-budget", "10MiB"]) == 0
    text = capsys.readouterr().out
    assert "  auto plan  " in text and "  memory budget  " in text
    assert "  compute times  " in text and "measured (cpu)" in text  # timed on this CPU
    data = json.loads((out / "report.json").read_text())
    plan = data["plan"]
    assert plan["schema_version"] == 3
    assert plan["search"]["memory_budget"] == 10 * 2**20
    assert plan["search"]["world_size"] == 2
    assert plan["estimate"]["peak_memory_bytes"] <= 10 * 2**20
    chosen = plan["search"]["candidates"][plan["search"]["chosen"]]
    assert chosen["step_time_s"] == plan["estimate"]["step_time_s"]
    assert plan["prefetch"] == chosen["prefetch"]
    assert plan["stats"]["prefetch"] == plan["prefetch"]  # the plan's stats at its own depth
    # the summary's collectives and peak are the chosen plan's, not --prefetch's
    rows = {
        line.split("  ")[1]: line.rsplit("  ", 1)[1]
        for line in text.splitlines()
        if "  " in line[2:]
    }
    assert (
        rows["all-gathers/step"] == f"{plan['estimate']['all_gathers']} (the auto plan's choices)"
    )
    assert f"peak unsharded (prefetch {plan['prefetch']}, as chosen)" in rows
    assert rows["fallback reason"] == (
        "- (not tried: the auto-planner needs compute times, recorded at run time)"
    )
    for base in data["baselines"].values():
        assert base["estimate"]["world_size"] == 2
    assert main(["show", str(out / "report.json")]) == 0
    shown = capsys.readouterr().out
    assert ", bucket size auto\n" in shown
    kept = sum(1 for f in plan["reshard_after_forward"][1:] if not f)
    settings = (
        f"prefetch {plan['prefetch']} (chosen), every group but the root resharded after forward"
        if kept == 0
        else f"prefetch {plan['prefetch']} (chosen), {kept} group{'' if kept == 1 else 's'} "
        "besides the root not resharded after forward"
    )
    assert (
        f"auto plan: {settings}, predicted step {plan['estimate']['step_time_s'] * 1e3:.3f} ms, "
        "peak "
    ) in shown
    assert "on 2 ranks (budget 10.00 MiB)\n" in shown
    # the same counts `execwrap report` printed: at the auto plan's own choices
    peak = rows[f"peak unsharded (prefetch {plan['prefetch']}, as chosen)"]
    assert (
        f"figures ({settings}): {len(plan['units'])} groups, "
        f"{plan['estimate']['all_gathers']} all-gathers/step, "
    ) in shown
    assert f"peak unsharded {peak}\n" in shown
    page = (out / "report.html").read_text()
    assert '<section id="predicted">' in page
    assert ('id="chart-step"' in page and 'id="chart-candidates"' in page) or NO_CHARTS_LINE in page
    assert "Predicted step time" in page


def test_impossible_budget_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cm_path = cost_model().save(tmp_path / "cost.json")
    args = [
        "report",
        "--bucket-size",
        "auto",
        "--cost-model",
        str(cm_path),
        "--memory-budget",
        "1KiB",
    ]
    assert main([*args, "--out", str(tmp_path / "r")]) == 1  # a finding, as fit's
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("execwrap: ")]
    assert len(err) == 1, err  # one line (the timing WARNING of recording aside)
    line = err[0]
    assert line.startswith(
        "execwrap: --memory-budget: no plan fits the memory budget of 1.00 KiB (1024 bytes) "
        "per rank: the smallest peak any candidate reaches is "
    )
    # the remedy names the command's options, not plan_wrap's optimizer= (no such flag)
    assert line.endswith(
        "dominated by optimizer state (861.50 KiB (882176 bytes)); to fit, raise --memory-budget, "
        "or plan for more ranks (--world-size N, with a cost model for N ranks); the command "
        "line prices AdamW's state (for an optimizer with less state, plan in Python: "
        'plan_wrap(..., optimizer="sgd"))'
    )
    assert not (tmp_path / "r").exists()


def test_no_compute_times_warning_names_the_input_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --input the planner has no compute times; its WARNING says to pass
    --input, not to call record_execution_order."""
    args = ["report", "--model", "tests.execwrap.factories:demo2", "--bucket-size", "auto"]
    args += ["--cost-model", "h100-nvlink-8", "--out", str(tmp_path / "r"), "--format", "json"]
    assert main(args) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "WARNING" in line]
    assert warnings == [
        "WARNING execwrap.planning.auto.space: the auto-planner has no compute times, so it weighs "
        "communication and parameter memory only (no compute to overlap, no activations): pass "
        "--input SPEC (one forward and backward on those inputs times the compute, or estimates "
        "it with a GPU cost model's rates)"
    ]


def test_cost_model_for_another_world_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cm_path = cost_model().save(tmp_path / "cost.json")
    args = ["report", "--bucket-size", "auto", "--cost-model", str(cm_path), "--world-size", "4"]
    assert main([*args, "--out", str(tmp_path / "r")]) == 2
    assert _err_line(capsys) == (
        f"execwrap: error: --cost-model '{cm_path}' does not fit world size 4 (this cost model "
        "is for 2 ranks): calibrate on the target's 4 ranks (`execwrap calibrate` under "
        "torchrun), pass a preset that describes them (--cost-model PRESET --world-size 4; "
        f"presets: {_PRESETS}), or leave --world-size out to "
        "plan for 2 ranks"
    )


def test_cost_model_for_more_ranks_than_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """For one rank no preset applies (they describe 2 or more GPUs): none is suggested."""
    cm_path = cost_model().save(tmp_path / "cost.json")
    args = ["report", "--bucket-size", "auto", "--cost-model", str(cm_path), "--world-size", "1"]
    assert main([*args, "--out", str(tmp_path / "r")]) == 2
    assert _err_line(capsys) == (
        f"execwrap: error: --cost-model '{cm_path}' does not fit world size 1 (this cost model "
        "is for 2 ranks): calibrate on the target's 1 rank (`execwrap calibrate` under "
        "torchrun), or leave --world-size out to plan for 2 ranks"
    )


def test_report_for_a_gpu_preset_estimates_compute(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CPU model planned for 8 H100s: compute estimated on a meta copy of the model
    with the preset's rates (tied weights stay tied: the factory builds it on meta)."""
    out = tmp_path / "r"
    args = ["report", "--bucket-size", "auto", "--cost-model", "h100-nvlink-8", "--world-size", "8"]
    assert main([*args, "--out", str(out), "--format", "json"]) == 0
    assert "estimated (cuda)" in capsys.readouterr().out
    data = json.loads((out / "report.json").read_text())
    assert data["order"]["timing_method"] == "estimated"
    assert data["plan"]["search"]["world_size"] == 8
    assert data["plan"]["estimate"]["compute_time_s"] > data["plan"]["estimate"]["optimizer_time_s"]


def test_prefetch_with_auto_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["report", "--bucket-size", "auto", "--cost-model", "h100-nvlink-8", "--prefetch", "2"]
    assert main(args) == 2
    assert _err_line(capsys) == (
        "execwrap: error: --prefetch 2: with --bucket-size auto the auto-planner chooses the "
        "prefetch depth (0, 1 or 2) and reshard_after_forward; leave --prefetch out (the "
        "baselines are then predicted at prefetch 1)"
    )
