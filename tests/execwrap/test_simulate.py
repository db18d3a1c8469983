"""Tests for execwrap.simulate: the FSDP2 step simulator on cases computed by hand.

The cost model is made by hand so that every op has a round duration: an
all-gather takes 1 s and a reduce-scatter 2 s whatever their size, copies run
at 64 bytes/s, and each collective a group issues costs 0.25 s of
bookkeeping. The model is two bias-free ``Linear(4, 4)`` layers: 64 bytes of
float32 each; with ``world_size=2`` a shard is 32 bytes (a copy-in of 0.5 s),
an unsharded layer 64 bytes (a copy-out or a reduce-scatter copy-in of 1 s).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch.nn as nn

from execwrap import ModuleWrapPolicy, WrapPlan, plan_wrap, prefetch_schedule
from execwrap.cost import CollectiveCurve, ComputeRates, CostModel, CurveSegment
from execwrap.demo_models import Block, build_demo_model, demo_inputs
from execwrap.simulate import (
    MemoryBreakdown,
    StepEstimate,
    UnitCompute,
    simulate_step,
    unit_compute,
)
from execwrap.simulate.schedule import prefetch_lists
from tracing import record_execution_order, trace_execution_order


def _flat(seconds: float) -> CollectiveCurve:
    return CollectiveCurve((CurveSegment(None, seconds, 0.0),))


def _cost(
    device: str = "cpu", *, overlap: float = 0.0, world_size: int = 2, backend: str = "test"
) -> CostModel:
    flat = _flat
    return CostModel(
        device_type=device,
        backend=backend,
        world_size=world_size,
        all_gather=flat(1.0),
        reduce_scatter=flat(2.0),
        copy_bytes_per_s=64.0,
        group_overhead_s=0.25,
        overlap=overlap,
        compute=ComputeRates(device, 1e12, 1e12),
        source="by hand",
    )


def _plans() -> tuple[WrapPlan, WrapPlan]:
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    order = trace_execution_order(model)
    one = plan_wrap(model, order, ModuleWrapPolicy(set()))
    two = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}))
    assert one.groups == [[""]] and two.groups == [[""], ["0"], ["1"]]
    return one, two


ONE = UnitCompute(forward_s=(6.0,), backward_s=(12.0,), activation_bytes=(200,), optimizer_s=0.0)
TWO = UnitCompute(
    forward_s=(0.0, 3.0, 3.0),
    backward_s=(0.0, 6.0, 6.0),
    activation_bytes=(0, 100, 100),
    optimizer_s=0.0,
)


def test_one_group_resharded_root_is_gathered_again() -> None:
    one, _ = _plans()
    est = simulate_step(one, _cost(), world_size=2, compute=ONE, reshard_after_forward=True)
    # reshard_after_forward=True passed to fully_shard(root) too: one more gather in backward
    assert est.step_time_s == pytest.approx(26.5 + 0.25 + 1 + 1 + 2)
    assert (est.all_gathers, est.reduce_scatters) == (2, 1)
    assert est.reshard_after_forward == (True,)


def test_one_group() -> None:
    one, _ = _plans()
    est = simulate_step(one, _cost(), world_size=2, compute=ONE)
    # forward: overhead .25 + copy-in 1 (64 B shard) + all-gather 1 + copy-out 2 (128 B) + compute 6
    # backward (the root is not resharded): compute 12 + overhead .25 + RS copy-in 2 + RS 2
    assert est.step_time_s == pytest.approx(26.5)
    assert est.phase_times_s() == pytest.approx(
        {"forward": 10.25, "backward": 16.25, "optimizer": 0.0}
    )
    assert est.compute_time_s == pytest.approx(18.0)
    assert est.overhead_time_s == pytest.approx(0.25 + 1 + 2 + 0.25 + 2)
    assert est.exposed_comm_s == pytest.approx(3.0)
    assert (est.all_gathers, est.reduce_scatters) == (1, 1)
    # peak in forward: shard 64 + AdamW state 128 + AG output 128 + unsharded 128 + activations 200
    assert est.peak_memory_bytes == 648
    assert est.peak_phase == "forward"
    assert est.memory == MemoryBreakdown(
        sharded_params=64,
        optimizer_state=128,
        unsharded_params=128,
        activations=200,
        all_gather_buffers=128,
    )
    assert est.memory.dominant == "activations"


def test_two_groups_prefetch_1_reshard() -> None:
    _, two = _plans()
    est = simulate_step(two, _cost(), world_size=2, prefetch=1, compute=TWO)
    # forward: AG(0) 1.75 (issued by the root's prefetch), copy-out 1, AG(1) 1.75 (prefetched
    # by 0), compute 3, copy-out 1, compute 3 = 11.5; backward: AG(1) again 1.75 (root's list),
    # copy-out 1, AG(0) 1.75 (prefetched by 1), compute 6, post-backward 3.25, copy-out 1,
    # compute 6, post-backward 3.25 = 24
    assert est.step_time_s == pytest.approx(35.5)
    assert (est.forward_end_s, est.backward_end_s) == pytest.approx((11.5, 35.5))
    assert est.compute_time_s == pytest.approx(18.0)
    assert est.overhead_time_s == pytest.approx(9.5)
    assert est.exposed_comm_s == pytest.approx(8.0)
    assert (est.all_gathers, est.reduce_scatters) == (4, 2)
    assert est.reshard_after_forward == (False, True, True)
    starts: dict[str, tuple[float, float]] = {}
    for e in est.timeline:  # the first span of each label
        starts.setdefault(e.label, (e.start_s, e.end_s))
    assert starts["all-gather 0"] == pytest.approx((0.75, 1.75))
    assert starts["reduce-scatter 1"] == pytest.approx((23.25, 25.25))
    # peak in backward of unit 1: unit 0 prefetched (AG output 64), unit 1 unsharded (64)
    # with its unsharded gradients (64), both units' activations (200)
    assert est.peak_memory_bytes == 584
    assert est.peak_phase == "backward"
    assert est.memory == MemoryBreakdown(
        sharded_params=64,
        optimizer_state=128,
        unsharded_params=64,
        unsharded_grads=64,
        activations=200,
        all_gather_buffers=64,
    )


def test_two_groups_no_reshard() -> None:
    _, two = _plans()
    est = simulate_step(
        two, _cost(), world_size=2, prefetch=1, reshard_after_forward=False, compute=TWO
    )
    # backward gathers nothing: 11.5 + (6 + 3.25) * 2
    assert est.step_time_s == pytest.approx(30.0)
    assert (est.forward_end_s, est.backward_end_s) == pytest.approx((11.5, 30.0))
    assert (est.all_gathers, est.reduce_scatters) == (2, 2)
    assert est.exposed_comm_s == pytest.approx(6.0)
    # peak at the end of forward: both units unsharded (128), unit 1's AG output kept (64)
    assert est.peak_memory_bytes == 584
    assert est.peak_phase == "forward"
    assert est.memory.unsharded_params == 128


def test_two_groups_wait_for_the_slowest_rank() -> None:
    """With ``sync_jitter`` each collective first waits ``0.5 * sqrt(c)`` for compute
    of ``c`` seconds on the compute stream since the collective before it."""
    _, two = _plans()
    cm = _cost().replace(sync_jitter=0.5)
    est = simulate_step(two, cm, world_size=2, prefetch=1, reshard_after_forward=False, compute=TWO)
    # before AG(0): overhead .25 + copy-in .5; before AG(1), prefetched by unit 0: copy-out 1
    # of unit 0 + .75; before RS(1): compute 3 + copy-out 1 + compute 3 + backward 6 +
    # overhead .25 + RS copy-in 1; before RS(0): backward 6 + overhead .25 + copy-in 1
    spans = (0.75, 1.75, 14.25, 7.25)
    waits = [e for e in est.timeline if e.label.startswith("wait for ranks")]
    assert [e.label for e in waits] == [
        "wait for ranks all-gather 0",
        "wait for ranks all-gather 1",
        "wait for ranks reduce-scatter 1",
        "wait for ranks reduce-scatter 0",
    ]
    assert [e.end_s - e.start_s for e in waits] == pytest.approx([0.5 * c**0.5 for c in spans])
    assert est.step_time_s == pytest.approx(30.0 + sum(0.5 * c**0.5 for c in spans))
    assert est.exposed_comm_s == pytest.approx(6.0 + sum(0.5 * c**0.5 for c in spans))
    # on CUDA the host runs ahead: no wait
    cuda = _cost("cuda").replace(sync_jitter=0.5)
    plain = simulate_step(two, _cost("cuda"), world_size=2, prefetch=1, compute=TWO)
    assert simulate_step(
        two, cuda, world_size=2, prefetch=1, compute=TWO
    ).step_time_s == pytest.approx(plain.step_time_s)


def test_prefetch_depth_does_not_change_cpu_time_but_memory() -> None:
    _, two = _plans()
    times = set()
    for prefetch in (0, 1, 2):
        est = simulate_step(two, _cost(), world_size=2, prefetch=prefetch, compute=TWO)
        times.add(round(est.step_time_s, 9))
    assert times == {35.5}  # gloo collectives block the training thread


def test_synchronous_reduce_scatter_holds_the_gradients_until_it_ends() -> None:
    # FSDP2's post_backward keeps the unsharded gradients in a list until foreach_reduce
    # returns: on CPU (gloo, synchronous) after the reduce-scatter, whose output it
    # allocates first; on CUDA right after it issues it (the copy-in done)
    _, two = _plans()
    no_acts = dataclasses.replace(TWO, activation_bytes=(0, 0, 0))
    cpu = simulate_step(two, _cost("cpu"), world_size=2, prefetch=1, compute=no_acts)
    cuda = simulate_step(two, _cost("cuda"), world_size=2, prefetch=1, compute=no_acts)
    # unit 0's post-backward on CPU, from 32.25 s: reshard (-64 unsharded) and recycle
    # unit 1's RS input (-64), RS copy-in (+64 input), RS (+32 output at its start), the
    # gradients (-64) at its end, then the root's final callback frees the RS input
    assert cpu.memory_timeline[-6:] == (
        (32.25, 352),
        (32.25, 288),
        (32.5, 352),
        (33.5, 384),
        (35.5, 320),
        (35.5, 256),
    )
    # on CUDA the gradients go at the copy-in's end and the output counts from the RS's end
    assert cuda.memory_timeline[-6:] == (
        (30.5, 352),
        (30.5, 288),
        (30.75, 352),
        (31.75, 288),
        (33.75, 320),
        (33.75, 256),
    )
    # both peak at 416 in backward: shard 64 + AdamW state 128, unit 1's sharded gradients
    # 32 and RS input 64, unit 0's AG output 64 and its unsharded parameters or gradients 64
    assert (cpu.peak_memory_bytes, cuda.peak_memory_bytes) == (416, 416)
    # in forward the kept AG output of unit 0 goes when unit 1's copy-out ends (the local
    # prev_all_gather_state of wait_for_unshard holds it): unit 0 resharded at 7.5 s (-64),
    # unit 1 unsharded (+64), then unit 0's AG output (-64)
    assert cpu.memory_timeline[4:7] == ((7.5, 320), (7.5, 384), (8.5, 320))
    assert cpu.step_time_s == pytest.approx(35.5)  # memory only: the times are unchanged


def test_optimizer_on_the_calibrated_curve_per_tensor() -> None:
    _, two = _plans()
    cm = _cost().replace(optimizer_curve=_flat(0.5), optimizer_param_overhead_s=0.125)
    compute = dataclasses.replace(TWO, optimizer_s=None)
    # two trainable tensors (32-byte shards): 2 * (0.5 on the AdamW curve + 0.125)
    adamw = simulate_step(two, cm, world_size=2, compute=compute)
    assert adamw.optimizer_time_s == pytest.approx(1.25)
    assert adamw.step_time_s == pytest.approx(35.5 + 1.25)
    assert adamw.phase_times_s()["optimizer"] == pytest.approx(1.25)
    # SGD makes 3 of AdamW's 7 passes
    sgd = simulate_step(two, cm, world_size=2, compute=compute, optimizer="sgd")
    assert sgd.optimizer_time_s == pytest.approx(2 * (3 / 7 * 0.5 + 0.125))
    none = simulate_step(two, cm, world_size=2, compute=compute, optimizer="none")
    assert none.optimizer_time_s == 0.0


def test_copy_out_is_priced_per_parameter() -> None:
    one, _ = _plans()
    cm = _cost().replace(copy_curve=_flat(0.5))  # every copy 0.5 s, whatever its size
    est = simulate_step(one, cm, world_size=2, compute=ONE)
    # forward: overhead .25 + copy-in .5 + all-gather 1 + copy-out of 2 parameters 2 * .5
    # + compute 6; backward: compute 12 + overhead .25 + RS copy-in (one buffer) .5 + RS 2
    assert est.step_time_s == pytest.approx(23.5)
    copy_out = next(e for e in est.timeline if e.label == "copy-out <root>")
    assert copy_out.end_s - copy_out.start_s == pytest.approx(1.0)


def test_cuda_overlap_hides_all_gathers() -> None:
    _, two = _plans()
    hidden = simulate_step(two, _cost("cuda", overlap=1.0), world_size=2, prefetch=1, compute=TWO)
    exposed = simulate_step(two, _cost("cuda", overlap=0.0), world_size=2, prefetch=1, compute=TWO)
    assert hidden.step_time_s == pytest.approx(28.75)
    assert exposed.step_time_s > hidden.step_time_s
    lanes = {e.stream for e in hidden.timeline}
    assert lanes == {"compute", "all_gather", "reduce_scatter"}
    # the forward all-gather of unit 1 runs beside unit 0's compute
    ag1 = next(e for e in hidden.timeline if e.label == "all-gather 1")
    fwd0 = next(e for e in hidden.timeline if e.label == "forward 0")
    assert ag1.start_s < fwd0.start_s + 0.5 and ag1.end_s <= fwd0.end_s


def test_estimate_round_trips_as_dict() -> None:
    _, two = _plans()
    est = simulate_step(two, _cost(), world_size=2, compute=TWO)
    data = est.to_dict()
    assert data["memory"]["total"] == est.peak_memory_bytes
    assert StepEstimate.from_dict(data) == est


def test_refusals() -> None:
    _, two = _plans()
    with pytest.raises(
        ValueError, match=r"does not fit world size 8 \(this cost model is for 2 ranks\)"
    ):
        simulate_step(two, _cost(), world_size=8, compute=TWO)
    with pytest.raises(
        ValueError,
        match=r"compute times are for device type 'cuda' but the cost model is for 'cpu'",
    ):
        simulate_step(
            two,
            _cost(),
            world_size=2,
            compute=UnitCompute((0.0,) * 3, (0.0,) * 3, (0,) * 3, device_type="cuda"),
        )
    with pytest.raises(ValueError, match=r"optimizer must be one of .*got 'lion'"):
        simulate_step(two, _cost(), world_size=2, compute=TWO, optimizer="lion")
    with pytest.raises(
        ValueError,
        match=r"reshard_after_forward must be None, a bool or one bool per plan unit \(3\)",
    ):
        simulate_step(two, _cost(), world_size=2, compute=TWO, reshard_after_forward=[True])
    with pytest.raises(ValueError, match=r"compute has 1 units, the plan has 3"):
        simulate_step(two, _cost(), world_size=2, compute=ONE)
    with pytest.raises(ValueError, match=r"the plan's order has no compute times: capture it with"):
        simulate_step(two, _cost(), world_size=2)
    with pytest.raises(ValueError, match=r"simulate_step: prefetch must be an int >= 0"):
        simulate_step(two, _cost(), world_size=2, compute=TWO, prefetch=-1)


def test_merge_sums_atomic_units() -> None:
    c = UnitCompute((1.0, 2.0, 3.0), (2.0, 4.0, 6.0), (0, 10, 20), forward_tail_s=(0.5, 0.0, 0.0))
    merged = c.merge([[0], [1, 2]])
    assert merged == UnitCompute((1.0, 5.0), (2.0, 10.0), (0, 30), forward_tail_s=(0.5, 0.0))
    with pytest.raises(ValueError, match="index 2 out of range or repeated"):
        c.merge([[0, 2], [2]])
    with pytest.raises(ValueError, match=r"forward_tail_s\[0\] = 2.0 exceeds forward_s 1.0"):
        UnitCompute((1.0,), (1.0,), (0,), forward_tail_s=(2.0,))


@pytest.mark.parametrize("bucket", [None, 60_000])
@pytest.mark.parametrize("prefetch", [1, 2])
def test_prefetch_lists_match_apply_fully_shard(bucket: int | None, prefetch: int) -> None:
    model = build_demo_model(n_blocks=4)
    order = record_execution_order(model, demo_inputs(model))
    plan = plan_wrap(model, order, ModuleWrapPolicy({Block}), bucket_numel=bucket)
    units = [(u.module_fqns, u.param_fqns) for u in plan.units]
    mine = prefetch_lists(units, order, prefetch)
    theirs = prefetch_schedule(
        plan.groups, order, param_fqns=[u.param_fqns for u in plan.units], prefetch=prefetch
    )
    assert mine == theirs


def test_simulate_a_timed_order_end_to_end() -> None:
    model = build_demo_model(n_blocks=2)
    order = record_execution_order(model, demo_inputs(model), timing=True)
    plan = plan_wrap(model, order, ModuleWrapPolicy({Block}))
    compute = unit_compute(plan)
    est = simulate_step(
        plan, _cost(), world_size=2, compute=dataclasses.replace(compute, optimizer_s=0.5)
    )
    assert est.compute_time_s == pytest.approx(
        sum(compute.forward_s) + sum(compute.backward_s) + 0.5
    )
    # 3 groups with parameters: the root gathered once, each block twice; one RS per group
    assert (est.all_gathers, est.reduce_scatters) == (5, 3)
    assert est.step_time_s == pytest.approx(
        est.compute_time_s + est.overhead_time_s + est.exposed_comm_s
    )
    assert est.exposed_comm_s == pytest.approx(5 * 1.0 + 3 * 2.0)  # CPU: nothing overlaps
    # the root's forward tail (final norm, head, loss) saves its activations last and
    # frees them in the first part of the backward, before the peak (gradients held)
    assert compute.activation_tail_bytes[plan.root_index] > 0
    assert est.memory.activations == sum(compute.activation_bytes) - sum(
        compute.activation_tail_bytes
    )
    assert est.peak_phase in ("forward", "backward")
