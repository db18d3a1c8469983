"""Tests for what activation checkpointing keeps per unit, from an estimated capture.

The demo Llama (dim 64, MLP 172, 4 heads) on a batch of 2 x 16 tokens, float32:
each block's input is 2 x 16 x 64 x 4 = 8192 bytes; its matmuls, in order, are
``wq``, ``wk``, ``wv`` (8192 bytes each), ``wo`` (8192), ``w1``, ``w3`` (22016)
and ``w2`` (8192); its fused attention returns 8192 bytes and a 512-byte log-sum-exp.
"""

from __future__ import annotations

import pytest
import torch

from execwrap import ModuleWrapPolicy, plan_wrap
from execwrap.demo_models import Llama, LlamaBlock, LlamaConfig
from execwrap.simulate import unit_compute
from execwrap.simulate.checkpointing import checkpoint_facts
from tracing import record_execution_order
from tracing.rates import ComputeRates


def _plan(device: str = "cuda"):  # type: ignore[no-untyped-def]
    with torch.device("meta"):
        model = Llama(LlamaConfig(n_layers=2))
    tokens = torch.zeros(2, 16, dtype=torch.long, device="meta")
    order = record_execution_order(model, tokens, timing=ComputeRates(device, 1e9, 1e9))
    return plan_wrap(model, order, ModuleWrapPolicy({LlamaBlock}))


def test_full_keeps_the_block_input_and_selective_every_other_mm() -> None:
    plan = _plan()  # for a GPU: the meta capture's attention kernel stands for CUDA's
    c = unit_compute(plan)
    assert [u.label for u in plan.units] == ["<root>", "layers.0", "layers.1"]
    assert c.checkpoint_bytes == (0, 8192, 8192)
    # the input, wq, wv, w1, w2 (the 1st, 3rd, 5th and 7th mm) and the attention's outputs
    assert c.selective_bytes[1:] == (8192 + 8192 + 8192 + 22016 + 8192 + 8704,) * 2
    ops = [op for op in plan.order.compute_ops if op.call_index in range(4, 15)]
    kept = [op for op in ops if op.op != "mm"] + [
        op for k, op in enumerate(o for o in ops if o.op == "mm") if k % 2 == 0
    ]
    assert c.selective_saved_s[1] == pytest.approx(sum(op.seconds for op in kept))
    assert c.selective_saved_s[1] < c.forward_s[1]


def test_each_block_counts_the_ops_and_the_region_calls_it_checkpoints() -> None:
    """A block's region is its own call; its ops are those of every call inside it: the
    block's 2, the norms' 6 each, the attention's 9, 4 per linear (7 of them), the
    feed-forward's 2 (the capture counts them: tracing's forward_op_counts)."""
    c = unit_compute(_plan())
    assert c.checkpoint_regions == (1, 1, 1)
    assert c.checkpoint_ops[1:] == (2 + 6 + 9 + 6 + 2 + 4 * 7,) * 2 == (53, 53)
    merged = c.merge([[0], [1, 2]])
    assert (merged.checkpoint_ops[1], merged.checkpoint_regions[1]) == (106, 2)


def test_a_cpu_step_recomputes_the_cpu_attention_kernel() -> None:
    """torchtitan's save list has the CUDA attention kernels, not the CPU's."""
    c = unit_compute(_plan("cpu"))
    assert c.selective_bytes[1:] == (8192 + 8192 + 8192 + 22016 + 8192,) * 2


def test_no_checkpointing_facts_without_recorded_inputs() -> None:
    plan = _plan()
    plan.order.input_activation_bytes = []
    assert checkpoint_facts(plan, [0] * len(plan.order.module_forward_order)) is None
    assert unit_compute(plan).checkpoint_bytes == ()
