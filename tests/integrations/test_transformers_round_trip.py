"""Round trip of transformers' own FSDP plans: loaded into execwrap, exported back, the same dict.

For each model class of transformers' auto mappings, built from a tiny config made
generically from its config class (:mod:`benchmarks._tiny_configs`) on the
meta device: ``to_fsdp_plan(load_fsdp_plan(model), model)`` is the model's own
``fsdp_plan`` (``_fsdp_plan`` + ``base_model_fsdp_plan`` and its children's), less
what transformers itself discards when it resolves the plan (rules that name no
module; a tied input embedding's own rule), and transformers' own resolution of the
export builds the same groups with the same styles as the model's own plan.

The default run checks a sample across families (dense, tied, MoE, multimodal,
encoder-decoder, encoder-only, a base model); the full sweep over every class is
``slow``. A class whose model cannot be built from its config class (a missing
optional library such as timm or scipy, a config that needs a field with no default)
is skipped with the reason; a class whose plan transformers' own resolution cannot
resolve (a model with tied weights but no input embeddings: transformers asks it for
them and gets ``NotImplementedError``, so its own ``from_pretrained(..., distributed_config=...)``
fails too) is an expected failure with the reason.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks._tiny_configs import ModelEntry, build_meta, model_entries

pytest.importorskip("transformers")

ENTRIES = {e.class_name: e for e in model_entries()}

SAMPLE = [
    "LlamaForCausalLM",  # the template: embeddings, layers, [norm, lm_head]
    "GemmaForCausalLM",  # tied embeddings: the embedding's rule folded into the head's
    "Qwen3MoeForCausalLM",  # mixture of experts
    "LlavaForConditionalGeneration",  # multimodal: the language model's plan under its prefix
    "T5ForConditionalGeneration",  # encoder-decoder: no rule names a module
    "BertForMaskedLM",  # encoder-only: no rule names a module
    "MistralModel",  # a base model: the config's plan alone
]


def expected_export(
    model: Any, rules: dict[Any, str], unmatched: tuple[Any, ...]
) -> dict[Any, str]:
    """The model's rules less what transformers discards: rules naming nothing, and the
    input embedding's own rule when it is tied to the output head."""
    from execwrap.planning.rules import layer_pattern

    drop = set(unmatched)
    if getattr(model, "all_tied_weights_keys", None):
        names = {id(m): n for n, m in model.named_modules()}
        embed, head = _module(model.get_input_embeddings), _module(model.get_output_embeddings)
        if embed is not None and head is not None and id(embed) in names and id(head) in names:
            drop.add(names[id(embed)])
            drop.add(layer_pattern(names[id(embed)]))
    return {k: v for k, v in rules.items() if k not in drop}


def _module(getter: Any) -> Any:
    try:
        return getter()
    except NotImplementedError:  # vision and audio models without token embeddings
        return None


def reread_groups(model: Any, fsdp_plan: dict[Any, str]) -> list[tuple[frozenset[str], bool]]:
    """The groups transformers' own resolution builds from ``fsdp_plan`` as the model's plan."""
    from execwrap.integrations.transformers import resolve_fsdp_plan

    saved = model._fsdp_plan
    model._fsdp_plan = dict(fsdp_plan)
    try:
        groups = resolve_fsdp_plan(model).groups
    finally:
        model._fsdp_plan = saved
    return sorted((frozenset(g), r) for g, r in groups)


def check_round_trip(entry: ModelEntry) -> None:
    from transformers import PreTrainedModel

    from execwrap.integrations.transformers import load_fsdp_plan, resolve_fsdp_plan, to_fsdp_plan

    try:
        model = build_meta(entry).model
    except Exception as e:  # noqa: BLE001 - reported as the skip reason
        pytest.skip(
            f"{entry.class_name} cannot be built from {entry.model_type}'s config: {type(e).__name__}: {e}"
        )
    assert isinstance(model, PreTrainedModel)
    if not model.fsdp_plan:
        pytest.skip(
            f"{entry.class_name} has no fsdp_plan (its config's base_model_fsdp_plan is empty)"
        )
    try:
        resolved = resolve_fsdp_plan(model)
    except ValueError as e:
        if "transformers' own FSDP plan resolution fails" not in str(e):
            raise
        pytest.xfail(str(e))  # from_pretrained(..., distributed_config=...) fails the same way
    plan = load_fsdp_plan(model)
    assert sorted(plan.groups) == sorted([[""], *([*g] for g, _ in resolved.groups)])
    exported = to_fsdp_plan(plan, model)
    assert exported == expected_export(model, resolved.rules, resolved.unmatched)
    if not exported:  # transformers refuses an empty plan; the model's own shards the root only
        assert resolved.groups == []
        return
    assert reread_groups(model, exported) == sorted((frozenset(g), r) for g, r in resolved.groups)


@pytest.mark.parametrize("name", SAMPLE)
def test_round_trip_sample(name: str) -> None:
    check_round_trip(ENTRIES[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_round_trip_every_class(name: str) -> None:
    check_round_trip(ENTRIES[name])


def test_sample_plans_are_the_expected_ones() -> None:
    """What the sample's round trips went through: transformers' resolved groups, exactly."""
    from execwrap.integrations.transformers import resolve_fsdp_plan

    groups = {
        name: sorted(
            (list(g), r) for g, r in resolve_fsdp_plan(build_meta(ENTRIES[name]).model).groups
        )
        for name in ("LlamaForCausalLM", "GemmaForCausalLM", "BertForMaskedLM")
    }
    assert groups["LlamaForCausalLM"] == [
        (["model.embed_tokens"], True),
        (["model.layers.0"], True),
        (["model.layers.1"], True),
        (["model.norm", "lm_head"], False),
    ]
    assert groups["GemmaForCausalLM"] == [
        (["model.embed_tokens", "model.norm"], False),
        (["model.layers.0"], True),
        (["model.layers.1"], True),
    ]
    assert groups["BertForMaskedLM"] == []
