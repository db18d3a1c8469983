"""Values fixed by the config and the inputs' shapes, known to the fake run (tracing.runtime.known_values)."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn

from tests.cases._checks import snapshot
from tracing import TracingError, capture_execution_order
from tracing.rates import ComputeRates
from tracing.runtime.known_values import KNOWN_BYTES_LIMIT, SEED
from tracing.runtime.shadow import ShadowMode, record_zero_cost


def _line(fn: object, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)  # type: ignore[arg-type]
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_values_from_shapes_decide_item_and_nonzero() -> None:
    with ShadowMode():
        mask = torch.ones(2, 8, device="meta")
        mask[:, 5:] = 0
        positions = torch.arange(8, device="meta")
        kept = (positions % 3 == 0).nonzero()
        assert (bool((mask > 0).any()), int(mask.sum()), float(mask.mean())) == (True, 10, 0.625)
        assert (type(kept).__name__, kept.device.type, tuple(kept.shape)) == (
            "FakeTensor",
            "meta",
            (3, 1),
        )
        assert kept.tolist() == [[0], [3], [6]]
        assert positions[mask[0] > 0].tolist() == [0, 1, 2, 3, 4]


def test_a_write_the_run_cannot_compute_forgets_the_value() -> None:
    weight = torch.empty(8, device="meta")
    mode = ShadowMode()
    fake_weight = mode.from_tensor(weight)  # a weight's value is never known
    with mode:
        mask = torch.ones(8, device="meta")
        view = mask[:4]
        assert int(mask.sum()) == 8
        view.mul_(fake_weight[:4])  # through a view: the base is forgotten too
        with pytest.raises(Exception, match="_local_scalar_dense"):
            int(mask.sum())


def test_larger_values_are_not_kept() -> None:
    n = KNOWN_BYTES_LIMIT // 4 + 1  # float32 elements just over the limit
    with ShadowMode():
        assert int(torch.ones(n - 1, device="meta").sum()) == n - 1
        with pytest.raises(Exception, match="_local_scalar_dense"):
            int(torch.ones(n, device="meta").sum())


class LayerDrop(nn.Module):
    """BART's training-time layer drop: ``if torch.rand([]) < self.layerdrop: continue``."""

    def __init__(self, layerdrop: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.layerdrop = layerdrop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.training:
                dropout_probability = torch.rand([])
                if dropout_probability < self.layerdrop:
                    continue
            x = layer(x)
        return x


@pytest.mark.parametrize(("layerdrop", "called"), [(0.0, [0, 1, 2]), (1.0, []), (0.5, [1, 2])])
def test_a_layer_drop_is_decided_by_a_seeded_draw(layerdrop: float, called: list[int]) -> None:
    with torch.device("meta"):
        model = LayerDrop(layerdrop)
    x = torch.randn(2, 4, device="meta")
    rng = torch.get_rng_state()
    orders = [record_zero_cost(model, x) for _ in range(2)]
    assert torch.equal(torch.get_rng_state(), rng)  # the user's random stream is untouched
    assert orders[0].module_forward_order == ["", *(f"layers.{i}" for i in called)]
    assert orders[1].module_forward_order == orders[0].module_forward_order  # the same draws
    line = _line(LayerDrop.forward, "if dropout_probability < self.layerdrop:")
    assert orders[0].warnings == [
        f"a random draw decided control flow at tests/tracing/test_known_values.py:{line} "
        "(`if dropout_probability < self.layerdrop:`) (e.g. a training-time layer drop); the "
        f"order is that of one draw from a generator seeded with {SEED}, the same on every "
        "rank; a step with other draws may skip or add calls"
    ]
    model.eval()
    assert record_zero_cost(model, x).warnings == []  # no draw in eval mode


class MaskedMerge(nn.Module):
    """A boolean-mask index built from positions: its backward runs ``nonzero`` on the mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 4)
        self.extra = nn.Parameter(torch.ones(4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        marked = torch.arange(ids.shape[1], device=ids.device) % 2 == 0
        h[:, marked] = self.extra
        return h


def test_a_known_mask_in_backward() -> None:
    with torch.device("meta"):
        model = MaskedMerge()
    order = record_zero_cost(model, torch.zeros(2, 6, dtype=torch.long, device="meta"))
    assert order.param_backward_order == ["extra", "embed.weight"]


class InputLengths(nn.Module):
    """XLM's check: ``lengths = (ids != pad).sum(1)``; ``assert lengths.max().item() <= slen``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        lengths = (ids != 0).sum(dim=1)
        assert lengths.max().item() <= ids.shape[1]
        return self.embed(ids)


def test_real_inputs_values_are_known_meta_ones_are_not() -> None:
    model = InputLengths()
    before = snapshot(model)
    ids = torch.ones(2, 6, dtype=torch.long)
    order = capture_execution_order(model, example_inputs=ids)
    assert (order.capture_step, order.module_forward_order) == ("zero-cost runtime", ["", "embed"])
    before.assert_unchanged(model)
    with pytest.raises(TracingError, match=r"_local_scalar_dense.*lengths\.max\(\)\.item\(\)"):
        record_zero_cost(model.to("meta"), ids.to("meta"))


class CastRouter(nn.Module):
    """SwitchTransformers' router: ``self.classifier = self.classifier.to(self.dtype)`` in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.classifier = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4)
        self.dtype = torch.float32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.classifier = self.classifier.to(self.dtype)
        return self.out(self.classifier(x))


def test_a_conversion_inside_forward_that_changes_nothing() -> None:
    model = CastRouter()
    before = snapshot(model)
    weight = model.classifier.weight
    order = record_zero_cost(model, torch.randn(2, 4))
    before.assert_unchanged(model)
    assert model.classifier.weight is weight and "_apply" not in vars(model.classifier)
    assert order.param_backward_order == [
        "out.bias",
        "out.weight",
        "classifier.bias",
        "classifier.weight",
    ]


def test_timing_estimates_every_call() -> None:
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8))
    rates = ComputeRates("cuda", flops_per_s=1e12, memory_bytes_per_s=1e12, op_overhead_s=0.0)
    order = record_zero_cost(model, torch.randn(32, 64, device="meta"), timing=rates)
    assert (order.timing_method, order.timing_device) == ("estimated", "cuda")
    # the first Linear: at least its 2*32*64*64 matmul FLOPs at 1e12 FLOP/s
    assert order.forward_times_s[1] >= 2 * 32 * 64 * 64 / 1e12
    with pytest.raises(
        TypeError,
        match=r"^record_zero_cost: timing must be a tracing\.rates\.ComputeRates \(e\.g\. "
        r"CostModel\.preset\(\.\.\.\)\.compute\) or None, got bool$",
    ):
        record_zero_cost(model, torch.randn(32, 64, device="meta"), timing=True)  # type: ignore[arg-type]


def test_a_model_under_fake_tensors_has_no_real_step() -> None:
    from torch._subclasses import FakeTensorMode

    class Router(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            return h if h.sum() > 0 else x

    with FakeTensorMode():
        model = Router()
    with pytest.raises(TracingError, match=r"^zero-cost runtime capture \(fake tensors\) failed"):
        capture_execution_order(model, example_inputs=torch.randn(2, 4))
