"""Zero-cost runtime capture: the recording run on a fake shadow of the model."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch._subclasses import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from execwrap.demo_models import GPT, GPTConfig, Llama, LlamaConfig
from tests.cases._checks import snapshot
from tests.cases._expected import CASES, build, inputs
from tracing import ExecutionOrder, TracingError, record_execution_order
from tracing.runtime.shadow import record_zero_cost

_FIELDS = (
    "module_forward_order",
    "param_forward_order",
    "param_backward_order",
    "module_backward_order",
    "recompute_order",
    "shared_params",
    "params",
    "module_classes",
)
#: Cases whose forward branches on tensor values: a fake run cannot decide them.
VALUE_DEPENDENT = {"data_dependent_if"}


def _uses(order: ExecutionOrder) -> list[tuple[str, int, tuple[str, ...], str]]:
    return [(u.module_fqn, u.call_index, u.param_fqns, u.op) for u in order.param_uses]


def _has_data(t: torch.Tensor) -> bool:
    return not isinstance(t, FakeTensor) and t.device.type != "meta"


def _assert_same(fake: ExecutionOrder, real: ExecutionOrder) -> None:
    for name in _FIELDS:
        assert getattr(fake, name) == getattr(real, name), name
    assert _uses(fake) == _uses(real)


@pytest.mark.parametrize("name", sorted(set(CASES) - VALUE_DEPENDENT))
def test_zero_cost_equals_a_real_recording(name: str) -> None:
    case = CASES[name]
    model, args = build(case), inputs(case)
    before = snapshot(model)
    fake = record_zero_cost(model, *args)
    before.assert_unchanged(model)
    assert (fake.method, fake.zero_cost, fake.capture_step) == (
        "runtime",
        True,
        "zero-cost runtime",
    )
    _assert_same(fake, record_execution_order(model, *args))


@pytest.mark.parametrize("tie", [True, False])
def test_demo_models_tied_and_untied(tie: bool) -> None:
    torch.manual_seed(0)
    for model in (GPT(GPTConfig(n_blocks=2, tie_weights=tie)), Llama(LlamaConfig(n_layers=2))):
        idx = torch.zeros(2, 8, dtype=torch.long)
        _assert_same(record_zero_cost(model, idx), record_execution_order(model, idx))


def test_nothing_is_computed_and_no_grad_reaches_the_model_or_inputs() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(3, 4, requires_grad=True)
    real_kernels: list[str] = []

    class Count(TorchDispatchMode):
        """Below the fake mode: sees every kernel that runs, with its tensors."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            leaves = pytree.tree_leaves((args, kwargs))
            if any(isinstance(t, torch.Tensor) and _has_data(t) for t in leaves):
                real_kernels.append(str(func))
            return func(*args, **(kwargs or {}))

    rng = torch.get_rng_state()
    with Count():
        order = record_zero_cost(model, x)
    assert order.param_backward_order == ["2.bias", "2.weight", "0.bias", "0.weight"]
    assert real_kernels == []  # only meta kernels inside the fake mode ran
    with Count():
        model(x)  # the control: a real forward shows up
    assert "aten.addmm.default" in real_kernels
    assert x.grad is None and all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)


class Stores(nn.Module):
    """Its forward stores an attribute, reassigns a buffer and counts calls."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last_input = x
        self.steps = self.steps + 1
        self.calls += 1
        return self.fc(x)


def test_what_the_forward_stores_is_removed() -> None:
    model = Stores()
    steps = model.steps
    record_zero_cost(model, torch.randn(2, 4))
    assert "last_input" not in vars(model)
    assert model.steps is steps and int(model.steps) == 0
    assert model.calls == 0
    assert all(not isinstance(p, torch._subclasses.FakeTensor) for p in model.parameters())


class ValueBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(x)


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.up(x).sum() > 0:  # computed from a weight: unknown
            return self.up(x)
        return x


def test_value_dependent_branch_names_module_op_and_line() -> None:
    model = ValueBranch()
    before = snapshot(model)
    with pytest.raises(TracingError) as info:
        record_zero_cost(model, torch.randn(2, 4))
    before.assert_unchanged(model)
    e = info.value
    assert (e.module_fqn, e.module_class) == ("gate", "Gate")
    lines, first = inspect.getsourcelines(Gate.forward)
    line = first + next(i for i, text in enumerate(lines) if "if self.up(x).sum() > 0:" in text)
    assert str(e) == (
        "zero-cost runtime capture (fake tensors) failed in module 'gate' (Gate): "
        f"DataDependentOutputException: aten._local_scalar_dense.default at "
        f"tests/tracing/test_shadow.py:{line} (`if self.up(x).sum() > 0:  # computed from a weight: "
        "unknown`): the op's result depends on "
        "tensor values, which fake tensors do not have."
    )


def test_meta_model_and_inputs() -> None:
    with torch.device("meta"):
        model = GPT(GPTConfig(n_blocks=2))
    idx = torch.zeros(2, 8, dtype=torch.long, device="meta")
    order = record_zero_cost(model, idx)
    assert order.module_forward_order[:4] == ["", "wte", "blocks.0", "blocks.0.ln1"]
    assert len(order.param_backward_order) == len(order.params)


def test_lazy_module_is_refused() -> None:
    with pytest.raises(TracingError, match=r"module '1' \(LazyLinear\) has uninitialized"):
        record_zero_cost(nn.Sequential(nn.Linear(4, 4), nn.LazyLinear(2)), torch.randn(2, 4))
