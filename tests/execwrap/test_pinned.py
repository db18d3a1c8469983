"""Pinned plans (``execwrap.plan.pinned``): plan.json written atomically, read back byte for
byte, checked against the model, and what a re-planned job changed, in words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from execwrap import ModuleWrapPolicy, ParamExecOrderWrapPolicy, TracingConfig, plan_wrap
from execwrap.demo_models import GPT, Block, GPTConfig
from execwrap.plan.pinned import (
    PLAN_FILE,
    check_plan_fits,
    load_plan,
    plan_changes,
    plan_path,
    save_plan,
)
from tests.execwrap.autoplan_cases import cost_model
from tracing import ExecutionOrder, trace_execution_order


def _model(**changes: object) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{"n_blocks": 3, "dim": 32, "vocab_size": 64, **changes}))


def _plan(model: GPT, **kwargs: object):  # type: ignore[no-untyped-def]
    return plan_wrap(model, trace_execution_order(model, TracingConfig()), ModuleWrapPolicy({Block}), **kwargs)  # fmt: skip


def test_a_saved_plan_loads_back_to_the_same_bytes(tmp_path: Path) -> None:
    model = _model()
    plan = _plan(model, bucket_numel="auto", cost_model=cost_model())
    written = save_plan(plan, tmp_path / "step-3")
    assert written == tmp_path / "step-3" / PLAN_FILE
    loaded = load_plan(tmp_path / "step-3", model)
    assert loaded.groups == plan.groups == [[""], ["blocks.0", "blocks.1", "blocks.2"]]
    assert loaded.prefetch == plan.prefetch
    assert loaded.reshard_after_forward == plan.reshard_after_forward
    again = save_plan(loaded, tmp_path / "again.json")
    assert again.read_bytes() == written.read_bytes()
    assert [p.name for p in (tmp_path / "step-3").iterdir()] == [PLAN_FILE]  # no temp file left
    # the order inside reads as an order, as a report's does
    assert ExecutionOrder.load(written).module_forward_order == plan.order.module_forward_order


def test_plan_path() -> None:
    assert plan_path("ckpt/step-3") == Path("ckpt/step-3/plan.json")
    assert plan_path("ckpt/mine.json") == Path("ckpt/mine.json")


def test_a_plan_for_another_model_names_the_first_difference(tmp_path: Path) -> None:
    save_plan(_plan(_model()), tmp_path)
    source = tmp_path / PLAN_FILE
    with pytest.raises(ValueError) as info:
        load_plan(tmp_path, _model(n_blocks=2))
    assert str(info.value) == (
        f"{source} was made for another model than this GPT: the first module that differs "
        "is 'blocks.2', which only the plan's model has. Plan this model again (plan_wrap("
        "model, capture_execution_order(model, ...), ...)), or build the model the plan was "
        "made for"
    )
    with pytest.raises(ValueError, match=r"which only the plan's model has"):
        load_plan(tmp_path, _model(n_blocks=2))
    with pytest.raises(ValueError) as info:
        load_plan(tmp_path, _model(n_blocks=4))
    assert "the first module that differs is 'blocks.3', which only GPT has" in str(info.value)
    with pytest.raises(ValueError) as info:
        load_plan(tmp_path, _model(max_seq_len=32))
    assert (
        "the first parameter that differs is 'wpe': shape (64, 32), float32, "
        "requires_grad=True in the plan; shape (32, 32), float32, requires_grad=True in GPT"
    ) in str(info.value)
    frozen = _model()
    frozen.blocks[1].attn.qkv.weight.requires_grad_(False)
    with pytest.raises(ValueError, match=r"'blocks\.1\.attn\.qkv\.weight': shape .* "
                       r"requires_grad=True in the plan; .* requires_grad=False in GPT"):  # fmt: skip
        check_plan_fits(load_plan(tmp_path), frozen)


def test_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"^load_plan: no pinned plan at .*plan\.json"):
        load_plan(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        load_plan(tmp_path / "nope.json")
    assert str(info.value) == (
        f"load_plan: no such file: {tmp_path / 'nope.json'} (save_plan(plan, "
        f"{str(tmp_path / 'nope.json')!r}) writes one)"
    )
    (tmp_path / PLAN_FILE).write_text(json.dumps({"order": {}, "plan": {}}))
    with pytest.raises(ValueError, match=r"not a pinned execwrap plan"):
        load_plan(tmp_path)
    (tmp_path / PLAN_FILE).write_text(json.dumps({"kind": "execwrap-pinned-plan", "version": 9}))
    with pytest.raises(ValueError, match=r"pinned-plan layout version 9; this execwrap reads "):
        load_plan(tmp_path)
    with pytest.raises(TypeError, match=r"^save_plan: plan must be a WrapPlan, got dict$"):
        save_plan({}, tmp_path)  # type: ignore[arg-type]


def test_plan_changes_in_words() -> None:
    model = _model()
    per_block = _plan(model)
    auto = _plan(model, bucket_numel="auto", cost_model=cost_model())
    assert plan_changes(per_block, per_block) == []
    lines = plan_changes(per_block, auto)
    assert (
        lines[0]
        == "groups: 4 -> 2; group 1 was ['blocks.0'], is now ['blocks.0', 'blocks.1', 'blocks.2']"
    )
    assert lines[1] == f"prefetch: None -> {auto.prefetch}"
    assert lines[2].startswith("reshard_after_forward: FSDP2's default -> [")
    assert lines[3] == "all gathers per step: 7 -> 3"
    assert lines[4].startswith("peak unsharded bytes: ")


def test_the_policy_takes_a_pinned_plan_alone(tmp_path: Path) -> None:
    model = _model()
    plan = _plan(model)
    policy = ParamExecOrderWrapPolicy(pinned_plan=plan)
    assert policy.build_plan(model) is plan
    assert policy.order is plan.order
    with pytest.raises(ValueError) as info:
        ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}), TracingConfig(), pinned_plan=plan)
    assert str(info.value) == (
        "ParamExecOrderWrapPolicy: pinned_plan is applied as it is (no capture, no planning), "
        "so tracing_config would be ignored; pass pinned_plan alone, or leave it out to capture "
        "and plan again"
    )
    with pytest.raises(TypeError, match=r"pinned_plan must be a WrapPlan .* got str$"):
        ParamExecOrderWrapPolicy(pinned_plan="plan.json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^ParamExecOrderWrapPolicy\.pinned_plan was made for "):
        ParamExecOrderWrapPolicy(pinned_plan=plan).build_plan(_model(n_blocks=2))


def test_save_plan_never_replaces_a_file_unless_told(tmp_path: Path) -> None:
    plan = _plan(_model())
    written = save_plan(plan, tmp_path / "step-3")
    before = written.read_bytes()
    with pytest.raises(FileExistsError) as info:
        save_plan(plan, tmp_path / "step-3")
    assert str(info.value) == (
        f"save_plan: {written} holds a plan saved before; save to another path, or pass "
        "overwrite=True to replace it"
    )
    mine = tmp_path / "mine.json"
    mine.write_text('{"lr": 0.1}\n')
    with pytest.raises(FileExistsError) as info:
        save_plan(plan, mine)
    assert str(info.value) == (
        f"save_plan: {mine} exists and is not a plan execwrap saved; save to another path, or "
        "pass overwrite=True to replace it"
    )
    assert mine.read_text() == '{"lr": 0.1}\n'  # untouched
    assert save_plan(plan, mine, overwrite=True) == mine
    assert mine.read_bytes() == before
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(IsADirectoryError) as dir_info:
        save_plan(plan, tmp_path / "folder.json", overwrite=True)
    assert str(dir_info.value) == (
        f"save_plan: {tmp_path / 'folder.json'} is a folder; pass the path of a .json file or "
        "a checkpoint folder"
    )


class _OtherGPT(GPT):
    """Another model class with GPT's modules (for the message about the root)."""


class _MyNorm(torch.nn.LayerNorm):
    """Another class at one module."""


def test_a_plan_for_another_model_class_says_which_class_it_was_made_for(tmp_path: Path) -> None:
    save_plan(_plan(_model()), tmp_path)
    torch.manual_seed(0)
    other = _OtherGPT(GPTConfig(n_blocks=3, dim=32, vocab_size=64))
    with pytest.raises(ValueError) as info:
        load_plan(tmp_path, other)
    assert str(info.value) == (
        f"{tmp_path / PLAN_FILE} was made for another model: a GPT (the root module <root>), "
        "but the model passed is a _OtherGPT. Plan this model again (plan_wrap(model, "
        "capture_execution_order(model, ...), ...)), or build the model the plan was made for"
    )
    model = _model()
    model.ln_f = _MyNorm(32)
    with pytest.raises(ValueError) as info:
        load_plan(tmp_path, model)
    assert str(info.value) == (
        f"{tmp_path / PLAN_FILE} was made for another model than this GPT: module 'ln_f' is a "
        "LayerNorm in the model the plan was made for, but a _MyNorm in this GPT. Plan this "
        "model again (plan_wrap(model, capture_execution_order(model, ...), ...)), or build "
        "the model the plan was made for"
    )
