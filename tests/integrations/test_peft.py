"""PEFT (LoRA on a frozen Llama) on 2 gloo ranks: PEFT's own FSDP recipes against execwrap's.

FSDP1: PEFT's recipe is ``FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model),
use_orig_params=False)`` (the adapters' leaf modules are units of their own, so
no flat parameter mixes frozen and trainable weights); execwrap's is the same
units ordered by execution (:func:`peft_wrap_policy`). A policy whose units do
mix them (one unit per decoder layer) is refused before anything is wrapped.

FSDP2: the per-layer ``fully_shard`` recipe against :func:`execwrap.apply_fully_shard`;
the plan's notes speak of FSDP2 (mixed groups are fine there), not of FSDP1.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests._dist import run_ranks

pytest.importorskip("peft")
pytest.importorskip("transformers")

STEPS = 3


def _lora_llama() -> Any:
    from peft import LoraConfig, get_peft_model

    from tests.integrations._frameworks import tiny_llama

    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return get_peft_model(tiny_llama(), config)


def _train(model: Any, rank: int) -> list[float]:
    import torch

    from tests.integrations._frameworks import token_batches

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for batch in token_batches(STEPS, seed=10 + rank):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    import torch
    from peft.utils.other import fsdp_auto_wrap_policy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import fully_shard
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from execwrap import ModuleWrapPolicy, ParamExecOrderWrapPolicy, apply_fully_shard
    from execwrap.integrations import fsdp_groups
    from execwrap.integrations.peft import peft_wrap_policy
    from tests.integrations._frameworks import token_batches

    cpu = torch.device("cpu")
    example = (token_batches(1, seed=99)[0],)
    out: dict[str, Any] = {}

    model = _lora_llama()
    ref1 = FSDP(model, auto_wrap_policy=fsdp_auto_wrap_policy(model), device_id=cpu)
    out["fsdp1_ref_groups"] = fsdp_groups(ref1)
    out["fsdp1_ref"] = _train(ref1, rank)

    model = _lora_llama()
    policy = peft_wrap_policy(model, example_inputs=example)
    ours1 = FSDP(model, auto_wrap_policy=policy, device_id=cpu)
    out["fsdp1_ours_groups"] = fsdp_groups(ours1)
    out["fsdp1_ours"] = _train(ours1, rank)
    out["fsdp1_plan"] = policy.plan.groups if policy.plan else None

    model = _lora_llama()
    blocks = ParamExecOrderWrapPolicy(ModuleWrapPolicy({LlamaDecoderLayer}), example_inputs=example)
    try:
        FSDP(model, auto_wrap_policy=blocks, device_id=cpu)
    except ValueError as e:
        out["refused"] = str(e)
    out["refused_left_unwrapped"] = fsdp_groups(model)
    out["fsdp1_notes"] = [n for n in blocks.plan.notes if "mixes" in n] if blocks.plan else []

    model = _lora_llama()
    for layer in model.base_model.model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    out["fsdp2_ref_groups"] = fsdp_groups(model)
    out["fsdp2_ref"] = _train(model, rank)

    model = _lora_llama()
    policy2 = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({LlamaDecoderLayer}), example_inputs=example
    )
    plan = apply_fully_shard(model, policy2)
    out["fsdp2_ours_groups"] = fsdp_groups(model)
    out["fsdp2_ours"] = _train(model, rank)
    out["fsdp2_plan"] = plan.groups
    out["fsdp2_notes"] = [n for n in plan.notes if "mixes" in n]
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_worker, timeout_s=240.0)


LAYERS = ["base_model.model.model.layers.0", "base_model.model.model.layers.1"]


def test_fsdp1_peft_policy_trains_like_pefts_own_recipe(results: list[dict[str, Any]]) -> None:
    for rank in results:
        assert len(rank["fsdp1_ours"]) == STEPS
        assert rank["fsdp1_ours"] == rank["fsdp1_ref"]
        assert sorted(rank["fsdp1_ours_groups"]) == sorted(rank["fsdp1_ref_groups"])
        assert sorted(rank["fsdp1_ours_groups"]) == sorted(rank["fsdp1_plan"])
        assert len(rank["fsdp1_plan"]) == 11  # root, 2 layers, 8 LoRA leaves (q/v x A/B x 2)
    assert results[0]["fsdp1_ours"] != results[1]["fsdp1_ours"]


def test_fsdp1_use_orig_params_false_refuses_mixed_units_before_wrapping(
    results: list[dict[str, Any]],
) -> None:
    for rank in results:
        assert rank["refused"] == (
            "ParamExecOrderWrapPolicy: FSDP1 with use_orig_params=False flattens each unit into "
            "one flat parameter with one requires_grad, but 2 of 3 units mix frozen and trainable "
            f"parameters: {LAYERS[0]} (4 of 13 parameters trainable), {LAYERS[1]} (4 of 13 "
            "parameters trainable). Pass use_orig_params=True to FSDP, or use an init_policy that "
            "wraps the trainable modules separately (for PEFT models: "
            "peft.utils.other.fsdp_auto_wrap_policy(model))"
        )
        assert rank["refused_left_unwrapped"] == []
        assert len(rank["fsdp1_notes"]) == 2
        assert all("FSDP1 needs use_orig_params=True" in n for n in rank["fsdp1_notes"])


def test_fsdp2_plan_notes_speak_of_fsdp2(results: list[dict[str, Any]]) -> None:
    for rank in results:
        assert rank["fsdp2_ours"] == rank["fsdp2_ref"]
        assert rank["fsdp2_plan"] == [[""], [LAYERS[0]], [LAYERS[1]]]
        assert sorted(rank["fsdp2_ours_groups"]) == sorted(rank["fsdp2_ref_groups"])
        assert sorted(rank["fsdp2_ours_groups"]) == sorted(rank["fsdp2_plan"])
        assert len(rank["fsdp2_notes"]) == 2
        for note in rank["fsdp2_notes"]:
            assert note.endswith(
                "FSDP2 shards and all-gathers them together, and reduce-scatters the gradients "
                "of the trainable ones only."
            )
            assert "FSDP1" not in note and "use_orig_params" not in note
