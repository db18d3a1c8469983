"""Real model definitions from tiny configs (transformers 5), plus our own hard cases.

Each entry builds a model (deterministic under ``torch.manual_seed(0)``) and its
example inputs: ``(model, args, kwargs)``. Sizes are tiny on purpose (1-2
layers, hidden 16-64): the suite is about orders, not compute. Nothing is
downloaded: every model is built from a config.

timm is not here: ``import timm`` fails next to torch 2.13.0 CPU (timm's
``layers/create_norm.py`` imports ``torchvision.ops.misc``, and no torchvision
that loads against torch 2.13.0 CPU exists); :class:`OptionalMaskViT` reproduces
its ViT case (an optional ``attn_mask=None`` tested with ``is not None``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["FAMILIES", "Built", "LoRALinear", "LoRALM", "OptionalMaskViT", "build"]

#: ``(model, positional inputs, keyword inputs)``.
Built = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]

_VOCAB = 64
_SEQ = 6


def _ids(batch: int = 2, seq: int = _SEQ, vocab: int = _VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(1, vocab, (batch, seq), generator=g)


def _decoder(name: str, config: str | None = None, **extra: Any) -> Callable[[], Built]:
    """A causal LM ``<name>ForCausalLM`` from ``<name>Config`` (2 layers, hidden 32)."""

    def build_it() -> Built:
        import transformers

        config_cls = getattr(transformers, f"{config or name}Config")
        model_cls = getattr(transformers, f"{name}ForCausalLM")
        fields: dict[str, Any] = dict(
            vocab_size=_VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )
        fields.update(extra)
        model = model_cls(config_cls(**fields))
        return model, (), {"input_ids": _ids()}

    return build_it


def _gpt2() -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=_VOCAB,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    return GPT2LMHeadModel(config), (_ids(),), {}


def _encoder(name: str, head: str = "ForMaskedLM", **extra: Any) -> Callable[[], Built]:
    """A BERT-style encoder ``<name><head>`` (2 layers, hidden 32)."""

    def build_it() -> Built:
        import transformers

        config_cls = getattr(transformers, f"{name}Config")
        model_cls = getattr(transformers, f"{name}{head}")
        fields: dict[str, Any] = dict(
            vocab_size=_VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            pad_token_id=0,
        )
        fields.update(extra)
        model = model_cls(config_cls(**fields))
        ids = _ids()
        return model, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    return build_it


def _t5() -> Built:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=_VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    ids = _ids()
    return T5ForConditionalGeneration(config), (), {"input_ids": ids, "decoder_input_ids": ids}


def _bart() -> Built:
    from transformers import BartConfig, BartForConditionalGeneration

    config = BartConfig(
        vocab_size=_VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    ids = _ids()
    return BartForConditionalGeneration(config), (), {"input_ids": ids, "decoder_input_ids": ids}


def _vit() -> Built:
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(
        image_size=16,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
    )
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    return ViTForImageClassification(config), (), {"pixel_values": pixels}


def _clip() -> Built:
    from transformers import CLIPConfig, CLIPModel

    text = dict(
        vocab_size=_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = dict(
        image_size=16,
        patch_size=8,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
    )
    config = CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    return CLIPModel(config), (), {"input_ids": _ids(), "pixel_values": pixels}


def _whisper() -> Built:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=_VOCAB,
        num_mel_bins=8,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=8,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    features = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2))
    model = WhisperForConditionalGeneration(config)
    return model, (), {"input_features": features, "decoder_input_ids": _ids(seq=4)}


class OptionalMaskViT(nn.Module):
    """timm's ViT shape: ``forward(x, attn_mask=None)`` with ``if attn_mask is not None``.

    Patch embedding, one attention block whose mask projection runs only when
    a mask is passed, and a head. Plain fx makes ``attn_mask`` a Proxy, so
    ``attn_mask is not None`` is true during the trace and ``mask_proj`` is
    traced although the real forward without a mask never calls it.
    """

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.patch = nn.Linear(12, dim)
        self.mask_proj = nn.Linear(dim, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 3)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.patch(x)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        bias = None
        if attn_mask is not None:
            bias = self.mask_proj(h) * attn_mask
        h = h + self.proj(F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
        return self.head(h.mean(dim=1))


def _convnext() -> Built:
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(
        num_channels=3,
        hidden_sizes=[8, 16],
        depths=[1, 1],
        num_stages=2,
        num_labels=3,
        image_size=32,
    )
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    return ConvNextForImageClassification(config), (), {"pixel_values": pixels}


def _swin() -> Built:
    from transformers import SwinConfig, SwinForImageClassification

    config = SwinConfig(
        image_size=16,
        patch_size=2,
        num_channels=3,
        embed_dim=8,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
        num_labels=3,
    )
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    return SwinForImageClassification(config), (), {"pixel_values": pixels}


def _optional_mask_vit() -> Built:
    return (
        OptionalMaskViT(),
        (torch.randn(2, 4, 12, generator=torch.Generator().manual_seed(3)),),
        {},
    )


class LoRALinear(nn.Module):
    """A frozen ``base`` Linear plus a trainable low-rank update ``B(A(x))`` (PEFT-free)."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base
        self.base.requires_grad_(False)
        self.lora_A = nn.Linear(base.in_features, rank, bias=False)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x))


