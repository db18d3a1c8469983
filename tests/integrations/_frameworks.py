"""Shared pieces of the framework tests: a tiny Llama, data, CPU workarounds, log capture.

Each framework test runs its framework's own recipe and the execwrap one in
the same two spawned gloo ranks (one spawn per framework keeps the imports,
the slow part, to once per rank), with the same seed and data, and returns
losses and the FSDP groups built.

Where a framework's own code refuses CPU, the smallest workaround is here,
named after what it undoes; everything else runs as the framework ships it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

VOCAB = 128


def tiny_llama(seed: int = 0, *, tie: bool = False) -> Any:
    """A 2-layer transformers Llama built from a small config (no download)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
    )
    return LlamaForCausalLM(config)


def token_batches(n: int, *, seed: int, batch: int = 2, seq: int = 16) -> list[torch.Tensor]:
    """``n`` batches of random token ids, ``[batch, seq]``, from their own generator."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (batch, seq), generator=g) for _ in range(n)]


def launcher_env(rank: int, world_size: int) -> None:
    """The variables torchrun would set (frameworks read them; the group is already up)."""
    os.environ.update(
        LOCAL_RANK=str(rank),
        RANK=str(rank),
        NODE_RANK="0",
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29511",
    )


def accelerate_keeps_fsdp_on_cpu() -> None:
    """Undo accelerate's CPU rule: on CPU it sets up MULTI_CPU and drops the FSDP plugin.

    ``AcceleratorState`` keeps ``fsdp_plugin`` only when ``PartialState`` found
    an accelerator; this marks the (gloo, CPU) process state as such before any
    ``Accelerator`` is built. Everything else (the plugin, ``prepare``, the
    Trainer) is accelerate's and transformers' own code.
    """
    from accelerate import PartialState
    from accelerate.utils import DistributedType

    PartialState(cpu=True)
    PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU


def reset_accelerate() -> None:
    """Forget accelerate's process-wide state between two recipes in one process
    (``AcceleratorState`` wrote its distributed type back into ``PartialState``)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
    accelerate_keeps_fsdp_on_cpu()


class Records(logging.Handler):
    """Collects the messages of WARNING records (to return from a rank)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> Records:
        logging.getLogger("execwrap").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("execwrap").removeHandler(self)
