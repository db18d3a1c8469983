"""RuntimeRecorder on models already wrapped by FSDP1 / FSDP2 (2 gloo ranks, CPU).

The recorder must report the original model's FQNs: the same orders as on the
unwrapped model. One spawn of 2 ranks records all four wrappings in turn (each on
its own model), and each test checks one of them.
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
from tracing import ExecutionOrder, RuntimeRecorder, record_execution_order

_FIELDS = (
    "module_forward_order",
    "param_forward_order",
    "param_backward_order",
    "module_backward_order",
    "recompute_order",
    "shared_params",
    "module_classes",
)


def _model() -> tuple[GPT, torch.Tensor]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_blocks=2, dim=32, n_heads=2, vocab_size=64, max_seq_len=16))
    return model, torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


def _summary(order: ExecutionOrder) -> dict[str, Any]:
    out: dict[str, Any] = {f: getattr(order, f) for f in _FIELDS}
    out["params"] = {k: (v.numel, v.shape) for k, v in order.params.items()}
    out["groups"] = [(u.module_fqn, u.call_index, u.param_fqns) for u in order.param_uses]
    return out


def _hooks(model: nn.Module) -> list[tuple[int, ...]]:
    """The hook ids on every module and parameter (FSDP2 installs its own)."""
    out = [
        (*m._forward_hooks, -1, *m._forward_pre_hooks, -2, *m._backward_hooks)
        for m in model.modules()
    ]
    out += [tuple(p._post_accumulate_grad_hooks or ()) for p in model.parameters()]
    return out


def _record_wrapped(wrapped: nn.Module, idx: torch.Tensor) -> ExecutionOrder:
    before = _hooks(wrapped)
    with RuntimeRecorder(wrapped) as rec:
        wrapped(idx).sum().backward()
    assert _hooks(wrapped) == before  # only the wrapper's own hooks remain
    assert torch.overrides._get_current_function_mode_stack() == []
    return rec.order


def _fsdp1_worker(rank: int, world_size: int, use_orig_params: bool) -> dict[str, Any]:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model, idx = _model()
    reference = record_execution_order(copy.deepcopy(model), idx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = FSDP(
            model,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            use_orig_params=use_orig_params,
            device_id=torch.device("cpu"),
        )
        order = _record_wrapped(wrapped, idx)
    return {"reference": _summary(reference), "wrapped": _summary(order)}


def _fsdp2_worker(rank: int, world_size: int, checkpoint: bool) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, idx = _model()
    reference = record_execution_order(copy.deepcopy(model), idx)
    if checkpoint:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing,
        )

        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Block))
    mesh = init_device_mesh("cpu", (world_size,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    order = _record_wrapped(model, idx)
    return {"reference": _summary(reference), "wrapped": _summary(order)}


def _all_worker(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    return {
        "fsdp1_orig": _fsdp1_worker(rank, world_size, True),
        "fsdp1_flat": _fsdp1_worker(rank, world_size, False),
        "fsdp2": _fsdp2_worker(rank, world_size, False),
        "fsdp2_checkpoint": _fsdp2_worker(rank, world_size, True),
    }


@pytest.fixture(scope="module")
def wrapped_results() -> dict[str, list[dict[str, Any]]]:
    """Case -> ``[rank 0's result, rank 1's]``, from one spawn of 2 ranks."""
    results = run_ranks(_all_worker, world_size=2)
    return {case: [r[case] for r in results] for case in results[0]}


def _assert_same(result: dict[str, Any], *, skip: tuple[str, ...] = ()) -> None:
    ref, got = result["reference"], result["wrapped"]
    for key in ref:
        if key not in skip:
            assert got[key] == ref[key], key


def _unit_completion(param_order: list[str]) -> list[str]:
    """FSDP units (blocks.0, blocks.1, root "") in the order their last gradient is ready."""
    last: dict[str, int] = {}
    for i, fqn in enumerate(param_order):
        unit = ".".join(fqn.split(".")[:2]) if fqn.startswith("blocks.") else ""
        last[unit] = i
    return sorted(last, key=last.__getitem__)


def test_fsdp1_use_orig_params(wrapped_results: dict[str, list[dict[str, Any]]]) -> None:
    results = wrapped_results["fsdp1_orig"]
    for result in results:
        # FSDP1 runs forward on views of its FlatParameter: the recorder hooks
        # each view's gradient, whose timing autograd schedules by the view's
        # creation (unshard) order, so within a unit the order can differ from
        # the unwrapped model's; per FSDP unit it is the same.
        _assert_same(result, skip=("param_backward_order", "module_backward_order"))
        ref, got = result["reference"], result["wrapped"]
        assert sorted(got["param_backward_order"]) == sorted(ref["param_backward_order"])
        assert _unit_completion(got["param_backward_order"]) == ["blocks.1", "blocks.0", ""]
        assert _unit_completion(ref["param_backward_order"]) == ["blocks.1", "blocks.0", ""]
    assert results[0]["wrapped"] == results[1]["wrapped"]


def test_fsdp1_flat_params(wrapped_results: dict[str, list[dict[str, Any]]]) -> None:
    """use_orig_params=False: modules by original FQN, parameters as FlatParameters."""
    results = wrapped_results["fsdp1_flat"]
    for result in results:
        ref, got = result["reference"], result["wrapped"]
        assert got["module_forward_order"] == ref["module_forward_order"]
        assert got["module_classes"] == ref["module_classes"]
        assert list(got["params"]) == [
            "_flat_param",
            "blocks.0._flat_param",
            "blocks.1._flat_param",
        ]
        assert got["param_forward_order"] == []
        assert sorted(got["param_backward_order"]) == sorted(got["params"])


def test_fsdp2(wrapped_results: dict[str, list[dict[str, Any]]]) -> None:
    for result in wrapped_results["fsdp2"]:
        _assert_same(result)


def test_fsdp2_with_checkpoint_wrapper(wrapped_results: dict[str, list[dict[str, Any]]]) -> None:
    for result in wrapped_results["fsdp2_checkpoint"]:
        ref, got = result["reference"], result["wrapped"]
        _assert_same(result, skip=("recompute_order",))
        # recomputation runs in backward order: block 1's calls, then block 0's
        calls = ref["module_forward_order"]
        block1 = [f for f in calls if f.startswith("blocks.1")]
        block0 = [f for f in calls if f.startswith("blocks.0")]
        assert got["recompute_order"] == block1 + block0
        assert got["module_classes"]["blocks.0"] == "Block"
