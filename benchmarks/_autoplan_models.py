"""Models and the plan grid of ``benchmarks/autoplan.py``.

Three models whose plans differ measurably on 2 gloo ranks (and on GPUs):

* ``wide``: communication-heavy: residual blocks of two wide ``Linear``
  layers (``dim -> 4 dim -> dim``) on a small batch of ``batch x seq`` rows,
  so all-gathering a block's weights costs more than computing with them;
* ``gpt``: :class:`execwrap.demo_models.GPT` (tied embedding, learned
  positions), token ids in, cross-entropy loss;
* ``llama``: :class:`execwrap.demo_models.Llama` (RMSNorm, SwiGLU MLP, untied
  output).

The grid (:func:`grid`) has the hand-made plans the auto plan is measured
against: per-block units with prefetch 0, 1 and 2; buckets of 2, 3, 4 and all
blocks; always-wrap units; no reshard after forward (per-block and buckets
of 2); and the auto plan, with no budget and under a budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MODELS", "ModelSpec", "PlanSpec", "WideBlock", "WideMLP", "block_numel", "grid"]


class WideBlock(nn.Module):
    """``x + fc2(gelu(fc1(norm(x))))`` with ``fc1: dim -> 4 dim``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class WideMLP(nn.Module):
    """An input projection, ``n_blocks`` :class:`WideBlock`, a head (``dim -> 1``)."""

    def __init__(self, dim: int, n_blocks: int) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(WideBlock(dim) for _ in range(n_blocks))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


@dataclass(frozen=True)
class ModelSpec:
    """One benchmark model: how to build it, its inputs, its loss and its block class.

    Attributes:
        name: table name.
        description: one line for the notes.
        build: ``build(size) -> nn.Module`` (``size``: the size dict).
        block: the transformer block class (``ModuleWrapPolicy({block})``).
        inputs: ``inputs(size, generator) -> (input, target)``.
        loss: ``loss(output, target) -> scalar``.
        full: sizes of a full run; quick: of ``--quick``.
    """

    name: str
    description: str
    build: Callable[[dict[str, int]], nn.Module]
    block: type[nn.Module]
    inputs: Callable[[dict[str, int], torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    full: dict[str, int] = field(default_factory=dict)
    quick: dict[str, int] = field(default_factory=dict)


def _token_inputs(size: dict[str, int], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (size["batch"], size["seq"])
    return (
        torch.randint(0, size["vocab"], shape, generator=gen),
        torch.randint(0, size["vocab"], shape, generator=gen),
    )


def _token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def _wide_inputs(size: dict[str, int], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    rows = (size["batch"], size["seq"], size["dim"])
    return torch.randn(rows, generator=gen), torch.randn(rows[:2] + (1,), generator=gen)


def _build_gpt(size: dict[str, int]) -> nn.Module:
    from execwrap.demo_models import GPT, GPTConfig

    return GPT(
        GPTConfig(
            vocab_size=size["vocab"],
            max_seq_len=size["seq"],
            dim=size["dim"],
            n_heads=size["heads"],
            n_blocks=size["blocks"],
        )
    )


def _build_llama(size: dict[str, int]) -> nn.Module:
    from execwrap.demo_models import Llama, LlamaConfig

    return Llama(
        LlamaConfig(
            vocab_size=size["vocab"],
            dim=size["dim"],
            n_heads=size["heads"],
            n_layers=size["blocks"],
            mlp_hidden=size["mlp"],
        )
    )


def _block_classes() -> tuple[type[nn.Module], type[nn.Module]]:
    from execwrap.demo_models import Block, LlamaBlock

    return Block, LlamaBlock


_GPT_BLOCK, _LLAMA_BLOCK = _block_classes()

#: The benchmark's models, in table order.
MODELS: dict[str, ModelSpec] = {
    "wide": ModelSpec(
        name="wide",
        description="wide MLP blocks (dim -> 4 dim -> dim), small batch: communication-heavy",
        build=lambda s: WideMLP(s["dim"], s["blocks"]),
        block=WideBlock,
        inputs=_wide_inputs,
        loss=lambda out, target: F.mse_loss(out, target),
        full={"dim": 512, "blocks": 8, "batch": 2, "seq": 8},
        quick={"dim": 128, "blocks": 4, "batch": 2, "seq": 8},
    ),
    "gpt": ModelSpec(
        name="gpt",
        description="execwrap.demo_models.GPT (tied embedding)",
        build=_build_gpt,
        block=_GPT_BLOCK,
        inputs=_token_inputs,
        loss=_token_loss,
        full={"dim": 256, "heads": 8, "blocks": 12, "vocab": 2048, "batch": 1, "seq": 64},
        quick={"dim": 64, "heads": 4, "blocks": 4, "vocab": 256, "batch": 2, "seq": 32},
    ),
    "llama": ModelSpec(
        name="llama",
        description="execwrap.demo_models.Llama (RMSNorm, SwiGLU, untied output)",
        build=_build_llama,
        block=_LLAMA_BLOCK,
        inputs=_token_inputs,
        loss=_token_loss,
        full={
            "dim": 256,
            "heads": 8,
            "blocks": 8,
            "mlp": 688,
            "vocab": 2048,
            "batch": 1,
            "seq": 64,
        },
        quick={"dim": 64, "heads": 4, "blocks": 4, "mlp": 172, "vocab": 256, "batch": 2, "seq": 32},
    ),
}


@dataclass(frozen=True)
class PlanSpec:
    """One plan of the grid.

    Attributes:
        name: table name.
        policy: ``"block"`` (``ModuleWrapPolicy({block})``) or ``"always"``.
        bucket_blocks: blocks per FSDP2 group (``0``: no buckets; ``-1``: all).
        prefetch: prefetch depth, or ``"auto"``.
        reshard: ``reshard_after_forward`` for every group (``None``: the plan's).
        auto: ``"none"``, ``"free"`` (auto plan, no budget) or ``"budget"``.
    """

    name: str
    policy: str = "block"
    bucket_blocks: int = 0
    prefetch: int | Literal["auto"] = 1
    reshard: bool | None = True
    auto: str = "none"


def grid() -> list[PlanSpec]:
    """The plans every model is measured with, in table order."""
    return [
        PlanSpec("per-block, prefetch 0", prefetch=0),
        PlanSpec("per-block, prefetch 1", prefetch=1),
        PlanSpec("per-block, prefetch 2", prefetch=2),
        PlanSpec("buckets of 2 blocks", bucket_blocks=2),
        PlanSpec("buckets of 3 blocks", bucket_blocks=3),
        PlanSpec("buckets of 4 blocks", bucket_blocks=4),
        PlanSpec("one bucket (all blocks)", bucket_blocks=-1),
        PlanSpec("always-wrap units", policy="always"),
        PlanSpec("per-block, no reshard", reshard=False),
        PlanSpec("buckets of 2, no reshard", bucket_blocks=2, reshard=False),
        PlanSpec("auto", prefetch="auto", reshard=None, auto="free"),
        PlanSpec("auto, under a budget", prefetch="auto", reshard=None, auto="budget"),
    ]


def block_numel(model: nn.Module, block: type[nn.Module]) -> int:
    """Elements of the first ``block`` module of ``model``."""
    first = next(m for m in model.modules() if isinstance(m, block))
    return sum(p.numel() for p in first.parameters())
