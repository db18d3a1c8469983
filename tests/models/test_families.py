"""Capture on the models people train: transformers 5 families from tiny configs.

For every family in :mod:`tests.models.zoo`, :func:`capture_execution_order`
(with a ``TracingConfig`` and the example inputs, as a user would call it):

* uses the pinned step of the ladder (``order.capture_step``) and names, in
  ``fallback_reason``, where symbolic tracing stopped (module FQN and class);
* gives the same module order, parameter order and parameters as a real
  runtime recording of the same call (and, at run time, the same parameter
  uses and gradient-ready order);
* leaves the model exactly as it was (state_dict, parameters, ``requires_grad``,
  ``.grad``, training flags, attributes, hooks);
* runs no kernel on real data but bookkeeping (:data:`BOOKKEEPING`), unless
  the step is real runtime.

Every family but one is captured without real computation (symbolic or
zero-cost). The exception is ``mixtral_eager`` (transformers' ``eager``
experts: a loop over the experts that ``nonzero()`` finds), whose order
depends on the routing of the real inputs; it is recorded for real, with the
reason.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree
from torch._subclasses import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from tests.cases._checks import snapshot
from tests.models.zoo import FAMILIES, build
from tracing import ExecutionOrder, TracingConfig, capture_execution_order, record_execution_order

pytest.importorskip("transformers")

_ZC = "zero-cost runtime"


def _failed(fqn: str, cls: str) -> str:
    return f"symbolic tracing failed in module {fqn!r} ({cls})"


#: family -> (capture step, first clause of fallback_reason or None)
EXPECTED: dict[str, tuple[str, str | None]] = {
    "gpt2": (_ZC, _failed("transformer", "GPT2Model")),
    "llama": (_ZC, _failed("model", "LlamaModel")),
    "mistral": (_ZC, _failed("model", "MistralModel")),
    "qwen2": (_ZC, _failed("model", "Qwen2Model")),
    "qwen3": (_ZC, _failed("model", "Qwen3Model")),
    "gemma2": (_ZC, _failed("model", "Gemma2Model")),
    "gemma3": (_ZC, _failed("model", "Gemma3TextModel")),
    "phi3": (_ZC, _failed("model", "Phi3Model")),
    "mixtral": (_ZC, _failed("model", "MixtralModel")),
    "mixtral_eager": ("runtime", _failed("model", "MixtralModel")),
    "qwen3_moe": (_ZC, _failed("model", "Qwen3MoeModel")),
    "deepseek_v3": (_ZC, _failed("model", "DeepseekV3Model")),
    "olmo2": (_ZC, _failed("model", "Olmo2Model")),
    "starcoder2": (_ZC, _failed("model", "Starcoder2Model")),
    "opt": (_ZC, _failed("model.decoder", "OPTDecoder")),
    "gpt_neox": (_ZC, _failed("gpt_neox", "GPTNeoXModel")),
    "bert": (_ZC, _failed("bert.embeddings", "BertEmbeddings")),
    "roberta": (_ZC, _failed("roberta", "RobertaModel")),
    "distilbert": (_ZC, _failed("distilbert.embeddings", "Embeddings")),
    "albert": (_ZC, _failed("albert.embeddings", "AlbertEmbeddings")),
    "electra": (_ZC, _failed("electra.embeddings", "ElectraEmbeddings")),
    "t5": (_ZC, _failed("encoder.block.0.layer.0.layer_norm", "T5LayerNorm")),
    "bart": (_ZC, _failed("model.encoder.layers.0.self_attn", "BartAttention")),
    "vit": (_ZC, _failed("vit", "ViTModel")),
    "convnext": (_ZC, _failed("convnext.embeddings", "ConvNextEmbeddings")),
    "swin": (_ZC, _failed("swin.embeddings.patch_embeddings", "SwinPatchEmbeddings")),
    "clip": (_ZC, _failed("vision_model.embeddings", "CLIPVisionEmbeddings")),
    "whisper": (_ZC, _failed("model.encoder", "WhisperEncoder")),
    "lora_llama": (_ZC, _failed("lm.model", "LlamaModel")),
    "optional_mask_vit": ("symbolic", None),
}


#: Ops on real tensors that are no computation: the symbolic attempt saves and
#: restores buffer values (detach, clone, copy_) and fx runs the model's
#: ``torch.tensor(...)`` constants (lift_fresh).
BOOKKEEPING = {
    "aten.detach.default",
    "aten.clone.default",
    "aten.copy_.default",
    "aten.lift_fresh.default",
}


class RealKernels(TorchDispatchMode):
    """Entered below the capture's fake mode: sees every kernel that touches real data."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        for t in pytree.tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor) and not t.is_meta:
                self.ops.add(str(func))
                break
        return func(*args, **(kwargs or {}))


def _uses(order: ExecutionOrder) -> list[tuple[str, int, tuple[str, ...], str]]:
    return [(u.module_fqn, u.call_index, u.param_fqns, u.op) for u in order.param_uses]


def test_every_family_is_pinned() -> None:
    assert sorted(EXPECTED) == sorted(FAMILIES)
    without_compute = [n for n, (step, _) in EXPECTED.items() if step != "runtime"]
    assert len(without_compute) >= 20
    assert [n for n in EXPECTED if n not in without_compute] == ["mixtral_eager"]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_capture_matches_a_real_recording(name: str) -> None:
    model, args, kwargs = build(name)
    before = snapshot(model)
    with RealKernels() as kernels:
        order = capture_execution_order(
            model, TracingConfig(), example_inputs=args, example_kwargs=kwargs
        )
    before.assert_unchanged(model)
    step, reason = EXPECTED[name]
    assert order.capture_step == step
    if step != "runtime":  # no real computation: no kernel but bookkeeping saw real data
        assert kernels.ops <= BOOKKEEPING, sorted(kernels.ops - BOOKKEEPING)
    else:
        assert "aten.mm.default" in kernels.ops
    assert (order.fallback_reason.split(": ")[0] if order.fallback_reason else None) == reason

    real = record_execution_order(model, *args, **kwargs)
    assert order.module_forward_order == real.module_forward_order
    assert order.param_forward_order == real.param_forward_order
    assert order.params == real.params
    assert order.shared_params == real.shared_params
    assert order.module_classes == real.module_classes
    if order.method == "runtime":
        assert _uses(order) == _uses(real)
        assert order.param_backward_order == real.param_backward_order
        assert order.module_backward_order == real.module_backward_order


def test_data_dependent_experts_fall_back_with_the_true_reason() -> None:
    model, args, kwargs = build("mixtral_eager")
    order = capture_execution_order(model, example_inputs=args, example_kwargs=kwargs)
    assert order.fallback_reason == (
        "zero-cost runtime capture failed in module 'model.layers.0.mlp.experts' "
        "(MixtralExperts): DynamicOutputShapeException: aten.nonzero.default at "
        "transformers/models/mixtral/modeling_mixtral.py:79 (`expert_hit = "
        "torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()`): the op's result depends "
        "on tensor values, which fake tensors do not have; the real model was run"
    )
