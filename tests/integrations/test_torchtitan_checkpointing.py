"""execwrap's selective checkpointing decides as torchtitan's ``SelectiveAC`` does.

One process, no sharding: a Llama block (bias-free linears: ``aten.mm``) and a GPT block
(linears with bias: ``aten.addmm``) run forward and backward under
``create_selective_checkpoint_contexts`` once with
:func:`execwrap.selective_checkpoint_policy` and once with the policy torchtitan's
``SelectiveAC._wrap_block`` builds (torchtitan 0.3,
``torchtitan/distributed/activation_checkpoint.py``), each wrapped to record its
decision per op. The two records are equal, op by op.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from execwrap import selective_checkpoint_policy
from execwrap.demo_models import Block, LlamaBlock, LlamaConfig

pytest.importorskip("triton")
pytest.importorskip("torchtitan")


def _torchtitan_policy() -> Any:
    """A fresh policy of torchtitan's SelectiveAC (no MoE router shapes to force)."""
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    config = SelectiveAC.Config(force_recompute_mm_shapes_by_fqns=[])
    wrapper = SelectiveAC(config)._wrap_block(nn.Linear(1, 1))
    forward_context, _ = wrapper.checkpoint_fn.keywords["context_fn"]()
    return forward_context.policy_fn


def _decisions(block: nn.Module, x: torch.Tensor, make_policy: Any) -> list[tuple[str, str]]:
    record: list[tuple[str, str]] = []

    def context_fn() -> Any:
        policy = make_policy()

        def recording(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
            decision = policy(ctx, func, *args, **kwargs)
            record.append((str(func), decision.name))
            return decision

        return create_selective_checkpoint_contexts(recording)

    out = checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    out.sum().backward()
    return record


@pytest.mark.parametrize("kind", ["llama", "gpt"])
def test_selective_policy_is_torchtitans(kind: str) -> None:
    torch.manual_seed(0)
    if kind == "llama":
        block: nn.Module = LlamaBlock(LlamaConfig(dim=16, n_heads=2, mlp_hidden=24))
    else:
        block = Block(16, 2, 4)
    x = torch.randn(2, 8, 16, requires_grad=True)
    ours = _decisions(block, x, selective_checkpoint_policy)
    theirs = _decisions(block, x, _torchtitan_policy)
    assert ours == theirs
    saved_mm = [d for f, d in ours if f == "aten.mm.default"]
    if kind == "llama":  # every second of the 7 matmuls recomputed
        assert saved_mm == ["MUST_SAVE", "PREFER_RECOMPUTE"] * 3 + ["MUST_SAVE"]
    else:  # linears with bias run as addmm: all saved
        assert {d for f, d in ours if f == "aten.addmm.default"} == {"MUST_SAVE"}
