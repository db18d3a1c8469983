"""FSDP plan rules (transformers' ``fsdp_plan`` format), plans of given groups, and plan files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap.demo_models import Block, build_demo_model
from execwrap.planning.given_groups import plan_from_groups, tables_order
from execwrap.planning.plan_file import load_plan_file, plan_file_dict, save_plan_file
from execwrap.planning.planner import plan_wrap
from execwrap.planning.rules import expand_rules, group_rules, layer_pattern
from execwrap.simulate import simulate_step
from tracing import record_execution_order, trace_execution_order

NAMES = [
    "",
    "wte",
    "blocks",
    "blocks.0",
    "blocks.0.mlp",
    "blocks.1",
    "blocks.1.mlp",
    "ln_f",
    "lm_head",
]


def test_layer_pattern_is_transformers_wildcard() -> None:
    assert layer_pattern("model.layers.12.mlp.experts.3") == "model.layers.*.mlp.experts.*"
    assert layer_pattern("model.layers.12") == "model.layers.*"
    assert layer_pattern("0.weight") == "0.weight"  # no dot before: not a layer number
    assert layer_pattern("a.0.1") == "a.*.1"  # non-overlapping, as transformers' regex


def test_expand_rules_wildcards_tuples_and_styles() -> None:
    groups = expand_rules(
        NAMES,
        {
            "blocks.*": "free_full_weight",
            ("ln_f", "lm_head"): "keep_full_weight",
            "wte": "free_full_weight",
        },
    )
    assert [(g.modules, g.reshard_after_forward, g.rule) for g in groups] == [
        (("wte",), True, "wte"),
        (("blocks.0",), True, "blocks.*"),
        (("blocks.1",), True, "blocks.*"),
        (("ln_f", "lm_head"), False, ("ln_f", "lm_head")),
    ]
    # a concrete FQN names its module too (a superset of transformers' matching)
    assert [g.modules for g in expand_rules(NAMES, {"blocks.1.mlp": "keep_full_weight"})] == [
        ("blocks.1.mlp",)
    ]


def test_group_rules_inverts_expand_rules() -> None:
    groups = [
        (("wte",), True),
        (("blocks.0",), True),
        (("blocks.1",), True),
        (("ln_f", "lm_head"), False),
    ]
    rules = group_rules(groups, NAMES)
    assert rules == {
        "wte": "free_full_weight",
        "blocks.*": "free_full_weight",
        ("ln_f", "lm_head"): "keep_full_weight",
    }
    assert [(g.modules, g.reshard_after_forward) for g in expand_rules(NAMES, rules)] == groups
    # one layer with another style: no wildcard
    mixed = group_rules([(("blocks.0",), True), (("blocks.1",), False)], NAMES)
    assert mixed == {"blocks.0": "free_full_weight", "blocks.1": "keep_full_weight"}
    # one layer missing from the groups: no wildcard either
    assert group_rules([(("blocks.0",), True)], NAMES) == {"blocks.0": "free_full_weight"}


@pytest.mark.parametrize(
    ("rules", "error", "match"),
    [
        (
            {"model.layers.*": "free_full_weight"},
            ValueError,
            r"^plan\.json: rule 'model\.layers\.\*' names no module of GPT \(its top-level modules: "
            r"'wte', 'blocks', 'ln_f' and 'lm_head'\); was the plan made for another model\?$",
        ),
        (
            {"blocks.*.attn": "free_full_weight"},
            ValueError,
            r"^plan\.json: rule 'blocks\.\*\.attn' names no module of GPT \(modules starting with "
            r"'blocks': 'blocks', 'blocks\.0', 'blocks\.0\.mlp', 'blocks\.1' and 'blocks\.1\.mlp'\)",
        ),
        (
            {"wte": "shard"},
            ValueError,
            r"^plan\.json: rule 'wte' has style 'shard'; use one of free_full_weight, keep_full_weight$",
        ),
        (
            {"wte": True},
            TypeError,
            r"^plan\.json: rule 'wte': the style must be a string; got True$",
        ),
        (
            {3: "free_full_weight"},
            TypeError,
            r"a rule's key must be a module FQN or a tuple of module FQNs; got int 3$",
        ),
        (
            {"": "free_full_weight"},
            ValueError,
            r"rule '' names the root module; the root is always a group",
        ),
        (
            {"blocks.*": "free_full_weight", "blocks.0": "keep_full_weight"},
            ValueError,
            r"^plan\.json: module 'blocks\.0' is named by rule 'blocks\.\*' and by rule 'blocks\.0'; "
            r"a module belongs to one group only$",
        ),
        (
            {("blocks.0", "blocks.0.mlp"): "free_full_weight"},
            ValueError,
            r"lists 'blocks\.0' and 'blocks\.0\.mlp', which is inside it; one fully_shard group",
        ),
        (
            {("ln_f", "head"): "keep_full_weight"},
            ValueError,
            r"^plan\.json: rule \('ln_f', 'head'\) names module 'head', which GPT does not have",
        ),
    ],
)
def test_expand_rules_refuses_with_the_first_bad_rule(rules: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        expand_rules(NAMES, rules, where="plan.json", model_name="GPT")


@pytest.fixture(scope="module")
def gpt() -> tuple[nn.Module, object]:
    model = build_demo_model(n_blocks=2)  # wte, blocks.0-1, ln_f, lm_head (tied to wte)
    return model, trace_execution_order(model)


def test_plan_from_groups_lays_units_out_as_fsdp2(gpt: tuple[nn.Module, object]) -> None:
    model, order = gpt
    plan = plan_from_groups(
        model,
        order,
        [["blocks.0", "blocks.1"], ["ln_f", "lm_head"], ["wte"]],
        reshard_after_forward=[True, False, False],
        prefetch=0,
        policy_name="mine",
    )
    assert plan.groups == [[""], ["wte"], ["blocks.0", "blocks.1"], ["ln_f", "lm_head"]]
    assert plan.reshard_after_forward == (False, False, True, False)
    assert plan.prefetch == 0 and plan.policy_name == "mine"
    assert plan.units[0].param_fqns == ("wpe",)  # the root's own parameter
    assert plan.units[1].param_fqns == ("wte.weight",)
    assert plan.units[3].param_fqns == ("ln_f.weight", "ln_f.bias")
    # the tied weight is reached from 'wte' and from 'lm_head': FSDP2 gathers it in both
    assert plan.notes == [
        "parameter 'wte.weight' (names 'wte.weight', 'lm_head.weight') is reached from group "
        "['wte'] and from group ['ln_f', 'lm_head']: FSDP2 manages it in each (each all-gathers "
        "it and reduce-scatters its gradient); this plan counts it once, in group ['wte']"
    ]
    assert sum(u.numel for u in plan.units) == sum(p.numel() for p in model.parameters())


def test_plan_from_groups_matches_plan_wrap_where_the_planner_keeps_the_groups(
    gpt: tuple[nn.Module, object],
) -> None:
    model, order = gpt
    planned = plan_wrap(model, order, ModuleWrapPolicy({Block}))
    given = plan_from_groups(model, order, [g for g in planned.groups if g != [""]])
    assert given.groups == planned.groups
    assert [u.param_fqns for u in given.units] == [u.param_fqns for u in planned.units]
    assert [(u.first_use, u.last_use, u.numel, u.bytes) for u in given.units] == [
        (u.first_use, u.last_use, u.numel, u.bytes) for u in planned.units
    ]
    assert given.reshard_after_forward is None


@pytest.mark.parametrize(
    ("groups", "flags", "error", "match"),
    [
        ("blocks.0", None, TypeError, r"groups must be a list of lists of module FQNs"),
        ([[]], None, ValueError, r"^plan_from_groups: groups\[0\] is empty; list its modules$"),
        (
            [["nope"]],
            None,
            ValueError,
            r"^plan_from_groups: groups\[0\] names module 'nope', which GPT does not have",
        ),
        (
            [[""]],
            None,
            ValueError,
            r"groups\[0\] names the root; the root is always a group of its own",
        ),
        ([["wte"], ["wte"]], None, ValueError, r"module 'wte' is in groups\[0\] and groups\[1\]"),
        (
            [["blocks", "blocks.0"]],
            None,
            ValueError,
            r"lists 'blocks' and 'blocks\.0', which is inside it",
        ),
        (
            [["wte"]],
            [True, False],
            ValueError,
            r"2 reshard_after_forward flag\(s\) for 1 group\(s\)",
        ),
    ],
)
def test_plan_from_groups_refuses(
    gpt: tuple[nn.Module, object], groups: object, flags: object, error: type, match: str
) -> None:
    model, order = gpt
    with pytest.raises(error, match=match):
        plan_from_groups(model, order, groups, reshard_after_forward=flags)  # type: ignore[arg-type]


def test_plan_file_round_trip_and_simulation(gpt: tuple[nn.Module, object], tmp_path: Path) -> None:
    from execwrap.cost import CostModel

    model, _ = gpt
    cm = CostModel.preset("h100-nvlink-8")
    with torch.device("meta"):
        meta = build_demo_model(n_blocks=2)
    ids = torch.zeros(2, 16, dtype=torch.long, device="meta")
    order = record_execution_order(meta, ids, timing=cm.compute)
    plan = plan_from_groups(
        meta, order, [["wte"], ["blocks.0"], ["blocks.1"], ["ln_f", "lm_head"]],
        reshard_after_forward=[True, True, True, False], prefetch=2,
    )  # fmt: skip
    path = save_plan_file(plan, tmp_path / "plan.json", meta)
    assert json.loads(path.read_text()) == {
        "execwrap_plan_file": 1,
        "model": "GPT",
        "fsdp_plan": {"wte": "free_full_weight", "blocks.*": "free_full_weight"},
        "groups": [{"modules": ["ln_f", "lm_head"], "style": "keep_full_weight"}],
        "prefetch": 2,
    }
    loaded = load_plan_file(path, meta, order=order)
    assert loaded.groups == plan.groups
    assert loaded.reshard_after_forward == plan.reshard_after_forward
    assert loaded.prefetch == 2 and loaded.policy_name == "plan file plan.json"
    assert simulate_step(loaded, cm, world_size=8) == simulate_step(plan, cm, world_size=8)
    with pytest.raises(FileExistsError) as info:  # an existing file: replaced only when told
        save_plan_file(plan, path, meta)
    assert str(info.value) == (
        f"save_plan_file: {path} holds a plan saved before; save to another path, or pass "
        "overwrite=True to replace it"
    )
    assert save_plan_file(plan, path, meta, overwrite=True) == path
    # on the real model too, without an order (the tables only)
    real = load_plan_file(path, model)
    assert real.groups == [[""], ["wte"], ["blocks.0"], ["blocks.1"], ["ln_f", "lm_head"]]
    assert real.order.module_forward_order == [] and real.order.params == tables_order(model).params
    assert plan_file_dict(real, model)["fsdp_plan"] == {
        "wte": "free_full_weight",
        "blocks.*": "free_full_weight",
    }


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("{", r"plan\.json: not valid JSON"),
        (
            '{"fsdp_plan": {}}',
            r"plan\.json: the document: not an execwrap plan file \(no 'execwrap_plan_file' field",
        ),
        (
            '{"execwrap_plan_file": 2, "fsdp_plan": {}}',
            r"plan\.json: malformed plan file: field execwrap_plan_file: expected one of 1, got int 2",
        ),
        (
            '{"execwrap_plan_file": 1, "fsdp_plan": {"wte": "keep"}}',
            r"field fsdp_plan\.wte: expected one of 'free_full_weight', 'keep_full_weight'",
        ),
        (
            '{"execwrap_plan_file": 1, "fsdp_plan": {}, "groups": [{"modules": [], "style": "keep_full_weight"}]}',
            r"field groups\[0\]\.modules: is empty",
        ),
        (
            '{"execwrap_plan_file": 1, "fsdp_plan": {}, "prefetch": -1}',
            r"field prefetch: expected an int >= 0 \(groups ahead\), got int -1",
        ),
        (
            '{"execwrap_plan_file": 1, "model": "LlamaForCausalLM", "fsdp_plan": {"model.layers.*": "free_full_weight"}}',
            r"^[^ ]*plan\.json: rule 'model\.layers\.\*' names no module of GPT \(the file was written for "
            r"LlamaForCausalLM\) \(its top-level modules: 'wte', 'blocks', 'ln_f' and 'lm_head'\); was the "
            r"plan made for another model\?$",
        ),
    ],
)
def test_load_plan_file_refuses(
    gpt: tuple[nn.Module, object], tmp_path: Path, content: str, match: str
) -> None:
    model, _ = gpt
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_plan_file(path, model)


def test_load_plan_file_missing(gpt: tuple[nn.Module, object], tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"nope\.json: cannot read the plan file: No such file or directory$"
    ):
        load_plan_file(tmp_path / "nope.json", gpt[0])
