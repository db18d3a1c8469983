"""torchtitan on 2 gloo ranks: its own parallelize step against execwrap's, 3 steps each.

The entry point is torchtitan's: a Llama3 model built on the meta device from
its config registry (``debugmodel``, 2 layers), the model spec's
``parallelize_fn`` called as torchtitan's trainer calls it, then
``to_empty`` + ``init_weights`` and training steps with torchtitan's
cross-entropy loss, with torchtitan's selective activation checkpointing. The
reference is ``parallelize_llama`` (its checkpointing: ``checkpoint_wrapper`` with
torchtitan's op-level policy); execwrap's is
:func:`execwrap.integrations.torchtitan.parallelize_fn` with
:func:`decoder_policy` (torchtitan's grouping stated, the order captured at
run time on the meta-device model: symbolic tracing fails in the RoPE module;
the same checkpointing applied by execwrap, FQNs kept).

CPU: torchtitan's trainer needs CUDA, so the loop here is the trainer's
forward/backward/step in a few lines. ``_cpu_torchtitan`` undoes torchtitan's
CPU limits: its meshes are built on ``device_type`` ("cuda" without a GPU),
its language-model configs refuse SDPA and FlexAttention has no backward on
CPU (the blocks get torchtitan's own ``ScaledDotProductAttention``, as its
graph-trainer tests use), and gloo has no ``PREMUL_SUM`` for the reference's
gradient-division-free reduce-scatter (forced to a sum, the same reduction;
execwrap's ``apply_fsdp`` does this itself on gloo). torchtitan's model
package imports ``triton``.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest

from tests._dist import run_ranks

pytest.importorskip("triton")
pytest.importorskip("torchtitan")

STEPS = 3
SEQ = 16


def _cpu_torchtitan() -> Any:
    """torchtitan's llama3 debug config, 2 layers, SDPA; meshes on CPU."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    parallel_dims.device_type = "cpu"
    spec = model_registry("debugmodel", attn_backend="flex")
    spec.model.layers = spec.model.layers[:2]
    for layer in spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return spec


def _train(
    spec: Any, parallelize: Any, rank: int, dump: str
) -> tuple[list[float], list[list[str]], list[str]]:
    import torch
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.components.loss import cross_entropy_loss
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    from execwrap.integrations import fsdp_groups

    parallelism = ParallelismConfig(spmd_backend="partial_dtensor", data_parallel_shard_degree=2)
    dims = ParallelDims.from_config(parallelism, 2)
    dims.build_mesh()
    with torch.device("meta"):
        model = spec.model.build()
    model = parallelize(
        model,
        parallel_dims=dims,
        training=TrainingConfig(mixed_precision_param="float32"),
        parallelism=parallelism,
        compile_config=CompileConfig(),
        ac_config=SelectiveAC.Config(),
        dump_folder=dump,
    )
    for module in model.modules():  # gloo has no PREMUL_SUM (execwrap's apply_fsdp sets it)
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(10 + rank)
    losses = []
    for _ in range(STEPS):
        tokens = torch.randint(0, 2048, (2, SEQ + 1), generator=g)
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        positions = torch.arange(SEQ).expand(2, SEQ)
        loss = cross_entropy_loss(model(inputs, positions=positions), labels) / labels.numel()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, fsdp_groups(model), _checkpointed(model)


def _checkpointed(model: Any) -> list[str]:
    """Modules checkpointed: by torch's ``CheckpointWrapper`` or by execwrap."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    from execwrap.fsdp import CheckpointedForward

    return [
        f"{name}: {type(m).__name__ if isinstance(m, CheckpointWrapper) else m.forward.mode}"
        for name, m in model.named_modules()
        if isinstance(m, CheckpointWrapper)
        or isinstance(m.__dict__.get("forward"), CheckpointedForward)
    ]


def _worker(rank: int, world_size: int, dump: str) -> dict[str, Any]:
    import torch
    from torchtitan.models.llama3 import parallelize_llama

    from execwrap.integrations.torchtitan import decoder_policy, parallelize_fn

    spec = _cpu_torchtitan()
    out: dict[str, Any] = {}
    out["ref"], out["ref_groups"], out["ref_checkpointed"] = _train(
        spec, parallelize_llama, rank, dump
    )
    example = torch.zeros(2, SEQ, dtype=torch.long, device="meta")
    positions = torch.arange(SEQ, device="meta").expand(2, SEQ)

    def policy(model: Any) -> Any:
        return decoder_policy(
            model, example_inputs=(example,), example_kwargs={"positions": positions}
        )

    ours = parallelize_fn(policy)
    out["ours"], out["ours_groups"], out["ours_checkpointed"] = _train(spec, ours, rank, dump)
    assert ours.plan is not None
    out["plan"] = ours.plan.groups
    out["method"] = ours.plan.order.method
    out["notes"] = [n for n in ours.plan.notes if "as stated" in n]
    return out


def test_parallelize_fn_trains_like_parallelize_llama() -> None:
    with tempfile.TemporaryDirectory() as dump:
        results = run_ranks(_worker, args=(dump,), timeout_s=240.0)
    torchtitan_groups = [[""], ["tok_embeddings"], ["layers.0"], ["layers.1"], ["norm", "lm_head"]]
    for rank in results:
        assert len(rank["ours"]) == STEPS
        assert rank["ours"] == rank["ref"]
        assert rank["ref_groups"] == torchtitan_groups
        assert rank["ours_groups"] == torchtitan_groups
        assert sorted(rank["plan"]) == sorted(torchtitan_groups)
        assert rank["plan"] == [
            [""],
            ["tok_embeddings"],
            ["layers.0"],
            ["layers.1"],
            ["norm", "lm_head"],
        ]
        assert rank["method"] == "runtime"
        assert rank["ref_checkpointed"] == [
            "layers.0: FSDPCheckpointWrapper",
            "layers.1: FSDPCheckpointWrapper",
        ]
        assert rank["ours_checkpointed"] == ["layers.0: selective", "layers.1: selective"]
        assert rank["notes"] == [
            "Module 'tok_embeddings' is a unit of its own, as stated in groups (524288 elements).",
            "Modules 'norm' and 'lm_head' form one FSDP group, as stated in groups: one "
            "all-gather and one reduce-scatter for 2 modules (524544 elements).",
        ]
    assert results[0]["ours"] != results[1]["ours"]
