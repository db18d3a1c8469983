"""HSDP and 2-D meshes without processes: topology pricing, the simulated collective
sequence, the shard-size choice, tensor-parallel sizes and bad input, by hand.

The hand-made cost model of the sequence tests prices, for a 2x2 (replicate,
shard) mesh of 4 ranks, an all-gather over the shard group at 1 s, a
reduce-scatter at 2 s, an all-reduce over the replicate group at 1 s per 16
bytes, copies at 64 bytes/s and 0.25 s of bookkeeping per collective: the
durations in the timeline then say which collective ran and on how many bytes.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn

from execwrap import CostModel, ModuleWrapPolicy, WrapPlan, plan_wrap
from execwrap.cost import CollectiveCurve, ComputeRates, CurveSegment
from execwrap.cost.device_memory import default_memory_budget
from execwrap.cost.mesh import GroupCurves
from execwrap.cost.topology import Topology
from execwrap.demo_models import Block, Llama, LlamaBlock, LlamaConfig
from execwrap.plan.search_record import MeshCandidate
from execwrap.planning.tensor_parallel import local_order
from execwrap.simulate import UnitCompute, simulate_step
from execwrap.util.mesh import MeshShape
from tracing import record_execution_order, trace_execution_order

#: comm_analysis's NIC efficiency on 2 nodes, and on 16.
_EFF2 = 0.77 + 0.23 / 7
_EFF16 = 1.0


def _line(latency: float, per_byte: float = 0.0) -> CollectiveCurve:
    return CollectiveCurve((CurveSegment(None, latency, per_byte),))


def _cost(groups: tuple[GroupCurves, ...] = ()) -> CostModel:
    return CostModel(
        device_type="cpu",
        backend="gloo",
        world_size=4,
        all_gather=_line(1.0),
        reduce_scatter=_line(2.0),
        copy_bytes_per_s=64.0,
        group_overhead_s=0.25,
        overlap=0.0,
        compute=ComputeRates("cpu", 1e12, 1e12),
        source="by hand",
        mesh_groups=groups,
    )


_GROUPS = (
    GroupCurves("shard", 2, 1, _line(1.0), _line(2.0)),
    GroupCurves("replicate", 2, 2, all_reduce=_line(0.0, 1 / 16)),
)


def _plans() -> tuple[WrapPlan, WrapPlan]:
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4, bias=False))
    order = trace_execution_order(model)
    return (
        plan_wrap(model, order, ModuleWrapPolicy(set())),
        plan_wrap(model, order, ModuleWrapPolicy({nn.Linear})),
    )


def _comms(est: object) -> list[tuple[str, str, float, float]]:
    return [
        (e.stream, e.label, e.start_s, e.end_s)
        for e in est.timeline  # type: ignore[attr-defined]
        if e.stream != "compute"
    ]


# ------------------------------------------------------------------ topology
def test_a_group_is_priced_by_the_links_it_spans() -> None:
    """2 nodes of 8 H100: 16 ranks cross the network (Simple ring over NDR at the NIC
    efficiency of 2 nodes), the node's 8 use NVLink (Simple ring at 370 GB/s), the
    replicate pair (ranks 0 and 8) is 2 nodes of one rank each (ring all-reduce)."""
    cm = CostModel.preset("h100-ib-400g", world_size=16)
    gib = 2**30
    # ring Simple: 8.4 us + 14 NVLink hops x max(3.4, 3) us + 1 network hop x 14 us = 70 us
    assert cm.all_gather_time(gib) == pytest.approx(70e-6 + gib * 15 / (16 * 50e9 * _EFF2))
    hsdp = cm.for_mesh((2, 8))
    assert (hsdp.world_size, hsdp.mesh, hsdp.all_reduce_own_link) == (8, MeshShape(2, 8), True)
    # ring Simple in a node: 8.4 us + 7 hops x 3.4 us = 32.2 us
    assert hsdp.all_gather_time(gib) == pytest.approx(32.2e-6 + gib * 7 / (8 * 370e9))
    assert hsdp.reduce_scatter_time(gib) == hsdp.all_gather_time(gib)
    # ring Simple all-reduce over 2 nodes: 8.4 us + 2 network hops x 14 us = 36.4 us
    assert hsdp.all_reduce_time(gib) == pytest.approx(36.4e-6 + gib / (50e9 * _EFF2))
    assert cm.all_gather_time(gib) / hsdp.all_gather_time(gib) == pytest.approx(9.78, abs=0.01)
    # HSDP's replicate group on 16 nodes: 16 ranks 8 apart, one per node
    topo = CostModel.preset("h100-ib-400g", world_size=128).topology
    assert topo is not None and topo.span(16, 8) == (16, 1) and topo.span(16, 1) == (2, 8)
    ar16 = topo.curve("all_reduce", 16, 8).time(gib)
    assert ar16 == pytest.approx(8.4e-6 + 30 * 14e-6 + gib * 30 / (16 * 50e9 * _EFF16))
    # the flat preset is its topology's group of every rank
    assert cm.all_gather == cm.topology.curve("all_gather", 16)  # type: ignore[union-attr]
    assert cm.for_mesh((1, 16)) is cm


def test_topology_refusals() -> None:
    one_node = CostModel.preset("h100-nvlink-8").topology
    assert one_node is not None and one_node.inter_node_bytes_per_s is None
    with pytest.raises(ValueError) as info:
        one_node.curve("all_gather", 16)
    assert str(info.value) == (
        "Topology.curve: a group of 16 ranks 1 apart spans 2 nodes of 8, but this topology "
        "has no inter-node network (one node): use a preset for several nodes (e.g. "
        "'h100-ib-400g')"
    )
    with pytest.raises(ValueError, match=r"family must be one of \['ampere', 'hopper'"):
        Topology(8, "volta", 1e9)


# ---------------------------------------------------------- collective sequence
def test_hsdp_step_of_one_group() -> None:
    """The root alone (2 x 64 B, a shard of 64 B over 2 ranks): all-gather and
    reduce-scatter over the shard group, then the all-reduce of its 64 B gradient
    shard over the replicate group (4 s at 16 B/s), after the reduce-scatter."""
    one, _ = _plans()
    compute = UnitCompute(forward_s=(6.0,), backward_s=(12.0,), activation_bytes=(200,))
    est = simulate_step(one, _cost(_GROUPS), world_size=4, mesh=(2, 2), compute=compute)
    assert _comms(est) == [
        ("all_gather", "all-gather <root>", 1.25, 2.25),
        ("reduce_scatter", "reduce-scatter <root>", 24.5, 26.5),
        ("all_reduce", "all-reduce <root>", 26.5, 30.5),
    ]
    assert est.step_time_s == pytest.approx(30.5)  # the flat 2-rank step (26.5) + 4 s
    assert (est.all_gathers, est.reduce_scatters, est.all_reduces) == (1, 1, 1)
    assert (est.world_size, est.mesh) == (4, MeshShape(2, 2))
    # memory from the shard group: 64 B shard, 128 B of AdamW state, as over 2 ranks
    assert (est.memory.sharded_params, est.memory.optimizer_state) == (64, 128)


def test_hsdp_step_of_two_groups() -> None:
    """Two Linear groups of 64 B: each reduce-scatter over the shard group is followed
    by the all-reduce of its 32 B shard (2 s) over the replicate group."""
    _, two = _plans()
    compute = UnitCompute(
        forward_s=(0.0, 3.0, 3.0), backward_s=(0.0, 6.0, 6.0), activation_bytes=(0, 100, 100)
    )
    est = simulate_step(two, _cost(_GROUPS), world_size=4, mesh=(2, 2), compute=compute, prefetch=1)
    comms = [(stream, label, end - start) for stream, label, start, end in _comms(est)]
    assert comms == [
        ("all_gather", "all-gather 0", 1.0),
        ("all_gather", "all-gather 1", 1.0),
        ("all_gather", "all-gather 1", 1.0),
        ("all_gather", "all-gather 0", 1.0),
        ("reduce_scatter", "reduce-scatter 1", 2.0),
        ("all_reduce", "all-reduce 1", 2.0),
        ("reduce_scatter", "reduce-scatter 0", 2.0),
        ("all_reduce", "all-reduce 0", 2.0),
    ]
    assert est.step_time_s == pytest.approx(35.5 + 4.0)  # the flat 2-rank step + 2 x 2 s
    assert est.all_reduces == 2


def test_hsdp_all_reduce_runs_beside_intra_node_collectives_on_cuda() -> None:
    """On CUDA the all-reduce has its own stream; across nodes it does not share the
    NVLink's bandwidth with the next group's collectives (FSDP2's all_reduce_stream)."""
    _, two = _plans()
    cm = CostModel.preset("h100-ib-400g", world_size=16)
    est = simulate_step(two, cm, world_size=16, mesh=(2, 8), compute=UnitCompute.zeros(3))
    assert est.all_reduces == 2 and {e.stream for e in est.timeline} >= {"all_reduce"}


# ------------------------------------------------------------------ bad input
def test_mesh_shape_must_hold_the_world() -> None:
    _, two = _plans()
    with pytest.raises(ValueError) as info:
        simulate_step(two, _cost(_GROUPS), world_size=4, mesh=(3, 2))
    assert str(info.value) == (
        "simulate_step: mesh shape (3, 2) holds 6 ranks but the world size is 4: pass a "
        "(replicate, shard) shape whose product is 4, e.g. (1, 4) for FSDP over all ranks or "
        "(2, 2) for shard groups of 2"
    )
    with pytest.raises(ValueError) as info:
        MeshShape.with_shard(16, 6, where="plan_wrap")
    assert str(info.value) == (
        "plan_wrap: a shard group of 6 rank(s) does not divide the 16 data-parallel rank(s) "
        "of world size 16: pass a divisor of 16 (1, 2, 4, 8, 16)"
    )


def test_a_flat_calibration_cannot_price_replicas() -> None:
    _, two = _plans()
    with pytest.raises(ValueError) as info:
        simulate_step(two, _cost(), world_size=4, mesh=(2, 2))
    assert str(info.value) == (
        "cost model (by hand) was calibrated flat, on one group of 4 ranks, and knows no "
        "topology: it cannot price the all-reduce over the replicate group of 2 ranks 2 "
        "apart of mesh 2x2 (replicate x shard); calibrate on that mesh "
        "(CostModel.calibrate(mesh=init_device_mesh(device, (2, 2), mesh_dim_names="
        "('dp_replicate', 'dp_shard')))) or use a preset that knows the cluster's topology "
        "(CostModel.preset('h100-nvlink-8', world_size=4))"
    )


def test_a_tp_mesh_needs_dtensors_or_a_tp_plan() -> None:
    model = Llama(LlamaConfig(n_layers=1, dim=64, n_heads=4, mlp_hidden=128, vocab_size=256))
    order = trace_execution_order(model)
    policy = ModuleWrapPolicy({LlamaBlock})
    with pytest.raises(ValueError) as info:
        plan_wrap(model, order, policy, mesh=(1, 2, 2))
    assert str(info.value) == (
        "plan_wrap: the mesh has a tensor-parallel dimension of 2 ranks but no parameter of "
        "Llama is a DTensor: apply the tensor-parallel plan first (torch.distributed.tensor."
        "parallel.parallelize_module(model, mesh['tp'], plan)) and plan that model, or pass "
        "tp_plan= (the parallelize_module plan, or transformers' model.base_model_tp_plan) to "
        "plan from the local sizes it leaves"
    )
    with pytest.raises(ValueError, match=r"^plan_wrap: tp_plan= sizes tensor-parallel shards"):
        plan_wrap(model, order, policy, tp_plan={"layers.*.attention.wq": "colwise"})


# ---------------------------------------------------------- tensor parallelism
def test_local_sizes_of_a_tp_plan() -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = Llama(LlamaConfig(n_layers=1, dim=64, n_heads=4, mlp_hidden=128, vocab_size=256))
    order = trace_execution_order(model)
    tp_plan = {
        "tok_embeddings": RowwiseParallel(),
        "layers.*.attention.w[qkv]": ColwiseParallel(),
        "layers.*.attention.wo": "rowwise",
        "layers.*.feed_forward.w1": "colwise",
        "output": "colwise_rep",
    }
    local = local_order(order, model, tp=4, tp_plan=tp_plan).params
    assert {f: local[f].shape for f in local if local[f].shape != order.params[f].shape} == {
        "tok_embeddings.weight": (64, 64),
        "layers.0.attention.wq.weight": (16, 64),
        "layers.0.attention.wk.weight": (16, 64),
        "layers.0.attention.wv.weight": (16, 64),
        "layers.0.attention.wo.weight": (64, 16),
        "layers.0.feed_forward.w1.weight": (32, 64),
        "output.weight": (64, 64),
    }
    assert local["layers.0.attention.wq.weight"].numel == 1024
    plan = plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock}), mesh=(1, 2, 4), tp_plan=tp_plan)
    assert plan.mesh == MeshShape(1, 2, 4) and plan.order.params == local


