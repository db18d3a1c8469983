"""Model factories and tracers for the CLI tests (``--model`` / ``--tracer`` targets),
and the models FSDP cannot build naively (shared modules, a scalar parameter)
that the plan tests share with ``tests/distributed/test_fsdp_builds.py``.

Used as ``tests.execwrap.factories:NAME`` from the repository root.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn as nn

from execwrap.demo_models import Block, build_demo_model

__all__ = [
    "HOSTILE_NAMES",
    "ClipHead",
    "Conv",
    "SharedBlocks",
    "SharedEmbed",
    "NUMBER",
    "BlockLeafTracer",
    "FlagModel",
    "GainBlock",
    "HostileNames",
    "ManyNotes",
    "broken",
    "demo2",
    "flag_model",
    "gpt2",
    "hostile_names",
    "llama8",
    "many_notes",
    "not_a_module",
    "raising_model",
    "returns_int",
    "shape_model",
]

#: Not a factory: ``--model tests.execwrap.factories:NUMBER`` is rejected.
NUMBER = 3


def gpt2() -> nn.Module:
    """A tiny transformers GPT-2 built from a config (no download)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def demo2() -> nn.Module:
    """The built-in GPT with two blocks."""
    return build_demo_model(2)


def broken() -> nn.Module:
    """A factory that raises."""
    raise RuntimeError("config file missing: weights.bin")


def not_a_module() -> object:
    """A factory that returns something else than a module."""
    return {"not": "a module"}


def returns_int() -> int:
    """A factory that returns an int."""
    return 7


class ModelFailure(Exception):
    """An exception of the model's own (not a torch error)."""


class _Raises(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > -1e9:  # value-dependent: not symbolically traceable
            raise ModelFailure("expert routing table is empty\nsecond line of detail")
        return self.lin(x)


class RaisingModel(nn.Module):
    """Its submodule ``inner`` raises :class:`ModelFailure` when run."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = _Raises()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def raising_model() -> nn.Module:
    return RaisingModel()


class FlagModel(nn.Module):
    """Runs ``b`` then ``a`` when ``flag`` is true, else ``a`` only.

    ``if flag:`` on a proxy fails symbolic tracing unless ``flag`` is kept
    concrete (``--concrete-arg flag=True``).
    """

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, flag: bool = True) -> torch.Tensor:
        if flag:
            x = self.b(x)
        return self.a(x)


def flag_model() -> nn.Module:
    torch.manual_seed(0)
    return FlagModel()


class BlockLeafTracer(torch.fx.Tracer):
    """Treats every transformer ``Block`` as a leaf (its parameters used at once)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, Block) or super().is_leaf_module(m, module_qualified_name)


#: Module names a model may legally have that break naive output formats:
#: spreadsheet formulas (OWASP CSV injection), characters XML 1.0 cannot carry,
#: terminal escape sequences and controls, a bidirectional override, a lone
#: surrogate, the escape characters themselves.
HOSTILE_NAMES = (
    "=HYPERLINK(1)",
    "+x",
    "-y",
    "@z",
    "\tt",
    "\rr",
    "'q",
    "a\x0bb",
    "\x1b[31mred",
    "\u202eevil",
    "s\ud800",
    "back\\slash",
    "nl\nx",
    "\x00nul",
    "\x07bell",
    "\x9bcsi",
    "\ufffe",
)


class HostileNames(nn.ModuleDict):
    """One ``Linear(4, 4)`` per name of :data:`HOSTILE_NAMES`, directly on the
    root (so each FQN starts with its name), called in that order."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        super().__init__({name: nn.Linear(4, 4) for name in HOSTILE_NAMES})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.values():
            x = layer(x)
        return x


def hostile_names() -> nn.Module:
    return HostileNames()


class Conv(nn.Module):
    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        self.embed = embed
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.relu(self.embed(x)))


class SharedEmbed(nn.Module):
    """``conv1.embed`` and ``conv2.embed`` are one ``Linear``."""

    def __init__(self) -> None:
        super().__init__()
        embed = nn.Linear(8, 8)
        self.conv1 = Conv(embed)
        self.conv2 = Conv(embed)
        self.head = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv1(x) + self.conv2(x))


class GainBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(8))
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.fc(x)) * self.gain


class SharedBlocks(nn.Module):
    """ALBERT-style: one ``GainBlock`` registered three times (``layers.0`` .. ``layers.2``)."""

    def __init__(self) -> None:
        super().__init__()
        block = GainBlock()
        self.layers = nn.ModuleList([block, block, block])
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


class ClipHead(nn.Module):
    """A CLIP-style head: its ``logit_scale`` is a 0-dim parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.logit_scale = nn.Parameter(torch.tensor(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.logit_scale.exp()


class ShapeModel(nn.Module):
    """Runs ``b`` then ``a`` for batches of more than one row, else ``a`` only.

    ``if x.shape[0] > 1:`` fails symbolic tracing (fx Proxies have no shapes)
    and is decided by the zero-cost run on fake tensors, which have them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 1:
            x = self.b(x)
        return self.a(x)


def shape_model() -> nn.Module:
    torch.manual_seed(0)
    return ShapeModel()


def llama8() -> nn.Module:
    """An 8-layer Llama-style model (dim 1024, MLP 2816, vocab 32000), for auto plans
    on the GPU presets (build it on the meta device: ``--device meta``)."""
    from execwrap.demo_models import Llama, LlamaConfig

    return Llama(LlamaConfig(vocab_size=32000, dim=1024, n_heads=16, n_layers=8, mlp_hidden=2816))


class ManyNotes(nn.Module):
    """Six linears that never run (a note each) and a 0-dim parameter (a warning: FSDP
    refuses it), for the command line's notes."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 4)
        for i in range(6):
            self.add_module(f"unused{i}", nn.Linear(4, 4))
        self.scale = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x) * self.scale


def many_notes() -> nn.Module:
    torch.manual_seed(0)
    return ManyNotes()
