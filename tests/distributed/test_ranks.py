"""``check_order_across_ranks`` on 2 gloo ranks: agreement, divergence, no hang.

One spawn of 2 ranks runs the three workers in turn (each error case ends with the
ranks still in step, which the later workers' collectives rely on), and each test
checks one worker's results; ``timeout_s`` bounds every collective, so a hang fails
the tests instead of stalling them.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from execwrap import (
    CostModel,
    ExecutionOrder,
    ModuleWrapPolicy,
    OrderDivergenceError,
    ParamExecOrderWrapPolicy,
    ParamMismatchError,
    PlanError,
    TracingConfig,
    always_wrap_policy,
    apply_fully_shard,
    check_order_across_ranks,
    plan_wrap,
)
from tests._dist import run_ranks
from tests.distributed._policy_cases import branch_case
from tracing import record_execution_order, trace_execution_order


def _error(fn: Any) -> dict[str, Any] | None:
    try:
        fn()
    except OrderDivergenceError as e:
        return {
            "ranks": e.ranks,
            "index": e.index,
            "expected": e.expected,
            "found": e.found,
            "msg": str(e),
        }
    return None


def _ranks_worker(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    same = ExecutionOrder(module_forward_order=["", "a", "b"], param_forward_order=["a.w", "b.w"])
    out["same"] = _error(lambda: check_order_across_ranks(same))

    mine = ["", "inp", "pos" if rank == 0 else "neg", "out"]
    differ = ExecutionOrder(module_forward_order=mine)
    out["modules"] = _error(lambda: check_order_across_ranks(differ))

    shorter = ExecutionOrder(module_forward_order=["", "a", "b"][: 3 - rank])
    out["prefix"] = _error(lambda: check_order_across_ranks(shorter))

    params = ExecutionOrder(
        module_forward_order=["", "a"], param_forward_order=["a.w", "a.b"][:: 1 - 2 * rank]
    )
    out["params"] = _error(lambda: check_order_across_ranks(params))

    # A rank whose inputs take the other branch: the policy catches it before
    # wrapping (FSDP1 and FSDP2), on both ranks.
    case = branch_case(sign=1.0 if rank == 0 else -1.0)
    example = case.example(rank, world_size)

    def fsdp1() -> None:
        policy = ParamExecOrderWrapPolicy(
            always_wrap_policy, TracingConfig(), example_inputs=example
        )
        FSDP(case.model(), auto_wrap_policy=policy, device_id=torch.device("cpu"))

    def fsdp2() -> None:
        policy = ParamExecOrderWrapPolicy(always_wrap_policy, example_inputs=example)
        apply_fully_shard(case.model(), policy, mesh=init_device_mesh("cpu", (world_size,)))

    def fsdp2_recorded() -> None:
        # Nothing to capture before sharding: the order is recorded during
        # step 1, and the check runs at the end of that first backward.
        policy = ParamExecOrderWrapPolicy(always_wrap_policy)
        model = case.model()
        apply_fully_shard(model, policy, mesh=init_device_mesh("cpu", (world_size,)))
        model(*example).sum().backward()

    out["fsdp1"] = _error(fsdp1)
    out["fsdp2"] = _error(fsdp2)
    out["fsdp2_recorded"] = _error(fsdp2_recorded)
    out.update(_plan_cases(rank, world_size))
    # The ranks are still in step: one more collective completes.
    t = torch.ones(1)
    dist.all_reduce(t)
    out["after"] = float(t)
    return out


def _four_linears() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(*(torch.nn.Linear(8, 8) for _ in range(4)))


def _plan_error(fn: Any) -> str | None:
    try:
        fn()
    except PlanError as e:
        return str(e)
    return None


def _plan_cases(rank: int, world_size: int) -> dict[str, Any]:
    """Ranks about to apply different plans: refused on both, before wrapping."""
    out: dict[str, Any] = {}
    x = torch.randn(2, 8)
    order = record_execution_order(_four_linears(), x)
    linears = ModuleWrapPolicy({torch.nn.Linear})

    def apply(bucket: int | None, prefetch: int) -> None:
        model = _four_linears()
        plan = plan_wrap(model, order, linears, bucket_numel=bucket)
        apply_fully_shard(
            model, plan, mesh=init_device_mesh("cpu", (world_size,)), prefetch=prefetch
        )
        model(x).sum().backward()

    out["plan_same"] = _plan_error(lambda: apply(None, 1))
    out["plan_groups"] = _plan_error(lambda: apply(None if rank == 0 else 144, 1))
    out["plan_prefetch"] = _plan_error(lambda: apply(None, 0 if rank == 0 else 2))

    # an auto plan made for 8 ranks, applied on 2: one WARNING
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("execwrap.fsdp.ranks").addHandler(handler)
    try:
        model = _four_linears()
        h100 = CostModel.preset("h100-nvlink-8")
        timed = record_execution_order(model, x, timing=h100.compute)  # estimated for an H100
        auto = plan_wrap(model, timed, linears, bucket_numel="auto", cost_model=h100)
        apply_fully_shard(model, auto, mesh=init_device_mesh("cpu", (world_size,)))
    finally:
        logging.getLogger("execwrap.fsdp.ranks").removeHandler(handler)
    out["other_world_warnings"] = [m for m in records if "made for 8 ranks" in m]
    return out


def _all_worker(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    return {
        "ranks": _ranks_worker(rank, world_size),
        "shapes": _shapes_worker(rank, world_size),
        "missing": _missing_worker(rank, world_size),
    }


@pytest.fixture(scope="module")
def ranks_results() -> dict[str, list[dict[str, Any]]]:
    """Worker -> ``[rank 0's result, rank 1's]``, from one spawn of 2 ranks."""
    results = run_ranks(_all_worker, world_size=2, timeout_s=60)
    return {name: [r[name] for r in results] for name in results[0]}


def test_check_order_across_ranks(ranks_results: dict[str, list[dict[str, Any]]]) -> None:
    r0, r1 = ranks_results["ranks"]
    assert r0["same"] is None and r1["same"] is None

    for r in (r0, r1):
        e = r["modules"]
        assert (e["ranks"], e["index"], e["expected"], e["found"]) == ((0, 1), 2, "pos", "neg")
        assert "rank 0 ran module 'pos', rank 1 ran module 'neg'" in e["msg"]
        assert "first divergence at forward call 2" in e["msg"].lower()

        e = r["prefix"]
        assert (e["index"], e["expected"], e["found"]) == (2, "b", None)

        e = r["params"]
        assert (e["index"], e["expected"], e["found"]) == (0, "a.w", "a.b")
        assert "parameter" in e["msg"]

        for key in ("fsdp1", "fsdp2", "fsdp2_recorded"):
            e = r[key]
            assert e is not None, key
            assert (e["ranks"], e["index"], e["expected"], e["found"]) == ((0, 1), 2, "pos", "neg")
        assert r["after"] == 2.0
        assert r["plan_same"] is None
        assert r["plan_groups"] == (
            "apply_fully_shard: rank 1 would apply another plan than rank 0: 5 groups on rank "
            "0, 3 on rank 1; group 1 is ['0'] on rank 0 and ['0', '1'] on rank 1; FSDP2 would "
            "pair the ranks' collectives wrongly and hang. Plan on one rank and send it to the "
            "others (torch.distributed.broadcast_object_list([plan], src=0)), or give every "
            "rank the same order, memory_budget and cost model"
        )
        assert r["plan_prefetch"] is not None
        assert "prefetch is 0 on rank 0 and 2 on rank 1" in r["plan_prefetch"]
    assert r0["other_world_warnings"] == [
        "apply_fully_shard: the plan was made for 8 ranks and is applied on 2; its grouping, "
        "prefetch, resharding and memory were chosen for 8. Plan again with world_size=2 (and "
        "a cost model for these ranks)"
    ]
    print(r0["modules"]["msg"])


def test_check_order_without_process_group() -> None:
    assert not dist.is_initialized()
    assert check_order_across_ranks(ExecutionOrder(module_forward_order=[""])) is None


class _Scaled(torch.nn.Module):
    """``fc(x) * scale``: with ``scale`` of 4 or of 1 element the forward runs the
    same way, so the ranks differ only in that one parameter's shape."""

    def __init__(self, scale_numel: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 4)
        self.out = torch.nn.Linear(4, 2)
        self.scale = torch.nn.Parameter(torch.ones(scale_numel))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(x) * self.scale)


