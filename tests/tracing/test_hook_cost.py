"""The timer's own cost taken off measured forward times (tracing.runtime.hook_cost)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tracing import record_execution_order
from tracing.runtime.hook_cost import without_hook_cost


def _fields(starts: list[float], times: list[float], backward: list[float | None],
            end: float | None) -> dict:  # fmt: skip
    return {"forward_start_s": starts, "forward_times_s": times, "backward_start_s": backward,
            "backward_end_s": end, "saved_activation_bytes": [0] * len(starts)}  # fmt: skip


def test_nested_calls_lose_their_hooks_cost_exactly() -> None:
    # root [0, 20] > a [1, 11] > (a.x [2, 5], a.y [6, 10]); then b [12, 19] (ms):
    # end -> start stretches 1 (a.x -> a.y) and 1 (a -> b): h = 1; start -> start 1 and 1:
    # a = 1, so b = 0 (nothing is left after an end)
    ms = 1e-3
    f = _fields([0, 1 * ms, 2 * ms, 6 * ms, 12 * ms], [20 * ms, 10 * ms, 3 * ms, 4 * ms, 7 * ms],
                [25 * ms, 30 * ms, 32 * ms, 31 * ms, 26 * ms], 40 * ms)  # fmt: skip
    new, h = without_hook_cost(f)
    assert h == pytest.approx(1 * ms)
    # inclusive times lose h per nested call: root 4, a 2, leaves 0
    assert new["forward_times_s"] == pytest.approx([16 * ms, 8 * ms, 3 * ms, 4 * ms, 7 * ms])
    # starts lose the pre-hook part (a = h here) of every call started before them
    assert new["forward_start_s"] == pytest.approx([0, 0, 0, 3 * ms, 8 * ms])
    # backward: the whole forward's cost (5 calls) less the root's own pre-hook
    assert new["backward_start_s"] == pytest.approx([21 * ms, 26 * ms, 28 * ms, 27 * ms, 22 * ms])
    assert new["backward_end_s"] == pytest.approx(36 * ms)
    assert f["forward_times_s"][0] == 20 * ms  # the input is not changed
    # still nested: every call inside its parent, in call order
    ends = [s + t for s, t in zip(new["forward_start_s"], new["forward_times_s"], strict=True)]
    assert ends == pytest.approx([16 * ms, 8 * ms, 3 * ms, 7 * ms, 15 * ms])


def test_calls_that_never_follow_one_another_are_left_alone() -> None:
    # a chain: root > a > b, no call starts after another one's end
    f = _fields([0.0, 0.001, 0.002], [0.010, 0.008, 0.005], [None, None, None], None)
    new, h = without_hook_cost(f)
    assert h == 0.0 and new == f


def test_the_cost_never_makes_time_run_backwards() -> None:
    # the stretch after b's end to the root's end is 0.1 ms, shorter than the hooks'
    # 1 ms (a = 0.2 ms before each start): only 0.1 ms is taken after an end
    ms = 1e-3
    f = _fields([0, 0.2 * ms, 4.2 * ms], [7.3 * ms, 3 * ms, 3 * ms], [8 * ms, 9 * ms, 8.5 * ms],
                10 * ms)  # fmt: skip
    new, h = without_hook_cost(f)
    assert h == pytest.approx(0.3 * ms)
    ends = [s + t for s, t in zip(new["forward_start_s"], new["forward_times_s"], strict=True)]
    assert new["forward_start_s"] == sorted(new["forward_start_s"])
    assert ends[2] <= ends[0] and min(new["forward_times_s"]) > 0
    assert min(new["backward_start_s"]) >= ends[0]


def test_a_measured_order_keeps_its_shape() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU())
    order = record_execution_order(model, torch.randn(4, 16), timing=True)
    starts, times = order.forward_start_s, order.forward_times_s
    ends = [s + t for s, t in zip(starts, times, strict=True)]
    assert starts[0] == 0.0 and starts == sorted(starts) and min(times) >= 0.0
    assert all(e <= ends[0] + 1e-12 for e in ends)  # nested inside the root call
    assert all(ends[k] <= starts[k + 1] + 1e-12 for k in range(1, 4))  # the layers in turn
    assert all(b is not None and b >= ends[0] - 1e-12 for b in order.backward_start_s)
