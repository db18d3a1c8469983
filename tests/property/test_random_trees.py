"""Property tests on random module trees (issue 8, point 3).

Trees of depth up to 4 and fan-out up to 4 with Linear/Embedding/LayerNorm
leaves, children called in random order with repeats and omissions, modules
called again from the root, tied weights, root-level functional uses, frozen
parameters, and sometimes a leaf registered under a second name (see
trees.py). Every tree is symbolically traceable by construction.

Invariants:

* symbolic and runtime capture agree (module calls, first parameter uses,
  the groups used together, tied names);
* runtime backward order holds each trainable used parameter exactly once,
  and nothing else;
* the plan (several policies, with and without bucketing) puts every name of
  every parameter (aliases through their canonical FQN) in exactly one
  unit, passes its own check, and names only modules that run a forward
  (the root excepted);
* after capture and planning, no hook or TorchFunctionMode is left and the
  model (state_dict, parameters, requires_grad, ``.grad``, attributes) is
  unchanged.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
from hypothesis import given, note
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    always_wrap_policy,
    size_based_auto_wrap_policy,
)

from execwrap import WrapPlan, plan_wrap
from tests.cases._checks import snapshot
from tests.property.trees import (
    ModelSpec,
    Node,
    build_model,
    example_input,
    model_specs,
)
from tracing import ExecutionOrder, record_execution_order, trace_execution_order

POLICIES = {
    "always": always_wrap_policy,
    "size32": functools.partial(size_based_auto_wrap_policy, min_num_params=32),
    "node": ModuleWrapPolicy({Node}),
    "leaves": ModuleWrapPolicy({nn.Linear, nn.Embedding, nn.LayerNorm}),
}


def _uses(order: ExecutionOrder) -> list[tuple[str, int, tuple[str, ...]]]:
    return [(u.module_fqn, u.call_index, u.param_fqns) for u in order.param_uses]


def _check_plan(model: nn.Module, order: ExecutionOrder, plan: WrapPlan) -> None:
    plan.check(model)
    canonical = order.alias_to_canonical()
    for fqn, _ in model.named_parameters(remove_duplicate=False):
        holders = [u.module_fqns for u in plan.units if canonical[fqn] in u.param_fqns]
        assert len(holders) == 1, (fqn, canonical[fqn], holders)
    called = set(order.module_forward_order)
    for unit in plan.units:
        for fqn in unit.module_fqns:
            assert fqn == "" or fqn in called, f"unit {fqn!r} never runs its forward"
    assert sum(len(u.param_fqns) for u in plan.units) == len(order.params)
    if plan.bucket_numel is not None:
        for unit in plan.units:
            if len(unit.module_fqns) > 1:
                assert unit.numel <= plan.bucket_numel
    # units in execution order: called units by first call, root first
    firsts = [u.first_use for u in plan.units if u.first_use is not None]
    assert firsts == sorted(firsts)
    assert plan.units[0].module_fqns == ("",)


@given(spec=model_specs())
def test_random_tree_capture_and_plan(spec: ModelSpec) -> None:
    model = build_model(spec)
    x = example_input(spec)
    note(repr(model))
    before = snapshot(model)
    rng = torch.get_rng_state()

    symbolic = trace_execution_order(model)
    runtime = record_execution_order(model, x)

    # symbolic and runtime capture agree on a traceable model
    assert runtime.module_forward_order == symbolic.module_forward_order
    assert runtime.param_forward_order == symbolic.param_forward_order
    assert _uses(runtime) == _uses(symbolic)
    assert runtime.shared_params == symbolic.shared_params
    assert runtime.params == symbolic.params
    assert runtime.module_forward_order[0] == ""

    # every canonical name, and only those, is known; first uses are unique
    names = [n for n, _ in model.named_parameters()]
    assert list(symbolic.params) == names
    assert len(set(symbolic.param_forward_order)) == len(symbolic.param_forward_order)
    assert set(symbolic.param_forward_order) <= set(names)

    # backward: every trainable parameter used in forward, once, nothing else
    trainable = {n for n, info in runtime.params.items() if info.requires_grad}
    expected_backward = set(runtime.param_forward_order) & trainable
    assert len(set(runtime.param_backward_order)) == len(runtime.param_backward_order)
    assert set(runtime.param_backward_order) == expected_backward

    for order in (symbolic, runtime):
        for policy in POLICIES.values():
            _check_plan(model, order, plan_wrap(model, order, policy))
        _check_plan(model, order, plan_wrap(model, order, always_wrap_policy, bucket_numel=40))

    # no harm: hooks and modes gone, model and RNG untouched
    before.assert_unchanged(model)
    assert torch.equal(torch.get_rng_state(), rng)


@given(spec=model_specs())
def test_random_tree_numerics_unchanged_by_capture(spec: ModelSpec) -> None:
    """A model captured at run time computes exactly what an uncaptured copy does."""
    model = build_model(spec)
    reference = build_model(spec)
    x = example_input(spec)
    record_execution_order(model, x)
    out = model(x)
    ref = reference(x)
    assert torch.equal(out, ref)
    if out.requires_grad:
        out.sum().backward()
        ref.sum().backward()
        grads = dict(model.named_parameters())
        for name, p in reference.named_parameters():
            g = grads[name].grad
            assert (g is None) == (p.grad is None), name
            if g is not None:
                assert torch.equal(g, p.grad), name
