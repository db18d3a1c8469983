"""The architecture suite (:mod:`benchmarks._architectures`): every class of transformers'
causal-LM, masked-LM, seq2seq and image-classification mappings captured without
computing, planned and predicted.

The default run checks the suite's sample across families
(:data:`benchmarks._architectures.SAMPLE`) and the generic config and input rules on
small exact cases; the full sweep over every class, with the shares the issue asks
for (95% of the causal-LM classes, 92% overall) and a reason for every class that
fails, is ``slow`` (about 20 minutes on two loaded cores).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("transformers")

from benchmarks._architectures import (  # noqa: E402 - after the importorskip
    MAPPINGS,
    SAMPLE,
    Row,
    example_inputs,
    run_class,
    suite_entries,
)
from benchmarks._tiny_configs import ModelEntry, tiny_config  # noqa: E402

ENTRIES = {e.class_name: e for e in suite_entries()}


def _row(name: str) -> Row:
    return run_class(ENTRIES[name])


@pytest.mark.parametrize("name", SAMPLE)
def test_sample_is_captured_without_computing_planned_and_predicted(name: str) -> None:
    row = _row(name)
    assert row.failed == "", row.reason
    assert row.capture_step == "zero-cost runtime"
    assert row.ours is not None and row.ours[0] >= 1
    assert row.ours[1] > 0 and row.ours[2] > 0


def test_llama_both_plans_predicted() -> None:
    """Llama: execwrap merges the blocks into 2 groups; transformers' own plan is its
    template (embeddings, each of the 2 layers, the final norm, the head: 5 groups)."""
    row = _row("LlamaForCausalLM")
    assert (row.family, row.level) == ("dense", "shrunk")
    assert row.ours is not None and row.theirs is not None
    assert (row.ours[0], row.theirs[0]) == (2, 5)


def test_layer_drop_and_lengths_from_token_values_are_captured() -> None:
    """M2M100 draws a layer drop per layer (decided by one seeded draw, with a note);
    XLM turns lengths computed from the token ids' values into Python ints."""
    m2m = _row("M2M100ForConditionalGeneration")
    assert m2m.failed == "" and m2m.family == "encoder-decoder"
    assert any("random draw decided control flow" in n for n in m2m.notes)
    assert _row("XLMWithLMHeadModel").failed == ""


def test_a_missing_library_is_the_reason() -> None:
    row = _row("TimmWrapperForImageClassification")
    assert row.failed == "build"
    assert row.reason.startswith("ImportError: TimmWrapperForImageClassification requires the timm")


def test_a_broken_default_config_is_the_reason() -> None:
    row = _row("DbrxForCausalLM")
    assert row.failed == "build"
    assert row.reason == (
        "transformers' default config of the class does not build it: "
        "AttributeError: 'DbrxAttentionConfig' object has no attribute 'rope_theta'"
    )


def test_mappings_of_a_row_are_listed_once() -> None:
    assert _row("Qwen4ExpForCausalLM").mappings == ("causal_lm",)


def test_derived_fields_are_derived_again() -> None:
    """DeepSeek-V2's ``qk_head_dim`` (the sum of its parts) and ``num_key_value_heads``
    (the heads') are derived from the shrunk sizes, not shrunk on their own."""
    from transformers import DeepseekV2Config

    config = tiny_config(DeepseekV2Config)
    assert (config.qk_nope_head_dim, config.qk_rope_head_dim, config.qk_head_dim) == (16, 16, 32)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 4)


def test_the_widths_level_keeps_every_layer() -> None:
    from huggingface_hub.errors import StrictDataclassClassValidationError
    from transformers import GPTNeoConfig

    with pytest.raises(
        StrictDataclassClassValidationError, match="len\\(config.attention_layers\\)"
    ):
        tiny_config(GPTNeoConfig)
    config = tiny_config(GPTNeoConfig, "widths")
    assert (config.num_layers, config.hidden_size, config.num_heads) == (24, 64, 4)


def test_filled_gives_open_sizes_and_choices() -> None:
    """Dots1 leaves its expert counts at ``None``; X-MOD its default language (one of
    its config's ``languages``); ESM its padding id."""
    from transformers import Dots1Config, EsmConfig, XmodConfig

    dots = tiny_config(Dots1Config, "filled")
    assert (dots.n_routed_experts, dots.num_experts_per_tok, dots.n_shared_experts) == (4, 2, 1)
    xmod = tiny_config(XmodConfig, "filled")
    assert xmod.default_language == xmod.languages[0] == "en_XX"
    assert tiny_config(EsmConfig, "filled").pad_token_id == 0


def _inputs(name: str) -> dict[str, Any]:
    from benchmarks._tiny_configs import build_meta

    entry: ModelEntry = ENTRIES[name]
    return example_inputs(build_meta(entry).model, entry)


def test_example_inputs_follow_the_config() -> None:
    """ViT: pixel values of its image size; ImageGPT: token ids (its images are token
    ids); Reformer: the length its axial positions fix (64 x 64); GraniteMoeHybrid:
    ``use_cache=False`` through ``**kwargs``."""
    vit = _inputs("ViTForImageClassification")
    assert list(vit) == ["pixel_values"] and tuple(vit["pixel_values"].shape) == (2, 3, 64, 64)
    gpt = _inputs("ImageGPTForImageClassification")
    assert tuple(gpt["input_ids"].shape) == (2, 16) and gpt["use_cache"] is False
    assert tuple(_inputs("ReformerModelWithLMHead")["input_ids"].shape) == (2, 4096)
    assert _inputs("GraniteMoeHybridForCausalLM")["use_cache"] is False


@pytest.mark.slow
def test_every_class_is_captured_or_named_with_its_reason() -> None:
    from benchmarks.architectures import summary

    rows = [run_class(e) for e in suite_entries()]
    shares = {m: (ok, n) for m, ok, n in summary(rows)}
    assert set(shares) == {m.removeprefix("for_") for m in MAPPINGS} | {"all"}
    ok, n = shares["causal_lm"]
    assert ok / n >= 0.95, (ok, n)
    ok, n = shares["all"]
    assert ok / n >= 0.92, (ok, n)
    for row in rows:
        if row.failed:
            assert row.failed in ("build", "capture", "plan", "predict") and row.reason, row
