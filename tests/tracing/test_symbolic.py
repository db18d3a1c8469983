"""Tests for tracing.symbolic.trace_execution_order (symbolic capture with torch.fx)."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
import torch
import torch.fx
import torch.nn as nn

from execwrap.demo_models import GPT, GPTConfig, Llama, LlamaConfig
from tests.tracing import models as M
from tracing import ExecutionOrder, ParamUse, TracingConfig, TracingError, trace_execution_order
from tracing.order import param_infos, shared_param_map


def _uses(order: ExecutionOrder) -> list[tuple[str, int, tuple[str, ...], str]]:
    return [(u.module_fqn, u.call_index, u.param_fqns, u.op) for u in order.param_uses]


# --------------------------------------------------------------------- orders
def test_forward_order_differs_from_definition_order() -> None:
    model = M.OutOfOrderNet()
    order = trace_execution_order(model)

    assert order.method == "symbolic"
    assert order.fallback_reason is None
    assert order.module_forward_order == [
        "",
        "layer0",
        "layer2",
        "layer2.0",
        "layer2.1",
        "layer2.2",
        "layer1",
    ]
    assert order.param_forward_order == [
        "layer0.weight",
        "layer0.bias",
        "layer2.0.weight",
        "layer2.2.weight",
        "layer1.weight",
    ]
    # Definition order is different: layer1 comes before layer2.
    assert [n for n, _ in model.named_parameters()] != order.param_forward_order
    assert _uses(order) == [
        ("layer0", 1, ("layer0.weight", "layer0.bias"), "call_module"),
        ("layer2.0", 3, ("layer2.0.weight",), "call_module"),
        ("layer2.2", 5, ("layer2.2.weight",), "call_module"),
        ("layer1", 6, ("layer1.weight",), "call_module"),
    ]
    assert order.param_backward_order == []
    assert order.shared_params == {}
    assert order.params == param_infos(model)
    assert order.module_classes == {
        "": "OutOfOrderNet",
        "layer0": "Linear",
        "layer1": "Linear",
        "layer2": "Sequential",
        "layer2.0": "Linear",
        "layer2.1": "ReLU",
        "layer2.2": "Linear",
    }
    assert order.torch_version == str(torch.__version__)


def test_default_config_is_a_plain_tracer() -> None:
    model = M.OutOfOrderNet()
    assert trace_execution_order(model) == trace_execution_order(model, TracingConfig())


def test_config_must_be_a_tracing_config() -> None:
    with pytest.raises(TypeError, match="config must be a TracingConfig or None, got Tracer"):
        trace_execution_order(M.OutOfOrderNet(), torch.fx.Tracer())  # type: ignore[arg-type]


def test_functional_ops_at_root_and_in_submodule() -> None:
    order = trace_execution_order(M.FunctionalNet())
    assert order.module_forward_order == ["", "fc", "inner"]
    assert _uses(order) == [
        ("", 0, ("weight", "bias"), "linear"),
        ("fc", 1, ("fc.weight", "fc.bias"), "call_module"),
        ("inner", 2, ("inner.weight", "inner.bias"), "linear"),
    ]
    assert order.param_forward_order == [
        "weight",
        "bias",
        "fc.weight",
        "fc.bias",
        "inner.weight",
        "inner.bias",
    ]


def test_parameters_passed_by_keyword() -> None:
    order = trace_execution_order(M.KeywordNet())
    assert _uses(order) == [("", 0, ("w", "b"), "linear")]
    # Keyword order (weight=, bias=), not definition order (b, w).
    assert order.param_forward_order == ["w", "b"]


def test_parameters_inside_list_tuple_and_dict() -> None:
    order = trace_execution_order(M.ContainerNet())
    assert _uses(order) == [
        ("", 0, ("a", "b"), "cat"),
        ("", 0, ("c", "a"), "stack"),
        ("", 0, ("d",), "combine_dict"),
    ]
    assert order.param_forward_order == ["a", "b", "c", "d"]


def test_parameters_used_through_tensor_methods() -> None:
    order = trace_execution_order(M.MethodNet())
    assert _uses(order) == [("", 0, ("w",), "t"), ("", 0, ("s",), "mul")]
    assert order.param_forward_order == ["w", "s"]


def test_module_called_twice_appears_twice() -> None:
    order = trace_execution_order(M.TwiceNet())
    assert order.module_forward_order == ["", "shared", "other", "shared"]
    assert _uses(order) == [
        ("shared", 1, ("shared.weight", "shared.bias"), "call_module"),
        ("other", 2, ("other.weight",), "call_module"),
        ("shared", 3, ("shared.weight", "shared.bias"), "call_module"),
    ]
    assert order.param_forward_order == ["shared.weight", "shared.bias", "other.weight"]
    assert order.first_call_index() == {"": 0, "shared": 1, "other": 2}
    assert order.param_last_use_index()["shared.weight"] == 3


def test_tied_embedding_and_output_weight() -> None:
    model = M.TiedLM()
    order = trace_execution_order(model)
    assert order.module_forward_order == ["", "emb", "proj", "head"]
    assert _uses(order) == [
        ("emb", 1, ("emb.weight",), "call_module"),
        ("proj", 2, ("proj.weight", "proj.bias"), "call_module"),
        ("head", 3, ("emb.weight",), "call_module"),
    ]
    assert order.param_forward_order == ["emb.weight", "proj.weight", "proj.bias"]
    assert order.shared_params == {"emb.weight": ["head.weight"]}
    assert list(order.params) == ["emb.weight", "proj.weight", "proj.bias"]
    assert order.alias_to_canonical()["head.weight"] == "emb.weight"
    assert (order.shared_params, order.params) == (shared_param_map(model)[1], param_infos(model))


def test_tied_weight_used_functionally_under_its_alias() -> None:
    class AliasUse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, M.DIM)
            self.head = nn.Module()
            self.head.weight = self.emb.weight  # registered under a second name

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            weight = cast(torch.Tensor, self.head.weight)  # a Proxy while tracing
            return torch.nn.functional.linear(self.emb(idx), weight)

    order = trace_execution_order(AliasUse())
    assert _uses(order) == [
        ("emb", 1, ("emb.weight",), "call_module"),
        ("", 0, ("emb.weight",), "linear"),
    ]
    assert order.shared_params == {"emb.weight": ["head.weight"]}


def test_buffers_are_not_parameters() -> None:
    order = trace_execution_order(M.BufferNet())
    assert _uses(order) == [
        ("bn", 1, ("bn.weight", "bn.bias"), "call_module"),
        ("", 0, ("w",), "mul"),
    ]
    assert "offset" not in order.param_forward_order
    assert list(order.params) == ["w", "bn.weight", "bn.bias"]


def test_metadata_reads_are_not_uses() -> None:
    order = trace_execution_order(M.MetadataNet())
    assert _uses(order) == [("", 0, ("w",), "matmul")]


def test_custom_tracer_leaf_rule_gives_whole_block() -> None:
    model = M.TwoBlockNet()
    default = trace_execution_order(model)
    assert default.module_forward_order == ["", "b1", "b1.fc", "b0", "b0.fc"]
    assert _uses(default) == [
        ("b1.fc", 2, ("b1.fc.weight", "b1.fc.bias"), "call_module"),
        ("b1", 1, ("b1.scale",), "mul"),
        ("b0.fc", 4, ("b0.fc.weight", "b0.fc.bias"), "call_module"),
        ("b0", 3, ("b0.scale",), "mul"),
    ]

    blocks = trace_execution_order(model, TracingConfig(tracer=M.BlockLeafTracer()))
    assert blocks.module_forward_order == ["", "b1", "b0"]
    # All of a leaf block's parameters, recursively, in named_parameters() order.
    assert _uses(blocks) == [
        ("b1", 1, ("b1.scale", "b1.fc.weight", "b1.fc.bias"), "call_module"),
        ("b0", 2, ("b0.scale", "b0.fc.weight", "b0.fc.bias"), "call_module"),
    ]
    assert blocks.param_forward_order == [
        "b1.scale",
        "b1.fc.weight",
        "b1.fc.bias",
        "b0.scale",
        "b0.fc.weight",
        "b0.fc.bias",
    ]


def test_concrete_args_remove_a_branch() -> None:
    model = M.BranchNet()
    off = trace_execution_order(model, TracingConfig(concrete_args={"use_extra": False}))
    on = trace_execution_order(model, TracingConfig(concrete_args={"use_extra": True}))
    assert off.module_forward_order == ["", "fc"]
    assert off.param_forward_order == ["fc.weight", "fc.bias"]
    assert on.module_forward_order == ["", "fc", "extra"]
    assert on.param_forward_order == ["fc.weight", "fc.bias", "extra.weight", "extra.bias"]
    # Unused parameters are still listed in params.
    assert list(off.params) == ["fc.weight", "fc.bias", "extra.weight", "extra.bias"]


def test_gpt_demo_model_exact_order() -> None:
    model = GPT(GPTConfig(n_blocks=2))
    order = trace_execution_order(model)

    block_modules = ["ln1", "attn", "attn.qkv", "attn.proj", "ln2", "mlp", "mlp.fc", "mlp.proj"]
    expected_modules = ["", "wte"]
    for i in range(2):
        expected_modules += [f"blocks.{i}"] + [f"blocks.{i}.{m}" for m in block_modules]
    expected_modules += ["ln_f", "lm_head"]
    assert order.module_forward_order == expected_modules

    block_params = [
        f"{m}.{p}"
        for m in ("ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc", "mlp.proj")
        for p in ("weight", "bias")
    ]
    expected_params = ["wte.weight", "wpe"]
    for i in range(2):
        expected_params += [f"blocks.{i}.{p}" for p in block_params]
    expected_params += ["ln_f.weight", "ln_f.bias"]
    assert order.param_forward_order == expected_params
    # wpe is a root parameter used by slicing; lm_head uses the tied wte weight.
    assert order.param_uses[1] == ParamUse("", 0, ("wpe",), "getitem")
    assert order.param_uses[-1] == ParamUse(
        "lm_head", len(expected_modules) - 1, ("wte.weight",), "call_module"
    )
    assert order.shared_params == {"wte.weight": ["lm_head.weight"]}
    assert sorted(order.param_forward_order) == sorted(order.params)


def test_meta_model_over_a_billion_parameters() -> None:
    config = LlamaConfig(dim=4096, n_heads=32, n_layers=4, mlp_hidden=11008, vocab_size=32000)
    with torch.device("meta"):
        model = Llama(config)
    assert sum(p.numel() for p in model.parameters()) == 1_071_681_536

    order = trace_execution_order(model)

    assert order.total_numel() == 1_071_681_536
    layer = [
        "attention_norm",
        "attention",
        "attention.wq",
        "attention.wk",
        "attention.wv",
        "attention.wo",
        "ffn_norm",
        "feed_forward",
        "feed_forward.w1",
        "feed_forward.w3",
        "feed_forward.w2",
    ]
    expected = ["", "tok_embeddings"]
    for i in range(4):
        expected += [f"layers.{i}"] + [f"layers.{i}.{m}" for m in layer]
    expected += ["norm", "output"]
    assert order.module_forward_order == expected
    assert order.param_forward_order[:6] == [
        "tok_embeddings.weight",
        "layers.0.attention_norm.weight",
        "layers.0.attention.wq.weight",
        "layers.0.attention.wk.weight",
        "layers.0.attention.wv.weight",
        "layers.0.attention.wo.weight",
    ]
    assert order.param_forward_order[-2:] == ["norm.weight", "output.weight"]
    assert len(order.param_forward_order) == len(order.params) == 39
    assert all(p.is_meta for p in model.parameters())


# ------------------------------------------------------------------- failures
def test_data_dependent_if_names_the_module() -> None:
    with pytest.raises(TracingError, match=r"module 'body\.gate' \(_DataDependent\)") as info:
        trace_execution_order(M.DataDependentNet())
    err = info.value
    assert err.module_fqn == "body.gate"
    assert err.module_class == "_DataDependent"
    assert isinstance(err, RuntimeError)
    assert isinstance(err.__cause__, torch.fx.proxy.TraceError)
    message = str(err)
    assert "TraceError: symbolically traced variables cannot be used as inputs to control flow" in (
        message
    )
    assert "concrete_args" in message
    assert "is_leaf_module() returns True for 'body.gate'" in message
    assert "capture_execution_order(model, example_inputs=...)" in message


def test_tensor_factory_with_traced_size_names_the_module() -> None:
    model = M.Wrapper(M.FactoryNet())
    with pytest.raises(
        TracingError, match=r"module 'wrapped\.make' \(_Factory\): TypeError"
    ) as info:
        trace_execution_order(model)
    assert info.value.module_fqn == "wrapped.make"
    assert info.value.module_class == "_Factory"
    assert isinstance(info.value.__cause__, TypeError)


def test_failure_in_root_forward_names_the_root() -> None:
    with pytest.raises(TracingError, match=r"the root module <root> \(BranchNet\)") as info:
        trace_execution_order(M.BranchNet())
    assert info.value.module_fqn == ""
    assert info.value.module_class == "BranchNet"
    assert "is_leaf_module" not in str(info.value)  # no leaf rule can hide the root


def test_failure_after_a_caught_inner_error_names_the_right_module() -> None:
    class Catching(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = M.Wrapper(M.DataDependentNet())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                self.gate(x)
            except torch.fx.proxy.TraceError:
                pass
            return torch.zeros(x.size(0), 2)

    with pytest.raises(TracingError, match=r"the root module <root> \(Catching\): TypeError"):
        trace_execution_order(Catching())


# -------------------------------------------------------- tracer and model kept
def _model_snapshot(model: nn.Module) -> dict[str, Any]:
    return {
        "params": [
            (n, id(p), p.requires_grad, p.device, p.dtype)
            for n, p in model.named_parameters(remove_duplicate=False)
        ],
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "modules": [
            (
                n,
                m.training,
                sorted(vars(m)),
                len(m._forward_hooks),
                len(m._forward_pre_hooks),
                len(m._backward_hooks),
                len(m._backward_pre_hooks),
                len(m._state_dict_hooks),
                len(m._load_state_dict_pre_hooks),
            )
            for n, m in model.named_modules(remove_duplicate=False)
        ],
        "param_attrs": [sorted(vars(p)) for p in model.parameters()],
    }


def _assert_same(model: nn.Module, before: dict[str, Any]) -> None:
    after = _model_snapshot(model)
    assert after["params"] == before["params"]
    assert after["modules"] == before["modules"]
    assert after["param_attrs"] == before["param_attrs"]
    assert before["state"].keys() == after["state"].keys()
    for k, v in before["state"].items():
        w = after["state"][k]
        assert (v.shape, v.dtype, v.device) == (w.shape, w.dtype, w.device), k
        assert v.is_meta or torch.equal(v, w), k


def _assert_tracer_restored(tracer: torch.fx.Tracer) -> None:
    for name in ("call_module", "create_proxy"):
        assert name not in vars(tracer)
        assert getattr(tracer, name).__func__ is getattr(type(tracer), name)


@pytest.mark.parametrize(
    "tracer", [torch.fx.Tracer(), M.BlockLeafTracer()], ids=["Tracer", "BlockLeafTracer"]
)
def test_tracer_restored_and_model_unchanged_after_success(tracer: torch.fx.Tracer) -> None:
    model = M.TwoBlockNet().eval()
    model.b0.train()
    before = _model_snapshot(model)
    trace_execution_order(model, TracingConfig(tracer=tracer))
    _assert_tracer_restored(tracer)
    _assert_same(model, before)
    assert not model.training and model.b0.training


def test_tracer_restored_and_model_unchanged_after_failure() -> None:
    model = M.DataDependentNet()
    before = _model_snapshot(model)
    tracer = torch.fx.Tracer()
    with pytest.raises(TracingError):
        trace_execution_order(model, TracingConfig(tracer=tracer))
    _assert_tracer_restored(tracer)
    _assert_same(model, before)
    # The same tracer traces a good model correctly afterwards.
    good = trace_execution_order(M.OutOfOrderNet(), TracingConfig(tracer=tracer))
    assert good.module_forward_order[:2] == ["", "layer0"]


def test_existing_instance_attributes_on_the_tracer_are_put_back() -> None:
    tracer = torch.fx.Tracer()
    calls: list[str] = []
    class_create_proxy = tracer.create_proxy

    def create_proxy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return class_create_proxy(*args, **kwargs)

    tracer.create_proxy = create_proxy  # type: ignore[method-assign]
    order = trace_execution_order(M.MethodNet(), TracingConfig(tracer=tracer))
    assert tracer.create_proxy is create_proxy
    assert "call_module" not in vars(tracer)
    assert "call_method" in calls  # the user's wrapper ran inside ours
    assert order.param_forward_order == ["w", "s"]

    with pytest.raises(TracingError):
        trace_execution_order(M.DataDependentNet(), TracingConfig(tracer=tracer))
    assert tracer.create_proxy is create_proxy


def test_meta_model_stays_on_meta_and_copy_is_equal() -> None:
    with torch.device("meta"):
        model = GPT(GPTConfig(n_blocks=2))
    before = _model_snapshot(model)
    twin = copy.deepcopy(model)
    assert trace_execution_order(model) == trace_execution_order(twin)
    assert all(p.is_meta for p in model.parameters())
    _assert_same(model, before)
