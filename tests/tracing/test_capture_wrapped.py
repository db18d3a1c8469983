"""Capture of a model already wrapped by FSDP1 / FSDP2 (2 gloo ranks, CPU).

Symbolic tracing would run the wrapper's forward with Proxies and leave it
unusable (FSDP1: ``'Sequential' object has no attribute '_unshard_stream'``;
FSDP2: ``FSDP state has already been lazily initialized``). Capture must
refuse before anything changes, or record a real step with the original FQNs;
either way the model trains afterwards exactly like an untouched copy. One spawn
of 2 ranks runs both wrappers in turn (each on its own model).
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
import torch.nn as nn

from execwrap.demo_models import GPT, Block, GPTConfig
from tests._dist import run_ranks
from tracing import TracingConfig, TracingError, capture_execution_order, trace_execution_order


def _model() -> tuple[GPT, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_blocks=2, dim=32, n_heads=2, vocab_size=64, max_seq_len=16))
    return model, torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


def _wrap(model: nn.Module, kind: str, world_size: int) -> nn.Module:
    if kind == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return FSDP(
                model,
                auto_wrap_policy=ModuleWrapPolicy({Block}),
                use_orig_params=True,
                device_id=torch.device("cpu"),
            )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _loss_after_steps(model: nn.Module, idx: torch.Tensor) -> float:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.zeros(())
    for _ in range(2):
        opt.zero_grad()
        loss = model(idx).float().pow(2).mean()
        loss.backward()
        opt.step()
    return float(loss)


def _worker(rank: int, world_size: int, kind: str) -> dict[str, Any]:
    model, idx = _model()
    reference = _wrap(copy.deepcopy(model), kind, world_size)
    wrapped = _wrap(model, kind, world_size)
    refused = ""
    try:
        trace_execution_order(wrapped, TracingConfig())
    except TracingError as e:
        refused = str(e)
    try:
        capture_execution_order(wrapped, TracingConfig())
    except TracingError as e:
        refused_without_inputs = str(e)
    order = capture_execution_order(wrapped, TracingConfig(), example_inputs=idx)
    return {
        "refused": refused,
        "refused_without_inputs": refused_without_inputs,
        "step": order.capture_step,
        "calls": order.module_forward_order[:4],
        "reason": order.fallback_reason,
        "losses": (_loss_after_steps(wrapped, idx), _loss_after_steps(reference, idx)),
    }


def _both_worker(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    return {kind: _worker(rank, world_size, kind) for kind in ("fsdp1", "fsdp2")}


@pytest.fixture(scope="module")
def wrapped_results() -> dict[str, list[dict[str, Any]]]:
    """Wrapper -> ``[rank 0's result, rank 1's]``, from one spawn of 2 ranks."""
    results = run_ranks(_both_worker, world_size=2)
    return {kind: [r[kind] for r in results] for kind in results[0]}


def _check(results: list[dict[str, Any]], label: str) -> None:
    for result in results:
        assert result["refused"].startswith(
            f"symbolic tracing refused: the root module <root> (GPT) is wrapped by {label}. "
            "Tracing runs the wrapper's forward with Proxies"
        )
        assert result["refused_without_inputs"].startswith(
            f"cannot capture the execution order: the root module <root> (GPT) is wrapped by "
            f"{label}, and symbolic or zero-cost capture would run the wrapper's forward"
        )
        assert result["step"] == "runtime"
        assert result["calls"] == ["", "wte", "blocks.0", "blocks.0.ln1"]  # original FQNs
        assert result["reason"] == (
            f"symbolic and zero-cost runtime capture skipped: the root module <root> (GPT) is "
            f"wrapped by {label}, whose forward cannot run on Proxies or fake tensors; capture "
            "before wrapping to avoid a real step"
        )
        captured, untouched = result["losses"]
        assert captured == untouched  # the wrapped model trains as if never captured


def test_fsdp1_wrapped_model_is_refused_or_recorded_and_still_trains(
    wrapped_results: dict[str, list[dict[str, Any]]],
) -> None:
    _check(wrapped_results["fsdp1"], "FSDP1 (FullyShardedDataParallel)")


def test_fsdp2_wrapped_model_is_refused_or_recorded_and_still_trains(
    wrapped_results: dict[str, list[dict[str, Any]]],
) -> None:
    _check(wrapped_results["fsdp2"], "FSDP2 (fully_shard)")