def _mismatch(fn: Any) -> dict[str, Any] | None:
    try:
        fn()
    except ParamMismatchError as e:
        return {
            "ranks": e.ranks,
            "index": e.index,
            "names": (e.expected, e.found),
            "params": (e.expected_param, e.found_param),
            "msg": str(e),
        }
    return None


def _shapes_worker(rank: int, world_size: int) -> dict[str, Any]:
    def model() -> torch.nn.Module:
        return _Scaled(4 if rank == 0 else 1)

    x = (torch.randn(2, 4),)
    mesh = init_device_mesh("cpu", (world_size,))
    out: dict[str, Any] = {}
    out["check"] = _mismatch(
        lambda: check_order_across_ranks(trace_execution_order(model()), model=model())
    )
    out["fsdp1"] = _mismatch(
        lambda: FSDP(
            model(),
            auto_wrap_policy=ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig()),
            device_id=torch.device("cpu"),
        )
    )
    out["fsdp2"] = _mismatch(
        lambda: apply_fully_shard(
            model(), ParamExecOrderWrapPolicy(always_wrap_policy, example_inputs=x), mesh=mesh
        )
    )
    out["fsdp2_recorded"] = _mismatch(  # no order before the first step: parameters checked now
        lambda: apply_fully_shard(model(), ParamExecOrderWrapPolicy(always_wrap_policy), mesh=mesh)
    )
    t = torch.ones(1)
    dist.all_reduce(t)  # the ranks are still in step
    out["after"] = float(t)
    return out


