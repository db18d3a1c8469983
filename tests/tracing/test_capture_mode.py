"""The mode of a capture (schema 3: ``training``, ``grad_enabled``) and the calls that
are not part of the recorded step (``tracing.runtime.step_calls``)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn

from tracing import ExecutionOrder, RuntimeRecorder, record_execution_order, trace_execution_order
from tracing.runtime.step_calls import NO_AUTOGRAD_WARNING


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class Head(nn.Module):
    """``generate``: three decoding calls of the model under ``torch.no_grad()``."""

    def __init__(self) -> None:
        super().__init__()
        self.net = Net()
        self.c = nn.Linear(2, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @torch.no_grad()
    def generate(self, x: torch.Tensor, steps: int = 3) -> torch.Tensor:
        for _ in range(steps):
            x = self.c(self(x))
        return x


def _x() -> torch.Tensor:
    return torch.ones(2, 4)


def test_a_training_capture_records_its_mode() -> None:
    order = record_execution_order(Net(), _x())
    assert (order.training, order.grad_enabled) == (True, True)
    assert order.param_backward_order == ["b.bias", "b.weight", "a.bias", "a.weight"]
    assert order.warnings == []


def test_a_capture_without_autograd_has_no_backward_order_and_says_why() -> None:
    with torch.inference_mode():
        order = record_execution_order(Net(), _x())
    assert (order.training, order.grad_enabled) == (True, False)
    assert order.param_backward_order == []
    assert order.warnings == [NO_AUTOGRAD_WARNING]
    assert NO_AUTOGRAD_WARNING.startswith(
        "recorded without autograd (under torch.no_grad() or torch.inference_mode()): no "
        "backward ran, so the order has no backward order"
    )


def test_symbolic_capture_records_the_training_flag_only() -> None:
    order = trace_execution_order(Net().eval())
    assert (order.training, order.grad_enabled) == (None, None)


def test_a_generate_loop_is_kept_out_of_the_training_order() -> None:
    model = Head()
    with RuntimeRecorder(model) as rec:
        model(_x()).sum().backward()  # the step
        model.generate(_x())  # three calls of the root without autograd, and 3 of c
    order = rec.order
    assert order.module_forward_order == ["", "net", "net.a", "net.b"]
    assert order.module_call_depths == [0, 1, 2, 2]
    assert order.param_forward_order == ["net.a.weight", "net.a.bias", "net.b.weight", "net.b.bias"]
    assert [u.call_index for u in order.param_uses] == [2, 3]
    assert (order.training, order.grad_enabled) == (True, True)
    assert order.warnings == [
        "15 forward call(s) outside the training step were left out of the order (a generate "
        "loop or an evaluation pass, say): the root module <root> called without autograd (3 "
        "times); module 'c' called without autograd (3 times). The order holds the 4 call(s) "
        "made in training mode with autograd on"
    ]


def test_an_evaluation_pass_before_the_step_is_kept_out_with_its_timing() -> None:
    model = Net()
    with RuntimeRecorder(model, timing=True) as rec:
        model.eval()
        with torch.no_grad():
            model(_x())  # evaluation first
        model.train()
        model(_x()).sum().backward()
    order = rec.order
    assert order.module_forward_order == ["", "a", "b"]
    assert len(order.forward_times_s) == len(order.saved_activation_bytes) == 3
    assert order.forward_start_s[0] == 0.0  # counted from the first call kept
    assert order.backward_end_s is not None and order.backward_end_s > 0
    assert order.warnings[0].startswith(
        "3 forward call(s) outside the training step were left out of the order (a generate "
        "loop or an evaluation pass, say): the root module <root> called in eval mode without "
        "autograd (1 time)."
    )


def test_an_inference_capture_keeps_every_call() -> None:
    model = Head().eval()
    with RuntimeRecorder(model) as rec:
        model.generate(_x(), steps=2)
    assert rec.order.module_forward_order == ["", "net", "net.a", "net.b", "c"] * 2
    assert (rec.order.training, rec.order.grad_enabled) == (False, False)
    assert rec.order.warnings == [NO_AUTOGRAD_WARNING]


def test_mode_fields_round_trip_and_version_2_files_load(tmp_path: Path) -> None:
    order = record_execution_order(Net().eval(), _x())
    assert (order.training, order.grad_enabled) == (False, True)
    loaded = ExecutionOrder.load(order.save(tmp_path / "o.json"))
    assert loaded == order
    data = order.to_dict()
    data["schema_version"] = 2
    del data["training"], data["grad_enabled"]
    (tmp_path / "v2.json").write_text(json.dumps(data))
    old = ExecutionOrder.load(tmp_path / "v2.json")
    assert (old.training, old.grad_enabled) == (None, None)
    assert old.module_forward_order == order.module_forward_order
