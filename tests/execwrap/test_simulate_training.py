"""Tests for the training step in execwrap.simulate: precision, activation checkpointing,
CPU offload, micro-batches and the allocator pools, on cases computed by hand.

As in ``test_simulate.py``: an all-gather takes 1 s and a reduce-scatter 2 s
whatever their size, copies run at 64 bytes/s, each collective a group issues
costs 0.25 s; two bias-free ``Linear(4, 4)`` units of 64 float32 bytes on 2
ranks (a 32-byte shard) under an empty root. Each unit computes 3 s forward
and 6 s backward and saves 100 bytes; full checkpointing keeps 10 of them,
selective 40 (its kept ops took 1 s); its forward has 7 bytes of transient
memory, its backward 11.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

from execwrap import ModuleWrapPolicy, WrapPlan, plan_wrap
from execwrap.cost import CollectiveCurve, ComputeRates, CostModel, CurveSegment
from execwrap.cost.host_link import HostLink
from execwrap.simulate import Precision, TrainingStep, UnitCompute, simulate_step, unit_compute
from tracing import record_execution_order, trace_execution_order


def _flat(seconds: float) -> CollectiveCurve:
    return CollectiveCurve((CurveSegment(None, seconds, 0.0),))


def _cost(device: str = "cpu", overlap: float = 0.0) -> CostModel:
    return CostModel(
        device_type=device,
        backend="test",
        world_size=2,
        all_gather=_flat(1.0),
        reduce_scatter=_flat(2.0),
        copy_bytes_per_s=64.0,
        group_overhead_s=0.25,
        overlap=overlap,
        compute=ComputeRates(device, 1e12, 1e12),
        source="by hand",
    )


def _plan() -> WrapPlan:
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    return plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({nn.Linear}))


TWO = UnitCompute(
    (0.0, 3.0, 3.0),
    (0.0, 6.0, 6.0),
    (0, 100, 100),
    optimizer_s=0.0,
    checkpoint_bytes=(0, 10, 10),
    selective_bytes=(0, 40, 40),
    selective_saved_s=(0.0, 1.0, 1.0),
    forward_transient_bytes=(0, 7, 7),
    backward_transient_bytes=(0, 11, 11),
)


def _parts(est: object) -> dict[str, int]:
    return {k: v for k, v in est.memory.to_dict().items() if v}  # type: ignore[attr-defined]


def test_defaults_change_nothing() -> None:
    plan = _plan()
    plain = simulate_step(plan, _cost(), world_size=2, compute=TWO)
    assert simulate_step(plan, _cost(), world_size=2, compute=TWO, training=TrainingStep()) == plain
    assert (plain.step_time_s, plain.peak_memory_bytes, plain.micro_batches) == (35.5, 595, 1)
    # the backward's 11 transient bytes on top of what the step held before
    assert _parts(plain)["temporaries"] == 11
    assert plain.reserved_memory_bytes == plain.peak_memory_bytes  # CPU: no CUDA pools


def test_bf16_parameters_halve_the_gathers_and_the_casts_are_priced() -> None:
    plan = _plan()
    plain = simulate_step(plan, _cost(), world_size=2, compute=TWO)
    bf16 = simulate_step(
        plan, _cost(), world_size=2, compute=TWO, precision=Precision("bfloat16", "float32")
    )
    # per all-gather (4): copy-in reads 16 fp32 + writes 8 bf16 elements (24 bytes as a copy:
    # 0.375 s, was 0.5), copy-out 32 bytes (0.5 s, was 1); per reduce-scatter (2): the copy-in
    # reads 32 bf16 and writes 64 fp32 bytes (0.75 s, was 1)
    assert plain.step_time_s - bf16.step_time_s == pytest.approx(4 * (0.125 + 0.5) + 2 * 0.25)
    assert _parts(bf16) == {
        "sharded_params": 64,  # float32 shards stay
        "optimizer_state": 128,
        "unsharded_params": 32,
        "unsharded_grads": 32,
        "activations": 200,
        "all_gather_buffers": 32,
        "temporaries": 11,
        "total": 499,
    }


def test_checkpointing_keeps_less_and_runs_the_forward_again() -> None:
    plan = _plan()
    full = simulate_step(plan, _cost(), world_size=2, compute=TWO, checkpointing="full")
    selective = simulate_step(plan, _cost(), world_size=2, compute=TWO, checkpointing="selective")
    assert full.step_time_s == 35.5 + 2 * 3.0  # each unit's forward again
    assert selective.step_time_s == 35.5 + 2 * (3.0 - 1.0)  # all but the kept ops
    # unit 1's backward: both units' kept bytes, and what unit 1 made again
    assert _parts(selective)["activations"] == 40 + 40 + 60
    assert _parts(full)["activations"] == 10 + 90  # at unit 0's backward, unit 1 done
    assert full.peak_memory_bytes == 527 and selective.peak_memory_bytes == 535
    recompute = [e for e in full.timeline if e.label.startswith("recompute")]
    assert [(e.label, e.end_s - e.start_s) for e in recompute] == [
        ("recompute 1", 3.0),
        ("recompute 0", 3.0),
    ]


def test_checkpointing_pays_its_host_work_per_region_and_per_op() -> None:
    """Each unit is one region of 10 ops: full checkpointing adds 0.1 s per op + 0.5 s
    per region to its forward and 0.2 s + 1 s to its recomputation; selective 0.3 + 2
    and 0.4 + 3 s."""
    from execwrap.cost import CheckpointOpCost

    plan = _plan()
    cm = _cost().replace(
        checkpoint_overhead=CheckpointOpCost(0.1, 0.5, 0.2, 1.0, 0.3, 2.0, 0.4, 3.0)
    )
    c = dataclasses.replace(TWO, checkpoint_ops=(0, 10, 10), checkpoint_regions=(0, 1, 1))
    full = simulate_step(plan, cm, world_size=2, compute=c, checkpointing="full")
    selective = simulate_step(plan, cm, world_size=2, compute=c, checkpointing="selective")
    plain = simulate_step(plan, cm, world_size=2, compute=c)
    assert plain.step_time_s == 35.5  # nothing checkpointed: nothing added
    assert full.step_time_s == pytest.approx(35.5 + 2 * (3.0 + (1.0 + 0.5) + (2.0 + 1.0)))
    assert selective.step_time_s == pytest.approx(35.5 + 2 * (2.0 + (3.0 + 2.0) + (4.0 + 3.0)))
    forward = [e for e in full.timeline if e.label == "forward 1"]
    assert [e.end_s - e.start_s for e in forward] == [pytest.approx(3.0 + 1.5)]
    recompute = [e for e in selective.timeline if e.label.startswith("recompute")]
    assert [e.end_s - e.start_s for e in recompute] == [pytest.approx(2.0 + 7.0)] * 2


def test_checkpointing_needs_what_the_capture_keeps() -> None:
    bare = UnitCompute((0.0, 3.0, 3.0), (0.0, 6.0, 6.0), (0, 100, 100), optimizer_s=0.0)
    with pytest.raises(
        ValueError,
        match=r"unit '0' is checkpointed \('full'\) but the compute does not say what that "
        r"keeps: capture the order on the target's rates",
    ):
        simulate_step(_plan(), _cost(), world_size=2, compute=bare, checkpointing="full")


def test_micro_batches_run_forward_and_backward_each_and_the_optimizer_once() -> None:
    plan = _plan()
    compute = dataclasses.replace(TWO, optimizer_s=1.0)
    one = simulate_step(plan, _cost(), world_size=2, compute=compute)
    two = simulate_step(plan, _cost(), world_size=2, compute=compute, micro_batches=2)
    assert two.step_time_s == 2 * (one.step_time_s - 1.0) + 1.0
    assert (two.all_gathers, two.reduce_scatters, two.micro_batches) == (8, 4, 2)
    assert two.peak_memory_bytes == one.peak_memory_bytes + 64  # the first one's sharded grads


def test_syncing_the_last_keeps_unsharded_gradients_until_then() -> None:
    plan = _plan()
    sync = simulate_step(plan, _cost(), world_size=2, compute=TWO, micro_batches=2)
    step = TrainingStep(micro_batches=2, gradient_sync="last")
    no_sync = simulate_step(plan, _cost(), world_size=2, compute=TWO, training=step)
    # the first micro-batch skips each unit's copy-in (1 s), reduce-scatter (2 s), overhead
    assert sync.step_time_s - no_sync.step_time_s == 2 * (1.0 + 2.0 + 0.25)
    assert (no_sync.all_gathers, no_sync.reduce_scatters) == (8, 2)
    assert _parts(no_sync)["unsharded_grads"] == 2 * 64 + 64  # both accumulated + the current
    kept = dataclasses.replace(step, reshard_after_backward=False)
    keep = simulate_step(plan, _cost(), world_size=2, compute=TWO, training=kept)
    # the second forward finds both units unsharded: two all-gathers fewer (2.75 s each)
    assert keep.all_gathers == 6
    assert no_sync.step_time_s - keep.step_time_s == 2 * (0.5 + 1.0 + 0.25 + 1.0)


def test_cuda_reserves_each_streams_peak() -> None:
    est = simulate_step(_plan(), _cost("cuda", overlap=1.0), world_size=2, compute=TWO)
    assert est.peak_memory_bytes == 595
    assert est.reserved_memory_bytes == 787  # + the all-gather and reduce-scatter pools' peaks
    assert StepEstimateRoundTrip.of(est)


class StepEstimateRoundTrip:
    @staticmethod
    def of(est: object) -> bool:
        from execwrap.simulate import StepEstimate

        return StepEstimate.from_dict(est.to_dict()) == est  # type: ignore[attr-defined]


def test_cpu_offload_moves_the_shards_and_the_optimizer_to_the_host() -> None:
    plan = _plan()
    gpu = _cost("cuda", overlap=1.0).replace(host=HostLink(16.0, 8.0, 7.0))
    adamw = dataclasses.replace(TWO, optimizer_s=None)
    on_device = simulate_step(plan, gpu, world_size=2, compute=adamw)
    offloaded = simulate_step(plan, gpu, world_size=2, compute=adamw, offload="cpu")
    assert on_device.peak_memory_bytes - offloaded.peak_memory_bytes == 64 + 128
    assert "sharded_params" not in _parts(offloaded)
    # AdamW on the host: 7 passes over 2 shards of 32 bytes at 7 bytes/s
    assert offloaded.optimizer_time_s == pytest.approx(64.0)
    copies = {e.label for e in offloaded.timeline if "host" in e.label}
    assert copies == {
        "host-to-device 0",
        "host-to-device 1",
        "device-to-host 0",
        "device-to-host 1",
    }


def test_cpu_offload_is_refused_where_it_cannot_be_priced() -> None:
    with pytest.raises(
        ValueError,
        match=r"offload='cpu' moves shards, gradients and optimizer state from device memory "
        r"to host memory, but the cost model is for CPU devices, whose memory is host memory "
        r"already: there is nothing to offload; use offload='none'",
    ):
        simulate_step(_plan(), _cost(), world_size=2, compute=TWO, offload="cpu")
    with pytest.raises(ValueError, match=r"offload='cpu' needs the host link's rates"):
        simulate_step(_plan(), _cost("cuda"), world_size=2, compute=TWO, offload="cpu")


def test_the_step_must_compute_in_the_captured_dtype() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=False))
    x = torch.empty(2, 8, device="meta")
    cm = CostModel.preset("h100-nvlink-8", world_size=2)
    order = record_execution_order(model, x, timing=cm.compute, param_dtype=torch.bfloat16)
    plan = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}))
    with pytest.raises(
        ValueError,
        match=r"the step computes in float32 but the plan's order was captured in bfloat16",
    ):
        simulate_step(plan, cm, world_size=2)
    with pytest.raises(ValueError, match=r"under torch\.autocast \(bfloat16\) the activations"):
        simulate_step(plan, cm, world_size=2, precision=Precision(autocast_dtype="bfloat16"))
    est = simulate_step(plan, cm, world_size=2, precision=Precision("bfloat16"))
    assert unit_compute(plan).activation_bytes == (0, 32, 32)  # each input: 2 x 8 bfloat16
    assert est.all_gathers == 4
