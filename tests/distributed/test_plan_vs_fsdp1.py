"""The plan's units are the units torch's own FSDP1 builds for the same policy.

Two gloo ranks on CPU wrap each model with ``FullyShardedDataParallel`` and
report every FSDP instance's module FQN (wrapper prefixes stripped) and the
parameters in its flat parameter; the test compares them with
:func:`execwrap.policy_units` (policy alone) and :func:`execwrap.plan_wrap`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import (
    ModuleWrapPolicy,
    always_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

from execwrap.demo_models import GPT, Block, GPTConfig, Llama, LlamaBlock, LlamaConfig
from execwrap.planning.planner import plan_wrap, policy_units
from tests._dist import run_ranks
from tracing import trace_execution_order
from tracing.fqn import clean_fqn, join_fqn


class LayerOrder(nn.Module):
    """Defined layer0, layer1, layer2; runs layer0 -> layer2 -> layer1."""

    def __init__(self) -> None:
        super().__init__()
        self.layer0 = nn.Linear(4, 8)
        self.layer1 = nn.Linear(16, 4)
        self.layer2 = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer1(self.layer2(self.layer0(x)))


def _new_style(module: nn.Module, recurse: bool, nonwrapped_numel: int) -> bool:
    return recurse or nonwrapped_numel >= 30000


def _old_style(module: nn.Module, recurse: bool, unwrapped_params: int) -> bool:
    """The same rule with the torch 1.12 signature (FSDP1 itself cannot call it)."""
    return recurse or unwrapped_params >= 30000


def _gpt() -> nn.Module:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_blocks=2))


def _llama() -> nn.Module:
    torch.manual_seed(0)
    return Llama(LlamaConfig(n_layers=3))


# case -> (model factory, policy given to FSDP1, policy given to the planner)
CASES: dict[str, tuple[Callable[[], nn.Module], Any, Any]] = {
    "layer_order/always_wrap": (LayerOrder, always_wrap_policy, always_wrap_policy),
    "gpt/module_wrap_block": (_gpt, ModuleWrapPolicy({Block}), ModuleWrapPolicy({Block})),
    "gpt/size_based_30000": (
        _gpt,
        functools.partial(size_based_auto_wrap_policy, min_num_params=30000),
        functools.partial(size_based_auto_wrap_policy, min_num_params=30000),
    ),
    "gpt/size_based_10000": (
        _gpt,
        functools.partial(size_based_auto_wrap_policy, min_num_params=10000),
        functools.partial(size_based_auto_wrap_policy, min_num_params=10000),
    ),
    "gpt/old_style_signature": (_gpt, _new_style, _old_style),
    "llama/transformer_auto_wrap": (
        _llama,
        functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaBlock}),
        functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaBlock}),
    ),
    "llama/size_based_20000": (
        _llama,
        functools.partial(size_based_auto_wrap_policy, min_num_params=20000),
        functools.partial(size_based_auto_wrap_policy, min_num_params=20000),
    ),
    "llama/always_wrap": (_llama, always_wrap_policy, always_wrap_policy),
}


def _fsdp1_units(rank: int, world_size: int, names: list[str]) -> dict[str, dict[str, list[str]]]:
    """FSDP module FQN -> FQNs of the parameters in its flat parameter, per case."""
    out: dict[str, dict[str, list[str]]] = {}
    for name in names:
        factory, fsdp_policy, _ = CASES[name]
        model = FSDP(
            factory(),
            auto_wrap_policy=fsdp_policy,
            use_orig_params=True,
            device_id=torch.device("cpu"),
        )
        fqn_of = {id(m): clean_fqn(n) for n, m in model.named_modules()}
        units: dict[str, list[str]] = {}
        for m in FSDP.fsdp_modules(model):
            fqn = fqn_of[id(m)]
            handle = m._handle  # noqa: SLF001 - the flat parameter's FQNs
            rel = list(handle.flat_param._fqns) if handle is not None else []
            units[fqn] = sorted(join_fqn(fqn, clean_fqn(r)) for r in rel)
        out[name] = units
    return out


def test_plan_units_match_fsdp1() -> None:
    names = list(CASES)
    results = run_ranks(_fsdp1_units, world_size=2, args=(names,), timeout_s=120)
    assert results[0] == results[1]
    fsdp = results[0]
    for name in names:
        factory, _, planner_policy = CASES[name]
        model = factory()
        # the policy alone decides what FSDP1 decides, in any case
        assert sorted(policy_units(model, planner_policy)) == sorted(fsdp[name]), name

    def plan_units(name: str) -> dict[str, list[str]]:
        factory, _, planner_policy = CASES[name]
        model = factory()
        plan = plan_wrap(model, trace_execution_order(model), planner_policy)
        return {u.module_fqns[0]: sorted(u.param_fqns) for u in plan.units}

    # where the order shows nothing unsafe, the plan is exactly FSDP1's units,
    # parameter by parameter (tied lm_head.weight is wte.weight in the root)
    for name in (
        "layer_order/always_wrap",
        "gpt/module_wrap_block",
        "gpt/size_based_30000",
        "llama/transformer_auto_wrap",
        "llama/size_based_20000",
    ):
        assert plan_units(name) == fsdp[name], name
    assert sorted(fsdp["gpt/module_wrap_block"]) == ["", "blocks.0", "blocks.1"]
    assert "wte.weight" in fsdp["gpt/module_wrap_block"][""]

    # FSDP1 wraps wte, whose weight lm_head (in the root unit) uses after wte
    # has resharded it; the plan keeps the tied weight in the root instead
    fsdp_small = fsdp["gpt/size_based_10000"]
    assert "wte" in fsdp_small and "lm_head" not in fsdp_small
    assert fsdp_small["wte"] == ["wte.weight"]
    planned = plan_units("gpt/size_based_10000")
    assert set(fsdp_small) - set(planned) == {"wte"}
    assert planned[""] == sorted(fsdp_small[""] + ["wte.weight"])

    # FSDP1 wraps the ModuleList `blocks` (its hooks never fire; torch warns); the
    # plan does not, and the blocks' remaining parameters go to the root
    planned = plan_units("gpt/old_style_signature")
    assert set(fsdp["gpt/old_style_signature"]) - set(planned) == {"blocks"}
    assert planned[""] == sorted(
        fsdp["gpt/old_style_signature"]["blocks"] + fsdp["gpt/old_style_signature"][""]
    )

    # always_wrap: FSDP1 wraps the ModuleList too; the plan does not
    planned = plan_units("llama/always_wrap")
    assert set(fsdp["llama/always_wrap"]) - set(planned) == {"layers"}
    for fqn, params in planned.items():
        assert params == fsdp["llama/always_wrap"][fqn], fqn