# ------------------------------------------------------------ the shard size
def test_the_planner_chooses_the_shard_group_size_and_says_why() -> None:
    model = Llama(LlamaConfig(n_layers=4, dim=256, n_heads=4, mlp_hidden=512, vocab_size=1024))
    cm = CostModel.preset("h100-ib-400g", world_size=32)
    with torch.device("meta"):
        meta = Llama(LlamaConfig(n_layers=4, dim=256, n_heads=4, mlp_hidden=512, vocab_size=1024))
    tokens = torch.zeros(8, 512, dtype=torch.long, device="meta")
    order = record_execution_order(meta, tokens, timing=cm.compute)
    policy = ModuleWrapPolicy({LlamaBlock})
    plan = plan_wrap(model, order, policy, bucket_numel="auto", cost_model=cm, mesh="auto")
    search = plan.search
    assert search is not None and plan.mesh is not None and plan.estimate is not None
    records = {m.shard: m for m in search.meshes}
    assert sorted(records) == [1, 2, 4, 8, 16, 32]
    chosen, flat = records[plan.mesh.shard], records[32]
    assert chosen.status == "searched" and plan.estimate.mesh == plan.mesh
    assert (
        chosen.step_time_s
        == plan.estimate.step_time_s
        == min(r.step_time_s for r in records.values())
    )
    more = chosen.peak_memory_bytes - flat.peak_memory_bytes
    from execwrap.util.formatting import format_bytes

    default = default_memory_budget(cm)  # no memory_budget: the device's, less a reserve
    assert default is not None and default[1] in plan.notes

    assert search.mesh_reason == (
        f"sharding over {plan.mesh.shard} ranks: {flat.step_time_s / chosen.step_time_s:.2g}x "
        f"faster per step than over 32 ({flat.status}), {format_bytes(abs(more))} "
        f"{'more' if more >= 0 else 'less'} per rank, within the budget of "
        f"{format_bytes(default[0])}"
    )
    assert search.mesh_reason in plan.notes
    # a budget below the replicated state skips the small shard groups by the bound
    budget = records[8].peak_memory_bytes
    tight = plan_wrap(
        model, order, policy, bucket_numel="auto", cost_model=cm, mesh="auto", memory_budget=budget
    )
    assert tight.search is not None
    skipped = [m.shard for m in tight.search.meshes if m.status == "skipped"]
    assert skipped and max(skipped) < 8 and tight.estimate.peak_memory_bytes <= budget
    assert tight.search.mesh_reason.endswith(f"within the budget of {format_bytes(budget)}")


