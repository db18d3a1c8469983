"""One test per fix of issue 12, item 5: capture leaves model and inputs as they were.

(FSDP1 / FSDP2-wrapped models: tests/tracing/test_capture_wrapped.py.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.cases._checks import snapshot
from tracing import (
    TracingConfig,
    TracingError,
    capture_execution_order,
    record_execution_order,
    trace_execution_order,
)
from tracing.runtime.shadow import record_zero_cost


class Late(nn.Module):
    """Raises for positive inputs (a value-dependent branch: only a real run gets here)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            raise ValueError("late failure")
        return self.lin(x)


class FailsLate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.late = Late()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.late(self.first(x))


def _fails_late() -> FailsLate:
    model = FailsLate()
    with torch.no_grad():
        model.first.weight.fill_(1.0)
        model.first.bias.fill_(1.0)
    return model


def test_error_during_the_fallback_names_the_module_that_raised() -> None:
    model = _fails_late()
    before = snapshot(model)
    with pytest.raises(ValueError, match="^late failure") as info:
        capture_execution_order(model, TracingConfig(), example_inputs=torch.ones(2, 4))
    assert info.value.__notes__ == ["While recording the execution order, in module 'late' (Late)"]
    before.assert_unchanged(model)


def test_error_location_ignores_an_exception_being_handled_by_the_caller() -> None:
    model = _fails_late()
    with pytest.raises(ValueError) as info:
        try:
            raise KeyError("handled by the caller")
        except KeyError:
            record_execution_order(model, torch.ones(2, 4))
    assert info.value.__notes__ == ["While recording the execution order, in module 'late' (Late)"]


class Counter(nn.Module):
    """``self.count += 1`` in forward (an in-place buffer update)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count += 1
        return self.fc(x)


@pytest.mark.parametrize("with_inputs", [False, True])
def test_symbolic_capture_restores_buffers(with_inputs: bool) -> None:
    model = Counter()
    before = snapshot(model)
    inputs = {"example_inputs": torch.ones(2, 4)} if with_inputs else {}
    order = trace_execution_order(model, TracingConfig(), **inputs)  # type: ignore[arg-type]
    assert order.module_forward_order == ["", "fc"]
    assert int(model.count) == 0
    before.assert_unchanged(model)


@pytest.mark.parametrize("step", ["runtime", "zero-cost runtime"])
def test_inputs_keep_their_grad(step: str) -> None:
    model = nn.Linear(4, 4) if step == "zero-cost runtime" else _value_branch()
    fresh = torch.ones(2, 4, requires_grad=True)
    used = torch.ones(2, 4, requires_grad=True)
    used.grad = torch.full((2, 4), 7.0)
    grad = used.grad
    for x in (fresh, used):
        order = capture_execution_order(model, example_inputs=x)
        assert order.capture_step == step
    assert fresh.grad is None
    assert used.grad is grad and torch.equal(used.grad, torch.full((2, 4), 7.0))


def test_inputs_keep_their_grad_when_the_model_raises() -> None:
    x = torch.ones(2, 4, requires_grad=True)
    with pytest.raises(ValueError):
        capture_execution_order(_fails_late(), example_inputs=x)
    assert x.grad is None


def _value_branch() -> nn.Module:
    class ValueBranch(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            return h if h.sum() * 0 == 0 else x  # an activation's value: decided by a run only

    return ValueBranch()


LAZY = (
    "cannot capture the execution order: module 'head' (LazyLinear) has uninitialized "
    "parameters (a lazy module gets its parameter shapes from its first forward, which also "
    "changes its class). Run one forward pass with real inputs first (model(*example_inputs)) "
    "to initialise it, then capture."
)


@pytest.mark.parametrize(
    "capture",
    [
        lambda m, x: capture_execution_order(m, TracingConfig(), example_inputs=x),
        lambda m, x: capture_execution_order(m, example_inputs=x),
        lambda m, x: trace_execution_order(m),
        lambda m, x: record_execution_order(m, x),
        lambda m, x: record_zero_cost(m, x),
    ],
    ids=["ladder", "ladder-runtime", "symbolic", "runtime", "zero-cost"],
)
def test_uninitialised_lazy_module_is_named(capture) -> None:  # type: ignore[no-untyped-def]
    model = nn.Sequential()
    model.add_module("body", nn.Linear(4, 4))
    model.add_module("head", nn.LazyLinear(2))
    body = list(model.body.parameters())
    with pytest.raises(TracingError) as info:
        capture(model, torch.ones(2, 4))
    assert str(info.value) == LAZY
    assert (info.value.module_fqn, info.value.module_class) == ("head", "LazyLinear")
    assert type(model.head) is nn.LazyLinear and model.head.has_uninitialized_params()
    assert list(model.body.parameters()) == body and model.body.weight.grad is None


class PlainTensorState(nn.Module):
    """Updates a plain tensor attribute (neither parameter nor buffer) in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.seen = torch.zeros(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(1)
        return self.fc(x) + self.seen


@pytest.mark.parametrize(
    "capture",
    [
        lambda m, x: trace_execution_order(m),
        lambda m, x: record_zero_cost(m, x),
        lambda m, x: record_execution_order(m, x),
    ],
    ids=["symbolic", "zero-cost", "runtime"],
)
def test_plain_tensor_attributes_keep_their_values(capture) -> None:  # type: ignore[no-untyped-def]
    model = PlainTensorState()
    seen = model.seen
    capture(model, torch.ones(2, 4))
    assert model.seen is seen and torch.equal(seen, torch.zeros(4))


class Cache:
    """A KV-cache-like input object that the forward appends to."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []


class UsesCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, cache: Cache) -> torch.Tensor:
        cache.keys.append(self.k(x))
        return torch.cat(cache.keys).sum(0)


def test_zero_cost_capture_leaves_input_objects_alone() -> None:
    cache = Cache()
    order = capture_execution_order(
        UsesCache(), example_inputs=torch.ones(2, 4), example_kwargs={"cache": cache}
    )
    assert order.capture_step == "zero-cost runtime"
    assert cache.keys == []


def test_flags_stay_as_they_were_also_when_capture_fails() -> None:
    model = _fails_late()
    model.eval()
    model.late.train()
    model.first.bias.requires_grad_(False)
    before = snapshot(model)
    for capture in (
        lambda: capture_execution_order(model, example_inputs=-torch.ones(2, 4)),
        lambda: capture_execution_order(model, TracingConfig(), example_inputs=-torch.ones(2, 4)),
    ):
        capture()  # negative inputs: `late` does not raise
        before.assert_unchanged(model)
    with pytest.raises(ValueError):
        capture_execution_order(model, TracingConfig(), example_inputs=torch.ones(2, 4))
    before.assert_unchanged(model)
    assert (model.training, model.late.training, model.first.bias.requires_grad) == (
        False,
        True,
        False,
    )
