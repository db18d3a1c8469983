"""``execwrap report --plan FILE``: a plan file reported for a model; exit 2 for another model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from execwrap.cli import main

REPO = Path(__file__).resolve().parents[2]

DEMO_PLAN = {
    "execwrap_plan_file": 1,
    "model": "GPT",
    "fsdp_plan": {"blocks.*": "free_full_weight"},
    "groups": [{"modules": ["ln_f", "lm_head"], "style": "keep_full_weight"}],
    "prefetch": 1,
}


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO))  # --model tests.execwrap.factories:...


def _plan_file(tmp_path: Path, content: dict) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(content))
    return path


def test_report_of_a_plan_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _plan_file(tmp_path, DEMO_PLAN)
    rc = main(["report", "--plan", str(path), "--out", str(tmp_path / "r"), "--format", "json"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "  plan file  " in out and str(path) in out
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["plan"]["groups"] == [
        [""], ["blocks.0"], ["blocks.1"], ["blocks.2"], ["blocks.3"], ["ln_f", "lm_head"]
    ]  # fmt: skip
    assert report["plan"]["policy_name"] == "plan file plan.json"
    assert report["plan"]["reshard_after_forward"] == [False, True, True, True, True, False]


def test_plan_file_for_another_model_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _plan_file(tmp_path, DEMO_PLAN)
    args = ["report", "--model", "tests.execwrap.factories:gpt2", "--plan", str(path)]
    rc = main([*args, "--out", str(tmp_path / "r"), "--format", "json"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err == (
        f"execwrap: error: --plan: {path}: rule 'blocks.*' names no module of GPT2LMHeadModel "
        "(the file was written for GPT) (its top-level modules: 'transformer' and 'lm_head'); "
        "was the plan made for another model?"
    )
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("extra", "content", "message"),
    [
        (
            ["--bucket-size", "1M"],
            DEMO_PLAN,
            "--plan {path!r} with --bucket-size 1M: the plan file holds the groups; leave "
            "--bucket-size out",
        ),
        ([], {"fsdp_plan": {}}, "--plan: {path}: the document: not an execwrap plan file"),
    ],
)
def test_plan_file_bad_usage_is_exit_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    content: dict,
    message: str,
) -> None:
    path = _plan_file(tmp_path, content)
    rc = main(["report", "--plan", str(path), *extra, "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.startswith("execwrap: error: " + message.format(path=str(path)))
