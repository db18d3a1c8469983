"""Plans FSDP can build, on 2 gloo ranks: shared modules, scalar parameters,
a block's submodule called from outside the block.

A module registered under two parents builds under FSDP1 and FSDP2 and trains
like the unwrapped model; a model with a 0-dim parameter is refused by both
before anything is wrapped, and builds once that parameter is left unsharded.

What FSDP really does with such a module (checked on 2 gloo ranks, torch 2.13):
FSDP1's auto-wrap visits a module once and sets its wrapper under the first
name only, so a unit at the shared module breaks the calls through the other
name ("setStorage: ... storage of size 0"), and a unit that encloses one name
but not the other flattens the shared weight into itself and breaks the
other's call ("mat2 must be a matrix, got 1-D tensor" with
``use_orig_params=True``, "... out of bounds for storage of size 0" without). FSDP2 hooks the
module object (a unit at the shared module works) but a unit enclosing only
one name breaks too. Units *inside* the shared module work under both (the
wrapper is set on the shared module itself). So the plan keeps the shared
module out of the units, drops the units that enclose some but not all of
its names, and its parameters go to the innermost unit enclosing every name.

One spawn of 2 ranks runs both workers (the scalar refusals first), and each test
checks one's results.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from execwrap import (
    ModuleWrapPolicy,
    ParamExecOrderWrapPolicy,
    TracingConfig,
    always_wrap_policy,
    apply_fully_shard,
)
from tests._dist import run_ranks
from tests.cases.models import CalledOutsideBlock, MLPBlock
from tests.distributed._policy_cases import Case, _dense_batch, dtensor_full_grads, run_parity
from tests.execwrap.factories import ClipHead, Conv, GainBlock, SharedBlocks, SharedEmbed

CPU = torch.device("cpu")


def _fsdp1_full_grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    with FSDP.summon_full_params(model, with_grads=True):
        return {
            n.replace("_fsdp_wrapped_module.", ""): (
                p.grad.detach().clone() if p.grad is not None else None
            )
            for n, p in model.named_parameters()
        }


CASES = {
    "shared_embed": Case("shared_embed", SharedEmbed, _dense_batch, F.mse_loss),
    "shared_blocks": Case("shared_blocks", SharedBlocks, _dense_batch, F.mse_loss),
    # the root calls block0.fc2 after block0 returned (tests/cases: called_outside_block)
    "called_outside": Case(
        "called_outside", CalledOutsideBlock, functools.partial(_dense_batch, dim=4), F.mse_loss
    ),
}
POLICIES = {
    "always": always_wrap_policy,
    "conv": ModuleWrapPolicy({Conv, GainBlock}),
    "blocks": ModuleWrapPolicy({MLPBlock}),
}
RUNS = [
    *((c, p) for c in ("shared_embed", "shared_blocks") for p in ("always", "conv")),
    ("called_outside", "blocks"),
]


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world_size,))
    out: dict[str, Any] = {}
    for case_name, policy_name in RUNS:
        case, init_policy = CASES[case_name], POLICIES[policy_name]
        for fsdp in ("fsdp1", "fsdp2"):
            policy = ParamExecOrderWrapPolicy(init_policy, TracingConfig())

            def wrap(model: nn.Module, p: Any = policy, f: str = fsdp) -> nn.Module:
                if f == "fsdp1":
                    return FSDP(model, auto_wrap_policy=p, use_orig_params=True, device_id=CPU)
                apply_fully_shard(model, p, mesh=mesh)
                return model

            grads = _fsdp1_full_grads if fsdp == "fsdp1" else dtensor_full_grads
            res = run_parity(rank, world_size, case, wrap, grads)  # asserts parity
            out[f"{case_name}/{policy_name}/{fsdp}"] = {
                "groups": policy.plan.groups,
                "losses": res["losses"],
                "diff": res["max_grad_diff"],
            }
            dist.barrier()
    # Negative control: FSDP1's own auto-wrap with the same policy (units conv1, conv2)
    model = FSDP(SharedEmbed(), auto_wrap_policy=POLICIES["conv"], device_id=CPU)
    try:
        model(torch.randn(2, 8)).sum().backward()
    except RuntimeError as e:
        out["control"] = str(e).splitlines()[0]
    return out


def _both_worker(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    scalar = _scalar_worker(rank, world_size)
    return {"scalar": scalar, "shared": _worker(rank, world_size)}


@pytest.fixture(scope="module")
def built() -> dict[str, list[dict[str, Any]]]:
    """Worker -> ``[rank 0's result, rank 1's]``, from one spawn of 2 ranks."""
    results = run_ranks(_both_worker, world_size=2, timeout_s=120)
    return {name: [r[name] for r in results] for name in results[0]}


def test_shared_modules_build_and_train_like_the_unwrapped_model(
    built: dict[str, list[dict[str, Any]]],
) -> None:
    r0, r1 = (dict(r) for r in built["shared"])
    control = r0.pop("control")
    assert control == r1.pop("control") and control.endswith("out of bounds for storage of size 0")
    groups = {key: value["groups"] for key, value in r0.items()}
    assert groups == {
        # conv1.embed is not a unit; conv1 and conv2 enclose one name each: not units
        "shared_embed/always/fsdp1": [[""], ["conv1.proj"], ["conv2.proj"], ["head"]],
        "shared_embed/always/fsdp2": [[""], ["conv1.proj"], ["conv2.proj"], ["head"]],
        "shared_embed/conv/fsdp1": [[""]],
        "shared_embed/conv/fsdp2": [[""]],
        # the shared GainBlock is not a unit (its gain goes to the root); its fc stays one
        "shared_blocks/always/fsdp1": [[""], ["layers.0.fc"], ["out"]],
        "shared_blocks/always/fsdp2": [[""], ["layers.0.fc"], ["out"]],
        "shared_blocks/conv/fsdp1": [[""]],
        "shared_blocks/conv/fsdp2": [[""]],
        # block0.fc2 is called from the root after block0 returned: block0 is not a unit
        "called_outside/blocks/fsdp1": [[""], ["block1"]],
        "called_outside/blocks/fsdp2": [[""], ["block1"]],
    }
    for key, value in r0.items():
        assert value["losses"] == r1[key]["losses"], key  # the mean loss over ranks
        assert value["diff"] < 1e-5, key
        print(key, value["losses"])


def _refusal(fn: Any) -> str | None:
    try:
        fn()
    except ValueError as e:
        return str(e)
    return None


def _scalar_worker(rank: int, world_size: int) -> dict[str, Any]:
    mesh = init_device_mesh("cpu", (world_size,))
    out: dict[str, Any] = {}
    torch.manual_seed(0)
    models = {"fsdp1": ClipHead(), "fsdp2": ClipHead()}
    out["fsdp1"] = _refusal(
        lambda: FSDP(
            models["fsdp1"],
            auto_wrap_policy=ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig()),
            device_id=CPU,
        )
    )
    out["fsdp2"] = _refusal(
        lambda: apply_fully_shard(
            models["fsdp2"],
            ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig()),
            mesh=mesh,
        )
    )
    out["untouched"] = [  # nothing was wrapped: same class, no FSDP module anywhere
        type(m) is ClipHead and not any(isinstance(s, (FSDP, FSDPModule)) for s in m.modules())
        for m in models.values()
    ]
    # the remedy the message gives: keep it unsharded on every rank
    torch.manual_seed(0)
    m1 = ClipHead()
    m1 = FSDP(
        m1,
        auto_wrap_policy=ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig()),
        ignored_states=[m1.get_parameter("logit_scale")],
        device_id=CPU,
    )
    torch.manual_seed(0)
    m2 = ClipHead()
    apply_fully_shard(
        m2,
        ParamExecOrderWrapPolicy(always_wrap_policy, TracingConfig()),
        mesh=mesh,
        ignored_params={m2.get_parameter("logit_scale")},
    )
    x = torch.randn(2, 8)
    out["built"] = [float(m(x).sum().detach()) for m in (m1, m2)]
    return out


def test_scalar_parameters_are_refused_before_wrapping(
    built: dict[str, list[dict[str, Any]]],
) -> None:
    r0, r1 = built["scalar"]
    for r in (r0, r1):
        assert r["fsdp1"] == (
            "ParamExecOrderWrapPolicy: ClipHead has 1 0-dim (scalar) parameter, 'logit_scale', "
            "which FSDP refuses (torch: \"FSDP doesn't support scalar parameters. Change "
            'logit_scale to a 1D tensor with numel equal to 1."); nothing has been wrapped. '
            "Make each a 1-D parameter of one element (e.g. nn.Parameter(t.reshape(1)), read as "
            "p[0]), or keep it unsharded on every rank: FSDP(model, ..., "
            "ignored_states=[model.get_parameter('logit_scale')])"
        )
        assert r["fsdp2"] == (
            "apply_fully_shard: ClipHead has 1 0-dim (scalar) parameter, 'logit_scale', which "
            "fully_shard refuses (torch: \"fully_shard doesn't support scalar parameters. Change "
            'logit_scale to a 1D tensor with numel equal to 1."); nothing has been wrapped. '
            "Make each a 1-D parameter of one element (e.g. nn.Parameter(t.reshape(1)), read as "
            "p[0]), or keep it unsharded on every rank: apply_fully_shard(model, ..., "
            "ignored_params={model.get_parameter('logit_scale')})"
        )
        assert r["untouched"] == [True, True]
    assert r0["built"][0] == r0["built"][1]  # same weights, same output under FSDP1 and FSDP2