def test_plans_with_meshes_round_trip() -> None:
    cm = CostModel.preset("h100-ib-400g", world_size=16).for_mesh((2, 8))
    assert CostModel.from_dict(json.loads(json.dumps(cm.to_dict()))) == cm
    measured = _cost(_GROUPS)
    assert CostModel.from_dict(json.loads(json.dumps(measured.to_dict()))) == measured
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    order = trace_execution_order(model)
    plan = plan_wrap(model, order, ModuleWrapPolicy({nn.Linear}), mesh=(2, 2))
    again = WrapPlan.from_dict(json.loads(json.dumps(plan.to_dict())), order)
    assert again.mesh == MeshShape(2, 2)
    record = MeshCandidate(8, 2, "skipped", float("inf"), 10, False, "over the budget")
    assert MeshCandidate.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_gpt_blocks_plan_on_a_fixed_mesh() -> None:
    from execwrap.demo_models import GPT, GPTConfig

    model = GPT(GPTConfig(n_blocks=2))
    order = trace_execution_order(model)
    cm = CostModel.preset("h100-ib-400g", world_size=16)
    plan = plan_wrap(
        model, order, ModuleWrapPolicy({Block}), bucket_numel="auto", cost_model=cm, mesh=(2, 8)
    )
    assert plan.mesh == MeshShape(2, 8) and plan.estimate is not None
    assert plan.estimate.mesh == MeshShape(2, 8) and plan.estimate.world_size == 16
    assert plan.estimate.all_reduces == plan.estimate.reduce_scatters


