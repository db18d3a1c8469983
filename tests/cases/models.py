"""One small model per hard kind of issue 8 (tracers, hooks and FSDP break on these).

Every model maps small float inputs (or token ids) to a small output and is
deterministic given the seed it is built under. Sizes are tiny on purpose: the
case suite is about orders and plans, not compute. Inputs are 2-D (batch,
features) or 1-D token ids, so every ``F.linear`` is a plain ``addmm``/``mm``
and the autograd order of gradients is easy to read off (see the expected
values in test_cases.py).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = [
    "Branch",
    "CalledOutsideBlock",
    "CalledTwice",
    "CheckpointedBlocks",
    "EmbedReadByHead",
    "FACTORY_KINDS",
    "FactoryBlock",
    "FactoryModel",
    "InplaceAfterLinear",
    "LoRALinear",
    "LoRAModel",
    "LoopOverArgs",
    "MLPBlock",
    "MHAModel",
    "RootParams",
    "TiedLM",
    "WithUnused",
    "DataDependentIf",
]


# ----------------------------------------------------------- data-dependent if
class Branch(nn.Module):
    """Picks ``pos`` or ``neg`` by the sign of the reduced input value."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Linear(4, 4)
        self.neg = nn.Linear(4, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent: fx cannot trace this
            return self.pos(x)
        return self.neg(x)


class DataDependentIf(nn.Module):
    """``block`` (a :class:`Branch`) then ``post``; with positive inputs ``block.neg`` never runs."""

    def __init__(self) -> None:
        super().__init__()
        self.block = Branch()
        self.post = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.block(x))


# ------------------------------------------------ tensor factories, traced size
#: fx raises TypeError for the four factories and RuntimeError for ``len``.
FACTORY_KINDS = ("zeros", "ones", "empty", "tensor", "len")


class FactoryBlock(nn.Module):
    """``fc`` then a tensor factory whose size comes from the input."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind not in FACTORY_KINDS:
            raise ValueError(f"unknown factory kind {kind!r}")
        self.kind = kind
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.kind == "zeros":
            return h + torch.zeros(x.size(0), 4)
        if self.kind == "ones":
            return h * torch.ones(x.size(0), 4)
        if self.kind == "empty":
            return h + torch.empty(x.size(0), 4).zero_()
        if self.kind == "tensor":
            return h / torch.tensor(x.size(0))
        return h / len(x)  # "len": fx raises RuntimeError


class FactoryModel(nn.Module):
    """``block`` (a :class:`FactoryBlock`) then ``head``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.block = FactoryBlock(kind)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x))


# ------------------------------------------------------- container, *args loop
class LoopOverArgs(nn.Module):
    """A container whose ``forward(*args)`` loops over its inputs.

    Input ``i`` goes through ``layers[n - 1 - i]``, so the execution order is
    the reverse of the definition order; the outputs are summed.
    ``layers`` (a ``ModuleList``) never runs a forward of its own.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4, bias=False), nn.Linear(4, 4)])

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        outs = []
        for i, a in enumerate(args):
            outs.append(self.layers[len(self.layers) - 1 - i](a))
        return torch.stack(outs).sum(0)


# ------------------------------------------------ parameters read at the root
class RootParams(nn.Module):
    """Root parameters used functionally: inside a list, by keyword, as a scalar.

    ``named_parameters()`` order is ``w1, w2, proj, scale, fc.weight, fc.bias``
    (the root's own parameters first) while execution uses ``fc`` first.
    """

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.w1 = nn.Parameter(torch.randn(2, 4))
        self.w2 = nn.Parameter(torch.randn(2, 4))
        self.proj = nn.Parameter(torch.randn(3, 4))
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        h = F.linear(h, torch.cat([self.w1, self.w2]))  # parameters inside a list
        h = F.linear(h, weight=self.proj)  # parameter by keyword
        return h * self.scale  # scalar parameter


# ------------------------------------------------- module called twice, order
class CalledTwice(nn.Module):
    """``shared`` runs twice with ``mid`` in between; ``out`` is defined first, runs last."""

    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(4, 2)
        self.shared = nn.Linear(4, 4)
        self.mid = nn.Linear(4, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.shared(x)
        x = self.mid(x)
        x = self.shared(x)
        return self.out(x)


# ------------------------------------------------------------ embedding reuse
class ReadsWeight(nn.Module):
    """A head that reads a weight it does not own (passed in by the caller)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4)

    def forward(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(h), weight)


