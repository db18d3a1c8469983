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


def test_report_of_a_pinned_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the plan.json that execwrap.save_plan writes beside a checkpoint is a --plan file too
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from execwrap import plan_wrap, save_plan
    from execwrap.demo_models import Block, build_demo_model
    from tracing import trace_execution_order

    model = build_demo_model()
    plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}), bucket_numel=1)
    path = save_plan(plan, tmp_path / "ckpt")
    rc = main(["report", "--plan", str(path), "--out", str(tmp_path / "r"), "--format", "json"])
    capsys.readouterr()
    assert rc == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["plan"]["groups"] == plan.groups
    other = ["report", "--model", "tests.execwrap.factories:gpt2", "--plan", str(path)]
    assert main([*other, "--out", str(tmp_path / "r2"), "--format", "json"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"execwrap: error: --plan {path} was made for another model: a GPT (the root module "
        "<root>), but the model passed is a GPT2LMHeadModel. Run execwrap report without "
        "--plan to plan this model, or pass the --model the plan was made for\n"
    )  # one line, no traceback
