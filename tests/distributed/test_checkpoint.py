"""Checkpoints across plans on gloo ranks: train 3 steps under plan A, save, load under plan B,
train 3 more; the losses are those of 6 uninterrupted steps under plan A.

Every step trains on one global batch of 4 sequences, each rank on its slice,
and the loss compared is the mean over ranks (an ``all_reduce``), so runs on
different world sizes see the same data. On the same world size the losses are
equal to the bit; after a change of world size they agree to ``RTOL`` (the
batch mean is summed in another order).

One spawn of 2 ranks runs the same-world cases (FSDP2 per-block -> auto-bucketed,
FSDP2 prefetch/resharding change, FSDP1 per block -> FSDP1 per sublayer with ``SHARDED_STATE_DICT``,
FSDP1 -> FSDP2, a restart from the pinned plan, and the refusals); the
world-size change runs 2 ranks -> 1 rank.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from execwrap import (
    ModuleWrapPolicy,
    ParamExecOrderWrapPolicy,
    TracingConfig,
    apply_fully_shard,
    plan_wrap,
)
from execwrap.demo_models import GPT, MLP, Block, CausalSelfAttention, GPTConfig
from execwrap.fsdp.restart import load_checkpoint, restart_fully_shard, save_checkpoint
from execwrap.plan.pinned import PLAN_FILE, load_plan, save_plan
from tests._dist import run_ranks
from tests.execwrap.autoplan_cases import cost_model
from tracing import trace_execution_order

pytestmark = pytest.mark.timeout(300)

STEPS = 3
GLOBAL_BATCH = 4
RTOL = 1e-5
CONFIG = dict(n_blocks=3, dim=32, vocab_size=64, max_seq_len=16)

#: A sharding: the model -> (the sharded model, the plan applied or None).
Shard = Callable[[nn.Module], tuple[nn.Module, Any]]


def _model(**changes: Any) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**CONFIG, **changes}))


def _batch(step: int) -> torch.Tensor:
    """This rank's slice of step ``step``'s global batch."""
    x = torch.randint(0, 64, (GLOBAL_BATCH, 8), generator=torch.Generator().manual_seed(step))
    n = GLOBAL_BATCH // dist.get_world_size()
    return x[dist.get_rank() * n : (dist.get_rank() + 1) * n]


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[float]:
    """One AdamW step per batch; the loss averaged over ranks, per step."""
    losses = []
    for step in steps:
        x = _batch(step)
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        opt.step()
        mean = loss.detach().reshape(1)
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    return losses


def _optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-2)


# ------------------------------------------------------------------ plans
def fsdp2(policy: str = "blocks", **apply: Any) -> Shard:
    def shard(model: nn.Module) -> tuple[nn.Module, Any]:
        order = trace_execution_order(model, TracingConfig())
        if policy == "blocks":
            plan = plan_wrap(model, order, ModuleWrapPolicy({Block}))
        else:  # the auto-planner, without compute times: communication and memory only
            plan = plan_wrap(
                model,
                order,
                ModuleWrapPolicy({Block}),
                bucket_numel="auto",
                cost_model=cost_model(world_size=max(dist.get_world_size(), 2)),
            )
        return model, apply_fully_shard(model, plan, **apply)

    return shard


def fsdp1(policy: str, *, use_orig_params: bool) -> Shard:
    from torch.distributed.fsdp import FullyShardedDataParallel

    def shard(model: nn.Module) -> tuple[nn.Module, Any]:
        if policy == "blocks":
            p = ParamExecOrderWrapPolicy(ModuleWrapPolicy({Block}), TracingConfig())
        else:
            # finer units: attention and MLP of each block (FSDP1 builds no bucketed
            # group that no called module holds exactly)
            p = ParamExecOrderWrapPolicy(
                ModuleWrapPolicy({CausalSelfAttention, MLP}), TracingConfig()
            )
        wrapped = FullyShardedDataParallel(
            model,
            auto_wrap_policy=p,
            use_orig_params=use_orig_params,
            device_id=torch.device("cpu"),
        )
        return wrapped, p.plan

    return shard


def _restart(a: Shard, b: Shard, folder: str, reference: list[float]) -> dict[str, Any]:
    """Losses of 3 steps under ``a`` + 3 under ``b`` after a checkpoint (and ``reference``:
    those of 6 steps under ``a``)."""
    model, plan_a = a(_model())
    opt = _optimizer(model)
    first = _train(model, opt, range(STEPS))
    save_checkpoint(folder, model, opt, plan=plan_a)
    model, plan_b = b(_model())
    opt = _optimizer(model)
    load_checkpoint(folder, model, opt, plan=plan_b)
    return {
        "reference": reference,
        "restarted": first + _train(model, opt, range(STEPS, 2 * STEPS)),
        "groups": (plan_a.groups, plan_b.groups),
    }


# ------------------------------------------------------------------ cases on 2 ranks
_FSDP2_BLOCKS = fsdp2()
_FSDP1_BLOCKS = fsdp1("blocks", use_orig_params=False)
PAIRS: dict[str, tuple[Shard, Shard]] = {
    "FSDP2 per-block -> auto": (_FSDP2_BLOCKS, fsdp2("auto")),
    "FSDP2 prefetch 1 -> 2, resharding -> none": (
        _FSDP2_BLOCKS,
        fsdp2(prefetch=2, reshard_after_forward=False),
    ),
    "FSDP1 per-block -> per-sublayer": (
        _FSDP1_BLOCKS,
        fsdp1("sublayers", use_orig_params=True),
    ),
    "FSDP1 -> FSDP2": (_FSDP1_BLOCKS, fsdp2("auto")),
}


def _pinned_restart(folder: str) -> dict[str, Any]:
    """Train under an auto plan, save with it, restart from the pinned plan."""
    model, plan = fsdp2("auto", prefetch="auto")(_model())
    opt = _optimizer(model)
    first = _train(model, opt, range(STEPS))
    save_checkpoint(folder, model, opt, plan=plan)
    restarted = _model()
    applied = restart_fully_shard(restarted, folder)
    opt = _optimizer(restarted)
    pinned = load_checkpoint(folder, restarted, opt, plan=applied)
    again = Path(folder) / "again.json"
    if dist.get_rank() == 0:
        save_plan(applied, again)
    dist.barrier()
    model, _ = fsdp2("auto", prefetch="auto")(_model())
    return {
        "same bytes": (Path(folder) / PLAN_FILE).read_bytes() == again.read_bytes(),
        "groups": applied.groups,
        "returned pinned": pinned is not None and pinned.groups == applied.groups,
        "reference": _train(model, _optimizer(model), range(2 * STEPS)),
        "restarted": first + _train(restarted, opt, range(STEPS, 2 * STEPS)),
    }


def _outcome(fn: Callable[[], Any]) -> tuple[str, str]:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - returned to the test
        return type(e).__name__, str(e)
    return "ok", ""


def _refusals(folder: str) -> dict[str, tuple[str, str]]:
    out = {}
    # wpe left out of the sharding: each rank trains its own copy
    model = _model()
    plan = plan_wrap(
        model, trace_execution_order(model, TracingConfig()), ModuleWrapPolicy({Block})
    )
    apply_fully_shard(model, plan, ignored_params={model.wpe})
    opt = _optimizer(model)
    _train(model, opt, range(1))
    out["unsharded replicas differ"] = _outcome(lambda: save_checkpoint(folder, model, opt))
    # a checkpoint of the 3-block model loaded into a 2-block one
    model, _ = fsdp2()(_model())
    opt = _optimizer(model)
    save_checkpoint(folder, model, opt)
    smaller, _ = fsdp2()(_model(n_blocks=2))
    out["another model"] = _outcome(lambda: load_checkpoint(folder, smaller, _optimizer(smaller)))
    wider, _ = fsdp2()(_model(max_seq_len=32))
    out["another shape"] = _outcome(lambda: load_checkpoint(folder, wider, _optimizer(wider)))
    return out


def _uninterrupted(a: Shard) -> list[float]:
    model, _ = a(_model())
    return _train(model, _optimizer(model), range(2 * STEPS))


def _worker(rank: int, world_size: int, root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    references: dict[int, list[float]] = {}  # per plan A (the pairs share two)
    for i, (name, (a, b)) in enumerate(PAIRS.items()):
        reference = references.setdefault(id(a), _uninterrupted(a))
        out[name] = _restart(a, b, f"{root}/pair{i}", reference)
    out["pinned"] = _pinned_restart(f"{root}/pinned")
    out["refusals"] = _refusals(f"{root}/refusals")
    out["saved on 2"] = _save_on(rank, world_size, f"{root}/{_WORLD_FOLDER}")
    return out


#: The folder (under the module's temp dir) of the checkpoint that 1 rank loads.
_WORLD_FOLDER = "world"


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ckpt")


@pytest.fixture(scope="module")
def two_ranks(ckpt_root: Path) -> list[dict[str, Any]]:
    """Every 2-rank case in one spawn (the checkpoint for 1 rank saved last)."""
    return run_ranks(_worker, world_size=2, args=(str(ckpt_root),))


@pytest.mark.parametrize("pair", list(PAIRS))
def test_training_goes_on_under_another_plan(two_ranks: list[dict[str, Any]], pair: str) -> None:
    for rank in two_ranks:
        got = rank[pair]
        assert got["groups"][0] != got["groups"][1] or "prefetch" in pair
        assert got["restarted"] == got["reference"]  # to the bit
    assert two_ranks[0][pair] == two_ranks[1][pair]


def test_restart_from_the_pinned_plan(two_ranks: list[dict[str, Any]]) -> None:
    r0, r1 = (rank["pinned"] for rank in two_ranks)
    assert r0["same bytes"] and r1["same bytes"]
    assert r0["groups"] == r1["groups"] == [[""], ["blocks.0", "blocks.1", "blocks.2"]]
    assert r0["returned pinned"] and r1["returned pinned"]
    assert r0["restarted"] == r0["reference"] == r1["restarted"]


def test_unsharded_tensors_that_differ_between_ranks_are_refused(
    two_ranks: list[dict[str, Any]],
) -> None:
    for rank in two_ranks:
        kind, message = rank["refusals"]["unsharded replicas differ"]
        assert kind == "ValueError"
        assert message.startswith(
            "save_checkpoint: 'model.wpe' is not sharded (a plain tensor, not a DTensor: "
            "FSDP2's ignored_params, or a module no FSDP unit manages) and its values differ "
            "between rank 0 and rank 1. DCP saves one copy of a tensor that is not sharded"
        )


def test_a_checkpoint_of_another_model_is_refused(two_ranks: list[dict[str, Any]]) -> None:
    for rank in two_ranks:
        kind, message = rank["refusals"]["another model"]
        assert kind == "ValueError"
        assert message.endswith(
            "holds 'blocks.2.ln1.weight', which the model does not have (DCP would skip it "
            "without a word); it was saved from another model. Load it into the model it was "
            "saved from"
        )
        kind, message = rank["refusals"]["another shape"]
        assert kind == "ValueError"
        assert message.startswith("load_checkpoint: 'wpe' has shape (16, 32) in the checkpoint at ")
        assert message.endswith("and (32, 32) in the model; it was saved from another model. "
                                "Load it into the model it was saved from")  # fmt: skip


# ------------------------------------------------------------------ another world size
def _save_on(rank: int, world_size: int, folder: str) -> list[float]:
    model, plan = fsdp2()(_model())
    opt = _optimizer(model)
    reference = _train(model, opt, range(STEPS))
    save_checkpoint(folder, model, opt, plan=plan)
    return reference + _train(model, opt, range(STEPS, 2 * STEPS))


def _load_on(rank: int, world_size: int, folder: str) -> list[float]:
    model, _ = fsdp2("auto")(_model())
    opt = _optimizer(model)
    load_checkpoint(folder, model, opt)
    return _train(model, opt, range(STEPS, 2 * STEPS))


def test_a_checkpoint_of_2_ranks_trains_on_on_1(
    two_ranks: list[dict[str, Any]], ckpt_root: Path
) -> None:
    folder = str(ckpt_root / _WORLD_FOLDER)  # saved by _save_on in the 2-rank spawn
    uninterrupted = two_ranks[0]["saved on 2"]
    restarted = run_ranks(_load_on, world_size=1, args=(folder,))[0]
    assert restarted == pytest.approx(uninterrupted[STEPS:], rel=RTOL)
    assert json.loads((ckpt_root / _WORLD_FOLDER / PLAN_FILE).read_text())["kind"] == (
        "execwrap-pinned-plan"
    )
    assert load_plan(folder).groups == [[""], ["blocks.0"], ["blocks.1"], ["blocks.2"]]
