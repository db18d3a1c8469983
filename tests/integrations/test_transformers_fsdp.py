"""transformers' own FSDP2 entry point on 2 gloo ranks: its plan in execwrap, execwrap's plans through it.

One spawn runs, in each rank, ``from_pretrained(folder, distributed_config=DistributedConfig(fsdp_size=2))``
on a tiny Llama saved in a temp folder (built from a config, never downloaded), 3 steps each:

1. transformers' own path with the model's own plan (untied and tied embeddings);
2. that plan loaded into execwrap (:func:`load_fsdp_plan` on the meta model) and applied
   through the same ``from_pretrained`` with :func:`applying_plan`: the same groups
   and the same losses, bit for bit (also on HSDP's ``(dp_replicate, fsdp)`` mesh);
3. execwrap's own plan (blocks two by two, ``[norm, lm_head]`` as one group, explicit
   prefetching) through :func:`applying_plan`: the groups are the plan's, the losses
   transformers' (in fp32 the grouping moves parameters, not arithmetic); and with full
   activation checkpointing of every group (``checkpointing="full"``): the same again;
4. execwrap's plan saved as a plan file and read back: the same groups and losses;
5. a plan the format holds, exported with :func:`distributed_config_for` and loaded by
   transformers itself, then :func:`set_prefetch`: transformers builds the plan's groups.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests._dist import run_ranks

pytest.importorskip("transformers")

STEPS = 3
LR = 1e-2


def _train(model: Any, rank: int) -> list[float]:
    import torch

    from tests.integrations._frameworks import token_batches

    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for batch in token_batches(STEPS, seed=10 + rank):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _meta_plans(folder: str) -> dict[str, Any]:
    """transformers' plan and two of execwrap's, on the meta model of ``folder``'s config
    (untied embeddings: execwrap's own planner keeps a tied weight in the root's group)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from execwrap import ModuleWrapPolicy, plan_wrap
    from execwrap.integrations.transformers import plan_from_pretrained
    from execwrap.planning.given_groups import plan_from_groups

    found = plan_from_pretrained(folder, sequence_length=16)
    ours = plan_wrap(
        found.model,
        found.order,
        ModuleWrapPolicy({LlamaDecoderLayer}),
        groups=[["model.layers.0", "model.layers.1"], ["model.norm", "lm_head"]],
    )
    # the layers kept unsharded after forward, one group per module: the fsdp_plan format holds it
    kept = plan_from_groups(
        found.model,
        found.order,
        [
            ["model.embed_tokens"],
            ["model.layers.0"],
            ["model.layers.1"],
            ["model.norm"],
            ["lm_head"],
        ],
        reshard_after_forward=[True, False, False, False, False],
    )
    return {"model": found.model, "theirs": found.plan, "ours": ours, "kept": kept}


def _worker(rank: int, world_size: int, untied: str, tied: str) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    from execwrap.fsdp.checkpointing import CheckpointedForward
    from execwrap.integrations import fsdp_groups
    from execwrap.integrations.transformers import (
        applying_plan,
        distributed_config_for,
        load_fsdp_plan,
        plan_from_pretrained,
        set_prefetch,
    )
    from execwrap.planning.plan_file import load_plan_file, save_plan_file
    from tests.integrations._frameworks import launcher_env

    launcher_env(rank, world_size)
    config = DistributedConfig(fsdp_size=world_size)
    out: dict[str, Any] = {}

    def load(folder: str, dc: Any = config) -> Any:
        return AutoModelForCausalLM.from_pretrained(folder, distributed_config=dc)

    for name, folder in (("untied", untied), ("tied", tied)):
        theirs = load_fsdp_plan(plan_from_pretrained(folder).model)
        model = load(folder)
        out[f"{name}_own"] = {"groups": fsdp_groups(model), "losses": _train(model, rank)}
        with applying_plan(theirs) as applied:
            model = load(folder)
        out[f"{name}_loaded"] = {
            "groups": fsdp_groups(model),
            "losses": _train(model, rank),
            "plan": theirs.groups,
            "applied": len(applied.models),
        }
    hsdp = DistributedConfig(fsdp_size=1, dp_replicate_size=world_size)  # HSDP's 2-D mesh
    model = load(untied, hsdp)
    out["hsdp_own"] = {"groups": fsdp_groups(model), "losses": _train(model, rank)}
    with applying_plan(load_fsdp_plan(plan_from_pretrained(untied).model)):
        model = load(untied, hsdp)
    out["hsdp_loaded"] = {"groups": fsdp_groups(model), "losses": _train(model, rank)}
    plans = _meta_plans(untied)
    with applying_plan(plans["ours"], prefetch=1, checkpointing="full"):
        model = load(untied)
    out["ours_checkpointed"] = {"groups": fsdp_groups(model), "losses": _train(model, rank)}
    out["checkpointed_modules"] = sorted(
        n
        for n, m in model.named_modules()
        if isinstance(m.__dict__.get("forward"), CheckpointedForward)
    )
    with applying_plan(plans["ours"], prefetch=1):
        model = load(untied)
    out["ours"] = {
        "groups": fsdp_groups(model),
        "losses": _train(model, rank),
        "plan": plans["ours"].groups,
    }
    # the same plan through a plan file, read back for the meta model
    path = Path(untied) / f"plan{rank}.json"
    save_plan_file(plans["ours"], path, plans["model"])
    from_file = load_plan_file(path, plans["model"], order=plans["ours"].order)
    with applying_plan(from_file, prefetch=1):
        model = load(untied)
    out["from_file"] = {"groups": fsdp_groups(model), "losses": _train(model, rank)}
    dc = distributed_config_for(plans["kept"], plans["model"], fsdp_size=world_size)
    model = load(untied, dc)
    set_prefetch(model, plans["kept"], prefetch=1)
    out["dict"] = {
        "groups": fsdp_groups(model),
        "losses": _train(model, rank),
        "plan": plans["kept"].groups,
        "fsdp_plan": dc.fsdp_plan,
        "reshard": _reshard(model),
    }
    return out