# --------------------------------------------------------------- frameworks
class _Mesh:
    """What MeshShape.from_device_mesh reads of a DeviceMesh."""

    def __init__(self, shape: tuple[int, ...], names: tuple[str, ...] | None) -> None:
        self.shape, self.mesh_dim_names = shape, names


@pytest.mark.parametrize(
    ("shape", "names", "expected"),
    [
        ((16,), ("dp_shard_cp",), MeshShape(1, 16)),  # accelerate, FSDP alone
        ((2, 8), ("dp_replicate", "dp_shard_cp"), MeshShape(2, 8)),  # accelerate HSDP
        ((2, 8), ("dp_replicate", "fsdp"), MeshShape(2, 8)),  # torchtitan dp_replicate
        ((2, 4), ("data_parallel", "tensor_parallel"), MeshShape(1, 2, 4)),  # Lightning
        ((2, 2, 4), ("dp_replicate", "dp_shard", "tp"), MeshShape(2, 2, 4)),
        ((2, 8), None, MeshShape(2, 8)),  # unnamed 2-D: HSDP, as FSDP2 takes it
    ],
)
def test_framework_meshes_are_read(
    shape: tuple[int, ...], names: tuple[str, ...] | None, expected: MeshShape
) -> None:
    assert MeshShape.from_device_mesh(_Mesh(shape, names)) == expected


def test_a_policy_plans_for_the_framework_mesh() -> None:
    from execwrap import ParamExecOrderWrapPolicy
    from execwrap.integrations import plan_for_mesh

    policy = ParamExecOrderWrapPolicy()
    plan_for_mesh(policy, MeshShape(1, 16))  # plain FSDP: nothing to say
    assert policy.mesh is None
    plan_for_mesh(policy, MeshShape(2, 8))
    assert policy.mesh == MeshShape(2, 8)
    plan_for_mesh(policy, MeshShape(4, 4))  # its own mesh is kept (and checked when applied)
    assert policy.mesh == MeshShape(2, 8)
    with pytest.raises(ValueError) as info:
        MeshShape.from_device_mesh(_Mesh((2, 2, 2, 2), ("a", "b", "c", "d")))
    assert str(info.value).startswith(
        "MeshShape.from_device_mesh: cannot read a mesh of shape (2, 2, 2, 2) with dimension "
        "names ('a', 'b', 'c', 'd'): name its dimensions"
    )
