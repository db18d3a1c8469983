"""accelerate and the HF Trainer on 2 gloo ranks: their own FSDP recipes against execwrap's.

One spawn runs, in order, in each rank (accelerate's state reset between):

1. accelerate's own FSDP2 recipe (plugin ``transformer_based_wrap`` on
   ``LlamaDecoderLayer``), 3 steps;
2. the same plugin (class names kept) with
   :func:`execwrap.integrations.accelerate.prepare_fully_shard` before
   ``prepare``: same losses, and the groups built are the plan's;
3. the silent-ignore case: an FSDP2 plugin given the policy as
   ``auto_wrap_policy``: the first optimizer step names it;
4. the Trainer's own FSDP2 recipe (``fsdp_config`` with
   ``transformer_layer_cls_to_wrap``) against :class:`ExecwrapTrainer`;
5. the silent-ignore case: a policy assigned to a Trainer's plugin after
   construction.

CPU: accelerate drops the FSDP plugin on CPU; ``accelerate_keeps_fsdp_on_cpu``
undoes that one rule, the rest is accelerate's and transformers' own code.
accelerate's FSDP1 path is not run: with that rule undone on CPU it passes
``device_id=cpu:0`` for parameters on ``cpu``, which FSDP1 refuses.
Losses are equal although accelerate's own groups differ from the plan's
(it also shards the embeddings and ``[norm, lm_head]``): in fp32, sharding
changes where parameters live, not the arithmetic (each gradient element is
summed over the same two ranks).
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

from tests._dist import run_ranks

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

STEPS = 3
LR = 1e-2


def _accelerate_run(plugin: Any, shard: Any, rank: int) -> dict[str, Any]:
    import torch
    from accelerate import Accelerator

    from execwrap.integrations import fsdp_groups
    from tests.integrations._frameworks import reset_accelerate, tiny_llama, token_batches

    accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    model = tiny_llama()
    plan = shard(accelerator, model) if shard is not None else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for batch in token_batches(STEPS, seed=10 + rank):
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    groups = fsdp_groups(model)
    reset_accelerate()
    return {
        "losses": losses,
        "groups": groups,
        "plan": None if plan is None else plan.groups,
        "checkpointed": _checkpointed(model),
    }


def _checkpointed(model: Any) -> list[str]:
    """Modules checkpointed: torch's ``CheckpointWrapper`` (by name), or execwrap's (with mode)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from execwrap.fsdp import CheckpointedForward

    found = []
    for name, m in model.named_modules():
        if isinstance(m, CheckpointWrapper):
            found.append(name)
        elif isinstance(m.__dict__.get("forward"), CheckpointedForward):
            found.append(f"{name}: {m.forward.mode}")
    return found


def _trainer_run(trainer_cls: Any, rank: int, tmp: str, **kwargs: Any) -> dict[str, Any]:
    from transformers import TrainingArguments

    from execwrap.integrations import fsdp_groups
    from tests.integrations._frameworks import (
        accelerate_keeps_fsdp_on_cpu,
        reset_accelerate,
        tiny_llama,
        token_batches,
    )

    rows = [{"input_ids": b[0], "labels": b[0]} for b in token_batches(6, seed=20, batch=1)]
    fsdp_config: dict[str, Any] = {"fsdp_version": 2}
    fsdp_config.update(kwargs.pop("fsdp_config", {}))
    args = TrainingArguments(
        output_dir=tmp,
        max_steps=STEPS,
        per_device_train_batch_size=1,
        learning_rate=LR,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        seed=0,
        disable_tqdm=True,
        fsdp=True,
        fsdp_config=fsdp_config,
    )
    assert args.device.type == "cpu"  # TrainingArguments sets accelerate's process state up anew
    accelerate_keeps_fsdp_on_cpu()
    setup = kwargs.pop("setup", None)
    trainer = trainer_cls(model=tiny_llama(), args=args, train_dataset=rows, **kwargs)
    if setup is not None:
        setup(trainer)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    plan = getattr(trainer, "wrap_plan", None)
    out = {
        "losses": losses,
        "groups": fsdp_groups(trainer.model),
        "plan": None if plan is None else plan.groups,
    }
    reset_accelerate()
    return out


