"""Case suite, plans: the exact units and notes for each hard model kind (issue 8).

The plan must be the same whichever capture path gave the order, must pass
its own checks, and must leave the model alone.
"""

from __future__ import annotations

import functools

import pytest
import torch.nn as nn
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    always_wrap_policy,
    size_based_auto_wrap_policy,
)

from execwrap import WrapPlan, plan_wrap
from tests.cases._checks import snapshot
from tests.cases._expected import CASES, PLANS, PlanCase, build, inputs
from tracing import record_execution_order, trace_execution_order

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch.utils.checkpoint")


def _plan(name: str, method: str) -> tuple[nn.Module, WrapPlan]:
    expected = PLANS[name]
    case = CASES[expected.case]
    model = build(case)
    if method == "symbolic":
        order = trace_execution_order(model)
    else:
        order = record_execution_order(model, *inputs(case))
    policy = expected.policy() if expected.policy is not None else always_wrap_policy
    before = snapshot(model)
    plan = plan_wrap(model, order, policy)
    before.assert_unchanged(model)
    return model, plan


def _units(plan: WrapPlan) -> list[tuple[tuple[str, ...], tuple[str, ...], int | None, int | None]]:
    return [(u.module_fqns, u.param_fqns, u.first_use, u.last_use) for u in plan.units]


def _assert_notes(plan: WrapPlan, expected: PlanCase) -> None:
    assert len(plan.notes) == len(expected.notes), plan.notes
    for fragments in expected.notes:
        matching = [n for n in plan.notes if all(f in n for f in fragments)]
        assert len(matching) == 1, (fragments, plan.notes)


_PARAMS = [
    pytest.param(name, method, id=f"{name}-{method}")
    for name, expected in PLANS.items()
    for method in ("runtime", "symbolic")
    if method == "runtime" or CASES[expected.case].symbolic_error is None
]


@pytest.mark.parametrize(("name", "method"), _PARAMS)
def test_plan_units_and_notes(name: str, method: str) -> None:
    expected = PLANS[name]
    model, plan = _plan(name, method)
    assert _units(plan) == expected.units
    assert plan.atomic_units == plan.units  # no bucketing asked
    _assert_notes(plan, expected)
    plan.check(model)
    # every name of every parameter (aliases too) is in exactly one unit
    canonical = plan.order.alias_to_canonical()
    for fqn, _ in model.named_parameters(remove_duplicate=False):
        holders = [u for u in plan.units if canonical[fqn] in u.param_fqns]
        assert len(holders) == 1, fqn


@pytest.mark.parametrize(
    "policy",
    [
        always_wrap_policy,
        functools.partial(size_based_auto_wrap_policy, min_num_params=1),
        ModuleWrapPolicy({nn.Linear}),  # out_proj is a Linear subclass
        ModuleWrapPolicy({nn.Linear, nn.MultiheadAttention}),
    ],
    ids=["always", "size1", "linear", "linear+mha"],
)
def test_multihead_attention_out_proj_never_a_unit(policy: object) -> None:
    case = CASES["multihead_attention"]
    model = build(case)
    for order in (trace_execution_order(model), record_execution_order(model, *inputs(case))):
        plan = plan_wrap(model, order, policy)
        assert all("attn.out_proj" not in u.module_fqns for u in plan.units), plan.groups
        holder = [u for u in plan.units if "attn.out_proj.weight" in u.param_fqns]
        assert len(holder) == 1
        # out_proj's weights live with the module whose forward uses them
        assert holder[0].module_fqns[0] in ("attn", "")
        assert "attn.in_proj_weight" in holder[0].param_fqns
        assert "attn.out_proj.bias" in holder[0].param_fqns
        plan.check(model)


def test_checkpoint_untied_keeps_blocks_as_units() -> None:
    """Without the tie, checkpointed blocks are ordinary units (recompute
    does not add calls, so first_use/last_use are the forward calls: a
    block's span runs from its call to its last nested call, fc2)."""
    from tests.cases.models import CheckpointedBlocks, MLPBlock

    for reentrant in (True, False):
        model = CheckpointedBlocks(use_reentrant=reentrant, tie=False)
        order = record_execution_order(model, *inputs(CASES["checkpoint_reentrant"]))
        plan = plan_wrap(model, order, ModuleWrapPolicy({MLPBlock}))
        assert _units(plan) == [
            (("",), ("inp.weight", "inp.bias", "head.weight", "head.bias"), 0, 10),
            (
                ("block0",),
                ("block0.fc1.weight", "block0.fc1.bias", "block0.fc2.weight", "block0.fc2.bias"),
                2,
                5,  # block0, block0.fc1, block0.act, block0.fc2
            ),
            (
                ("block1",),
                ("block1.fc1.weight", "block1.fc1.bias", "block1.fc2.weight", "block1.fc2.bias"),
                6,
                9,
            ),
        ]
        assert plan.notes == []
