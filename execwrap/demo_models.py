"""Built-in demo models: a GPT-style and a Llama-style decoder.

Both are symbolically traceable with a plain ``torch.fx.Tracer`` (shape-only
control flow) and can be built on the meta device, so they serve the CLI's
default report, the tests and the benchmarks.

Shapes: inputs are token ids ``(batch, seq)`` of dtype ``long``; outputs are
logits ``(batch, seq, vocab_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "GPT",
    "GPTConfig",
    "Llama",
    "LlamaConfig",
    "build_demo_model",
    "demo_inputs",
]


@dataclass
class GPTConfig:
    """Size of the GPT-style demo model.

    Attributes:
        vocab_size: number of tokens.
        max_seq_len: length of the learned position table.
        dim: hidden size.
        n_heads: attention heads (``dim`` must be divisible by it).
        n_blocks: transformer blocks.
        mlp_ratio: MLP hidden size is ``mlp_ratio * dim``.
        tie_weights: tie the output projection to the token embedding.
    """

    vocab_size: int = 256
    max_seq_len: int = 64
    dim: int = 64
    n_heads: int = 4
    n_blocks: int = 4
    mlp_ratio: int = 4
    tie_weights: bool = True

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(
                f"GPTConfig.dim ({self.dim}) must be divisible by n_heads ({self.n_heads})"
            )


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused ``qkv`` projection."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.unflatten(-1, (self.n_heads, -1)).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).flatten(2))


class MLP(nn.Module):
    """Two-layer GELU MLP."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.proj = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block: ``x + attn(ln1(x))``, ``x + mlp(ln2(x))``."""

    def __init__(self, dim: int, n_heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, n_heads)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_ratio * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """GPT-style decoder: token embedding, learned positions, blocks, final norm.

    The position table ``wpe`` is a root-level parameter used functionally
    (sliced in ``forward``), and with ``tie_weights`` the output projection
    ``lm_head.weight`` is the same tensor as ``wte.weight`` (tied weights).

    Example:
        >>> model = GPT(GPTConfig(n_blocks=2))
        >>> model(torch.zeros(2, 8, dtype=torch.long)).shape
        torch.Size([2, 8, 256])
    """

    def __init__(self, config: GPTConfig | None = None) -> None:
        super().__init__()
        config = config or GPTConfig()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.dim)
        self.wpe = nn.Parameter(torch.randn(config.max_seq_len, config.dim) * 0.02)
        self.blocks = nn.ModuleList(
            Block(config.dim, config.n_heads, config.mlp_ratio) for _ in range(config.n_blocks)
        )
        self.ln_f = nn.LayerNorm(config.dim)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe[: idx.size(1)]
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@dataclass
class LlamaConfig:
    """Size of the Llama-style demo model (defaults: tiny; see the benchmarks
    for the Llama-3-70B shape: dim 8192, 64 heads, MLP 28672, vocab 128256)."""

    vocab_size: int = 256
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 4
    mlp_hidden: int = 172

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(
                f"LlamaConfig.dim ({self.dim}) must be divisible by n_heads ({self.n_heads})"
            )


class LlamaAttention(nn.Module):
    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (
            w(x).unflatten(-1, (self.n_heads, -1)).transpose(1, 2)
            for w in (self.wq, self.wk, self.wv)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).flatten(2))


class LlamaMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim)
        self.attention = LlamaAttention(config.dim, config.n_heads)
        self.ffn_norm = nn.RMSNorm(config.dim)
        self.feed_forward = LlamaMLP(config.dim, config.mlp_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Llama-style decoder (torchtitan layout, untied output, no RoPE).

    Example:
        >>> with torch.device("meta"):
        ...     model = Llama(LlamaConfig(dim=8192, n_heads=64, n_layers=2,
        ...                               mlp_hidden=28672, vocab_size=128256))
        >>> sum(p.numel() for p in model.parameters()) > 3e9
        True
    """

    def __init__(self, config: LlamaConfig | None = None) -> None:
        super().__init__()
        config = config or LlamaConfig()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.dim)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def build_demo_model(n_blocks: int = 4, *, seed: int = 0) -> GPT:
    """The CLI's default model: a small tied-embedding GPT (reproducible init).

    Args:
        n_blocks: number of transformer blocks.
        seed: RNG seed for the initial weights.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT(GPTConfig(n_blocks=n_blocks))


def demo_inputs(model: nn.Module, batch: int = 2, seq: int = 16, *, seed: int = 0) -> torch.Tensor:
    """Random token ids ``(batch, seq)`` for :class:`GPT` / :class:`Llama`."""
    config = getattr(model, "config", None)
    vocab = int(getattr(config, "vocab_size", 256))
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=gen).to(device)
