"""Runtime capture: exact orders, cleanup, and "capture never changes the model"."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from execwrap.demo_models import GPT, GPTConfig
from tracing import ExecutionOrder, ParamUse, RuntimeRecorder, TracingError, record_execution_order
from tracing.nested import default_loss
from tracing.runtime import RecorderState
from tracing.runtime.step_calls import NO_AUTOGRAD_WARNING

# ------------------------------------------------------------------ models


class Reordered(nn.Module):
    """Defined layer0, layer1, layer2; called layer0 -> layer2 -> layer1."""

    def __init__(self) -> None:
        super().__init__()
        self.layer0 = nn.Linear(4, 4)
        self.layer1 = nn.Linear(4, 4)
        self.layer2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer1(self.layer2(self.layer0(x)))


class RootFunctional(nn.Module):
    """Root-level parameters used functionally (by keyword and inside a list)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.weight = nn.Parameter(torch.randn(4, 4))
        self.bias = nn.Parameter(torch.zeros(4))
        self.scales = nn.Parameter(torch.ones(2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.linear(x, self.weight, bias=self.bias)
        x = self.fc(x)
        return torch.cat([x, self.scales], dim=0)


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(idx))


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.fc(self.fc(x)))


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Checkpointed(nn.Module):
    def __init__(self, use_reentrant: bool) -> None:
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(4, 4)
        self.block = Inner()
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        x = checkpoint(self.block, x, use_reentrant=self.use_reentrant)
        return self.out(x)


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        h = self.a(x)
        return {"h": h, "pair": (self.b(h), x.argmax(-1)), "n": 3}


@dataclasses.dataclass
class _Out:
    logits: torch.Tensor
    extra: list[torch.Tensor]


class DataclassOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> tuple[_Out, int]:
        h = self.a(x)
        return _Out(logits=self.b(h), extra=[h]), 7


