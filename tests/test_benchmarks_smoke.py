"""Smoke test: every benchmark runs end to end in ``--quick`` mode.

Each benchmark runs as a subprocess, the way the README tells users to run it
(``python -m benchmarks.NAME``; one also as ``python benchmarks/NAME.py``),
so a broken import, option or table fails here instead of rotting silently.
Results go to a temp dir (``--out``) or are not written (``--no-write``):
smoke runs never touch ``benchmarks/results/``. No wall time is asserted.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
#: A cost model calibrated on 2 gloo ranks by an earlier autoplan run (``--cost-model``).
SAVED_COST_MODEL = RESULTS / "autoplan-2026-12-03_133431.cost.json"

# (name, how to run it, writes a result file into --out)
CASES = [
    ("capture", ["-m", "benchmarks.capture"], True),
    ("scale", ["-m", "benchmarks.scale"], True),
    ("plans", ["benchmarks/plans.py"], True),  # script form
    ("fsdp_step", ["-m", "benchmarks.fsdp_step"], True),
    ("monitor_overhead", ["-m", "benchmarks.monitor_overhead"], True),
    ("runtime_overhead", ["-m", "benchmarks.runtime_overhead"], True),
    ("startup", ["-m", "benchmarks.startup"], True),
    ("report_io", ["-m", "benchmarks.report_io"], True),
    ("estimate", ["-m", "benchmarks.estimate"], True),
    ("zero_cost", ["-m", "benchmarks.zero_cost"], True),
    # a saved calibration of 2 gloo ranks: the same plans, steps and tables without the
    # calibration (1-2 minutes, 70% of this smoke's time; it runs in the slow case below)
    ("autoplan", ["-m", "benchmarks.autoplan", "--cost-model", str(SAVED_COST_MODEL)], True),
    ("published", ["-m", "benchmarks.published"], True),
    ("architectures", ["-m", "benchmarks.architectures"], True),
    ("joint_plan", ["-m", "benchmarks.joint_plan"], True),
    # calibrates (CostModel.calibrate on the spawned ranks, 4 MiB) before the same run as
    # "autoplan" above, which covers the rest: slow. The calibration itself is covered by
    # tests/distributed/test_calibrate.py
    pytest.param(
        "autoplan",
        ["-m", "benchmarks.autoplan"],
        True,
        marks=pytest.mark.slow,
        id="autoplan-calibrated",
    ),
    # 2 spawned ranks over 38 training steps: minutes, so kept out of the default run
    pytest.param(
        "training_step",
        ["-m", "benchmarks.training_step"],
        True,
        marks=pytest.mark.slow,
        id="training_step",
    ),
]


def _results_listing() -> set[str]:
    return {p.name for p in RESULTS.glob("*")} if RESULTS.exists() else set()


@pytest.mark.parametrize(
    "name,command,writes", CASES, ids=[c[0] if isinstance(c, tuple) else c.id for c in CASES]
)
def test_benchmark_quick(name: str, command: list[str], writes: bool, tmp_path: Path) -> None:
    before = _results_listing()
    out_args = ["--out", str(tmp_path)] if writes else ["--no-write"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, *command, "--quick", *out_args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, (
        f"{name} --quick failed (exit {proc.returncode}):\n"
        f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-6000:]}"
    )
    assert "|---|" in proc.stdout, f"{name} printed no table:\n{proc.stdout[-3000:]}"
    assert "torch" in proc.stdout, f"{name} printed no machine line:\n{proc.stdout[-3000:]}"
    if writes:
        written = list(tmp_path.glob(f"{name}-*.md"))
        assert len(written) == 1, f"{name}: expected one result in {tmp_path}, found {written}"
        text = written[0].read_text(encoding="utf-8")
        assert "- torch:" in text and "- cpu:" in text and "- cores:" in text
        assert "Mode: quick" in text
        if name == "training_step":  # its raw per-rank step times beside the table
            raw = json.loads(written[0].with_suffix(".json").read_text(encoding="utf-8"))
            rows = raw["models"]["gpt"]["rows"]
            assert [len(r["rank_steps_s"]) for r in rows] == [2] * 19
    assert _results_listing() == before, f"{name} --quick wrote into {RESULTS}"


def test_autoplan_claims_report_the_spread_of_step_times() -> None:
    from benchmarks._autoplan_metrics import claims
    from benchmarks._autoplan_ranks import _quartiles

    assert _quartiles([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 4.0)
    assert _quartiles([7.0]) == (7.0, 7.0)
    names = ["per-block, prefetch 0", "per-block, prefetch 1", "always-wrap units"]
    rows = [
        {
            "name": n,
            "predicted_s": p,
            "measured_s": m,
            "spread_s": (m - d, m + d),
            "predicted_peak": 100,
            "measured_peak": 100,
            "budget": None,
        }
        for n, p, m, d in zip(
            names, [1.0, 2.0, 4.0], [1.0, 2.0, 4.0], [0.05, 0.2, 0.2], strict=True
        )
    ]
    rows += [
        {**rows[0], "name": "auto", "spread_s": (0.95, 1.05)},
        {**rows[0], "name": "auto, under a budget", "budget": 100},
    ]
    c = claims(rows)
    # IQR / median per plan: 0.1, 0.2, 0.1, 0.1, 0.1 -> median 0.1
    assert c["spread"] == pytest.approx(0.1)
    assert c["spearman"] == pytest.approx(1.0) and c["median_abs_error"] == 0.0
    assert math.isnan(c["split_half"])  # rows without halves


def test_autoplan_split_half_ranks_the_odd_steps_against_the_even_ones() -> None:
    from benchmarks._autoplan_metrics import split_half_spearman

    # even-step medians rank the plans 1, 2, 3, 4; odd-step medians 1, 3, 2, 4:
    # d = (0, 1, 1, 0), 1 - 6 * 2 / (4 * 15) = 0.8
    rows = [{"halves_s": h} for h in [(1.0, 1.0), (2.0, 3.0), (3.0, 2.5), (4.0, 4.0)]]
    assert split_half_spearman(rows) == pytest.approx(0.8)
    assert math.isnan(split_half_spearman(rows[:1]))
    assert math.isnan(split_half_spearman([*rows, {"name": "no halves"}]))


def test_autoplan_phases_are_the_slowest_ranks_over_the_clean_steps() -> None:
    from benchmarks._autoplan_ranks import _slowest_phases

    # step 0: rank 1 is slower; step 1: rank 0; step 2 was left out (steal)
    gathered = [
        {
            "times": {"p": [1.0, 3.0, 9.0]},
            "phases": {"p": [(0.2, 0.5, 0.3), (1, 1.5, 0.5), (9, 0, 0)]},
        },
        {
            "times": {"p": [2.0, 2.5, 1.0]},
            "phases": {"p": [(0.4, 1.2, 0.4), (1, 1, 0.5), (1, 0, 0)]},
        },
    ]
    phases = _slowest_phases(gathered, "p", [0, 1])
    assert phases == pytest.approx({"forward": 0.7, "backward": 1.35, "optimizer": 0.45})


def test_autoplan_refuses_a_calibration_repeat_below_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks.autoplan import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--calibration-repeat", "0", "--no-write"])
    assert exit_info.value.code == 2
    assert "--calibration-repeat must be >= 1, got 0" in capsys.readouterr().err


def test_autoplan_speed_probe_divides_the_steps_median_by_the_calibrations() -> None:
    import torch

    from benchmarks._autoplan_drift import PARTS, SpeedProbe, describe

    probe = SpeedProbe(torch.device("cpu"), collective=False)
    assert sorted(probe.sample()) == ["compute", "dispatch"]
    probe.reference = {"compute": 2.0, "dispatch": 1.0, "all-gather": 4.0}
    probe.during = [
        {"compute": 2.0, "dispatch": 1.5, "all-gather": 4.0},
        {"compute": 3.0, "dispatch": 0.5, "all-gather": 5.0},
        {"compute": 2.5, "dispatch": 1.2, "all-gather": 6.0},
    ]
    drift = probe.drift()
    # medians 2.5, 1.2, 5.0 over references 2.0, 1.0, 4.0
    assert drift == pytest.approx({"compute": 1.25, "dispatch": 1.2, "all-gather": 1.25})
    assert probe.during == [] and probe.drift() == {}  # a new model starts afresh
    assert describe(drift) == "compute 1.25x, dispatch 1.20x, all-gather 1.25x"
    assert describe({}) == "-" and PARTS == ("compute", "dispatch", "all-gather")


def test_training_step_claims_are_the_issues() -> None:
    from benchmarks._training_step_grid import AUTO, BASELINE, FALLBACK, claims, grid

    names = [s.name for s in grid()]
    assert len(names) == 19 and names[0] == BASELINE and names[-1] == AUTO
    # every step predicted and measured alike: 1 ms per grid index; peaks 100 bytes,
    # the auto plan's budget 100; the auto plan half the fallback's time
    rows = [
        {"name": n, "predicted_s": i + 1.0, "measured_s": i + 1.0, "predicted_peak": 100,
         "measured_peak": 100}
        for i, n in enumerate(names)
    ]  # fmt: skip
    fallback = names.index(FALLBACK) + 1.0
    rows[-1] = {**rows[-1], "predicted_s": fallback / 2, "measured_s": fallback / 2}
    c = claims(rows, 100)
    assert (c["peak_within"], c["rows"], c["ratio_within"], c["ratios"]) == (19, 19, 18, 18)
    assert c["auto_fits"] == 1.0 and c["auto_vs_fallback"] == 0.5
    # the best fitting float32 step of 4 micro-batches is the fastest such: fp32, none, 4 mb every
    assert c["best_name"] == "fp32, none, 4 mb every"
    assert c["auto_vs_best"] == (fallback / 2) / 2.0
    assert c["spearman"] == pytest.approx(1.0)
    assert not c["all_met"]  # the auto plan is 1.25x the best fitting step, over 1.03x


@pytest.mark.parametrize(
    "args, message",
    [
        (["--calibrate-per-model"], "--cost-model and --calibrate-per-model exclude each other"),
        (["--world-size", "4"], "describes 2 cpu ranks; this run has 4 cpu ranks"),
    ],
)
def test_autoplan_refuses_a_saved_cost_model_it_cannot_use(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks.autoplan import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--cost-model", str(SAVED_COST_MODEL), *args, "--no-write"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
