"""Tests for timing capture: measured per-call times, saved activations, roofline estimates."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn as nn

from execwrap import ModuleWrapPolicy, plan_wrap, unit_compute
from execwrap.demo_models import Block, build_demo_model, demo_inputs
from tracing import ExecutionOrder, RuntimeRecorder, record_execution_order
from tracing.rates import ComputeRates
from tracing.runtime.estimate import tensor_traffic_bytes


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def test_measured_timing_fields() -> None:
    model = _mlp()
    order = record_execution_order(model, torch.randn(3, 4), timing=True)
    assert (order.timing_method, order.timing_device) == ("measured", "cpu")
    assert order.has_timing
    n = len(order.module_forward_order)
    assert n == 4
    assert (
        len(order.forward_times_s) == len(order.forward_start_s) == len(order.backward_start_s) == n
    )
    assert order.forward_start_s[0] == 0.0
    assert order.forward_start_s == sorted(order.forward_start_s)
    root = order.forward_times_s[0]
    assert all(0 <= t <= root for t in order.forward_times_s)
    ends = [s + d for s, d in zip(order.forward_start_s, order.forward_times_s, strict=True)]
    assert all(e <= ends[0] + 1e-9 for e in ends)  # nested inside the root call
    assert all(b is not None and b >= ends[0] for b in order.backward_start_s)
    assert order.backward_end_s is not None
    assert order.backward_end_s >= max(b for b in order.backward_start_s if b is not None)
    assert set(order.backward_times_s) == {"", "0", "1", "2"}
    # ReLU saves its output (3x8 float32), the first Linear its input (3x4); the second
    # Linear's input is the ReLU output, already counted; weights are parameters
    assert order.saved_activation_bytes == [0, 48, 96, 0]


def test_timing_changes_nothing() -> None:
    x = torch.randn(3, 4)
    plain, timed = _mlp(), _mlp()
    plain(x).sum().backward()
    record_execution_order(timed, x, timing=True)
    assert all(p.grad is None for p in timed.parameters())  # grads put back
    timed(x).sum().backward()
    for a, b in zip(plain.parameters(), timed.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)
    for m in timed.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks


def test_runtime_recorder_times_the_users_step() -> None:
    model = build_demo_model(n_blocks=2)
    x = demo_inputs(model)
    with RuntimeRecorder(model, timing=True) as rec:
        model(x).sum().backward()
    order = rec.order
    assert order.timing_method == "measured"
    assert len(order.forward_times_s) == len(order.module_forward_order)
    assert len(order.saved_activation_bytes) == len(order.module_forward_order)
    assert sum(order.saved_activation_bytes) > 0
    assert order.backward_times_s["blocks.1"] > 0
    loaded = ExecutionOrder.from_dict(order.to_dict())
    assert loaded == order


def test_estimated_timing_on_meta_is_a_roofline() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 8, bias=False))
    # forward: mm (3x4) @ (4x8): 192 FLOPs -> 1 s at 192 FLOP/s; reads 48 + 128 bytes and
    # writes 96: 272 bytes -> 2 s at 136 bytes/s; the roofline takes the larger, + 0.25 s per op
    rates = ComputeRates("cpu", flops_per_s=192.0, memory_bytes_per_s=136.0, op_overhead_s=0.25)
    order = record_execution_order(model, torch.randn(3, 4, device="meta"), timing=rates)
    assert (order.timing_method, order.timing_device) == ("estimated", "cpu")
    assert order.forward_times_s == pytest.approx([2.25, 2.25])
    # the loss: sum (96 + 4 bytes) then ones_like (4 + 4 bytes) before backward reaches the model
    assert order.backward_start_s[0] == pytest.approx(2.25 + (100 / 136 + 0.25) + (8 / 136 + 0.25))
    assert order.saved_activation_bytes == [0, 48]


def test_timing_true_on_meta_asks_for_rates() -> None:
    with torch.device("meta"):
        model = nn.Linear(4, 4)
    with pytest.raises(
        ValueError, match=r"timing=True needs real tensors.*timing=cost_model\.compute"
    ):
        record_execution_order(model, torch.randn(2, 4, device="meta"), timing=True)
    with pytest.raises(
        TypeError, match=r"timing must be True, False or a tracing\.rates\.ComputeRates"
    ):
        RuntimeRecorder(model, timing="yes")  # type: ignore[arg-type]


def test_traffic_counts_broadcast_dimensions_once() -> None:
    x = torch.zeros(4, 1).expand(4, 8)
    assert tensor_traffic_bytes([x, [torch.zeros(2)], 3]) == 4 * 4 + 2 * 4


def test_unit_compute_attributes_segments_to_units() -> None:
    model = build_demo_model(n_blocks=2)
    order = ExecutionOrder.from_dict(record_execution_order(model, demo_inputs(model)).to_dict())
    calls = order.module_forward_order
    n = len(calls)
    assert calls[:3] == ["", "wte", "blocks.0"]
    # a synthetic clock: every call starts 1 s after the previous one and calls are leaves,
    # except the root (spans all) and the blocks (span their submodules)
    block0 = [i for i, f in enumerate(calls) if f == "blocks.0" or f.startswith("blocks.0.")]
    block1 = [i for i, f in enumerate(calls) if f == "blocks.1" or f.startswith("blocks.1.")]
    starts = [float(i) for i in range(n)]
    durations = [1.0] * n
    durations[0] = float(n)  # the root: until the end
    durations[block0[0]] = float(len(block0))
    durations[block1[0]] = float(len(block1))
    timed = ExecutionOrder.from_dict(
        {
            **order.to_dict(),
            "forward_times_s": durations,
            "forward_start_s": starts,
            # backward in reverse call order, 2 s per call, then the end
            "backward_start_s": [float(n + 2 * (n - 1 - i)) for i in range(n)],
            "backward_end_s": float(3 * n),
            "saved_activation_bytes": [1] * n,
            "timing_device": "cpu",
            "timing_method": "measured",
        }
    )
    plan = plan_wrap(model, timed, ModuleWrapPolicy({Block}))
    assert plan.groups == [[""], ["blocks.0"], ["blocks.1"]]
    c = unit_compute(plan)
    root_calls = n - len(block0) - len(block1)
    assert c.forward_s == pytest.approx((root_calls, len(block0), len(block1)))
    # the root's head (root call's own first second + wte) runs before the blocks
    tail = n - (block1[-1] + 1)
    assert c.forward_tail_s == pytest.approx((tail, 0.0, 0.0))
    assert c.backward_s == pytest.approx((2 * root_calls, 2 * len(block0), 2 * len(block1)))
    assert c.backward_tail_s[0] == pytest.approx(2 * 2)  # wte and the root call, last in backward
    assert c.activation_bytes == (root_calls, len(block0), len(block1))
    assert (c.method, c.device_type) == ("measured", "cpu")


def test_estimated_timing_under_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    rates = ComputeRates("cuda", flops_per_s=192.0, memory_bytes_per_s=136.0, op_overhead_s=0.25)
    with FakeTensorMode():
        model = nn.Sequential(nn.Linear(4, 8, bias=False))
        order = record_execution_order(model, torch.randn(3, 4), timing=rates)
        with pytest.raises(ValueError, match="timing=True needs real tensors"):
            record_execution_order(model, torch.randn(3, 4), timing=True)
    assert (order.timing_method, order.timing_device) == ("estimated", "cuda")
    assert order.forward_times_s == pytest.approx([2.25, 2.25])
    assert order.saved_activation_bytes == [0, 48]


class _Stall(nn.Module):
    """Sleeps for the next of ``delays`` (seconds) on each forward."""

    def __init__(self, delays: list[float]) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.delays = delays

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delays.pop(0))
        return self.fc(x)


def test_a_disturbed_timing_step_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    # the recorded step, then three timed steps: the last one stalls for 60 ms
    model = _Stall([0.0, 0.0, 0.0, 0.06])
    with caplog.at_level("WARNING", logger="tracing.runtime.record"):
        order = record_execution_order(model, torch.randn(2, 4), timing=True)
    assert order.has_timing and model.delays == []
    (record,) = caplog.records
    assert record.getMessage().startswith("record_execution_order: the 3 timed steps took ")
    assert record.getMessage().endswith(
        "the machine may be busy. The median step is kept; time again on a quiet machine "
        "before planning from these times"
    )
    assert order.forward_times_s[0] < 0.03  # the median step, not the stalled one


class _Attention(nn.Module):
    """qkv projection and causal attention, ``dropout_p`` on the attention weights."""

    def __init__(self, dropout_p: float = 0.0) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48, bias=False)
        self.dropout_p = dropout_p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(1, 16, 3, 2, 8).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout_p
        )


@pytest.mark.parametrize("dropout_p", [0.0, 0.1], ids=["fused", "dropout"])
def test_attention_on_meta_is_estimated_like_on_cpu(dropout_p: float) -> None:
    """On meta, ``scaled_dot_product_attention`` runs the kernel a CPU would choose:
    fused without dropout (saving q, k, v, the output and its log-sum-exp, not the
    16 x 16 attention weights of each head), the math path with dropout."""
    rates = ComputeRates("cpu", flops_per_s=1e9, memory_bytes_per_s=1e9, op_overhead_s=1e-6)
    orders = {}
    for device in ("cpu", "meta"):
        torch.manual_seed(0)
        with torch.device(device):
            model = _Attention(dropout_p)
        x = torch.randn(1, 16, 16).to(device)
        orders[device] = record_execution_order(model, x, timing=rates)
    cpu, meta = orders["cpu"], orders["meta"]
    assert meta.saved_activation_bytes == cpu.saved_activation_bytes
    assert meta.forward_times_s == pytest.approx(cpu.forward_times_s, rel=1e-12)
    assert meta.backward_times_s == pytest.approx(cpu.backward_times_s, rel=1e-12)
    # the qkv call saves x (1024 bytes); the root saves the qkv output (3072, one storage for
    # q, k and v) and, fused, the output (1024) and log-sum-exp (128): 4224; the math path
    # also saves the decomposition's scaled operands, attention weights and dropout mask
    assert meta.saved_activation_bytes == {0.0: [4224, 1024], 0.1: [11264, 1024]}[dropout_p]


class _Scale(nn.Module):
    """``w * x``: with ``x`` and the loss's scale at 1e-20, ``w``'s gradient is 1e-40."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w * x


def test_denormal_gradients_are_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    flushing = torch.set_flush_denormal(False)  # torch's default; True where supported
    model = _Scale()
    with caplog.at_level("WARNING", logger="tracing.runtime.record"):
        order = record_execution_order(
            model, torch.full((4,), 1e-20), timing=True, loss_fn=lambda out: out.sum() * 1e-20
        )
    assert order.has_timing and model.w.grad is None  # the model as before
    assert flushing
    (record,) = caplog.records
    assert record.getMessage() == (
        "record_execution_order: 4 gradient elements are denormal (nonzero, below their "
        "dtype's smallest normal number; most in 'w': 4); a CPU computes such values "
        "several times slower, so the measured times may be too long. Call "
        "torch.set_flush_denormal(True) and record again (GPUs compute them at full speed)"
    )


def test_flushed_denormals_are_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    torch.set_flush_denormal(True)
    try:
        with caplog.at_level("WARNING", logger="tracing.runtime.record"):
            record_execution_order(
                _Scale(), torch.full((4,), 1e-20), timing=True, loss_fn=lambda o: o.sum() * 1e-20
            )
    finally:
        torch.set_flush_denormal(False)
    assert caplog.records == []
