"""Tests for what an estimated capture records for the training step: compute ops,
region inputs, transient memory, and the capture "as if" in another dtype.

The model is ``Linear(8, 16) -> ReLU -> Linear(16, 8)`` (no bias) on a batch of 4,
on the meta device: calls ``""`` (0), ``"0"`` (1), ``"1"`` (2), ``"2"`` (3). In
float32 its activations are 128 bytes (4 x 8) and 256 bytes (4 x 16).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tracing import ExecutionOrder, record_execution_order, record_zero_cost
from tracing.compute_op import ComputeOp
from tracing.rates import ComputeRates
from tracing.runtime.estimate import causal_fraction
from tracing.runtime.precision import cast_parameters

RATES = ComputeRates("cpu", 1e9, 1e9)


def _mlp() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 8, bias=False))


def _order(dtype: torch.dtype | None = None) -> ExecutionOrder:
    x = torch.empty(4, 8, device="meta")
    return record_execution_order(_mlp(), x, timing=RATES, param_dtype=dtype)


def test_float32_capture_records_matmuls_inputs_and_transients() -> None:
    order = _order()
    assert order.param_dtype == ""
    assert order.compute_ops == [
        ComputeOp(1, "mm", 256, pytest.approx(1.024e-6)),  # (4x8 @ 8x16): 1024 FLOPs, 1 us/op
        ComputeOp(3, "mm", 128, pytest.approx(1.024e-6)),
    ]
    assert order.input_activation_bytes == [128, 128, 256, 256]
    assert order.saved_activation_bytes == [0, 128, 256, 0]
    # the first mm's output until ReLU has used it; ReLU's own input while it runs (its
    # output is saved); the second mm's output; the root: the output and the loss's scalars
    assert order.forward_transient_bytes == [132, 256, 256, 128]
    assert order.backward_transient_bytes == [776, 776, 520, 0]


def test_bfloat16_capture_halves_every_activation_and_keeps_param_dtypes() -> None:
    fp32, bf16 = _order(), _order(torch.bfloat16)
    assert bf16.param_dtype == "bfloat16"
    assert {info.dtype for info in bf16.params.values()} == {"float32"}
    assert bf16.param_backward_order == fp32.param_backward_order == ["2.weight", "0.weight"]
    assert [op.output_bytes for op in bf16.compute_ops] == [128, 64]
    for name in (
        "saved_activation_bytes",
        "input_activation_bytes",
        "forward_transient_bytes",
        "backward_transient_bytes",
    ):
        assert getattr(bf16, name) == [b // 2 for b in getattr(fp32, name)], name


def test_bfloat16_capture_leaves_the_model_as_it_was() -> None:
    model = _mlp()
    before = [(n, p) for n, p in model.named_parameters()]
    record_execution_order(
        model, torch.empty(4, 8, device="meta"), timing=RATES, param_dtype=torch.bfloat16
    )
    assert [(n, p) for n, p in model.named_parameters()] == before
    assert all(p.dtype == torch.float32 and p.grad is None for _, p in before)


def test_zero_cost_capture_in_bfloat16() -> None:
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 8, bias=False))
    order = record_zero_cost(model, torch.randn(4, 8), param_dtype=torch.bfloat16)
    assert order.param_dtype == "bfloat16" and order.zero_cost
    assert order.param_backward_order == ["2.weight", "0.weight"]
    assert model[0].weight.dtype == torch.float32


def test_cast_parameters_keeps_tied_weights_tied() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    with cast_parameters(model, torch.float16):
        assert model[1].weight is model[0].weight
        assert model[0].weight.dtype == torch.float16
    assert model[1].weight is model[0].weight and model[0].weight.dtype == torch.float32


def test_param_dtype_must_be_a_floating_dtype() -> None:
    with pytest.raises(TypeError, match=r"param_dtype must be None or a floating-point"):
        record_execution_order(_mlp(), torch.empty(4, 8, device="meta"), param_dtype=torch.int8)
    with pytest.raises(TypeError, match=r"record_zero_cost: param_dtype must be None"):
        record_zero_cost(nn.Linear(2, 2), torch.randn(1, 2), param_dtype="bf16")  # type: ignore[arg-type]


def test_each_call_counts_the_ops_its_own_forward_dispatched() -> None:
    """Linear without bias on a 2-D input: ``t`` (a view) and ``mm``; ReLU: ``relu``; the
    root: the default loss (``sum``) and ``ones_like`` (the loss's gradient), which run
    before the first backward. Estimated on the meta device and measured on the CPU alike."""
    assert _order().forward_op_counts == [2, 2, 1, 2]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 8, bias=False))
    measured = record_execution_order(model, torch.randn(4, 8), timing=True)
    assert measured.forward_op_counts == [2, 2, 1, 2]
    assert record_execution_order(model, torch.randn(4, 8)).forward_op_counts == []


def test_op_counts_need_one_entry_per_call() -> None:
    data = _order().to_dict()
    data["forward_op_counts"] = [2, 2]
    with pytest.raises(Exception, match=r"forward_op_counts: has 2 entries for 4 calls"):
        ExecutionOrder.from_dict(data)


def test_compute_ops_and_transients_round_trip_as_json() -> None:
    order = _order(torch.bfloat16)
    again = ExecutionOrder.from_dict(order.to_dict())
    assert again == order
    assert again.compute_ops[0] == ComputeOp(1, "mm", 128, order.compute_ops[0].seconds)


def test_causal_attention_counts_the_kept_half() -> None:
    q = torch.empty(1, 2, 8, 4, device="meta")
    fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    assert causal_fraction(fwd, (q, q, q), {"is_causal": True}) == 36 / 64
    assert causal_fraction(fwd, (q, q, q, 0.0, False), {}) == 1.0
    short = torch.empty(1, 2, 2, 4, device="meta")  # 2 queries, 8 keys: rows keep 1 and 2
    assert causal_fraction(fwd, (short, q, q, 0.0, True), {}) == 3 / 16


def test_attention_runs_at_its_own_rate_per_dtype() -> None:
    with torch.device("meta"):
        q = torch.empty(1, 2, 64, 16, requires_grad=True)
    flops = 4 * 2 * 64 * 64 * 16  # two matmuls of the score matrix, 2 FLOPs a multiply-add
    rates = ComputeRates(
        "cpu", 1.0, 1e30, attention_flops_per_s={"float32": 1.0}, matmul_flops_per_s={}
    )

    class Attend(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(x, x, x, is_causal=True)

    order = record_execution_order(Attend(), q, timing=rates, backward=False)
    assert order.forward_times_s[0] == pytest.approx(flops * (65 / 128))
    assert [op.op for op in order.compute_ops] == ["_scaled_dot_product_flash_attention_for_cpu"]
