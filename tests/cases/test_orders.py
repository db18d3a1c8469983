"""Case suite, orders: exact expected orders of each hard model kind (issue 8).

Symbolic capture must give the expected orders or fail with a TracingError
naming the module; runtime capture must give them always; the automatic
capture must fall back on every tracer exception (TraceError, TypeError,
RuntimeError) and say where; and capture must leave numerics unchanged.
"""

from __future__ import annotations

import copy
import logging
import re

import pytest
import torch

from tests.cases._checks import snapshot, step
from tests.cases._expected import CASES, Case, build, inputs
from tracing import (
    ExecutionOrder,
    RuntimeRecorder,
    TracingConfig,
    TracingError,
    capture_execution_order,
    record_execution_order,
    trace_execution_order,
)

TRACEABLE = [name for name, c in CASES.items() if c.symbolic_error is None]
UNTRACEABLE = [name for name, c in CASES.items() if c.symbolic_error is not None]

pytestmark = pytest.mark.filterwarnings(
    # reentrant checkpoint warns when traced / when its input needs no grad
    "ignore::UserWarning:torch.utils.checkpoint"
)


def _uses(order: ExecutionOrder) -> list[tuple[str, int, tuple[str, ...]]]:
    return [(u.module_fqn, u.call_index, tuple(u.param_fqns)) for u in order.param_uses]


def _assert_forward(order: ExecutionOrder, case: Case) -> None:
    assert order.module_forward_order == case.module_forward_order
    assert order.param_forward_order == case.param_forward_order
    assert _uses(order) == case.param_uses
    assert order.shared_params == case.shared_params
    if case.module_call_depths is not None:
        assert order.module_call_depths == case.module_call_depths


def _assert_runtime(order: ExecutionOrder, case: Case) -> None:
    assert order.method == "runtime"
    _assert_forward(order, case)
    assert order.param_backward_order == case.param_backward_order
    assert order.recompute_order == case.recompute_order


# ------------------------------------------------------------------ symbolic
@pytest.mark.parametrize("name", TRACEABLE)
def test_symbolic_orders(name: str) -> None:
    case = CASES[name]
    model = build(case)
    before = snapshot(model)
    order = trace_execution_order(model)
    assert order.method == "symbolic"
    _assert_forward(order, case)
    assert order.param_backward_order == []
    assert order.fallback_reason is None
    before.assert_unchanged(model)


@pytest.mark.parametrize("name", UNTRACEABLE)
def test_symbolic_failure_names_the_module(name: str) -> None:
    case = CASES[name]
    assert case.symbolic_error is not None
    fqn, cls, error_type = case.symbolic_error
    model = build(case)
    config = TracingConfig()
    before = snapshot(model)
    where = "<root>" if fqn == "" else repr(fqn)
    with pytest.raises(TracingError, match=re.escape(f"{where} ({cls})")) as info:
        trace_execution_order(model, config)
    assert info.value.module_fqn == fqn
    assert info.value.module_class == cls
    assert type(info.value.__cause__).__name__ == error_type
    assert error_type in str(info.value)
    # the tracer is as it was: no instance attributes left
    assert "call_module" not in vars(config.tracer)
    assert "create_proxy" not in vars(config.tracer)
    before.assert_unchanged(model)


# ------------------------------------------------------------------- runtime
@pytest.mark.parametrize(
    "name",
    list(CASES),
)
def test_runtime_orders(name: str) -> None:
    case = CASES[name]
    model = build(case)
    rng = torch.get_rng_state()
    before = snapshot(model)
    order = record_execution_order(model, *inputs(case))
    _assert_runtime(order, case)
    before.assert_unchanged(model)
    assert torch.equal(torch.get_rng_state(), rng)