def _reshard(model: Any) -> dict[str, bool]:
    """The first module of each FSDP2 group -> whether it reshards after forward."""
    from torch.distributed.fsdp import FSDPModule

    names = {id(m): n for n, m in model.named_modules()}
    out: dict[str, bool] = {}
    for m in model.modules():
        if isinstance(m, FSDPModule):
            group = m._get_fsdp_state()._fsdp_param_group
            if group is not None:
                out.setdefault(names[id(m)], group.post_forward_mesh_info is not None)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    from tests.integrations._frameworks import tiny_llama

    with tempfile.TemporaryDirectory() as tmp:
        untied, tied = Path(tmp, "untied"), Path(tmp, "tied")
        tiny_llama(tie=False).save_pretrained(untied)
        tiny_llama(tie=True).save_pretrained(tied)
        return run_ranks(_worker, args=(str(untied), str(tied)), timeout_s=240.0)


OWN_UNTIED = [
    [""],
    ["model.embed_tokens"],
    ["model.layers.0"],
    ["model.layers.1"],
    ["model.norm", "lm_head"],
]
OWN_TIED = [[""], ["model.embed_tokens", "model.norm"], ["model.layers.0"], ["model.layers.1"]]


def test_transformers_plan_loaded_into_execwrap_is_what_transformers_builds(
    results: list[dict[str, Any]],
) -> None:
    for rank in results:
        assert rank["untied_own"]["groups"] == OWN_UNTIED
        assert rank["tied_own"]["groups"] == OWN_TIED
        for name in ("untied", "tied"):
            own, loaded = rank[f"{name}_own"], rank[f"{name}_loaded"]
            assert sorted(loaded["plan"]) == sorted(own["groups"])
            assert loaded["groups"] == own["groups"]
            assert loaded["losses"] == own["losses"]
            assert loaded["applied"] == 1
        assert rank["hsdp_loaded"] == rank["hsdp_own"]
        assert rank["hsdp_own"]["groups"] == OWN_UNTIED
    assert results[0]["untied_own"]["losses"] != results[1]["untied_own"]["losses"]  # own data


def test_execwrap_plan_applied_through_from_pretrained(results: list[dict[str, Any]]) -> None:
    for rank in results:
        ours = rank["ours"]
        assert ours["plan"] == [
            [""],
            ["model.layers.0", "model.layers.1"],
            ["model.norm", "lm_head"],
        ]
        assert sorted(ours["groups"]) == sorted(ours["plan"])
        assert ours["losses"] == rank["untied_own"]["losses"]
        assert rank["from_file"] == {"groups": ours["groups"], "losses": ours["losses"]}
        checkpointed = rank["ours_checkpointed"]  # recomputed in backward: the same arithmetic
        assert checkpointed == {"groups": ours["groups"], "losses": ours["losses"]}
        # 'model.norm' was a target too: its forward set on the instance is gone once
        # from_pretrained has loaded the weights (the layers and lm_head keep theirs)
        assert rank["checkpointed_modules"] == ["lm_head", "model.layers.0", "model.layers.1"]


def test_distributed_config_for_makes_transformers_build_the_plan(
    results: list[dict[str, Any]],
) -> None:
    for rank in results:
        d = rank["dict"]
        assert d["fsdp_plan"] == {
            "model.embed_tokens": "free_full_weight",
            "model.layers.*": "keep_full_weight",
            "model.norm": "keep_full_weight",
            "lm_head": "keep_full_weight",
        }
        assert d["groups"] == [
            [""],
            ["model.embed_tokens"],
            ["model.layers.0"],
            ["model.layers.1"],
            ["model.norm"],
            ["lm_head"],
        ]
        assert sorted(d["plan"]) == sorted(d["groups"])
        assert d["reshard"] == {  # the root holds no parameter here
            "model.embed_tokens": True,
            "model.layers.0": False,
            "model.layers.1": False,
            "model.norm": False,
            "lm_head": False,
        }
        assert d["losses"] == rank["untied_own"]["losses"]
