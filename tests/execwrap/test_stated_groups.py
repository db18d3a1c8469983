"""Stated groups (``plan_wrap(..., groups=...)``) and target-specific notes."""

from __future__ import annotations

import pytest
import torch.nn as nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap.demo_models import Block, build_demo_model
from execwrap.planning.planner import plan_wrap
from tracing import trace_execution_order

BLOCKS = ModuleWrapPolicy({Block})


@pytest.fixture(scope="module")
def gpt() -> tuple[nn.Module, object]:
    model = build_demo_model(n_blocks=4)  # wte, blocks.0-3, ln_f, lm_head (tied to wte)
    return model, trace_execution_order(model)


def test_group_of_modules_the_policy_did_not_choose(gpt: tuple[nn.Module, object]) -> None:
    model, order = gpt
    plan = plan_wrap(model, order, BLOCKS, groups=[["wte", "ln_f", "lm_head"]])
    assert plan.groups == [
        [""],
        ["wte", "ln_f", "lm_head"],
        ["blocks.0"],
        ["blocks.1"],
        ["blocks.2"],
        ["blocks.3"],
    ]
    group = plan.units[1]
    assert group.param_fqns == ("wte.weight", "ln_f.weight", "ln_f.bias")  # tied weight once
    assert plan.notes[:2] == [
        "Tied parameter 'wte.weight' (also 'lm_head.weight') is used by modules 'wte' and "
        "'lm_head'; it stays in the stated group 'wte', 'ln_f' and 'lm_head', which holds every "
        "name and use of it.",
        "Modules 'wte', 'ln_f' and 'lm_head' form one FSDP group, as stated in groups: one "
        f"all-gather and one reduce-scatter for 3 modules ({group.numel} elements).",
    ]
    plan.check(model)


def test_bucketing_fills_the_runs_between_stated_groups(gpt: tuple[nn.Module, object]) -> None:
    model, order = gpt
    plan = plan_wrap(model, order, BLOCKS, groups=[["blocks.1"]], bucket_numel=10**9)
    assert plan.groups == [[""], ["blocks.0"], ["blocks.1"], ["blocks.2", "blocks.3"]]
    assert "Module 'blocks.1' is a unit of its own, as stated in groups" in plan.notes[1]
    plan = plan_wrap(model, order, BLOCKS, groups=[["blocks.3", "ln_f"]], bucket_numel=10**9)
    assert plan.groups == [[""], ["blocks.0", "blocks.1", "blocks.2"], ["blocks.3", "ln_f"]]
    # a group whose members are not adjacent: its later member ends a run too, so
    # blocks.1 and blocks.3 (blocks.2 runs between them) are never merged
    plan = plan_wrap(model, order, BLOCKS, groups=[["blocks.0", "blocks.2"]], bucket_numel=10**9)
    assert plan.groups == [[""], ["blocks.0", "blocks.2"], ["blocks.1"], ["blocks.3"]]


def test_a_tied_module_alone_cannot_be_a_group(gpt: tuple[nn.Module, object]) -> None:
    model, order = gpt
    with pytest.raises(
        ValueError,
        match=r"groups\[0\] lists 'lm_head' \(Linear\), which holds tied parameter 'wte.weight' "
        r"\(also 'lm_head.weight'\), used outside it by 'wte': FSDP must keep such a parameter "
        r"in one unit enclosing every name and use of it, so the plan could not keep the module "
        r"as a unit. List the modules sharing it in the same group, or leave it out$",
    ):
        plan_wrap(model, order, BLOCKS, groups=[["ln_f", "lm_head"]])


@pytest.mark.parametrize(
    ("groups", "error", "match"),
    [
        ("ln_f", TypeError, r"groups must be a list of lists of module FQNs"),
        ([["nope"]], ValueError, r"groups\[0\] names module 'nope', which the model does not have"),
        ([[""]], ValueError, r"groups\[0\] names the root module"),
        ([[]], ValueError, r"groups\[0\] is empty"),
        ([["ln_f"], ["ln_f"]], ValueError, r"module 'ln_f' is in groups\[0\] and groups\[1\]"),
        (
            [["blocks.0", "blocks.0.mlp"]],
            ValueError,
            r"groups\[0\] lists 'blocks.0' and 'blocks.0.mlp', which is inside it",
        ),
        (
            [["blocks"]],
            ValueError,
            r"lists 'blocks' \(ModuleList\), which never runs its own forward",
        ),
    ],
)
def test_bad_groups_are_refused(
    gpt: tuple[nn.Module, object], groups: object, error: type[Exception], match: str
) -> None:
    model, order = gpt
    with pytest.raises(error, match=match):
        plan_wrap(model, order, BLOCKS, groups=groups)  # type: ignore[arg-type]


def test_notes_follow_the_target(gpt: tuple[nn.Module, object]) -> None:
    model, order = gpt
    model.blocks[0].attn.requires_grad_(False)
    try:
        mixed = {
            target: [
                n for n in plan_wrap(model, order, BLOCKS, target=target).notes if "mixes" in n
            ]
            for target in (None, "fsdp1", "fsdp2")
        }
    finally:
        model.requires_grad_(True)
    head = "Unit 'blocks.0' mixes requires_grad=True (8 parameters) and requires_grad=False (4 parameters"
    assert all(len(notes) == 1 and notes[0].startswith(head) for notes in mixed.values())
    assert mixed[None][0].endswith(
        "FSDP1 needs use_orig_params=True for it (FSDP2 accepts it); wrap the frozen parameters' modules separately to avoid it."
    )
    assert "with use_orig_params=False wrapping is refused" in mixed["fsdp1"][0]
    assert mixed["fsdp2"][0].endswith(
        "FSDP2 shards and all-gathers them together, and reduce-scatters the gradients of the "
        "trainable ones only."
    )
    with pytest.raises(ValueError, match=r"target must be one of \('fsdp1', 'fsdp2'\) or None"):
        plan_wrap(model, order, BLOCKS, target="fsdp3")  # type: ignore[arg-type]


def test_fsdp2_target_has_no_fsdp1_split_note(gpt: tuple[nn.Module, object]) -> None:
    model, order = gpt
    both = plan_wrap(model, order, BLOCKS, bucket_numel=10**9)
    fsdp2 = plan_wrap(model, order, BLOCKS, bucket_numel=10**9, target="fsdp2")
    assert any(n.startswith("FSDP1 wraps single modules") for n in both.notes)
    assert not any("FSDP1" in n for n in fsdp2.notes)
    assert fsdp2.groups == both.groups
