import logging

import pytest
import torch
import torch.nn as nn

from execwrap.order.monitor import DriftEvent, OrderMonitor
from tracing.order import ExecutionOrder


class Switch(nn.Module):
    """a -> (b | c) -> d, the branch chosen by a flag on the model."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)
        self.d = nn.Linear(4, 4)
        self.use_c = False
        self.skip_d = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        x = self.c(x) if self.use_c else self.b(x)
        return x if self.skip_d else self.d(x)


REFERENCE = ExecutionOrder(module_forward_order=["", "a", "b", "d"], method="runtime")


def _step(model: nn.Module) -> None:
    model(torch.ones(2, 4)).sum().backward()


def test_no_events_while_order_is_stable() -> None:
    model = Switch()
    with OrderMonitor(model, REFERENCE) as monitor:
        for _ in range(3):
            _step(model)
    assert monitor.events == []
    assert monitor.iterations == 3


def test_first_deviation_warns_once_then_quiet_until_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = Switch()
    monitor = OrderMonitor(model, REFERENCE)
    caplog.set_level(logging.INFO, logger="execwrap.order.monitor")
    _step(model)  # iteration 0: as captured
    model.use_c = True
    _step(model)  # iteration 1: drift
    _step(model)  # iteration 2: same drift, quiet
    model.use_c = False
    _step(model)  # iteration 3: back to the reference
    model.skip_d = True
    _step(model)  # iteration 4: ends early
    monitor.remove()
    assert monitor.events == [
        DriftEvent(iteration=1, phase="train", index=2, expected="b", found="c"),
        DriftEvent(iteration=4, phase="train", index=3, expected="d", found=None),
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "execution order drift at iteration 1 (train forward): call 2 expected module 'b', found 'c'",
        "execution order drift at iteration 4 (train forward): call 3 expected module 'd', found <end of forward>",
    ]
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["execution order back to the reference at iteration 3 (train forward)"]


def test_extra_calls_are_drift() -> None:
    model = Switch()
    ref = ExecutionOrder(module_forward_order=["", "a", "b"], method="runtime")
    with OrderMonitor(model, ref) as monitor:
        _step(model)
    assert monitor.events == [DriftEvent(0, "train", 3, None, "d")]


def test_eval_passes_are_their_own_phase() -> None:
    model = Switch()
    with OrderMonitor(model, REFERENCE) as monitor:
        _step(model)
        model.eval()
        model.use_c = True  # the eval path differs from training: not drift
        with torch.no_grad():
            model(torch.ones(2, 4))
            model(torch.ones(2, 4))
        model.use_c = False
        with torch.no_grad():
            model(torch.ones(2, 4))  # differs from the first eval pass: eval drift
        model.train()
        _step(model)
    assert monitor.events == [DriftEvent(3, "eval", 2, "c", "b")]
    assert monitor.iterations == 5


def test_remove_leaves_no_hooks() -> None:
    model = Switch()
    monitor = OrderMonitor(model, REFERENCE)
    monitor.remove()
    monitor.remove()
    for m in model.modules():
        assert not m._forward_pre_hooks and not m._forward_hooks


def test_empty_order_is_rejected() -> None:
    with pytest.raises(ValueError, match="needs an order with module calls"):
        OrderMonitor(Switch(), ExecutionOrder(method="runtime"))