def test_ranks_whose_parameters_differ_in_shape_fail_before_wrapping(
    ranks_results: dict[str, list[dict[str, Any]]],
) -> None:
    r0, r1 = ranks_results["shapes"]
    expected = (
        "Ranks 0 and 1 hold different parameters (ranks differing from rank 0: [1]). First "
        "difference at parameter 0 in named_parameters() order: rank 0 has 'scale' of shape "
        "(4,) (4 elements), float32, requires_grad=True, rank 1 has 'scale' of shape (1,) "
        "(1 element), float32, requires_grad=True.\n"
    )
    for r in (r0, r1):
        for key in ("check", "fsdp1", "fsdp2", "fsdp2_recorded"):
            e = r[key]
            assert e is not None, key
            assert (e["ranks"], e["index"], e["names"]) == ((0, 1), 0, ("scale", "scale"))
            assert e["params"] == (((4,), "float32", True), ((1,), "float32", True))
            assert e["msg"].startswith(expected)
            assert "Received data size doesn't match expected size" in e["msg"]
        assert r["after"] == 2.0


class _Pair(torch.nn.Module):
    def __init__(self, bias_a: bool = True) -> None:
        super().__init__()
        self.a = torch.nn.Linear(4, 4, bias=bias_a)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class _TwoPairs(torch.nn.Module):
    """``b1.a`` without a bias on one rank: the same modules run in the same
    order, but that rank lacks parameter 5, ``b1.a.bias``."""

    def __init__(self, bias_a: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.b0 = _Pair()
        self.b1 = _Pair(bias_a)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b1(self.b0(x))


def _missing_worker(rank: int, world_size: int) -> dict[str, Any]:
    def model() -> torch.nn.Module:
        return _TwoPairs(bias_a=rank == 0)

    x = (torch.randn(2, 4),)
    out: dict[str, Any] = {}
    out["check"] = _mismatch(
        lambda: check_order_across_ranks(trace_execution_order(model()), model=model())
    )
    out["order_only"] = _mismatch(lambda: check_order_across_ranks(trace_execution_order(model())))
    out["fsdp2"] = _mismatch(
        lambda: apply_fully_shard(
            model(),
            ParamExecOrderWrapPolicy(always_wrap_policy, example_inputs=x),
            mesh=init_device_mesh("cpu", (world_size,)),
        )
    )
    t = torch.ones(1)
    dist.all_reduce(t)  # the ranks are still in step
    out["after"] = float(t)
    return out


def test_a_parameter_one_rank_lacks_is_named_with_the_rank_that_has_it(
    ranks_results: dict[str, list[dict[str, Any]]],
) -> None:
    r0, r1 = ranks_results["missing"]
    expected = (
        "Ranks 0 and 1 hold different parameters (ranks differing from rank 0: [1]). Parameter "
        "'b1.a.bias' of shape (4,) (4 elements), float32, requires_grad=True (parameter 5 in "
        "named_parameters() order on rank 0) is on rank 0 but not on rank 1 (rank 0 has 8 "
        "parameters, rank 1 has 7).\n"
    )
    for r in (r0, r1):
        for key in ("check", "order_only", "fsdp2"):
            e = r[key]
            assert e is not None, key
            assert (e["ranks"], e["index"], e["names"]) == ((0, 1), 5, ("b1.a.bias", None))
            assert e["params"] == (((4,), "float32", True), None)
            assert e["msg"].startswith(expected)
            assert e["msg"].endswith(
                "Fix: build the same model on every rank (the same config, widths, dtype, bias "
                "and frozen parameters) before wrapping."
            )
        assert r["after"] == 2.0


class _MixedBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.low = torch.nn.Linear(4, 4).to(torch.bfloat16)
        self.full = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.full(self.low(x.to(torch.bfloat16)).float())


def test_a_group_that_mixes_dtypes_is_refused_before_wrapping() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(_MixedBlock(), torch.nn.Linear(4, 2))
    order = record_execution_order(model, torch.randn(2, 4))
    plan = plan_wrap(model, order, ModuleWrapPolicy({_MixedBlock}))
    assert plan.groups == [[""], ["0"]]
    with pytest.raises(ValueError) as info:
        apply_fully_shard(model, plan)
    assert str(info.value) == (
        "apply_fully_shard: group ['0'] mixes trainable parameter dtypes: bfloat16 "
        "(0.low.weight), float32 (0.full.weight); FSDP2 needs one dtype per group. Pass "
        "mp_policy=MixedPrecisionPolicy(param_dtype=...), cast the module to one dtype, or plan "
        "with a finer init_policy that puts them in different groups"
    )
    assert not any(isinstance(m, FSDPModule) for m in model.modules())  # nothing wrapped