def _worker(rank: int, world_size: int, tmp: str) -> dict[str, Any]:
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin as Plugin
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers import Trainer
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from execwrap import ModuleWrapPolicy, ParamExecOrderWrapPolicy
    from execwrap.integrations.accelerate import prepare_fully_shard
    from execwrap.integrations.hf_trainer import ExecwrapTrainer
    from tests.integrations._frameworks import (
        Records,
        accelerate_keeps_fsdp_on_cpu,
        launcher_env,
        token_batches,
    )

    launcher_env(rank, world_size)
    accelerate_keeps_fsdp_on_cpu()
    example = (token_batches(1, seed=99)[0],)
    blocks = ["LlamaDecoderLayer"]

    def policy(**kwargs: Any) -> ParamExecOrderWrapPolicy:
        return ParamExecOrderWrapPolicy(ModuleWrapPolicy({LlamaDecoderLayer}), **kwargs)

    out: dict[str, Any] = {}
    wrap = {"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": blocks}
    out["acc_ref"] = _accelerate_run(Plugin(fsdp_version=2, **wrap), None, rank)
    ours = policy(example_inputs=example)
    out["acc_ours"] = _accelerate_run(
        Plugin(fsdp_version=2, **wrap),
        lambda acc, model: prepare_fully_shard(acc, model, ours),
        rank,
    )
    # the training step: accelerate's activation checkpointing and mixed precision
    step = {
        "activation_checkpointing": True,
        "mixed_precision_policy": MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        ),
    }
    out["acc_ref_step"] = _accelerate_run(Plugin(fsdp_version=2, **wrap, **step), None, rank)
    out["acc_ours_step"] = _accelerate_run(
        Plugin(fsdp_version=2, **wrap, **step),
        lambda acc, model: prepare_fully_shard(acc, model, policy(example_inputs=example)),
        rank,
    )
    with Records() as records:
        out["acc_ignored"] = _accelerate_run(
            Plugin(fsdp_version=2, auto_wrap_policy=policy()), None, rank
        )
    out["acc_ignored_warnings"] = records.messages

    with tempfile.TemporaryDirectory() as tmp_dir:
        out["hf_ref"] = _trainer_run(
            Trainer, rank, tmp_dir, fsdp_config={"transformer_layer_cls_to_wrap": blocks}
        )
        out["hf_ours"] = _trainer_run(ExecwrapTrainer, rank, tmp_dir, wrap_policy=policy())
        late = policy()

        def assign_late(trainer: Any) -> None:
            trainer.accelerator.state.fsdp_plugin.auto_wrap_policy = late

        with Records() as records:
            out["hf_late"] = _trainer_run(Trainer, rank, tmp_dir, setup=assign_late)
        out["hf_late_warnings"] = records.messages
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        return run_ranks(_worker, args=(tmp,), timeout_s=240.0)


BLOCK_GROUPS = [[""], ["model.layers.0"], ["model.layers.1"]]


def test_accelerate_fsdp2_prepare_fully_shard_trains_like_accelerates_own_recipe(
    results: list[dict[str, Any]],
) -> None:
    for rank in results:
        ref, ours = rank["acc_ref"], rank["acc_ours"]
        assert len(ours["losses"]) == STEPS
        assert ours["losses"] == ref["losses"]
        assert ref["groups"] == [
            [""],
            ["model.embed_tokens"],
            ["model.layers.0"],
            ["model.layers.1"],
            ["model.norm", "lm_head"],
        ]
        assert ours["plan"] == BLOCK_GROUPS
        assert sorted(ours["groups"]) == sorted(ours["plan"])
        # with activation checkpointing and bf16 mixed precision: the same losses
        ref, ours = rank["acc_ref_step"], rank["acc_ours_step"]
        assert len(ours["losses"]) == STEPS
        assert ours["losses"] == ref["losses"]
        assert ours["losses"] != rank["acc_ours"]["losses"]  # bf16 changes them
        assert ours["checkpointed"] == ["model.layers.0: full", "model.layers.1: full"]
        assert ref["checkpointed"] == ["model.layers.0", "model.layers.1"]
    assert results[0]["acc_ours"]["losses"] != results[1]["acc_ours"]["losses"]  # own data


