"""HSDP on 4 gloo ranks as a 2x2 (replicate, shard) mesh: applied, read back, predicted.

One spawn of 4 ranks (slow on 2 cores: tiny model, two steps each) checks, with
the same plan (``plan_wrap(..., mesh=(2, 2))``, one group per block):

* ``apply_fully_shard(model, plan)`` builds the plan's mesh itself and trains with
  the losses of FSDP2's own HSDP set up by hand (``fully_shard(mesh=2x2)`` per block,
  then the root) and of the unsharded model on the whole batch; the mesh read back
  from every group (:func:`execwrap.fsdp.mesh.applied_mesh`) is the plan's, and the
  drift monitor sees no drift on the HSDP model;
* FSDP1 with ``HYBRID_SHARD`` over the same 2-D mesh, through
  ``ParamExecOrderWrapPolicy(mesh=(2, 2))``: the same losses, the mesh read back; the
  FSDP groups of both (:func:`execwrap.integrations.fsdp_groups`) are the plan's;
* the simulator's peak memory within 10% of ``FSDPMemTracker``'s (AdamW, its state
  made by a first step) for the HSDP plan and for the flat plan over all 4 ranks, and
  as many all-reduces as FSDP2 issues (one per group).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tests._dist import run_ranks

_STEPS = 2


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randint(0, 512, (1, 32), generator=g), torch.randint(0, 512, (1, 32), generator=g)


def _train(model: Any, idx: torch.Tensor, tgt: torch.Tensor) -> list[float]:
    """Losses of ``_STEPS`` SGD steps, averaged over the ranks (what the reference sees)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(_STEPS):
        loss = F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / dist.get_world_size())
    return losses


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy, fully_shard

    from execwrap import (
        CostModel,
        ModuleWrapPolicy,
        OrderMonitor,
        ParamExecOrderWrapPolicy,
        apply_fully_shard,
        plan_wrap,
        simulate_step,
    )
    from execwrap.demo_models import GPT, Block, GPTConfig
    from execwrap.fsdp.mesh import applied_mesh
    from execwrap.integrations import fsdp_groups
    from tracing import record_execution_order
    from tracing.rates import ComputeRates

    cfg = GPTConfig(vocab_size=512, max_seq_len=32, dim=64, n_heads=4, n_blocks=3)

    def build() -> GPT:
        torch.manual_seed(0)
        return GPT(cfg)

    idx, tgt = _batch(rank)
    out: dict[str, Any] = {}

    # the unsharded reference: every rank's batch, one model, the mean loss
    ref = build()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    batches = [_batch(r) for r in range(world_size)]
    out["reference"] = []
    for _ in range(_STEPS):
        losses = [F.cross_entropy(ref(i).flatten(0, 1), t.flatten()) for i, t in batches]
        loss = torch.stack(losses).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        out["reference"].append(float(loss.detach()))

    def loss_fn(o: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(o.flatten(0, 1), tgt.flatten())

    order = record_execution_order(build(), idx, loss_fn=loss_fn, timing=True)
    policy = ModuleWrapPolicy({Block})
    plan = plan_wrap(build(), order, policy, mesh=(2, 2))
    flat = plan_wrap(build(), order, policy)

    # FSDP2's HSDP by hand
    model = build()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    out["by hand"] = _train(model, idx, tgt)

    # apply_fully_shard builds the plan's mesh
    model = build()
    applied = apply_fully_shard(model, plan, prefetch=1)
    out["read back"] = [applied_mesh(model.get_submodule(g[0])) for g in applied.groups]
    out["groups"] = (sorted(fsdp_groups(model)), sorted(plan.groups))
    with OrderMonitor(model, order) as monitor:
        out["apply"] = _train(model, idx, tgt)
    out["drift"] = len(monitor.events)

    # FSDP1 hybrid sharding through the policy
    model = build()
    fsdp1_policy = ParamExecOrderWrapPolicy(policy, order=order, mesh=(2, 2))
    wrapped = FSDP(
        model,
        auto_wrap_policy=fsdp1_policy,
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        device_mesh=mesh,
        use_orig_params=True,
        device_id=torch.device("cpu"),
    )
    out["fsdp1 read back"] = applied_mesh(wrapped)
    out["fsdp1 groups"] = sorted(fsdp_groups(wrapped))
    out["fsdp1"] = _train(wrapped, idx, tgt)

    # each mesh dimension's group measured (what CostModel.calibrate(mesh=...) adds)
    from execwrap.cost.mesh_sweep import measure_mesh_groups

    # the smallest sweep (4 and 16 KiB): every run flushes the CPU caches first (a write of
    # twice the last-level cache: 600 MiB per run per rank where a VM reports a 300 MiB L3),
    # so each size costs seconds on 4 ranks of 2 cores; only the groups' shapes are checked
    groups = measure_mesh_groups(mesh, torch.device("cpu"), 4096)
    out["measured"] = [
        (g.dim, g.size, g.stride, g.all_gather is not None, g.all_reduce is not None)
        for g in groups
    ]
    flat_cm = CostModel.preset("h100-nvlink-8", world_size=4).replace(
        device_type="cpu", compute=ComputeRates("cpu", 1e11, 1e10), topology=None
    )
    hsdp_cm = flat_cm.replace(mesh_groups=groups).for_mesh((2, 2))
    out["priced"] = (hsdp_cm.all_reduce == groups[1].all_reduce, hsdp_cm.world_size)
    tp_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    try:
        apply_fully_shard(build(), plan, mesh=tp_mesh)
    except ValueError as e:
        out["tp error"] = str(e)

    # predicted peak memory against the tracker, HSDP and flat
    cm = CostModel.preset("h100-nvlink-8", world_size=4).replace(
        device_type="cpu", compute=ComputeRates("cpu", 1e11, 1e10)
    )
    all_reduces = {"n": 0}
    orig = dist.all_reduce

    def counted(*a: Any, **k: Any) -> Any:
        all_reduces["n"] += 1
        return orig(*a, **k)

    for name, p, m in (("hsdp", plan, None), ("flat", flat, init_device_mesh("cpu", (4,)))):
        est = simulate_step(p, cm, world_size=world_size)
        model = build()
        apply_fully_shard(model, p, mesh=m)
        opt = torch.optim.AdamW(model.parameters())
        loss_fn(model(idx)).backward()  # the optimizer state exists before the tracked step
        opt.step()
        opt.zero_grad()
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs((idx,))
        dist.all_reduce = counted  # type: ignore[assignment]
        all_reduces["n"] = 0
        try:
            with tracker:
                loss_fn(model(idx)).backward()
                opt.step()
                opt.zero_grad()
        finally:
            dist.all_reduce = orig
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
        out[name] = (est.peak_memory_bytes / peak, est.all_reduces, all_reduces["n"], est.mesh)
    return out


def test_hsdp_trains_like_fsdp2_and_fsdp1_and_is_predicted() -> None:
    from execwrap.util.mesh import MeshShape

    results = run_ranks(_worker, world_size=4, timeout_s=240)
    r = results[0]
    ref = r["reference"]
    for key in ("by hand", "apply", "fsdp1"):
        assert [round(x, 4) for x in r[key]] == [round(x, 4) for x in ref], key
    assert r["read back"] == [MeshShape(2, 2)] * 4
    assert r["fsdp1 read back"] == MeshShape(2, 2)
    fsdp2_groups, planned = r["groups"]
    assert (
        fsdp2_groups
        == r["fsdp1 groups"]
        == planned
        == [[""], ["blocks.0"], ["blocks.1"], ["blocks.2"]]
    )
    assert r["drift"] == 0
    assert r["measured"] == [("shard", 2, 1, True, False), ("replicate", 2, 2, False, True)]
    assert r["priced"] == (True, 2)
    assert r["tp error"] == (
        "apply_fully_shard: the mesh (2, 2) ('dp', 'tp') has a tensor-parallel dimension "
        "('tp', 2 ranks) but no parameter of GPT is a DTensor: apply the tensor-parallel plan "
        "first (torch.distributed.tensor.parallel.parallelize_module(model, mesh['tp'], plan)), "
        "or pass FSDP's part of the mesh alone (mesh['dp']) to shard without tensor parallelism"
    )
    ratio, simulated, real, mesh = r["hsdp"]
    assert 0.9 <= ratio <= 1.1 and mesh == MeshShape(2, 2)
    assert simulated == real == 4  # one per group: the root and three blocks
    flat_ratio, flat_ar, _, flat_mesh = r["flat"]
    assert 0.9 <= flat_ratio <= 1.1 and flat_ar == 0 and flat_mesh is None
