"""execwrap.integrations.transformers in one process: reading, exporting, checking and refusing plans.

The 2-rank runs through ``from_pretrained`` are in ``test_transformers_fsdp.py``; here
everything is on the meta device (tiny Llama configs, never downloaded).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from transformers import LlamaConfig  # noqa: E402
from transformers.distributed import DistributedConfig  # noqa: E402

from execwrap import CostModel, compare_plans, simulate_step  # noqa: E402
from execwrap.integrations.transformers import (  # noqa: E402
    applying_plan,
    config_mesh,
    distributed_config_for,
    load_fsdp_plan,
    plan_from_config,
    resolve_fsdp_plan,
    set_prefetch,
    to_fsdp_plan,
)
from execwrap.planning.given_groups import plan_from_groups  # noqa: E402
from execwrap.util.mesh import MeshShape  # noqa: E402


def _config(*, tie: bool = False, layers: int = 2) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )


@pytest.fixture(scope="module")
def found() -> Any:
    return plan_from_config(_config(), sequence_length=16)


def test_load_fsdp_plan_is_transformers_plan(found: Any) -> None:
    plan = found.plan
    assert plan.groups == [
        [""], ["model.embed_tokens"], ["model.layers.0"], ["model.layers.1"], ["model.norm", "lm_head"]
    ]  # fmt: skip
    assert plan.reshard_after_forward == (False, True, True, True, False)
    assert plan.prefetch == 0 and plan.policy_name == "transformers fsdp_plan"
    assert plan.notes == []
    assert found.order.capture_step == "zero-cost runtime"
    assert sum(u.numel for u in plan.units) == sum(p.numel() for p in found.model.parameters())


def test_tied_embedding_is_folded_as_transformers_folds_it() -> None:
    tied = plan_from_config(_config(tie=True), sequence_length=16)
    plan = tied.plan
    assert plan.groups == [
        [""],
        ["model.embed_tokens", "model.norm"],
        ["model.layers.0"],
        ["model.layers.1"],
    ]
    assert plan.reshard_after_forward == (False, False, True, True)
    assert plan.notes == [
        "parameter 'model.embed_tokens.weight' (names 'model.embed_tokens.weight', "
        "'lm_head.weight') is reached from group ['model.embed_tokens', 'model.norm'] and from "
        "the root's group: FSDP2 manages it in each (each all-gathers it and reduce-scatters "
        "its gradient); this plan counts it once, in group ['model.embed_tokens', 'model.norm']"
    ]
    assert (
        to_fsdp_plan(plan, tied.model)
        == {
            "model.layers.*": "free_full_weight",
            "model.norm": "keep_full_weight",
            "lm_head": "keep_full_weight",  # transformers takes the tied embedding's style from the head's
        }
    )


def test_round_trip_and_overrides(found: Any) -> None:
    model = found.model
    assert to_fsdp_plan(found.plan, model) == model.fsdp_plan
    override = DistributedConfig(fsdp_size=8, fsdp_plan={"model.layers.*": "keep_full_weight"})
    plan = load_fsdp_plan(model, distributed_config=override, order=found.order)
    assert plan.groups == [
        [""],
        ["model.embed_tokens"],
        ["model.layers.0"],
        ["model.layers.1"],
        ["model.norm"],
        ["lm_head"],
    ]  # fmt: skip: four kept modules are not transformers' norm/head pair
    assert plan.reshard_after_forward == (False, True, False, False, False, False)
    assert model.fsdp_plan["model.layers.*"] == "free_full_weight"  # the model is left as it was


def test_transformers_plan_is_simulated_and_compared() -> None:
    cm = CostModel.preset("h100-nvlink-8")
    found = plan_from_config(_config(layers=4), sequence_length=16, timing=cm.compute)
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from execwrap import plan_wrap

    ours = plan_wrap(
        found.model, found.order, ModuleWrapPolicy({LlamaDecoderLayer}), bucket_numel=2 * 9280
    )
    estimate = simulate_step(found.plan, cm, world_size=8)
    assert estimate.step_time_s > 0 and estimate.peak_memory_bytes > 0
    rows = compare_plans({"transformers": found.plan, "execwrap": ours})
    assert [(r["name"], r["units"]) for r in rows] == [("transformers", 7), ("execwrap", 3)]
    # simulate_step follows the plan's styles: 6 groups with weights gathered in forward, the 5
    # resharded ones (embeddings, 4 layers) again in backward, [norm, lm_head] kept unsharded
    assert estimate.all_gathers == 11
    # plan.stats() and compare_plans count FSDP2's defaults (every non-root group resharded)
    assert rows[0]["all_gathers_per_step"] == found.plan.stats().all_gathers_per_step == 12


def test_distributed_config_for(found: Any) -> None:
    model = found.model
    config = distributed_config_for(found.plan, model, fsdp_size=4)
    assert config.fsdp_size == 4 and config.fsdp_plan == model.fsdp_plan
    grouped = plan_from_groups(model, found.order, [["model.layers.0", "model.layers.1"]])
    with pytest.raises(
        ValueError,
        match=r"^distributed_config_for: the plan's group \['model\.layers\.0', 'model\.layers\.1'\] "
        r"is a tuple rule, which transformers documents but does not apply \(DistributedConfig "
        r"refuses it as 'match nothing', a model's own tuple rule is skipped\); apply the plan "
        r"with `with applying_plan\(plan\): Model\.from_pretrained\(\.\.\., distributed_config=\.\.\.\)`$",
    ):
        distributed_config_for(grouped, model, fsdp_size=4)
    layers_only = plan_from_groups(model, found.order, [["model.layers.0"], ["model.layers.1"]])
    with pytest.raises(
        ValueError,
        match=r"^distributed_config_for: transformers would also shard \['model\.embed_tokens'\] as "
        r"a group of its own: the model's own fsdp_plan has a rule for it, and "
        r"DistributedConfig\(fsdp_plan=\.\.\.\) overrides rules but never removes one",
    ):
        distributed_config_for(layers_only, model, fsdp_size=4)


def test_distributed_config_for_a_tied_embedding_resharded() -> None:
    # the model's own 'lm_head' rule stays (an override cannot remove it) and transformers
    # folds the tied embedding into it, kept, paired with the norm
    tied = plan_from_config(_config(tie=True), sequence_length=16)
    groups = [["model.embed_tokens"], ["model.layers.0"], ["model.layers.1"], ["model.norm"]]
    plan = plan_from_groups(
        tied.model, tied.order, groups, reshard_after_forward=[True, True, True, False]
    )
    with pytest.raises(
        ValueError,
        match=r"^distributed_config_for: transformers would not build the plan's group "
        r"\['model\.embed_tokens'\] \(free_full_weight\) from this fsdp_plan; transformers builds "
        r"\[\['model\.embed_tokens', 'model\.norm'\]\] instead; apply the plan with "
        r"`with applying_plan\(plan\): \.\.\.`$",
    ):
        distributed_config_for(plan, tied.model, fsdp_size=2)


def test_to_fsdp_plan_refuses_another_models_plan(found: Any) -> None:
    other = plan_from_config(
        LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2),
        sequence_length=16,
    )  # fmt: skip
    with pytest.raises(
        ValueError,
        match=r"^to_fsdp_plan: the plan names module 'model\.layers\.2', which LlamaForCausalLM "
        r"does not have; was it made for another model\?$",
    ):
        to_fsdp_plan(other.plan, found.model)


def test_resolve_refuses(found: Any) -> None:
    with pytest.raises(
        TypeError, match=r"^resolve_fsdp_plan: expected a transformers PreTrainedModel, got Linear"
    ):
        resolve_fsdp_plan(torch.nn.Linear(2, 2))
    with pytest.raises(
        ValueError,
        match=r"^resolve_fsdp_plan: the DistributedConfig shards nothing \(dp_replicate_size 1 x "
        r"fsdp_size 1 = 1\): transformers applies FSDP only when their product is above 1; pass "
        r"fsdp_size=<ranks>$",
    ):
        resolve_fsdp_plan(found.model, DistributedConfig(fsdp_size=1))


def test_applying_plan_refuses_and_warns(found: Any, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(TypeError, match=r"^applying_plan: expected a WrapPlan, got dict$"):
        with applying_plan({}):  # type: ignore[arg-type]
            pass
    from transformers.distributed import mixin

    original = mixin.apply_fully_sharded_data_parallelism
    with caplog.at_level(logging.WARNING, logger="execwrap.integrations.transformers.apply"):
        with applying_plan(found.plan) as applied:
            assert mixin.apply_fully_sharded_data_parallelism is not original
            with pytest.raises(RuntimeError, match=r"^applying_plan: a block is already active"):
                with applying_plan(found.plan):
                    pass
    assert mixin.apply_fully_sharded_data_parallelism is original
    assert applied.prefetch == 0 and applied.models == []
    assert caplog.messages == [
        "applying_plan: no model was sharded inside the block, so the plan (5 groups) was not "
        "applied: call from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=N)) "
        "with N > 1 inside it"
    ]


def test_set_prefetch_refuses_other_groups(found: Any) -> None:
    with pytest.raises(
        ValueError,
        match=r"^set_prefetch: the plan's group \[''\] is not a group of the sharded "
        r"LlamaForCausalLM \(its groups: \[\]\); load it with distributed_config_for",
    ):
        set_prefetch(found.model, found.plan)


def test_plan_from_config_refuses() -> None:
    with pytest.raises(
        ValueError, match=r"^plan_from_config: sequence_length must be >= 1, got 0$"
    ):
        plan_from_config(_config(), sequence_length=0)
    with pytest.raises(ValueError, match=r"^plan_from_config: transformers cannot build"):
        plan_from_config(
            _config(), model_class=lambda config: (_ for _ in ()).throw(ValueError("no"))
        )


def test_the_distributed_configs_mesh_is_planned_for() -> None:
    """``dp_replicate_size``: HSDP, priced so (8-rank shards: twice the 16-rank ones, one
    all-reduce per reduce-scatter); ``tp_size``: the local sizes of the model's TP plan."""
    cm = CostModel.preset("h100-ib-400g", world_size=16)
    hsdp = DistributedConfig(dp_replicate_size=2, fsdp_size=8)
    assert config_mesh(hsdp) == MeshShape(2, 8)
    assert config_mesh(DistributedConfig(fsdp_size=16)) is None and config_mesh(None) is None
    found = plan_from_config(
        _config(), distributed_config=hsdp, sequence_length=16, timing=cm.compute
    )
    assert found.plan.mesh == MeshShape(2, 8)
    est = simulate_step(found.plan, cm, world_size=16)
    flat = simulate_step(found.plan, cm, world_size=16, mesh=(1, 16))
    assert (est.mesh, est.all_reduces, est.reduce_scatters) == (MeshShape(2, 8), 4, 4)
    assert (flat.mesh, flat.all_reduces) == (None, 0)
    assert (est.memory.sharded_params, flat.memory.sharded_params) == (13392, 6696)
    tp = plan_from_config(
        _config(), distributed_config=DistributedConfig(tp_size=2, fsdp_size=8), sequence_length=16
    )
    assert tp.plan.mesh == MeshShape(1, 8, 2)
    local, full = tp.plan.order.params, tp.order.params
    shapes = {f: (full[f].shape, local[f].shape) for f in local if local[f].shape != full[f].shape}
    assert {f: s for f, s in shapes.items() if ".layers.1." not in f} == {
        "model.embed_tokens.weight": ((128, 32), (64, 32)),  # embedding_rowwise
        "model.layers.0.self_attn.q_proj.weight": ((32, 32), (16, 32)),
        "model.layers.0.self_attn.k_proj.weight": ((16, 32), (8, 32)),
        "model.layers.0.self_attn.v_proj.weight": ((16, 32), (8, 32)),
        "model.layers.0.self_attn.o_proj.weight": ((32, 32), (32, 16)),
        "model.layers.0.mlp.gate_proj.weight": ((64, 32), (32, 32)),
        "model.layers.0.mlp.up_proj.weight": ((64, 32), (32, 32)),
        "model.layers.0.mlp.down_proj.weight": ((32, 64), (32, 32)),
        "lm_head.weight": ((128, 32), (64, 32)),  # colwise_gather_output
    }