def test_accelerate_fsdp2_plugin_ignoring_the_policy_is_named_at_the_first_step(
    results: list[dict[str, Any]],
) -> None:
    for rank in results:
        # accelerate carved out the embeddings and the tail; the blocks stayed in the root
        assert rank["acc_ignored"]["groups"] == [
            [""],
            ["model.embed_tokens"],
            ["model.norm", "lm_head"],
        ]
        (warning,) = [m for m in rank["acc_ignored_warnings"] if "never applied" in m]
        assert warning.startswith("ParamExecOrderWrapPolicy(ModuleWrapPolicy({LlamaDecoderLayer}))")
        assert "accelerate's FSDP2 plugin holds it as auto_wrap_policy" in warning
        assert "prepare_fully_shard(accelerator, model, policy)" in warning


def test_execwrap_trainer_trains_like_the_trainers_own_fsdp2_recipe(
    results: list[dict[str, Any]],
) -> None:
    for rank in results:
        ref, ours = rank["hf_ref"], rank["hf_ours"]
        assert len(ours["losses"]) == STEPS
        assert ours["losses"] == ref["losses"]
        assert ours["plan"] == BLOCK_GROUPS
        assert sorted(ours["groups"]) == sorted(ours["plan"])


def test_policy_set_on_the_trainers_plugin_after_construction_is_named(
    results: list[dict[str, Any]],
) -> None:
    for rank in results:
        (warning,) = [m for m in rank["hf_late_warnings"] if "never applied" in m]
        assert "accelerate's FSDP2 plugin holds it as auto_wrap_policy" in warning
        assert "ExecwrapTrainer(wrap_policy=policy)" in warning


def test_paths_that_would_drop_the_plan_refuse_it(tmp_path: Any) -> None:
    """In one process, without FSDP (as accelerate leaves it on CPU): clear errors."""
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin as Plugin
    from transformers import TrainingArguments

    from execwrap import ModuleWrapPolicy, ParamExecOrderWrapPolicy
    from execwrap.integrations.accelerate import check_fsdp_plugin, prepare_fully_shard
    from execwrap.integrations.hf_trainer import ExecwrapTrainer
    from tests.integrations._frameworks import reset_accelerate, tiny_llama

    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy(set()))
    with pytest.raises(
        TypeError,
        match=r"^accelerate's FSDP2 plugin ignores a ParamExecOrderWrapPolicy as auto_wrap_policy "
        r"\(its FSDP2 preparation knows only transformer_auto_wrap_policy and "
        r"size_based_auto_wrap_policy, so the blocks would stay unsharded\)",
    ):
        check_fsdp_plugin(Plugin(fsdp_version=2, auto_wrap_policy=policy))
    check_fsdp_plugin(Plugin(fsdp_version=1, auto_wrap_policy=policy))  # FSDP1 calls it
    try:
        with pytest.raises(
            ValueError,
            match=r"^prepare_fully_shard: the Accelerator is not set up for FSDP "
            r"\(distributed_type=DistributedType.NO\); pass fsdp_plugin=",
        ):
            prepare_fully_shard(Accelerator(cpu=True), tiny_llama(), policy)
        reset_accelerate()
        args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
        with pytest.raises(
            ValueError,
            match=r"^ExecwrapTrainer: FSDP is not enabled \(accelerate distributed_type="
            r"DistributedType.NO\); pass TrainingArguments\(fsdp=True, fsdp_config=",
        ):
            ExecwrapTrainer(model=tiny_llama(), args=args, wrap_policy=policy)
    finally:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
