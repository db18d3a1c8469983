"""execwrap's plan applied on 2 gloo ranks, architecture by architecture: the losses of plain FSDP2.

For each architecture of the sample (dense, tied, MoE, hybrid, encoder-decoder, encoder,
vision, multimodal), each rank builds the real tiny model from the suite's generic
config (:func:`benchmarks._tiny_configs.build_real`, the same seed on both ranks), and
trains it :data:`STEPS` steps twice on its own batches:

1. **execwrap**: the order captured without computing (zero-cost, on the example
   inputs derived from the config), the auto-planner's plan for 2 ranks
   (:func:`execwrap.plan_wrap`, ``bucket_numel="auto"``: groups, prefetch,
   resharding), applied with :func:`execwrap.apply_fully_shard`;
2. **plain FSDP2**: ``fully_shard`` by hand on every block (the classes of
   :func:`benchmarks._architectures.wrap_policy`; a block holding a parameter tied to
   one outside it stays with the root), then on the root.

The losses are equal to float32 rounding (:data:`RTOL`: a grouping moves parameters,
and at most the order in which a tied parameter's gradients are summed), the groups
built are the plan's, and the model trained (the loss moved). One spawn runs
the whole list in sequence; the default run takes :data:`FAST`, the rest is ``slow``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests._dist import run_ranks

pytest.importorskip("transformers")

STEPS = 2
LR = 1e-2
#: Relative tolerance of the losses: one float32 rounding step (2**-23 = 1.19e-7) of a
#: loss near 1, doubled. Other groups sum a tied parameter's gradients (T5's shared
#: embedding, used by the encoder, the decoder and the head) in another order.
RTOL = 2.4e-7
#: The default run's sample, one or two per family.
FAST = (
    "LlamaForCausalLM",  # dense decoder
    "Qwen3MoeForCausalLM",  # mixture of experts
    "T5ForConditionalGeneration",  # encoder-decoder
    "BertForMaskedLM",  # encoder
    "ViTForImageClassification",  # vision
    "Gemma3ForConditionalGeneration",  # multimodal (text batches)
)
#: The rest of the sample (``slow``).
REST = (
    "GemmaForCausalLM",  # tied embeddings
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "GPT2LMHeadModel",  # Conv1D layers
    "OPTForCausalLM",
    "MixtralForCausalLM",  # MoE
    "OlmoeForCausalLM",  # MoE
    "Qwen3NextForCausalLM",  # hybrid: linear attention and attention
    "BartForConditionalGeneration",  # encoder-decoder
    "M2M100ForConditionalGeneration",  # encoder-decoder with a layer drop
    "RobertaForMaskedLM",  # encoder
    "ResNetForImageClassification",  # convolutions, batch norm
    "ConvNextForImageClassification",  # convolutions
    "BeitForImageClassification",  # relative position bias
    "GitForCausalLM",  # multimodal: image encoder and text decoder
)


def _batch(model: Any, entry: Any, seed: int) -> dict[str, Any]:
    """The example inputs' shapes with random values from ``seed`` (token ids in the
    vocabulary, pixel values in [0, 1)); other arguments as they are."""
    import torch

    from benchmarks._architectures import example_inputs

    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in example_inputs(model, entry).items():
        if not isinstance(t, torch.Tensor):  # use_cache=False
            out[name] = t
        elif t.is_floating_point():
            out[name] = torch.rand(t.shape, generator=g)
        else:
            out[name] = torch.randint(0, int(t.max()) + 1, t.shape, generator=g)
    return out


def _loss(model: Any, batch: dict[str, Any]) -> Any:
    out = model(**batch)
    logits = out.logits if getattr(out, "logits", None) is not None else out[0]
    return logits.float().square().mean()


def _train(model: Any, batches: list[dict[str, Any]]) -> list[float]:
    import torch

    torch.manual_seed(1234)  # dropout and layer drop draw the same in both runs
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for batch in batches:
        loss = _loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _execwrap_plan(model: Any, entry: Any, world_size: int) -> Any:
    from benchmarks._architectures import PRESET, example_inputs, wrap_policy
    from execwrap import CostModel, plan_wrap
    from tracing import capture_execution_order

    cost = CostModel.preset(PRESET, world_size=world_size)
    inputs = example_inputs(model, entry)
    order = capture_execution_order(model, example_kwargs=inputs, timing=cost.compute)
    assert order.capture_step == "zero-cost runtime", order.fallback_reason
    return plan_wrap(
        model,
        order,
        wrap_policy(model),
        bucket_numel="auto",
        cost_model=cost,
        world_size=world_size,
    )


def _one(entry: Any, rank: int, world_size: int) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    from benchmarks._tiny_configs import build_real
    from execwrap import apply_fully_shard
    from execwrap.integrations import fsdp_groups

    model = build_real(entry, seed=0).model
    batches = [_batch(model, entry, seed=100 * step + rank) for step in range(STEPS)]
    plan = _execwrap_plan(model, entry, world_size)
    apply_fully_shard(model, plan, prefetch="auto")
    ours = {"groups": fsdp_groups(model), "losses": _train(model, batches)}
    plain_model = build_real(entry, seed=0).model
    for module in _plain_blocks(plain_model):
        fully_shard(module)
    fully_shard(plain_model)
    return {"ours": ours, "plain": _train(plain_model, batches), "plan": plan.groups}


def _plain_blocks(model: Any) -> list[Any]:
    """The blocks plain FSDP2 is applied to, children first: the modules of
    :func:`benchmarks._architectures.wrap_policy`'s classes, less a block holding a
    parameter tied to one outside it (BERT's word embeddings and its decoder): FSDP2
    refuses a tied parameter in two groups, so by hand it stays with the root."""
    from collections import Counter

    from benchmarks._architectures import wrap_policy

    blocks = tuple(wrap_policy(model)._module_classes)
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    out = []
    for module in reversed(list(model.modules())):
        if not isinstance(module, blocks):
            continue
        inside = Counter(id(p) for _, p in module.named_parameters(remove_duplicate=False))
        if all(uses[i] == n for i, n in inside.items()):
            out.append(module)
    return out


def _worker(rank: int, world_size: int, names: tuple[str, ...]) -> dict[str, Any]:
    import warnings

    from benchmarks._architectures import suite_entries

    warnings.simplefilter("ignore")
    entries = {e.class_name: e for e in suite_entries()}
    return {name: _one(entries[name], rank, world_size) for name in names}


def _check(names: tuple[str, ...]) -> None:
    import torch

    results = run_ranks(_worker, args=(names,), timeout_s=600)
    for name in names:
        for rank, per_rank in enumerate(results):
            got = per_rank[name]
            torch.testing.assert_close(
                got["ours"]["losses"], got["plain"], rtol=RTOL, atol=0, msg=f"{name}, rank {rank}"
            )
            assert got["ours"]["losses"][0] != got["ours"]["losses"][-1], (name, rank)
            built = sorted(sorted(g) for g in got["ours"]["groups"])
            assert built == sorted(sorted(g) for g in got["plan"]), (name, rank)


def test_sample_trains_as_plain_fsdp2() -> None:
    _check(FAST)


@pytest.mark.slow
def test_rest_trains_as_plain_fsdp2() -> None:
    _check(REST)


def test_the_sample_spans_the_families() -> None:
    """At least 20 architectures, every family of the suite among them."""
    from benchmarks._architectures import family, suite_entries
    from benchmarks._tiny_configs import build_meta

    entries = {e.class_name: e for e in suite_entries()}
    names = FAST + REST
    families = {family(entries[n], build_meta(entries[n]).model.config) for n in names}
    assert len(set(names)) >= 20
    assert families == {"dense", "MoE", "encoder-decoder", "encoder", "vision", "multimodal"}
