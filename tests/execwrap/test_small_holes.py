"""The smaller holes a newcomer found (issue 37): each a clear error or a fixed
behaviour, with the exact message.

* ``--memory-budget 1e400`` is one error line, not an ``OverflowError``;
* ``execwrap show`` refuses a report whose ``order.params`` was deleted, and a
  saved memory budget of -5 bytes;
* a keyword given twice in ``--input`` is refused;
* a plan for another model that shares some module names is refused when applied;
* a policy or plan that execwrap refused is not warned about later as "never applied";
* the command line's own root-only baseline never warns.
"""

from __future__ import annotations

import gc
import json
import logging
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap import ParamExecOrderWrapPolicy, apply_fully_shard
from execwrap.cli import main
from execwrap.demo_models import Block, build_demo_model
from execwrap.planning.planner import plan_wrap
from tracing import trace_execution_order

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def auto_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("auto") / "r"
    args = ["report", "--out", str(out), "--format", "json", "--bucket-size", "auto"]
    assert main([*args, "--cost-model", "h100-nvlink-8", "--memory-budget", "40GiB"]) == 0
    return out / "report.json"


def test_memory_budget_past_any_device_is_one_line(tmp_path, capsys):
    args = ["report", "--bucket-size", "auto", "--cost-model", "h100-nvlink-8"]
    assert main([*args, "--memory-budget", "1e400", "--out", str(tmp_path / "r")]) == 2
    assert _err(capsys) == (
        "execwrap: error: --memory-budget: invalid size '1e400': more bytes than any device "
        "holds (at most 2**63 - 1 bytes, 8 EiB, the largest size torch counts)"
    )


def test_show_refuses_a_report_whose_order_params_were_deleted(auto_report, tmp_path, capsys):
    data = json.loads(auto_report.read_text())
    del data["order"]["params"]
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    assert main(["show", str(path)]) == 2
    assert _err(capsys) == (
        f"execwrap: error: {path}: malformed WrapPlan: field plan.units[0].param_fqns[0]: "
        "names parameter 'wte.weight', which the order does not have"
    )


def test_show_refuses_a_negative_saved_budget(auto_report, tmp_path, capsys):
    data = json.loads(auto_report.read_text())
    assert data["plan"]["search"]["memory_budget"] == 40 * 2**30
    data["plan"]["search"]["memory_budget"] = -5
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    assert main(["show", str(path)]) == 2
    assert _err(capsys) == (
        f"execwrap: error: {path}: malformed WrapPlan: field plan.search: malformed "
        "(ValueError: PlanSearch.memory_budget must be > 0 bytes per rank or None (no limit), "
        "got -5)"
    )


def test_a_keyword_given_twice_in_input_is_refused(tmp_path, capsys):
    spec = "idx=long:2x16;idx=long:2x8"
    assert main(["report", "--input", spec, "--out", str(tmp_path / "r")]) == 2
    assert _err(capsys) == (
        "execwrap: error: --input: input items 'idx=long:2x16' and 'idx=long:2x8' both give "
        "keyword 'idx'; give each forward argument once"
    )


def test_a_plan_for_a_model_sharing_some_names_is_refused():
    small = build_demo_model(n_blocks=2)
    plan = plan_wrap(small, trace_execution_order(small), ModuleWrapPolicy({Block}))
    big = build_demo_model(n_blocks=3)  # blocks.0 and blocks.1 share their names
    with pytest.raises(ValueError) as info:
        apply_fully_shard(big, plan)
    assert str(info.value) == (
        "apply_fully_shard: the plan (policy ModuleWrapPolicy({Block}), 3 groups) was planned "
        "for another model than the GPT it is applied to, so nothing was wrapped: the order's "
        "parameters do not match those of GPT: 12 parameters differ (in the model but not in "
        "the order: 'blocks.2.ln1.weight', 'blocks.2.ln1.bias', 'blocks.2.attn.qkv.weight', ... "
        "(9 more)); the order was captured from a different model (or before the model "
        "changed): capture it again, e.g. tracing.capture_execution_order(model, ...), then "
        "plan_wrap(model, order, ...)"
    )
    assert not any(type(m).__name__.startswith("FSDP") for m in big.modules())


class _ZeroDim(nn.Module):
    """A 0-dim parameter: FSDP refuses it, so ``apply_fully_shard`` does first."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def test_what_execwrap_refused_is_not_warned_about_as_never_applied(caplog):
    model = _ZeroDim()
    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({nn.Linear}))
    small = build_demo_model(n_blocks=2)
    plan = plan_wrap(small, trace_execution_order(small), ModuleWrapPolicy({Block}))
    with pytest.raises(ValueError, match="0-dim"):
        apply_fully_shard(model, policy)
    with pytest.raises(ValueError, match="planned for another model"):
        apply_fully_shard(build_demo_model(n_blocks=3), plan)
    gc.collect()
    with caplog.at_level(logging.WARNING, logger="execwrap"):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, 4)).sum().backward()
        optimizer.step()
    assert [r.getMessage() for r in caplog.records if "never applied" in r.getMessage()] == []
    assert policy is not None and plan is not None


def test_the_command_lines_own_baselines_never_warn(tmp_path, capsys, caplog):
    with caplog.at_level(logging.WARNING):
        code = main(
            [
                "report",
                "--model",
                "tests.execwrap.factories:demo2",
                "--out",
                str(tmp_path),
                "--format",
                "json",
            ]  # fmt: skip
        )
    assert code == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "WARNING" not in capsys.readouterr().err
    # a plan the user asks to be the root alone does not warn either
    assert main(["report", "--model", "tests.execwrap.factories:demo2", "--policy", "none",
                 "--out", str(tmp_path / "none"), "--format", "json"]) == 0  # fmt: skip
    assert "WARNING" not in capsys.readouterr().err
