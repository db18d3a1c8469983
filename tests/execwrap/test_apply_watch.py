"""Never silent: policies and plans not applied by the first optimizer step are named."""

from __future__ import annotations

import gc
import logging
from typing import Any

import pytest
import torch
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap.demo_models import Block, build_demo_model, demo_inputs
from execwrap.fsdp.fsdp1 import ParamExecOrderWrapPolicy
from execwrap.planning.planner import plan_wrap
from tests._dist import run_ranks
from tracing import trace_execution_order

HERE = __file__


def _step(model: torch.nn.Module) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(demo_inputs(model)).sum().backward()
    optimizer.step()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """This file's objects only (objects other tests left alive are named too)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "execwrap.watch.registry" and f"(created at {HERE}:" in r.getMessage()
    ]


def test_unapplied_policy_and_plan_are_named_once_at_the_first_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = build_demo_model(n_blocks=2)
    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}))
    policy_line = _line_of("policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}))")
    plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))
    line = _line_of(
        "plan = plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))"
    )
    gone = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}))
    del gone
    gc.collect()
    with caplog.at_level(logging.WARNING, logger="execwrap"):
        _step(model)
        _step(model)
    tail = (
        "was never applied by the first optimizer step (SGD.step()): expected FSDP(model, "
        "auto_wrap_policy=policy), apply_fully_shard(model, policy_or_plan), or an "
        "execwrap.integrations helper to use it before training."
    )
    assert [w.split(" Frameworks that")[0] for w in _warnings(caplog)] == [
        f"ParamExecOrderWrapPolicy(ModuleWrapPolicy({{Block}})) (created at {HERE}:{policy_line}) "
        + tail,
        f"WrapPlan (policy ModuleWrapPolicy({{Block}}), 3 groups) (created at {HERE}:{line}) "
        + tail,
    ]
    assert policy is not None and plan is not None


def _line_of(text: str) -> int:
    with open(HERE, encoding="utf-8") as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    from execwrap import apply_fully_shard

    records: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("execwrap").addHandler(Handler(logging.WARNING))
    small = build_demo_model(n_blocks=2)
    plan = plan_wrap(small, trace_execution_order(small), ModuleWrapPolicy({Block}))
    big = build_demo_model(n_blocks=3)
    try:
        apply_fully_shard(big, plan)  # planned for 2 blocks, applied to 3: refused
        refused = ""
    except ValueError as e:
        refused = str(e)
    model = build_demo_model(n_blocks=2)
    apply_fully_shard(model, ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block})))
    _step(model)
    _step(big)
    return {"refused": refused, "after_steps": records}


def test_applied_objects_pass_and_a_plan_for_another_model_is_refused() -> None:
    (result,) = run_ranks(_worker, world_size=1)
    assert result["refused"].startswith(
        "apply_fully_shard: the plan (policy ModuleWrapPolicy({Block}), 3 groups) was planned "
        "for another model than the GPT it is applied to, so nothing was wrapped: the order's "
        "parameters do not match those of GPT: 12 parameters differ"
    )
    assert result["after_steps"] == []  # the refused plan is not "never applied" either
