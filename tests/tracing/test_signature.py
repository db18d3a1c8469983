"""Inputs bound to forward's signature: decorated roots, **kwargs, defaults, concrete_args."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypedDict

import pytest
import torch
import torch.nn as nn

from tests.models.zoo import OptionalMaskViT
from tracing import TracingConfig, TracingError, record_execution_order, trace_execution_order
from tracing.symbolic import check_concrete_args

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # pragma: no cover
    from typing_extensions import Unpack


def returns_dict(forward: Callable[..., Any]) -> Callable[..., Any]:
    """A transformers-5-style decorator: ``(self, *args, **kwargs)`` around the real forward."""

    @functools.wraps(forward)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        as_tuple = kwargs.pop("return_tuple", False)
        out = forward(self, *args, **kwargs)
        return (out["logits"],) if as_tuple else out

    return wrapper


class ExtraKwargs(TypedDict, total=False):
    output_hidden: bool


class DecoratedLM(nn.Module):
    """``forward(input_ids=None, inputs_embeds=None, mask=None, **kwargs)``, decorated."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.mask_proj = nn.Linear(4, 4)
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 3)

    @returns_dict
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        **kwargs: Unpack[ExtraKwargs],
    ) -> dict[str, torch.Tensor]:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("pass exactly one of input_ids or inputs_embeds")
        h = self.embed(input_ids) if inputs_embeds is None else inputs_embeds
        if mask is not None:
            h = h + self.mask_proj(h) * mask
        h = self.body(h)
        out = {"logits": self.head(h)}
        if kwargs.get("output_hidden"):
            out["hidden"] = h
        return out


class TypedKwargs(nn.Module):
    """An undecorated ``forward(x, **kwargs: Unpack[ExtraKwargs])``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, **kwargs: Unpack[ExtraKwargs]) -> torch.Tensor:
        return self.fc(x)


class ListInput(nn.Module):
    """Tensors inside a list argument, and a non-tensor option."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, xs: list[torch.Tensor], *, reverse: bool = False) -> torch.Tensor:
        layers = list(self.layers)[::-1] if reverse else list(self.layers)
        return sum(layer(x) for layer, x in zip(layers, xs, strict=True))  # type: ignore[return-value]


IDS = torch.tensor([[1, 2, 3]])


def test_decorated_root_with_kwargs_traces_with_inputs() -> None:
    model = DecoratedLM()
    order = trace_execution_order(model, example_kwargs={"input_ids": IDS})
    assert order.module_forward_order == ["", "embed", "body", "head"]  # mask not passed
    assert order.warnings == []
    real = record_execution_order(model, input_ids=IDS)
    assert order.module_forward_order == real.module_forward_order
    assert order.param_forward_order == real.param_forward_order


def test_inputs_embeds_branch_and_passed_mask() -> None:
    model = DecoratedLM()
    embeds = torch.randn(1, 3, 4)
    order = trace_execution_order(
        model, example_kwargs={"inputs_embeds": embeds, "mask": torch.ones(1, 3, 1)}
    )
    assert order.module_forward_order == ["", "mask_proj", "body", "head"]


def test_decorated_root_without_inputs_names_the_proxied_optional_arguments() -> None:
    with pytest.raises(TracingError) as info:
        trace_execution_order(DecoratedLM())
    # input_ids and inputs_embeds were both Proxies: `is None` is False for both
    assert info.value.reason is not None
    assert info.value.reason.startswith(
        "ValueError: pass exactly one of input_ids or inputs_embeds at "
        "tests/tracing/test_signature.py:"
    )
    assert "or example inputs" in str(info.value)


def test_optional_argument_not_passed_keeps_its_default() -> None:
    model = OptionalMaskViT()
    x = torch.randn(2, 4, 12)
    order = trace_execution_order(model, example_inputs=x)
    assert order.module_forward_order == ["", "patch", "qkv", "proj", "head"]
    assert order.module_forward_order == record_execution_order(model, x).module_forward_order
    assert order.warnings == []


def test_without_inputs_the_warning_names_the_proxied_optional_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="tracing"):
        order = trace_execution_order(OptionalMaskViT())
    assert order.module_forward_order == ["", "patch", "qkv", "mask_proj", "proj", "head"]
    assert order.warnings == [
        "OptionalMaskViT.forward was traced without example inputs, so fx made its optional "
        "argument 'attn_mask' a Proxy: a test such as `attn_mask is None` is False during "
        "the trace, and a branch on it follows the passed-argument side even when the "
        "argument is never passed. Pass example inputs (arguments not passed then keep their "
        "defaults) or concrete_args={'attn_mask': None} if the trace must match calls "
        "without it."
    ]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == order.warnings


def test_concrete_args_fix_the_optional_argument_without_inputs() -> None:
    order = trace_execution_order(
        OptionalMaskViT(), TracingConfig(concrete_args={"attn_mask": None})
    )
    assert order.module_forward_order == ["", "patch", "qkv", "proj", "head"]
    assert order.warnings == []


def test_tensors_inside_containers_and_keyword_only_options() -> None:
    model = ListInput()
    xs = [torch.randn(2, 4), torch.randn(2, 4)]
    forward = trace_execution_order(model, example_inputs=(xs,))
    backward = trace_execution_order(model, example_inputs=(xs,), example_kwargs={"reverse": True})
    assert forward.module_forward_order == ["", "layers.0", "layers.1"]
    assert backward.module_forward_order == ["", "layers.1", "layers.0"]


def test_decorator_still_runs_with_bound_inputs() -> None:
    # `return_tuple` goes into **kwargs and is popped by the decorator
    order = trace_execution_order(
        DecoratedLM(), example_kwargs={"input_ids": IDS, "return_tuple": True}
    )
    assert order.module_forward_order == ["", "embed", "body", "head"]


def test_inputs_that_do_not_fit_the_signature() -> None:
    with pytest.raises(
        TypeError,
        match=r"^the example inputs do not fit ListInput\.forward\(xs, \*, reverse=False\): "
        r"too many positional arguments$",
    ):
        trace_execution_order(ListInput(), example_inputs=([torch.ones(1, 4)], True))


@pytest.mark.parametrize(
    "model, names, message",
    [
        (
            OptionalMaskViT(),
            {"mask": None},
            "concrete_args: OptionalMaskViT.forward has no argument 'mask'; its arguments are "
            "'x', 'attn_mask'",
        ),
        (
            TypedKwargs(),
            {"use_cache": False, "x": None},
            "concrete_args: TypedKwargs.forward has no argument 'use_cache'; its arguments are "
            "'x', 'output_hidden'",
        ),
    ],
)
def test_unknown_concrete_arg_names_the_valid_ones(
    model: nn.Module, names: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message.replace('(', '.').replace(')', '.')}$"):
        check_concrete_args(model, names)
    with pytest.raises(ValueError, match="has no argument"):
        trace_execution_order(model, TracingConfig(concrete_args=names))


def test_typed_kwargs_keys_and_plain_kwargs_are_valid_concrete_args() -> None:
    check_concrete_args(TypedKwargs(), {"output_hidden": True})
    check_concrete_args(DecoratedLM(), {"return_tuple": True})  # the decorator may take it

    class Plain(nn.Module):
        def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            return x

    check_concrete_args(Plain(), {"anything": 1})  # goes into **kwargs
    order = trace_execution_order(
        DecoratedLM(),
        TracingConfig(concrete_args={"output_hidden": True}),
        example_kwargs={"input_ids": IDS},
    )
    assert order.module_forward_order == ["", "embed", "body", "head"]
