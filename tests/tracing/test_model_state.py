"""ModuleSnapshot: what a forward does to its modules while fx traces it is undone.

Symbolic capture runs the model's Python with Proxies: every statement of a
``forward`` that writes to a module (``self.x = ...``, ``register_buffer``,
``add_module``, reassigning a parameter, ``train(False)``, ``del self.x``)
runs for real. The snapshot lets every module work on copies of its dicts and
gives it the untouched originals back.
"""

from __future__ import annotations

from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

from tracing import TracingConfig, TracingError, trace_execution_order
from tracing.model_state import ModuleSnapshot


class Meddler(nn.Module):
    """A forward that writes to its modules in every way fx lets run for real."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.tag = "kept"
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.last = x
        del self.tag
        self.register_buffer("lazy", torch.zeros(2))
        self.add_module("extra", nn.Identity())
        self.fc.weight = nn.Parameter(torch.zeros(2, 2))
        self.train(False)
        if self.fail and x.sum() > 0:  # a branch on a value: the trace fails here
            return x
        return self.fc(x)


def _state(model: nn.Module) -> list[tuple[object, ...]]:
    return [
        (fqn, id(vars(m)), list(vars(m).items()), list(m._parameters.items()), m.training)
        for fqn, m in model.named_modules()
    ] + [(list(m._buffers.items()), list(m._modules.items())) for m in model.modules()]


@pytest.mark.parametrize("fail", [False, True], ids=["traced", "trace fails"])
def test_what_a_traced_forward_writes_to_its_modules_is_undone(fail: bool) -> None:
    model = Meddler(fail=fail)
    weight = model.fc.weight
    before = _state(model)
    if fail:
        with pytest.raises(TracingError, match=r"the root module <root> \(Meddler\)"):
            trace_execution_order(model, TracingConfig())
    else:
        order = trace_execution_order(model, TracingConfig())
        assert order.module_forward_order == ["", "fc"]
        assert [use.param_fqns for use in order.param_uses] == [("fc.weight", "fc.bias")]
    assert _state(model) == before
    assert model.fc.weight is weight and model.tag == "kept" and model.training
    assert not hasattr(model, "last") and "lazy" not in model._buffers
    assert "extra" not in model._modules


def test_snapshot_swaps_in_copies_and_puts_the_same_dicts_back() -> None:
    shared = nn.Linear(2, 2)
    model = nn.Sequential(shared, nn.ReLU(), shared)
    relu = model[1]
    originals = [vars(m) for m in (model, shared, relu)]
    relu_buffers = relu._buffers
    object.__setattr__(shared, "_parameters", OrderedDict(shared._parameters))

    snapshot = ModuleSnapshot(model)
    assert [vars(m) is d for m, d in zip((model, shared, relu), originals, strict=True)] == [
        False,
        False,
        False,
    ]
    assert type(shared._parameters) is OrderedDict  # a slot copy keeps its type
    relu._buffers["b"] = torch.ones(1)  # an empty slot dict is shared, not copied
    shared.weight = nn.Parameter(torch.zeros(2, 2))
    model.note = "run"
    snapshot.restore()

    assert [vars(m) is d for m, d in zip((model, shared, relu), originals, strict=True)] == [
        True,
        True,
        True,
    ]
    assert relu._buffers is relu_buffers and dict(relu._buffers) == {}
    assert not torch.equal(shared.weight, torch.zeros(2, 2)) and not hasattr(model, "note")


def test_snapshot_values_put_back_in_place_updates_of_buffers_and_tensor_attributes() -> None:
    model = nn.Linear(2, 2)
    model.register_buffer("count", torch.zeros((), dtype=torch.long))
    model.scale = torch.ones(2)
    count, scale = model.count, model.scale
    snapshot = ModuleSnapshot(model, values=True)
    model.count += 1  # in place: the same tensor
    model.scale.mul_(3)
    snapshot.restore()
    assert model.count is count and int(count) == 0
    assert model.scale is scale and scale.tolist() == [1.0, 1.0]
