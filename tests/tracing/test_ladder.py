"""The capture ladder: symbolic -> zero-cost runtime -> real runtime, and the check."""

from __future__ import annotations

import inspect
import logging

import pytest
import torch
import torch.nn as nn

from tests.cases._checks import snapshot
from tracing import TracingConfig, capture_execution_order, record_execution_order
from tracing.rates import ComputeRates


class IsInstanceBranch(nn.Module):
    """``isinstance(x, torch.Tensor)`` is False for an fx Proxy: a silently wrong trace."""

    def __init__(self) -> None:
        super().__init__()
        self.tensor_path = nn.Linear(4, 4)
        self.other_path = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            x = self.tensor_path(x)
        else:
            x = self.other_path(x)
        return self.head(x)


def _line(fn: object, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_a_wrong_trace_is_replaced_by_the_runtime_order(caplog: pytest.LogCaptureFixture) -> None:
    model = IsInstanceBranch()
    x = torch.randn(2, 4)
    before = snapshot(model)
    with caplog.at_level(logging.INFO, logger="tracing"):
        order = capture_execution_order(model, TracingConfig(), example_inputs=x)
    before.assert_unchanged(model)
    assert order.capture_step == "zero-cost runtime"
    assert order.module_forward_order == ["", "tensor_path", "head"]
    assert order.module_forward_order == record_execution_order(model, x).module_forward_order
    assert order.fallback_reason == (
        "the symbolic trace differs from a zero-cost runtime run of the example inputs: at "
        "module call 1 the trace has 'other_path' (Linear) but the run has 'tensor_path' "
        "(Linear) (the trace took a branch the real call does not take, e.g. on an argument "
        "that was a Proxy); the runtime order is used"
    )
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warnings] == [f"IsInstanceBranch: {order.fallback_reason}"]
    assert warnings[0].name == "tracing.ladder"


def test_check_off_keeps_the_trace() -> None:
    order = capture_execution_order(
        IsInstanceBranch(), TracingConfig(), example_inputs=torch.randn(2, 4), check=False
    )
    assert order.capture_step == "symbolic"
    assert order.module_forward_order == ["", "other_path", "head"]


class ScaledByWeight(nn.Module):
    """Reads a parameter's value with ``.item()``: fx records the call, a fake run cannot
    decide it (a weight's value is never known to it; a buffer's would be)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale.item()


def test_check_falls_back_to_a_real_run_when_the_fake_run_cannot_decide(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="tracing"):
        order = capture_execution_order(
            ScaledByWeight(), TracingConfig(), example_inputs=torch.randn(2, 4)
        )
    assert (order.capture_step, order.fallback_reason) == ("symbolic", None)
    line = _line(ScaledByWeight.forward, "self.scale.item()")
    assert [r.getMessage() for r in caplog.records] == [
        "checking the symbolic order with a real run: zero-cost runtime capture failed in the "
        "root module <root> (ScaledByWeight): DataDependentOutputException: "
        f"aten._local_scalar_dense.default at tests/tracing/test_ladder.py:{line} "
        "(`return self.fc(x) * self.scale.item()`): the op's result depends on tensor values, "
        "which fake tensors do not have; the real model was run"
    ]


class ValueRouter(nn.Module):
    """A branch on an activation's value: neither a trace nor a fake run can decide it."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 4)
        self.down = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if h.sum() * 0 == 0:
            return self.down(h)
        return h


def test_each_skipped_step_gives_its_reason() -> None:
    model = ValueRouter()
    x = torch.ones(2, 4)
    order = capture_execution_order(model, TracingConfig(), example_inputs=x)
    line = _line(ValueRouter.forward, "if h.sum() * 0 == 0:")
    at = f"at tests/tracing/test_ladder.py:{line} (`if h.sum() * 0 == 0:`)"
    assert order.capture_step == "runtime"
    assert order.module_forward_order == ["", "up", "down"]
    assert order.fallback_reason == (
        "symbolic tracing failed in the root module <root> (ValueRouter): TraceError: "
        f"symbolically traced variables cannot be used as inputs to control flow {at}: a "
        "Python branch (if/while/and/or/bool()) on the value of 'x'; it depends on tensor "
        "values, which only a run decides; zero-cost runtime capture failed in the root "
        "module <root> (ValueRouter): DataDependentOutputException: "
        f"aten._local_scalar_dense.default {at}: the op's result depends on tensor values, "
        "which fake tensors do not have; the real model was run"
    )


class ShapeBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            x = self.wide(x)
        return x


def test_shape_branch_is_decided_without_compute() -> None:
    order = capture_execution_order(ShapeBranch(), TracingConfig(), example_inputs=torch.ones(2, 4))
    assert order.capture_step == "zero-cost runtime"
    assert order.module_forward_order == ["", "wide"]
    line = _line(ShapeBranch.forward, "if x.shape[0] > 1:")
    assert order.fallback_reason == (
        "symbolic tracing failed in the root module <root> (ShapeBranch): TraceError: "
        "symbolically traced variables cannot be used as inputs to control flow at "
        f"tests/tracing/test_ladder.py:{line} (`if x.shape[0] > 1:`): a Python branch "
        "(if/while/and/or/bool()) on the shape or dtype of a tensor computed from 'x' (fx "
        "Proxies carry no shapes or dtypes); runtime capture records it without tracing"
    )


def test_flag_argument_advice_without_inputs() -> None:
    class Flag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, use_a: bool = True) -> torch.Tensor:
            return self.a(x) if use_a else x

    with pytest.raises(Exception) as info:
        capture_execution_order(Flag(), TracingConfig())
    assert "on the value of 'use_a'" in str(info.value)
    assert info.value.advice == "pass concrete_args={'use_a': ...} or example inputs to trace it"  # type: ignore[attr-defined]


def test_without_config_inputs_start_at_zero_cost() -> None:
    order = capture_execution_order(ShapeBranch(), example_inputs=torch.ones(2, 4))
    assert (order.capture_step, order.fallback_reason) == ("zero-cost runtime", None)


def test_config_of_the_wrong_type() -> None:
    with pytest.raises(
        TypeError, match="tracing_config must be a TracingConfig or None, got Tracer"
    ):
        capture_execution_order(ShapeBranch(), torch.fx.Tracer())  # type: ignore[arg-type]


RATES = ComputeRates("cuda", flops_per_s=1e12, memory_bytes_per_s=1e12)


@pytest.mark.parametrize("config", [None, TracingConfig()])
def test_timing_gives_the_timed_runtime_recording(config: TracingConfig | None) -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    x = torch.randn(4, 8, device="meta")
    order = capture_execution_order(model, config, example_inputs=x, timing=RATES)
    # a symbolic trace that agrees with the run is replaced by the run, which has the times
    assert (order.capture_step, order.fallback_reason) == ("zero-cost runtime", None)
    assert (order.timing_method, len(order.forward_times_s)) == ("estimated", 3)


def test_timing_needs_inputs() -> None:
    with pytest.raises(
        ValueError,
        match=r"^capture_execution_order: timing needs example_inputs \(the times are estimated "
        r"op by op on a recorded run; a symbolic trace has none\)$",
    ):
        capture_execution_order(nn.Linear(2, 2), TracingConfig(), timing=RATES)
