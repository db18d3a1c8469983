"""capture_execution_order: symbolic first, runtime fallback, and symbolic/runtime parity."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn as nn

from execwrap.demo_models import GPT, GPTConfig, Llama, LlamaConfig
from tests.tracing.test_runtime import RootFunctional, Tied, Twice
from tracing import (
    ExecutionOrder,
    TracingConfig,
    TracingError,
    capture_execution_order,
    record_execution_order,
    trace_execution_order,
)

# ------------------------------------------------------------------ models


class IssueOrder(nn.Module):
    """layer0 -> layer2 (Sequential of Linear, ReLU, Linear) -> layer1."""

    def __init__(self) -> None:
        super().__init__()
        self.layer0 = nn.Linear(4, 4)
        self.layer1 = nn.Linear(4, 4, bias=False)
        self.layer2 = nn.Sequential(
            nn.Linear(4, 4, bias=False), nn.ReLU(), nn.Linear(4, 4, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer1(self.layer2(self.layer0(x)))


class Router(nn.Module):
    """Data-dependent branch: symbolic tracing cannot decide it."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 4)
        self.down = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.up(x)
        return self.down(x)


class Positions(nn.Module):
    """A tensor factory whose size comes from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table(torch.arange(x.shape[1], device=x.device))


class Untraceable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.router = Router()
        self.positions = Positions()
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.positions(self.router(self.inp(x))))


def _untraceable_inputs() -> torch.Tensor:
    return torch.ones(2, 5, 4)


# ----------------------------------------------------------------- fallback


def test_fallback_to_runtime(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    model = Untraceable()
    with pytest.raises(TracingError) as info:
        trace_execution_order(model, TracingConfig())
    failing = info.value.module_fqn
    assert failing == "router"

    # inputs chosen so that the data-dependent branch takes `up`
    with torch.no_grad():
        model.inp.weight.fill_(0.1)
        model.inp.bias.fill_(0.1)
    with caplog.at_level(logging.INFO, logger="tracing"):
        order = capture_execution_order(
            model, TracingConfig(), example_inputs=_untraceable_inputs()
        )
    assert order.method == "runtime"
    assert order.fallback_reason is not None
    assert order.fallback_reason.startswith("symbolic tracing failed in module 'router' (Router)")
    records = [r for r in caplog.records if r.name == "tracing.ladder"]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert "'router'" in records[0].getMessage()

    assert order.module_forward_order == [
        "",
        "inp",
        "router",
        "router.up",
        "positions",
        "positions.table",
        "out",
    ]
    assert order.param_forward_order == [
        "inp.weight",
        "inp.bias",
        "router.up.weight",
        "router.up.bias",
        "positions.table.weight",
        "out.weight",
        "out.bias",
    ]
    assert order.param_backward_order == [
        "out.bias",
        "out.weight",
        "positions.table.weight",
        "router.up.bias",
        "router.up.weight",
        "inp.bias",
        "inp.weight",
    ]
    assert "router.down.weight" in order.params  # unused, still listed


def test_untraceable_without_inputs_raises() -> None:
    with pytest.raises(
        TracingError,
        match=r"symbolic tracing failed in module 'router' \(Router\) and no example inputs.*"
        r"Pass example_inputs",
    ) as info:
        capture_execution_order(Untraceable(), TracingConfig())
    assert info.value.module_fqn == "router"
    assert isinstance(info.value.__cause__, TracingError)


def test_neither_config_nor_inputs_raises() -> None:
    with pytest.raises(TracingError, match="no tracing_config.*and no example_inputs"):
        capture_execution_order(Twice())


def test_traceable_with_config_is_symbolic() -> None:
    order = capture_execution_order(Twice(), TracingConfig(), example_inputs=torch.randn(3, 4))
    assert order.method == "symbolic"
    assert order.fallback_reason is None
    assert order.param_backward_order == []


def test_without_config_captures_at_run_time() -> None:
    class KW(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, y: torch.Tensor, *, flip: bool = False) -> torch.Tensor:
            return self.a(self.b(x + y)) if flip else self.b(self.a(x + y))

    x = torch.randn(3, 4)
    order = capture_execution_order(KW(), example_inputs=(x, x), example_kwargs={"flip": True})
    assert order.method == "runtime"
    assert order.fallback_reason is None
    assert order.module_forward_order == ["", "b", "a"]
    assert order.param_backward_order == ["a.bias", "a.weight", "b.bias", "b.weight"]
    order = capture_execution_order(
        Twice(), example_inputs=torch.randn(3, 4), backward=False
    )  # single tensor
    assert order.module_forward_order == ["", "fc", "fc", "out"]
    assert order.param_backward_order == []


# ------------------------------------------------------------------- parity


def _gpt(tie: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_blocks=2, tie_weights=tie)), (torch.zeros(2, 8, dtype=torch.long),)


PARITY_CASES: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "gpt_tied": lambda: _gpt(True),
    "gpt_untied": lambda: _gpt(False),
    "llama": lambda: (Llama(LlamaConfig(n_layers=2)), (torch.zeros(2, 8, dtype=torch.long),)),
    "issue_order": lambda: (IssueOrder(), (torch.randn(3, 4),)),
    "tied": lambda: (Tied(), (torch.tensor([[1, 2, 3]]),)),
    "twice": lambda: (Twice(), (torch.randn(3, 4),)),
    "root_functional": lambda: (RootFunctional(), (torch.randn(3, 4),)),
}


def _groups(order: ExecutionOrder) -> list[tuple[str, int, tuple[str, ...]]]:
    return [(u.module_fqn, u.call_index, u.param_fqns) for u in order.param_uses]


@pytest.mark.parametrize("case", sorted(PARITY_CASES))
def test_runtime_equals_symbolic_on_traceable_models(case: str) -> None:
    model, inputs = PARITY_CASES[case]()
    symbolic = trace_execution_order(model, TracingConfig())
    runtime = record_execution_order(model, *inputs)
    assert symbolic.method == "symbolic" and runtime.method == "runtime"
    assert runtime.module_forward_order == symbolic.module_forward_order
    assert runtime.param_forward_order == symbolic.param_forward_order
    assert runtime.shared_params == symbolic.shared_params
    assert runtime.params == symbolic.params
    assert runtime.module_classes == symbolic.module_classes
    # the same groups at the same calls; only the op label differs for leaf
    # modules ("call_module" symbolically, the torch op at run time)
    assert _groups(runtime) == _groups(symbolic)


def test_issue_order_exact() -> None:
    order = capture_execution_order(IssueOrder(), example_inputs=torch.randn(3, 4))
    assert order.param_forward_order == [
        "layer0.weight",
        "layer0.bias",
        "layer2.0.weight",
        "layer2.2.weight",
        "layer1.weight",
    ]
    assert order.param_backward_order == [
        "layer1.weight",
        "layer2.2.weight",
        "layer2.0.weight",
        "layer0.bias",
        "layer0.weight",
    ]