@pytest.mark.parametrize("name", list(CASES))
def test_capture_chooses_path_and_names_fallback_module(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    case = CASES[name]
    model = build(case)
    caplog.set_level(logging.INFO, logger="tracing")
    order = capture_execution_order(
        model, tracing_config=TracingConfig(), example_inputs=inputs(case)
    )
    _assert_forward(order, case)
    if case.symbolic_error is None or case.traces_with_inputs:
        assert order.method == "symbolic"
        assert order.fallback_reason is None
        return
    fqn, cls, error_type = case.symbolic_error
    _assert_runtime(order, case)
    assert order.fallback_reason is not None
    where = "<root>" if fqn == "" else repr(fqn)
    assert f"{where} ({cls})" in order.fallback_reason
    assert error_type in order.fallback_reason
    fallback_lines = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(fallback_lines) == 1, [r.getMessage() for r in caplog.records]
    assert cls in fallback_lines[0].getMessage()


@pytest.mark.parametrize("name", UNTRACEABLE)
def test_capture_without_inputs_raises_naming_the_module(name: str) -> None:
    case = CASES[name]
    assert case.symbolic_error is not None
    fqn, cls, _ = case.symbolic_error
    model = build(case)
    before = snapshot(model)
    with pytest.raises(TracingError) as info:
        capture_execution_order(model, tracing_config=TracingConfig())
    assert info.value.module_fqn == fqn
    assert cls in str(info.value)
    assert re.search(r"example.?inputs", str(info.value)), str(info.value)
    before.assert_unchanged(model)


# ------------------------------------------------------------------ numerics
@pytest.mark.parametrize("name", list(CASES))
def test_capture_leaves_numerics_unchanged(name: str) -> None:
    """Same outputs and gradients as a model that was never captured, bit for bit.

    Covers both runtime entry points: ``record_execution_order`` (its own
    forward/backward, undone afterwards) and ``RuntimeRecorder`` around the
    user's own training step.
    """
    case = CASES[name]
    args = inputs(case)
    model = build(case)
    reference = copy.deepcopy(model)
    ref_out, ref_grads = step(reference, args)

    recorded = record_execution_order(model, *args)
    if case.symbolic_error is None:
        trace_execution_order(model)
    assert all(p.grad is None for p in model.parameters())

    with RuntimeRecorder(model) as recorder:
        out, grads = step(model, args)
    assert torch.equal(out, ref_out)
    assert grads.keys() == ref_grads.keys()
    for k, g in ref_grads.items():
        assert torch.equal(grads[k], g), k
    # the user's step recorded the same order as the self-contained capture
    _assert_forward(recorder.order, case)
    assert recorder.order.param_backward_order == recorded.param_backward_order
    assert recorder.order.recompute_order == recorded.recompute_order

    # and a plain step afterwards still matches (nothing left behind)
    model.zero_grad(set_to_none=True)
    reference.zero_grad(set_to_none=True)
    out2, grads2 = step(model, args)
    ref_out2, ref_grads2 = step(reference, args)
    assert torch.equal(out2, ref_out2)
    for k, g in ref_grads2.items():
        assert torch.equal(grads2[k], g), k


def test_inplace_relu_breaks_full_backward_hooks_but_not_capture() -> None:
    """The reason for the in-place case: module full backward hooks fail on it."""
    case = CASES["inplace_relu"]
    model = build(case)
    handle = model.fc1.register_full_backward_hook(lambda *a: None)
    try:
        with pytest.raises(RuntimeError, match="inplace"):
            model(*inputs(case))
    finally:
        handle.remove()
    _assert_runtime(record_execution_order(model, *inputs(case)), case)


def test_checkpoint_modes_agree() -> None:
    """Reentrant and non-reentrant checkpointing of the same model: same order.

    Under reentrant checkpointing each block's backward is a separate inner
    backward pass, so the tied ``block0.fc1.weight`` has its gradient
    accumulated twice (first from block1, then from block0); it is only
    ready after the second, as under non-reentrant checkpointing (one
    accumulation), and it must appear once.
    """
    orders = {}
    for name in ("checkpoint_reentrant", "checkpoint_non_reentrant"):
        case = CASES[name]
        orders[name] = record_execution_order(build(case), *inputs(case))
    a, b = orders.values()
    assert a.param_backward_order.count("block0.fc1.weight") == 1
    assert a.param_backward_order == b.param_backward_order
    assert a.module_forward_order == b.module_forward_order
    assert a.recompute_order == b.recompute_order


class _TensorConstant(torch.nn.Module):
    """Multiplies by a tensor created in forward: fx stores such constants on the root."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * torch.tensor([1.0, 2.0, 3.0, 4.0])


def test_symbolic_capture_leaves_no_tensor_constant_on_the_model() -> None:
    """fx's ``Tracer.create_arg`` does ``setattr(root, "_tensor_constant0", t)`` for a
    tensor that is not a parameter or buffer; capture must not leave it behind."""
    model = _TensorConstant()
    before = snapshot(model)
    order = trace_execution_order(model)
    assert order.param_forward_order == ["fc.weight", "fc.bias"]
    assert not hasattr(model, "_tensor_constant0")
    before.assert_unchanged(model)