class EmbedReadByHead(nn.Module):
    """``embed.weight`` is also read by ``head``, which does not own it."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.body = nn.Linear(4, 4)
        self.head = ReadsWeight()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(idx)), self.embed.weight)


class TiedLM(nn.Module):
    """Classic tied input/output embedding: ``lm_head.weight is embed.weight``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(6, 4)
        self.block = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.lm_head = nn.Linear(4, 6, bias=False)
        self.lm_head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(self.block(self.embed(idx))))


# ------------------------------------------------------- nn.MultiheadAttention
class MHAModel(nn.Module):
    """``inp`` -> ``nn.MultiheadAttention`` -> ``out``.

    ``attn.out_proj`` is a registered ``Linear`` whose parameters
    ``F.multi_head_attention_forward`` uses directly: ``out_proj.forward``
    never runs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.out = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h, _ = self.attn(h, h, h, need_weights=False)
        return self.out(h)


# ----------------------------------------------------------------------- LoRA
class LoRALinear(nn.Module):
    """Frozen base ``Linear`` plus a trainable low-rank pair ``lora_b(lora_a(x))``."""

    def __init__(self, d_in: int, d_out: int, rank: int = 2) -> None:
        super().__init__()
        self.base = nn.Linear(d_in, d_out)
        self.base.requires_grad_(False)
        self.lora_a = nn.Linear(d_in, rank, bias=False)
        self.lora_b = nn.Linear(rank, d_out, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + 0.5 * self.lora_b(self.lora_a(x))


class LoRAModel(nn.Module):
    """Two LoRA blocks with a ReLU in between."""

    def __init__(self) -> None:
        super().__init__()
        self.l0 = LoRALinear(4, 4)
        self.act = nn.ReLU()
        self.l1 = LoRALinear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l1(self.act(self.l0(x)))


# ---------------------------------------------------------------- never called
class WithUnused(nn.Module):
    """``unused`` is registered (between the two used layers) but never called."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


# ------------------------------------------------------------------- in-place
class InplaceAfterLinear(nn.Module):
    """``fc1`` then ``nn.ReLU(inplace=True)`` on its output then ``fc2``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


# --------------------------------------------------- activation checkpointing
class MLPBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CalledOutsideBlock(nn.Module):
    """The root calls ``block0.fc2`` again after both blocks ran: outside every
    call of ``block0``, so a ``block0`` unit would have resharded it."""

    def __init__(self) -> None:
        super().__init__()
        self.block0 = MLPBlock()
        self.block1 = MLPBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block0.fc2(self.block1(self.block0(x)))


class CheckpointedBlocks(nn.Module):
    """``inp`` -> checkpointed ``block0`` -> checkpointed ``block1`` -> ``head``.

    With ``tie``, ``block1.fc1.weight`` is tied to ``block0.fc1.weight``:
    under reentrant checkpointing its gradient is accumulated once per block
    (two separate inner backward passes), under non-reentrant checkpointing
    once.
    """

    def __init__(self, use_reentrant: bool, tie: bool = True) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(4, 4)
        self.block0 = MLPBlock()
        self.block1 = MLPBlock()
        if tie:
            self.block1.fc1.weight = self.block0.fc1.weight
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = checkpoint(self.block0, h, use_reentrant=self.use_reentrant)
        h = checkpoint(self.block1, h, use_reentrant=self.use_reentrant)
        return self.head(h)
