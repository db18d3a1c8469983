"""torchtitan's Llama 3 as it ran in its December 2024 benchmarks, for predictions on meta.

A re-implementation of ``torchtitan/models/llama/model.py`` at commit 9dec370
(2024-12-26, the commit of ``benchmarks/llama3_h100_202412_torchtitan.md``),
kept to what decides its cost: the same parameters and module tree (FQNs
``tok_embeddings``, ``layers.<i>.attention.wq`` ...), RMSNorm computed in
float32 (``self._norm(x.float()).type_as(x) * self.weight``), rotary
embeddings through complex float32 (``view_as_complex(xq.float()...)``),
grouped-query attention by materialising repeated keys and values
(``repeat_kv``) before ``F.scaled_dot_product_attention(..., is_causal=True)``,
and a SwiGLU feed-forward. Initialisation is left out (the model lives on the
meta device). torchtitan is BSD-licensed; this is written anew from its description.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "LLAMA2_13B",
    "LLAMA2_34B",
    "LLAMA2_70B",
    "LLAMA2_7B",
    "LLAMA3_70B",
    "LLAMA3_8B",
    "TitanBlock",
    "TitanLlama",
    "TitanLlamaArgs",
]


@dataclass(frozen=True)
class TitanLlamaArgs:
    """torchtitan's ``ModelArgs`` (the fields that shape the model)."""

    dim: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 8
    vocab_size: int = 128256
    multiple_of: int = 1024
    ffn_dim_multiplier: float | None = 1.3
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    max_seq_len: int = 8192
    #: April 2024's model cast its logits to float32 itself (``self.output(h).float()``)
    float_output: bool = False

    @property
    def hidden_dim(self) -> int:
        """The feed-forward width, as ``FeedForward.__init__`` computes it."""
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return self.multiple_of * ((hidden + self.multiple_of - 1) // self.multiple_of)


#: torchtitan's ``llama3_configs["8B"]`` / ``["70B"]`` (vocabulary: the Llama 3 tokenizer's).
LLAMA3_8B = TitanLlamaArgs()
LLAMA3_70B = TitanLlamaArgs(
    dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim_multiplier=1.3, multiple_of=4096
)
#: torchtitan's ``llama2_configs["13B"]`` / ``["70B"]`` of April 2024 (Llama 2 tokenizer: 32,000
#: tokens; multi-head attention for 13B; ``multiple_of=256`` by default).
LLAMA2_13B = TitanLlamaArgs(
    dim=5120,
    n_layers=40,
    n_heads=40,
    n_kv_heads=40,
    vocab_size=32000,
    multiple_of=256,
    ffn_dim_multiplier=None,
    rope_theta=10000.0,
    max_seq_len=4096,
    float_output=True,
)
LLAMA2_70B = TitanLlamaArgs(
    dim=8192,
    n_layers=80,
    n_heads=64,
    n_kv_heads=8,
    vocab_size=32000,
    multiple_of=4096,
    ffn_dim_multiplier=1.3,
    rope_theta=10000.0,
    max_seq_len=4096,
    float_output=True,
)

#: Llama 2 7B and the 34B shape (Code Llama 34B, grouped-query attention with 8 key/value
#: heads), as IBM's fms-fsdp trains them (``fms.models.llama`` configs "7b" and "34b":
#: feed-forward widths 11008 and 22016, the Llama 2 tokenizer, logits in bfloat16).
LLAMA2_7B = TitanLlamaArgs(
    dim=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=32,
    vocab_size=32000,
    multiple_of=256,
    ffn_dim_multiplier=None,
    rope_theta=10000.0,
    max_seq_len=4096,
)
LLAMA2_34B = TitanLlamaArgs(
    dim=8192,
    n_layers=48,
    n_heads=64,
    n_kv_heads=8,
    vocab_size=32000,
    multiple_of=256,
    ffn_dim_multiplier=None,
    rope_theta=10000.0,
    max_seq_len=4096,
)


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def _rotary(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    freqs = freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, xc.shape[-1])
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x.unsqueeze(3).expand(bs, slen, heads, n_rep, head_dim).reshape(bs, slen, -1, head_dim)


class _Attention(nn.Module):
    def __init__(self, a: TitanLlamaArgs) -> None:
        super().__init__()
        self.n_rep = a.n_heads // a.n_kv_heads
        self.head_dim = a.dim // a.n_heads
        self.wq = nn.Linear(a.dim, a.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * self.head_dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = _rotary(xq.view(bs, seqlen, -1, self.head_dim), freqs_cis)
        xk = _rotary(xk.view(bs, seqlen, -1, self.head_dim), freqs_cis)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        keys, values = _repeat_kv(xk, self.n_rep), _repeat_kv(xv, self.n_rep)
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).contiguous().view(bs, seqlen, -1))


class _FeedForward(nn.Module):
    def __init__(self, a: TitanLlamaArgs) -> None:
        super().__init__()
        self.w1 = nn.Linear(a.dim, a.hidden_dim, bias=False)
        self.w2 = nn.Linear(a.hidden_dim, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TitanBlock(nn.Module):
    """torchtitan's ``TransformerBlock``."""

    def __init__(self, a: TitanLlamaArgs) -> None:
        super().__init__()
        self.attention = _Attention(a)
        self.feed_forward = _FeedForward(a)
        self.attention_norm = _RMSNorm(a.dim, a.norm_eps)
        self.ffn_norm = _RMSNorm(a.dim, a.norm_eps)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class TitanLlama(nn.Module):
    """torchtitan's ``Transformer`` (Llama 3): embeddings, blocks, norm, untied output."""

    def __init__(self, a: TitanLlamaArgs = LLAMA3_8B) -> None:
        super().__init__()
        self.args = a
        self.tok_embeddings = nn.Embedding(a.vocab_size, a.dim)
        self.register_buffer("freqs_cis", self._freqs_cis(), persistent=True)
        self.layers = nn.ModuleDict({str(i): TitanBlock(a) for i in range(a.n_layers)})
        self.norm = _RMSNorm(a.dim, a.norm_eps)
        self.output = nn.Linear(a.dim, a.vocab_size, bias=False)

    def _freqs_cis(self) -> torch.Tensor:
        a = self.args
        head_dim = a.dim // a.n_heads
        freqs = 1.0 / (a.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(a.max_seq_len).float(), freqs)
        return torch.polar(torch.ones_like(angles), angles)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        out = self.output(self.norm(h))
        return out.float() if self.args.float_output else out