class Boom(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom in forward")


class Raising(nn.Module):
    """Raises inside ``inner.boom`` after ``fc`` ran."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.inner = nn.Sequential(nn.Linear(4, 4), Boom())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.fc(x))


class Gate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum().item() > 0:  # value-dependent: impossible on meta
            return x
        return -x


class ItemOnMeta(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gate = Gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gate(self.fc(x))


def _x() -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(1))


# --------------------------------------------------------------- helpers


def assert_clean(model: nn.Module) -> None:
    """No hook, mode or handle of the recorder is left anywhere."""
    for name, m in model.named_modules():
        for attr in (
            "_forward_hooks",
            "_forward_pre_hooks",
            "_backward_hooks",
            "_backward_pre_hooks",
            "_forward_hooks_always_called",
            "_forward_hooks_with_kwargs",
            "_forward_pre_hooks_with_kwargs",
        ):
            assert not getattr(m, attr), f"{name!r}.{attr} = {getattr(m, attr)}"
    for name, p in model.named_parameters():
        assert not p._post_accumulate_grad_hooks, name
        assert not p._backward_hooks, name
    mm = torch.nn.modules.module
    assert not mm._global_forward_hooks and not mm._global_forward_pre_hooks
    assert torch.overrides._get_current_function_mode_stack() == []


def _grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: p.grad for n, p in model.named_parameters()}


# ------------------------------------------------------------- exact orders


def test_reordered_layers() -> None:
    order = record_execution_order(Reordered(), _x())
    assert order.method == "runtime"
    assert order.fallback_reason is None
    assert order.module_forward_order == ["", "layer0", "layer2", "layer1"]
    assert order.param_forward_order == [
        "layer0.weight",
        "layer0.bias",
        "layer2.weight",
        "layer2.bias",
        "layer1.weight",
        "layer1.bias",
    ]
    assert order.param_backward_order == [
        "layer1.bias",
        "layer1.weight",
        "layer2.bias",
        "layer2.weight",
        "layer0.bias",
        "layer0.weight",
    ]
    assert order.module_backward_order == ["layer1", "layer2", "layer0", ""]
    assert order.recompute_order == []
    assert order.module_classes == {
        "": "Reordered",
        "layer0": "Linear",
        "layer1": "Linear",
        "layer2": "Linear",
    }
    assert list(order.params) == [
        "layer0.weight",
        "layer0.bias",
        "layer1.weight",
        "layer1.bias",
        "layer2.weight",
        "layer2.bias",
    ]
    assert order.params["layer0.weight"].shape == (4, 4)


def test_root_level_functional_use() -> None:
    order = record_execution_order(RootFunctional(), _x())
    assert order.module_forward_order == ["", "fc"]
    assert order.param_forward_order == ["weight", "bias", "fc.weight", "fc.bias", "scales"]
    assert order.param_uses == [
        ParamUse("", 0, ("weight", "bias"), "linear"),
        ParamUse("fc", 1, ("fc.weight", "fc.bias"), "linear"),
        ParamUse("", 0, ("scales",), "cat"),
    ]
    assert order.param_backward_order == [
        "scales",
        "fc.bias",
        "fc.weight",
        "bias",
        "weight",
    ]


def test_tied_weight() -> None:
    order = record_execution_order(Tied(), torch.tensor([[1, 2, 3]]))
    assert order.module_forward_order == ["", "emb", "head"]
    assert order.param_forward_order == ["emb.weight"]
    assert order.shared_params == {"emb.weight": ["head.weight"]}
    assert list(order.params) == ["emb.weight"]
    assert order.param_uses == [
        ParamUse("emb", 1, ("emb.weight",), "embedding"),
        ParamUse("head", 2, ("emb.weight",), "linear"),
    ]
    assert order.param_backward_order == ["emb.weight"]
    assert order.module_backward_order == ["head", "emb", ""]


def test_module_called_twice() -> None:
    order = record_execution_order(Twice(), _x())
    assert order.module_forward_order == ["", "fc", "fc", "out"]
    assert order.param_forward_order == ["fc.weight", "fc.bias", "out.weight", "out.bias"]
    assert order.param_uses == [
        ParamUse("fc", 1, ("fc.weight", "fc.bias"), "linear"),
        ParamUse("fc", 2, ("fc.weight", "fc.bias"), "linear"),
        ParamUse("out", 3, ("out.weight", "out.bias"), "linear"),
    ]
    assert order.param_backward_order == ["out.bias", "out.weight", "fc.bias", "fc.weight"]
    assert order.first_call_index() == {"": 0, "fc": 1, "out": 3}
    assert order.param_last_use_index()["fc.weight"] == 2


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpointed_block(use_reentrant: bool) -> None:
    model = Checkpointed(use_reentrant)
    order = record_execution_order(model, _x().requires_grad_())
    assert order.module_forward_order == ["", "inp", "block", "block.fc1", "block.fc2", "out"]
    assert order.recompute_order == ["block", "block.fc1", "block.fc2"]
    assert order.param_forward_order == [
        "inp.weight",
        "inp.bias",
        "block.fc1.weight",
        "block.fc1.bias",
        "block.fc2.weight",
        "block.fc2.bias",
        "out.weight",
        "out.bias",
    ]
    # recomputed calls add no uses
    assert [u.module_fqn for u in order.param_uses] == ["inp", "block.fc1", "block.fc2", "out"]
    assert order.param_backward_order == [
        "out.bias",
        "out.weight",
        "block.fc2.bias",
        "block.fc2.weight",
        "block.fc1.bias",
        "block.fc1.weight",
        "inp.bias",
        "inp.weight",
    ]
    assert_clean(model)


def test_frozen_params() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    model[0].requires_grad_(False)
    order = record_execution_order(model, _x())
    assert order.module_forward_order == ["", "0", "1", "2"]
    assert order.param_forward_order == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert order.param_backward_order == ["2.bias", "2.weight"]
    assert order.module_backward_order == ["2", ""]
    assert order.params["0.weight"].requires_grad is False
    assert model[0].weight.requires_grad is False  # unchanged


def test_all_frozen_skips_backward() -> None:
    model = nn.Linear(4, 2).requires_grad_(False)
    order = record_execution_order(model, _x())
    assert order.param_forward_order == ["weight", "bias"]
    assert order.param_backward_order == []


def test_dict_and_tuple_output() -> None:
    order = record_execution_order(DictOut(), _x())
    assert order.module_forward_order == ["", "a", "b"]
    # both "h" and "pair"[0] are in the default loss: a gets grads from both
    assert order.param_backward_order == ["b.bias", "b.weight", "a.bias", "a.weight"]


def test_dataclass_output_and_custom_loss() -> None:
    order = record_execution_order(DataclassOut(), _x())
    assert order.param_backward_order == ["b.bias", "b.weight", "a.bias", "a.weight"]
    # a loss of `h` only: b gets no gradient
    order = record_execution_order(DataclassOut(), _x(), loss_fn=lambda out: out[0].extra[0].sum())
    assert order.param_backward_order == ["a.bias", "a.weight"]
    order = record_execution_order(DataclassOut(), _x(), backward=False)
    assert order.param_backward_order == []
    assert order.param_forward_order == ["a.weight", "a.bias", "b.weight", "b.bias"]


def test_default_loss_finds_nested_tensors() -> None:
    a = torch.ones(2, requires_grad=True)
    b = torch.full((3,), 2.0, requires_grad=True)
    out = {"x": [a, (torch.arange(3), {"y": _Out(logits=b, extra=[])})], "z": "s"}
    loss = default_loss(out)
    assert loss is not None and loss.item() == 8.0
    assert default_loss((torch.ones(2), 3)) is None  # nothing requires grad


def test_kwargs_are_passed_to_the_model() -> None:
    class KW(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, *, flip: bool = False) -> torch.Tensor:
            return self.a(self.b(x)) if flip else self.b(self.a(x))

    assert record_execution_order(KW(), _x(), flip=True).module_forward_order == ["", "b", "a"]


GPT2_BACKWARD = [
    "transformer.ln_f.weight",
    "transformer.ln_f.bias",
    "transformer.h.1.mlp.c_proj.bias",
    "transformer.h.1.mlp.c_proj.weight",
    "transformer.h.1.mlp.c_fc.bias",
    "transformer.h.1.mlp.c_fc.weight",
    "transformer.h.1.ln_2.weight",
    "transformer.h.1.ln_2.bias",
    "transformer.h.1.attn.c_proj.bias",
    "transformer.h.1.attn.c_proj.weight",
    "transformer.h.1.attn.c_attn.bias",
    "transformer.h.1.attn.c_attn.weight",
    "transformer.h.1.ln_1.weight",
    "transformer.h.1.ln_1.bias",
    "transformer.h.0.mlp.c_proj.bias",
    "transformer.h.0.mlp.c_proj.weight",
    "transformer.h.0.mlp.c_fc.bias",
    "transformer.h.0.mlp.c_fc.weight",
    "transformer.h.0.ln_2.weight",
    "transformer.h.0.ln_2.bias",
    "transformer.h.0.attn.c_proj.bias",
    "transformer.h.0.attn.c_proj.weight",
    "transformer.h.0.attn.c_attn.bias",
    "transformer.h.0.attn.c_attn.weight",
    "transformer.h.0.ln_1.weight",
    "transformer.h.0.ln_1.bias",
    "transformer.wpe.weight",
    "transformer.wte.weight",
]


def test_transformers_gpt2() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    model = transformers.GPT2LMHeadModel(config)  # built from config, no download
    ids = torch.randint(0, 100, (2, 8))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    order = record_execution_order(model, ids, use_cache=False)

    assert order.param_backward_order == GPT2_BACKWARD
    blocks = [
        [
            f"transformer.h.{i}",
            f"transformer.h.{i}.ln_1",
            f"transformer.h.{i}.attn",
            f"transformer.h.{i}.attn.c_attn",
            f"transformer.h.{i}.attn.c_proj",
            f"transformer.h.{i}.attn.resid_dropout",
            f"transformer.h.{i}.ln_2",
            f"transformer.h.{i}.mlp",
            f"transformer.h.{i}.mlp.c_fc",
            f"transformer.h.{i}.mlp.act",
            f"transformer.h.{i}.mlp.c_proj",
            f"transformer.h.{i}.mlp.dropout",
        ]
        for i in range(2)
    ]
    assert order.module_forward_order == [
        "",
        "transformer",
        "transformer.wte",
        "transformer.wpe",
        "transformer.drop",
        *blocks[0],
        *blocks[1],
        "transformer.ln_f",
        "lm_head",
    ]
    assert order.shared_params == {"transformer.wte.weight": ["lm_head.weight"]}
    # every trainable parameter: used once in forward, ready once in backward
    assert sorted(order.param_forward_order) == sorted(order.params)
    assert sorted(order.param_backward_order) == sorted(order.params)
    assert order.param_uses[-1] == ParamUse("lm_head", 30, ("transformer.wte.weight",), "linear")
    assert order.module_classes["transformer.h.0.attn.c_attn"] == "Conv1D"
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert_clean(model)


def test_gpt_demo_model_param_uses() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_blocks=1))
    order = record_execution_order(model, torch.zeros(2, 8, dtype=torch.long))
    assert order.param_uses[:4] == [
        ParamUse("wte", 1, ("wte.weight",), "embedding"),
        ParamUse("", 0, ("wpe",), "getitem"),
        ParamUse("blocks.0.ln1", 3, ("blocks.0.ln1.weight", "blocks.0.ln1.bias"), "layer_norm"),
        ParamUse(
            "blocks.0.attn.qkv", 5, ("blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias"), "linear"
        ),
    ]
    assert order.param_uses[-1] == ParamUse("lm_head", 12, ("wte.weight",), "linear")
    assert order.param_backward_order[-2:] == ["wpe", "wte.weight"]


def test_metadata_reads_are_not_uses() -> None:
    class Meta(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(torch.ones(4))
            self.b = nn.Parameter(torch.ones(4))
            self.w = nn.Parameter(torch.ones(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = self.b.size(0) + self.b.shape[0] + self.b.dim()  # metadata only
            return (x @ self.w.T) * self.a + self.b * n

    order = record_execution_order(Meta(), _x())
    assert order.param_forward_order == ["w", "a", "b"]
    assert [u.op for u in order.param_uses] == ["T", "mul", "mul"]


# ----------------------------------------------------------------- recorder


def test_recorder_records_the_users_own_step() -> None:
    model = Twice()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with RuntimeRecorder(model) as rec:
        assert rec.state is RecorderState.RECORDING
        with pytest.raises(RuntimeError, match="available after"):
            _ = rec.order
        model(_x()).sum().backward()
        opt.step()
    assert rec.state is RecorderState.FINISHED
    assert rec.order.module_forward_order == ["", "fc", "fc", "out"]
    assert rec.order.param_backward_order == ["out.bias", "out.weight", "fc.bias", "fc.weight"]
    assert all(p.grad is not None for p in model.parameters())  # the user's grads stay
    assert_clean(model)
    rec.remove()  # idempotent


def test_recorder_remove_without_with() -> None:
    model = Reordered()
    rec = RuntimeRecorder(model)
    model(_x())
    rec.remove()
    assert rec.order.module_forward_order == ["", "layer0", "layer2", "layer1"]
    assert_clean(model)


def test_recorder_on_checkpoint_wrapper() -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    model = Checkpointed(use_reentrant=False)
    model.forward = lambda x: model.out(model.block(model.inp(x)))  # type: ignore[method-assign]
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, Inner))
    assert hasattr(model.block, "_checkpoint_wrapped_module")
    with RuntimeRecorder(model) as rec:
        model(_x()).sum().backward()
    order = rec.order
    assert order.module_forward_order == ["", "inp", "block", "block.fc1", "block.fc2", "out"]
    assert order.recompute_order == ["block", "block.fc1", "block.fc2"]
    assert order.module_classes["block"] == "Inner"
    assert "block.fc1.weight" in order.params
    assert order.param_backward_order[2:4] == ["block.fc2.bias", "block.fc2.weight"]
    assert_clean(model)


# ------------------------------------------------------------------ cleanup


def test_cleanup_after_success_restores_grads_rng_and_state() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 2))
    model[0].weight.grad = torch.full((4, 4), 3.0)
    grad_obj = model[0].weight.grad
    grads = _grads(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    order = record_execution_order(model, _x())
    after_capture = torch.rand(5)
    torch.manual_seed(123)
    assert torch.equal(after_capture, torch.rand(5))  # random stream not shifted

    assert order.param_backward_order[:2] == ["3.bias", "3.weight"]
    assert _grads(model) == grads  # same objects, None stays None
    assert model[0].weight.grad is grad_obj
    assert torch.equal(grad_obj, torch.full((4, 4), 3.0))
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert model.training
    assert_clean(model)


def test_cleanup_after_exception_mid_forward() -> None:
    model = Raising()
    model.fc.bias.grad = torch.ones(4)
    grads = _grads(model)
    with pytest.raises(ValueError, match="boom in forward") as info:
        record_execution_order(model, _x())
    assert any("inner.1" in n for n in getattr(info.value, "__notes__", []))
    assert _grads(model) == grads
    assert torch.equal(model.fc.bias.grad, torch.ones(4))
    assert_clean(model)


def test_recorder_cleanup_after_exception() -> None:
    model = Raising()
    with pytest.raises(ValueError, match="boom"):
        with RuntimeRecorder(model) as rec:
            model(_x())
    assert rec.state is RecorderState.FAILED
    with pytest.raises(RuntimeError, match="raised"):
        _ = rec.order
    assert_clean(model)
    # the model still works, without the recorder
    model.inner = nn.Sequential(nn.Linear(4, 4))
    model(_x())


def test_eval_mode_and_no_grad_context_are_kept() -> None:
    model = Reordered().eval()
    with torch.no_grad():
        order = record_execution_order(model, _x())
        assert not torch.is_grad_enabled()
    assert not model.training
    # captured without autograd: no backward order, and the order says why
    assert (order.training, order.grad_enabled) == (False, False)
    assert (order.param_backward_order, order.module_backward_order) == ([], [])
    assert order.warnings == [NO_AUTOGRAD_WARNING]
    assert order.module_forward_order == ["", "layer0", "layer2", "layer1"]


# --------------------------------------------------------------------- meta


def test_meta_model_forward_and_backward() -> None:
    torch.manual_seed(0)
    cpu_order = record_execution_order(
        GPT(GPTConfig(n_blocks=2)), torch.zeros(2, 8, dtype=torch.long)
    )
    with torch.device("meta"):
        model = GPT(GPTConfig(n_blocks=2))
    idx = torch.zeros(2, 8, dtype=torch.long, device="meta")
    order = record_execution_order(model, idx)
    assert all(p.is_meta for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())
    assert order.module_forward_order == cpu_order.module_forward_order
    assert order.param_forward_order == cpu_order.param_forward_order
    assert order.param_backward_order == cpu_order.param_backward_order
    assert order.params == cpu_order.params
    assert_clean(model)


def test_meta_value_dependent_op_names_the_module() -> None:
    with torch.device("meta"):
        model = ItemOnMeta()
    with pytest.raises(
        TracingError, match=r"module 'gate' \(Gate\).*Meta execution needs shape-only control flow"
    ) as info:
        record_execution_order(model, torch.randn(3, 4, device="meta"))
    assert info.value.module_fqn == "gate"
    assert info.value.module_class == "Gate"
    assert_clean(model)


def test_order_round_trips_through_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    order = record_execution_order(Checkpointed(use_reentrant=False), _x())
    assert ExecutionOrder.load(order.save(tmp_path / "o.json")) == order
