"""Small models shared by the tracing tests (others import them: keep names stable).

Every model here is CPU-cheap, deterministic to build, and documents the
exact execution order it is meant to produce.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "BlockLeafTracer",
    "BranchNet",
    "BufferNet",
    "ContainerNet",
    "DataDependentNet",
    "FactoryNet",
    "FunctionalNet",
    "KeywordNet",
    "MetadataNet",
    "MethodNet",
    "OutOfOrderNet",
    "TiedLM",
    "TwiceNet",
    "TwoBlockNet",
    "Wrapper",
    "combine_dict",
]

DIM = 4


class OutOfOrderNet(nn.Module):
    """Forward order differs from definition order: layer0 -> layer2 -> layer1.

    ``layer2`` is ``Sequential(Linear, ReLU, Linear)``; ``layer1`` and
    ``layer2``'s Linears have no bias. Parameter forward order:
    ``layer0.weight, layer0.bias, layer2.0.weight, layer2.2.weight, layer1.weight``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.layer0 = nn.Linear(DIM, DIM)
        self.layer1 = nn.Linear(DIM, DIM, bias=False)
        self.layer2 = nn.Sequential(
            nn.Linear(DIM, DIM, bias=False), nn.ReLU(), nn.Linear(DIM, DIM, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer1(self.layer2(self.layer0(x)))


class _FunctionalInner(nn.Module):
    """Uses its own parameters functionally (not through a leaf module)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(DIM, DIM))
        self.bias = nn.Parameter(torch.zeros(DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class FunctionalNet(nn.Module):
    """``F.linear`` at the root and one level down, around a leaf Linear.

    Uses: root ``linear(weight, bias)``; ``fc`` (leaf); ``inner`` ``linear``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.inner = _FunctionalInner()
        self.fc = nn.Linear(DIM, DIM)
        self.weight = nn.Parameter(torch.randn(DIM, DIM))
        self.bias = nn.Parameter(torch.zeros(DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.linear(x, self.weight, self.bias)
        return self.inner(self.fc(x))


class KeywordNet(nn.Module):
    """Parameters passed by keyword: ``F.linear(x, weight=self.w, bias=self.b)``."""

    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.zeros(DIM))
        self.w = nn.Parameter(torch.randn(DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight=self.w, bias=self.b)


@torch.fx.wrap
def combine_dict(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Sum a dict of tensors (a leaf function for fx: one node, dict argument)."""
    return sum(tensors.values(), torch.zeros(()))


class ContainerNet(nn.Module):
    """Parameters inside a list (``torch.cat``), a tuple (``torch.stack``) and a dict.

    Uses, in order: ``cat(a, b)``, ``stack(c, a)``, ``combine_dict(d)``.
    """

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(2, DIM))
        self.b = nn.Parameter(torch.randn(2, DIM))
        self.c = nn.Parameter(torch.randn(2, DIM))
        self.d = nn.Parameter(torch.randn(2, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([self.a, self.b]).sum() + torch.stack((self.c, self.a)).sum()
        return x + y + combine_dict({"d": self.d})


class MethodNet(nn.Module):
    """Parameters used through tensor methods: ``self.w.t()`` and ``self.s * 2``."""

    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.ones(DIM))
        self.w = nn.Parameter(torch.randn(DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w.t() + self.s * 2


class TwiceNet(nn.Module):
    """``shared`` is called twice, ``other`` once in between."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(DIM, DIM)
        self.other = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared(self.other(self.shared(x)))


class TiedLM(nn.Module):
    """Embedding and output head share one weight (tied, like GPT-2).

    ``named_parameters()`` order: ``emb.weight, proj.weight, proj.bias`` (the
    alias ``head.weight`` is removed as a duplicate).
    """

    def __init__(self, vocab: int = 10) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(self.emb(idx)))


class _Block(nn.Module):
    """A block with a leaf Linear and a functionally used scale."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)
        self.scale = nn.Parameter(torch.ones(DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


class TwoBlockNet(nn.Module):
    """Two ``_Block``s called in reverse definition order (``b1`` then ``b0``)."""

    def __init__(self) -> None:
        super().__init__()
        self.b0 = _Block()
        self.b1 = _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b0(self.b1(x))


class BlockLeafTracer(torch.fx.Tracer):
    """A tracer that does not trace inside ``_Block`` (a whole block is a leaf)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, _Block) or super().is_leaf_module(m, module_qualified_name)


class BranchNet(nn.Module):
    """``extra`` runs only when ``use_extra`` is true (a Python-level branch)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)
        self.extra = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        x = self.fc(x)
        if use_extra:
            x = self.extra(x)
        return x


class _DataDependent(nn.Module):
    """Branches on the input's values: not symbolically traceable."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x
        return -x


class _Factory(nn.Module):
    """Builds a tensor from a traced size: ``torch.zeros(x.size(0), 4)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.zeros(x.size(0), DIM)


class DataDependentNet(nn.Module):
    """``fc`` then ``body.gate`` (a ``_DataDependent``): tracing fails in ``body.gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)
        self.body = nn.Sequential()
        self.body.add_module("gate", _DataDependent())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.fc(x))


class FactoryNet(nn.Module):
    """``fc`` then ``make`` (a ``_Factory``): tracing fails in ``make``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, DIM)
        self.make = _Factory()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.make(self.fc(x))


class BufferNet(nn.Module):
    """Uses a buffer and a parameter in one op: only the parameter is recorded."""

    offset: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offset", torch.ones(DIM))
        self.w = nn.Parameter(torch.ones(DIM))
        self.bn = nn.BatchNorm1d(DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x + self.offset) * self.w


class MetadataNet(nn.Module):
    """Reads ``w``'s shape and size before using it: only the matmul is a use."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(DIM, DIM))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, self.w.shape[0]).reshape(-1, self.w.size(1))
        return x @ self.w


class Wrapper(nn.Module):
    """Puts ``inner`` one level down (as ``wrapped``), so errors name a nested FQN."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.wrapped = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wrapped(x)