class LoRALM(nn.Module):
    """A Llama from transformers with LoRA adapters on its q/v projections."""

    def __init__(self) -> None:
        super().__init__()
        model, _, _ = _decoder("Llama")()
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.q_proj = LoRALinear(attn.q_proj)
            attn.v_proj = LoRALinear(attn.v_proj)
        self.lm = model

    def forward(self, input_ids: torch.Tensor) -> Any:
        return self.lm(input_ids=input_ids).logits


def _lora() -> Built:
    return LoRALM(), (_ids(),), {}


#: Family name -> builder. Names are what the README table and the tests use.
FAMILIES: dict[str, Callable[[], Built]] = {
    "gpt2": _gpt2,
    "llama": _decoder("Llama"),
    "mistral": _decoder("Mistral"),
    "qwen2": _decoder("Qwen2"),
    "qwen3": _decoder("Qwen3", head_dim=8),
    "gemma2": _decoder("Gemma2", head_dim=8),
    "gemma3": _decoder("Gemma3", head_dim=8, sliding_window=4, config="Gemma3Text"),
    "phi3": _decoder("Phi3"),
    "mixtral": _decoder("Mixtral", num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": _decoder(
        "Qwen3Moe", head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16
    ),
    "deepseek_v3": _decoder(
        "DeepseekV3",
        n_routed_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=8,
        q_lora_rank=8,
        qk_rope_head_dim=4,
        qk_nope_head_dim=4,
        v_head_dim=8,
    ),
    "mixtral_eager": _decoder(
        "Mixtral", num_local_experts=4, num_experts_per_tok=2, experts_implementation="eager"
    ),
    "olmo2": _decoder("Olmo2"),
    "starcoder2": _decoder("Starcoder2"),
    "opt": _decoder("OPT", ffn_dim=64, word_embed_proj_dim=32),
    "gpt_neox": _decoder("GPTNeoX"),
    "bert": _encoder("Bert"),
    "roberta": _encoder("Roberta"),
    "distilbert": _encoder("DistilBert", head="ForMaskedLM"),
    "albert": _encoder("Albert", embedding_size=16),
    "electra": _encoder("Electra", embedding_size=16),
    "t5": _t5,
    "bart": _bart,
    "vit": _vit,
    "convnext": _convnext,
    "swin": _swin,
    "clip": _clip,
    "whisper": _whisper,
    "lora_llama": _lora,
    "optional_mask_vit": _optional_mask_vit,
}


def build(name: str) -> Built:
    """Build family ``name`` under ``torch.manual_seed(0)``."""
    torch.manual_seed(0)
    return FAMILIES[name]()
