"""Lightning on 2 gloo ranks: its own FSDP recipes against execwrap's, 3 steps each.

FSDP2: ``Trainer(strategy=ModelParallelStrategy())`` with ``configure_model``
doing Lightning's own per-block recipe (``fully_shard`` on each decoder layer,
then on the model) against :func:`shard_lightning_module` with a policy
capturing its order on the held model: same losses, same groups, and the plan
names modules as the LightningModule does (``model.model.layers.0``; its root
group is realised by ``fully_shard(self.model)``).

FSDP1: ``FSDPStrategy(auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}))``
against :func:`lightning_wrap_policy` around an execwrap policy with example
inputs for the held model. CPU: Lightning refuses ``FSDPStrategy`` on CPU
("requires a GPU accelerator"; its check is ``type(strategy) is FSDPStrategy``)
and passes ``device_id=None`` there, which FSDP1 refuses; ``_CPUFSDPStrategy``
is a subclass whose ``_setup_model`` passes ``device_id=cpu``, the rest is
Lightning's own.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests._dist import run_ranks

pytest.importorskip("lightning")
pytest.importorskip("transformers")

STEPS = 3


def _lit_module(configure: Any = None) -> Any:
    import lightning as L
    import torch

    from tests.integrations._frameworks import tiny_llama

    class LitLlama(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama()
            self.losses: list[float] = []
            self.plan: Any = None

        def configure_model(self) -> None:
            if configure is not None:
                configure(self)

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            loss = self.model(input_ids=batch, labels=batch).loss
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.trainer.model.parameters(), lr=1e-2)

    return LitLlama()


def _fit(lit: Any, strategy: Any, rank: int) -> list[list[str]]:
    import lightning as L
    import torch

    from execwrap.integrations import fsdp_groups
    from tests.integrations._frameworks import token_batches

    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = torch.utils.data.DataLoader(token_batches(STEPS, seed=10 + rank), batch_size=None)
    trainer.fit(lit, data)
    return fsdp_groups(trainer.model)


def _cpu_fsdp_strategy(**kwargs: Any) -> Any:
    import torch
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel

    class _CPUFSDPStrategy(FSDPStrategy):
        def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
            return FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=torch.device("cpu"),
                **self.kwargs,
            )

    return _CPUFSDPStrategy(**kwargs)


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    from lightning.pytorch.strategies import ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from execwrap import ModuleWrapPolicy, ParamExecOrderWrapPolicy
    from execwrap.integrations.lightning import lightning_wrap_policy, shard_lightning_module
    from tests.integrations._frameworks import launcher_env, token_batches

    launcher_env(rank, world_size)
    example = (token_batches(1, seed=99)[0],)
    out: dict[str, Any] = {}

    def lightning_recipe(lit: Any) -> None:
        mesh = lit.device_mesh["data_parallel"]
        for layer in lit.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(lit.model, mesh=mesh)

    ref = _lit_module(lightning_recipe)
    out["fsdp2_ref_groups"] = _fit(ref, ModelParallelStrategy(), rank)
    out["fsdp2_ref"] = ref.losses

    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({LlamaDecoderLayer}), example_inputs=example)

    def execwrap_recipe(lit: Any) -> None:
        lit.plan = shard_lightning_module(lit, policy)

    ours = _lit_module(execwrap_recipe)
    out["fsdp2_ours_groups"] = _fit(ours, ModelParallelStrategy(), rank)
    out["fsdp2_ours"] = ours.losses
    out["fsdp2_plan"] = ours.plan.groups
    out["fsdp2_plan_params"] = list(ours.plan.units[1].param_fqns[:2])

    ref1 = _lit_module()
    out["fsdp1_ref_groups"] = _fit(
        ref1, _cpu_fsdp_strategy(auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer})), rank
    )
    out["fsdp1_ref"] = ref1.losses
    policy1 = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({LlamaDecoderLayer}), example_inputs=example
    )
    ours1 = _lit_module()
    out["fsdp1_ours_groups"] = _fit(
        ours1, _cpu_fsdp_strategy(auto_wrap_policy=lightning_wrap_policy(policy1)), rank
    )
    out["fsdp1_ours"] = ours1.losses
    out["fsdp1_plan"] = policy1.plan.groups if policy1.plan else None
    out["fsdp1_method"] = policy1.order.method if policy1.order else None
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_worker, timeout_s=240.0)


def test_model_parallel_strategy_with_shard_lightning_module(results: list[dict[str, Any]]) -> None:
    for rank in results:
        assert len(rank["fsdp2_ours"]) == STEPS
        assert rank["fsdp2_ours"] == rank["fsdp2_ref"]
        assert rank["fsdp2_plan"] == [[""], ["model.model.layers.0"], ["model.model.layers.1"]]
        assert rank["fsdp2_plan_params"] == [
            "model.model.layers.0.input_layernorm.weight",
            "model.model.layers.0.self_attn.q_proj.weight",
        ]
        assert rank["fsdp2_ours_groups"] == rank["fsdp2_ref_groups"]
        assert rank["fsdp2_ours_groups"][0] == ["model"]  # the plan's root group, on self.model
        built = [["" if f == "model" else f for f in g] for g in rank["fsdp2_ours_groups"]]
        assert sorted(built) == sorted(rank["fsdp2_plan"])
    assert results[0]["fsdp2_ours"] != results[1]["fsdp2_ours"]


def test_fsdp_strategy_with_lightning_wrap_policy(results: list[dict[str, Any]]) -> None:
    for rank in results:
        assert rank["fsdp1_ours"] == rank["fsdp1_ref"]
        assert rank["fsdp1_method"] == "runtime"
        assert rank["fsdp1_plan"] == [[""], ["model.model.layers.0"], ["model.model.layers.1"]]
        assert sorted(rank["fsdp1_ours_groups"]) == sorted(rank["fsdp1_ref_groups"])
        assert sorted(rank["fsdp1_ours_groups"]) == sorted(rank["fsdp1_plan"])
