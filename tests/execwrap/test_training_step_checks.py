"""The training step's knobs in one process: bad input refused before anything is
wrapped (exact messages), and what checkpointing does to a model (which modules,
names unchanged, the same values, how many matmuls run again in backward).

Sharding itself and the losses on two ranks: tests/distributed/test_training_step.py.
"""

from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecision,
    MixedPrecisionPolicy,
)
from torch.utils._python_dispatch import TorchDispatchMode

from execwrap import (
    CHECKPOINT_MODES,
    GRADIENT_SYNCS,
    ModuleWrapPolicy,
    ParamExecOrderWrapPolicy,
    TracingConfig,
    TrainingStep,
    WrapPlan,
    accumulate_gradients,
    always_wrap_policy,
    apply_checkpointing,
    apply_fully_shard,
    plan_wrap,
)
from execwrap.demo_models import Llama, LlamaBlock, LlamaConfig
from execwrap.fsdp import CheckpointedForward, check_mixed_precision, check_offload
from execwrap.fsdp.offload import check_plan_offload
from tracing import capture_execution_order

CONFIG = LlamaConfig(vocab_size=32, dim=16, n_heads=2, n_layers=4, mlp_hidden=24)
MODES = "the modes are 'none', 'full' and 'selective'"
DTYPES = "torch.float16, torch.bfloat16, torch.float32 or torch.float64"


def _model() -> Llama:
    torch.manual_seed(0)
    return Llama(CONFIG)


def _plan(model: nn.Module, init_policy: Any = None) -> WrapPlan:
    order = capture_execution_order(model, tracing_config=TracingConfig())
    return plan_wrap(model, order, init_policy or ModuleWrapPolicy({LlamaBlock}))


def _untouched(model: nn.Module) -> bool:
    """Nothing sharded, nothing checkpointed."""
    return not any(
        isinstance(m, FSDPModule) or isinstance(m.__dict__.get("forward"), CheckpointedForward)
        for m in model.modules()
    )


def test_the_modes_and_syncs() -> None:
    assert CHECKPOINT_MODES == ("none", "full", "selective")
    assert GRADIENT_SYNCS == ("every", "last")


# ------------------------------------------------------------------ mixed precision
@pytest.mark.parametrize(
    ("policy", "error", "message"),
    [
        (
            MixedPrecisionPolicy(param_dtype=torch.int8),
            ValueError,
            "apply_fully_shard: mp_policy=MixedPrecisionPolicy(param_dtype=torch.int8) has "
            "param_dtype=torch.int8, which FSDP cannot compute or reduce gradients in (not a "
            "floating dtype: autograd needs floating parameters); param_dtype must be "
            f"{DTYPES} or None. Float8 training goes through torchao's float8 conversion, not "
            "mixed precision; nothing has been wrapped",
        ),
        (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float8_e4m3fn),
            ValueError,
            "apply_fully_shard: mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
            "reduce_dtype=torch.float8_e4m3fn) has reduce_dtype=torch.float8_e4m3fn, which "
            "FSDP cannot compute or reduce gradients in (a float8 dtype: no autograd, "
            f"reductions or optimizer step in it); reduce_dtype must be {DTYPES} or None",
        ),
        (
            MixedPrecisionPolicy(output_dtype=torch.complex64),
            ValueError,
            "apply_fully_shard: mp_policy=MixedPrecisionPolicy(output_dtype=torch.complex64) "
            "has output_dtype=torch.complex64, which FSDP cannot compute or reduce gradients "
            "in (a complex dtype: the loss and the gradients must be real)",
        ),
        (
            MixedPrecisionPolicy(param_dtype="bfloat16"),  # type: ignore[arg-type]
            TypeError,
            "apply_fully_shard: mp_policy=MixedPrecisionPolicy(param_dtype='bfloat16') has "
            "param_dtype='bfloat16', a str; FSDP takes a torch.dtype "
            f"({DTYPES}) or None. Pass e.g. param_dtype=torch.bfloat16; nothing has been "
            "wrapped",
        ),
        (
            MixedPrecisionPolicy(cast_forward_inputs="yes"),  # type: ignore[arg-type]
            TypeError,
            "apply_fully_shard: mp_policy=MixedPrecisionPolicy() has cast_forward_inputs='yes', "
            "a str; it must be True or False; nothing has been wrapped",
        ),
        (
            {"param_dtype": torch.bfloat16},
            TypeError,
            "apply_fully_shard: mp_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy "
            "or None; got dict (FSDP1's MixedPrecision belongs to "
            "FullyShardedDataParallel(mixed_precision=...)); nothing has been wrapped",
        ),
        (
            MixedPrecision(param_dtype=torch.bfloat16),
            TypeError,
            "apply_fully_shard: mp_policy must be a torch.distributed.fsdp.MixedPrecisionPolicy "
            "or None; got MixedPrecision",
        ),
    ],
)
def test_a_mixed_precision_policy_fsdp_would_refuse(
    policy: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match="^" + re.escape(message)):
        check_mixed_precision(policy)
    model = _model()
    plan = _plan(model)
    with pytest.raises(error, match="^" + re.escape(message)):
        apply_fully_shard(model, plan, mp_policy=policy, checkpointing="full")
    assert _untouched(model)


def test_fsdp1_mixed_precision_is_checked_too() -> None:
    with pytest.raises(ValueError, match=re.escape(
        "ParamExecOrderWrapPolicy: mixed_precision=MixedPrecision(buffer_dtype=torch.int32) has "
        "buffer_dtype=torch.int32, which FSDP cannot"
    )):  # fmt: skip
        check_mixed_precision(
            MixedPrecision(buffer_dtype=torch.int32), api="FSDP", where="ParamExecOrderWrapPolicy"
        )
    with pytest.raises(TypeError, match=re.escape(
        "ParamExecOrderWrapPolicy: mixed_precision must be a "
        "torch.distributed.fsdp.MixedPrecision or None; got MixedPrecisionPolicy (FSDP2's "
        "MixedPrecisionPolicy belongs to fully_shard(mp_policy=...)); nothing has been wrapped"
    )):  # fmt: skip
        check_mixed_precision(MixedPrecisionPolicy(), api="FSDP", where="ParamExecOrderWrapPolicy")
    check_mixed_precision(MixedPrecision(param_dtype=torch.float16), api="FSDP")


# ------------------------------------------------------------------ offload
def _no_accelerator() -> str:
    return (
        "" if torch.accelerator.is_available() else " (torch.accelerator.is_available() is False)"
    )


def test_offload_on_a_cpu_device_is_refused_saying_why() -> None:
    with pytest.raises(ValueError) as refused:
        check_offload(CPUOffload(offload_params=True), device_id=torch.device("cpu"), api="FSDP")
    assert str(refused.value) == (
        "apply_fully_shard: cpu_offload=CPUOffload(offload_params=True) keeps the sharded "
        "parameters, gradients and optimizer state in host memory and copies them to an "
        f"accelerator for each all-gather, but the device is the CPU{_no_accelerator()}: the "
        "parameters already live in host memory and there is no accelerator to copy them to "
        '(torch would fail later with "Cannot access accelerator device when none is '
        'available."); nothing has been wrapped. Leave cpu_offload out on a CPU-only device, '
        "or shard onto an accelerator (device_id=...)"
    )
    check_offload(CPUOffload(offload_params=False), device_id=torch.device("cpu"), api="FSDP")
    with pytest.raises(TypeError, match=re.escape(
        "apply_fully_shard: offload_policy must be a torch.distributed.fsdp.OffloadPolicy; got "
        "CPUOffload: pass offload_policy=CPUOffloadPolicy() (FSDP1's CPUOffload belongs to "
        "FullyShardedDataParallel(cpu_offload=...)); nothing has been wrapped"
    )):  # fmt: skip
        check_offload(CPUOffload(offload_params=True))


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the default device is an accelerator")
def test_apply_fully_shard_refuses_offload_on_a_cpu_only_device() -> None:
    model = _model()
    with pytest.raises(ValueError) as refused:
        apply_fully_shard(model, _plan(model), offload_policy=CPUOffloadPolicy())
    assert str(refused.value) == (
        "apply_fully_shard: offload_policy=CPUOffloadPolicy(pin_memory=True) keeps the sharded "
        "parameters, gradients and optimizer state in host memory and copies them to an "
        "accelerator for each all-gather, but the device is the CPU "
        "(torch.accelerator.is_available() is False): the parameters already live in host "
        "memory and there is no accelerator to copy them to (torch would fail later with "
        '"Cannot access accelerator device when none is available."); nothing has been '
        "wrapped. Leave offload_policy out on a CPU-only device, or shard onto an accelerator "
        '(init_device_mesh("cuda", ...))'
    )
    assert _untouched(model)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the default device is an accelerator")
def test_apply_fully_shard_refuses_the_plans_offload_on_a_cpu_only_device_naming_the_plan() -> None:
    model = _model()
    plan = dataclasses.replace(_plan(model), training=TrainingStep(offload="cpu"))
    with pytest.raises(ValueError) as refused:
        apply_fully_shard(model, plan)
    assert str(refused.value) == (
        "apply_fully_shard: the plan's training step chose CPU offload "
        "(plan.training.offload='cpu'), which keeps the sharded parameters, gradients and "
        "optimizer state in host memory and copies them to an accelerator for each all-gather, "
        "but the device is the CPU (torch.accelerator.is_available() is False): the parameters "
        "already live in host memory and there is no accelerator to copy them to (torch would "
        'fail later with "Cannot access accelerator device when none is available."); nothing '
        "has been wrapped. Pass offload_policy=OffloadPolicy() (torch.distributed.fsdp) to "
        "apply the plan without offload, or plan again with a cost model of this device "
        "(CostModel.calibrate() on it)"
    )
    assert _untouched(model)
    check_plan_offload("none", mesh=None)


# ------------------------------------------------------------------ checkpointing: refused
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"checkpointing": "fulll"},
            ValueError,
            f"apply_fully_shard: checkpointing='fulll' (for every unit) is not a checkpointing "
            f"mode; {MODES}",
        ),
        (
            {"checkpointing": {"layers.0": "full", "layers.1": "sel"}},
            ValueError,
            f"apply_fully_shard: checkpointing['layers.1'] = 'sel' is not a checkpointing "
            f"mode; {MODES}",
        ),
        (
            {"checkpointing": {"layers.9": "full"}},
            ValueError,
            "apply_fully_shard: checkpointing names module 'layers.9', which Llama does not "
            "have; name modules as named_modules() does",
        ),
        (
            {"checkpointing": {"": "full"}},
            ValueError,
            "apply_fully_shard: checkpointing names the root module <root>; checkpointing the "
            "whole model saves nothing FSDP can free: name the units inside it (e.g. the blocks)",
        ),
        (
            {"checkpointing": {"layers.0": "full", "layers.0.attention": "selective"}},
            ValueError,
            "apply_fully_shard: checkpointing names 'layers.0.attention' inside 'layers.0'; a "
            "module inside a checkpointed one would run its forward three times: keep only the "
            "outer one or the inner ones",
        ),
        (
            {"checkpointing": "full", "checkpoint_every": 0},
            ValueError,
            "apply_fully_shard: checkpoint_every=0; it must be 1 (every unit) or more (every "
            "N-th unit, counted from 1 in the plan's order)",
        ),
        (
            {"checkpointing": {"layers.0": "full"}, "checkpoint_every": 2},
            ValueError,
            "apply_fully_shard: checkpoint_every=2 counts the units that one mode applies to; "
            "with a mapping {module FQN: mode} leave it at 1 and list the modules to checkpoint",
        ),
        (
            {"checkpointing": "full", "checkpoint_every": 2.0},
            TypeError,
            "apply_fully_shard: checkpoint_every must be an int (checkpoint every N-th unit); "
            "got float",
        ),
        (
            {"checkpointing": ["layers.0"]},
            TypeError,
            "apply_fully_shard: checkpointing must be one of 'none', 'full' and 'selective', a "
            "mapping {module FQN: mode} or None; got list",
        ),
    ],
)
def test_bad_checkpointing_is_refused_before_anything_is_wrapped(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    model = _model()
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        apply_fully_shard(model, _plan(model), **kwargs)
    assert _untouched(model)


def test_a_module_checkpointed_by_hand_is_not_checkpointed_again() -> None:
    model = _model()
    plan = _plan(model)
    model.layers[1] = checkpoint_wrapper(model.layers[1])
    with pytest.raises(ValueError, match="^" + re.escape(
        "apply_fully_shard: module 'layers.1' is already checkpointed (torch's "
        "CheckpointWrapper) and checkpointing= would checkpoint 'layers.1' too: its forward "
        "would be recomputed twice in backward. Drop one of the two; nothing has been "
        "checkpointed or wrapped"
    )):  # fmt: skip
        apply_fully_shard(model, plan, checkpointing="selective")
    assert _untouched(model)
    model = _model()
    apply_checkpointing(model, plan, "full")
    with pytest.raises(ValueError, match=re.escape("module 'layers.0' is already checkpointed "
                                                   "(execwrap's checkpointing)")):  # fmt: skip
        apply_checkpointing(model, plan, {"layers.0.feed_forward": "full"})


def test_the_policy_checks_and_carries_its_checkpointing() -> None:
    with pytest.raises(ValueError, match="^" + re.escape(
        f"ParamExecOrderWrapPolicy: checkpointing='ful' (for every unit) is not a "
        f"checkpointing mode; {MODES}"
    )):  # fmt: skip
        ParamExecOrderWrapPolicy(always_wrap_policy, checkpointing="ful")  # type: ignore[arg-type]
    policy = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({LlamaBlock}), TracingConfig(), checkpointing="full"
    )
    model = _model()
    with pytest.raises(ValueError, match="^" + re.escape(
        "apply_fully_shard: checkpointing='selective', checkpoint_every=1 given, but the "
        "policy has checkpointing='full', checkpoint_every=1; set them in one place"
    )):  # fmt: skip
        apply_fully_shard(model, policy, checkpointing="selective")
    assert _untouched(model)


def test_apply_checkpointing_names_its_own_every_parameter() -> None:
    """apply_checkpointing's parameter is ``every`` (apply_fully_shard's ``checkpoint_every``)."""
    model = _model()
    with pytest.raises(ValueError) as info:
        apply_checkpointing(model, _plan(model), "full", every=0)
    assert str(info.value) == (
        "apply_checkpointing: every=0; it must be 1 (every unit) or more (every N-th unit, "
        "counted from 1 in the plan's order)"
    )
    with pytest.raises(TypeError) as type_info:
        apply_checkpointing(model, _plan(model), "full", every=2.0)  # type: ignore[arg-type]
    assert str(type_info.value) == (
        "apply_checkpointing: every must be an int (checkpoint every N-th unit); got float"
    )
    with pytest.raises(ValueError) as info:
        apply_checkpointing(model, _plan(model), {"layers.0": "full"}, every=2)
    assert str(info.value) == (
        "apply_checkpointing: every=2 counts the units that one mode applies to; with a "
        "mapping {module FQN: mode} leave it at 1 and list the modules to checkpoint"
    )


# ------------------------------------------------------------------ checkpointing: applied
def test_one_mode_applies_to_the_outermost_units_and_every_nth() -> None:
    model = _model()
    assert apply_checkpointing(model, _plan(model), "full", every=2) == {
        "layers.1": "full",
        "layers.3": "full",
    }
    model = _model()
    plan = _plan(model, always_wrap_policy)  # every module a unit: only the outermost
    assert apply_checkpointing(model, plan, "selective") == {
        "tok_embeddings": "selective",
        "layers.0": "selective",
        "layers.1": "selective",
        "layers.2": "selective",
        "layers.3": "selective",
        "norm": "selective",
        "output": "selective",
    }
    assert apply_checkpointing(_model(), plan, "none") == {}
    assert apply_checkpointing(_model(), plan.groups, None) == {}


class _MatmulCount(TorchDispatchMode):
    """Counts ``aten.mm`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.mm += func == torch.ops.aten.mm.default
        return func(*args, **(kwargs or {}))


def _step(model: nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
    """Loss, gradients and the matmuls backward ran (recomputation included)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, CONFIG.vocab_size, (2, 8), generator=g)
    loss = F.cross_entropy(model(x).flatten(0, 1), x.flatten())
    with _MatmulCount() as count:
        loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, count.mm


def test_checkpointing_keeps_names_and_values_and_recomputes_what_its_mode_says() -> None:
    reference = _model()
    plan = _plan(reference)
    loss, grads, backward_mm = _step(copy.deepcopy(reference))
    recomputed = {}
    for mode in ("full", "selective"):
        model = copy.deepcopy(reference)
        apply_checkpointing(model, plan, mode)  # type: ignore[arg-type]
        assert [n for n, _ in model.named_modules()] == [n for n, _ in reference.named_modules()]
        assert list(model.state_dict()) == list(reference.state_dict())
        assert (
            plan_wrap(
                model,
                capture_execution_order(model, tracing_config=TracingConfig()),
                ModuleWrapPolicy({LlamaBlock}),
            ).groups
            == plan.groups
        )
        mode_loss, mode_grads, mm = _step(model)
        assert torch.equal(mode_loss, loss)
        assert mode_grads.keys() == grads.keys()
        assert all(torch.equal(mode_grads[n], grads[n]) for n in grads), mode
        recomputed[mode] = mm - backward_mm
    # 4 layers of 7 bias-free linears (one aten.mm each in forward). Full runs 6 of each
    # layer's 7 again: recomputation stops early once every saved tensor backward needs is
    # back, and the last matmul's output (w2, into the residual add) is saved by nothing.
    # Selective keeps the 1st, 3rd, 5th and 7th matmul of each layer and runs 3 again.
    assert recomputed == {"full": 24, "selective": 12}


# ------------------------------------------------------------------ accumulation: refused
def test_accumulate_gradients_refuses_what_it_cannot_do() -> None:
    with pytest.raises(TypeError, match="^" + re.escape(
        "accumulate_gradients: Llama holds no FSDP module; pass the model after "
        "apply_fully_shard / fully_shard (FSDP2) or FullyShardedDataParallel (FSDP1)"
    )):  # fmt: skip
        accumulate_gradients(_model(), [1, 2])
    with pytest.raises(ValueError, match="^" + re.escape(
        "accumulate_gradients: sync='first'; it must be 'every' (reduce-scatter after every "
        "micro-batch) or 'last' (only after the last micro-batch)"
    )):  # fmt: skip
        accumulate_gradients(_model(), [1, 2], sync="first")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape(
        "accumulate_gradients: reshard_after_backward must be True or False; got int"
    )):  # fmt: skip
        accumulate_gradients(_model(), [1], reshard_after_backward=0)  # type: ignore[arg-type]


def test_a_forward_set_on_the_instance_is_kept() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    calls: list[str] = []
    plain = model[0].forward

    def doubled(x: torch.Tensor) -> torch.Tensor:
        calls.append("forward")
        return plain(x) * 2

    model[0].forward = doubled  # type: ignore[method-assign]
    expected = model[1](doubled(torch.ones(1, 4)))
    calls.clear()
    assert apply_checkpointing(model, [["0"], ["1"]], {"0": "full"}) == {"0": "full"}
    out = model(torch.ones(1, 4, requires_grad=True))
    assert torch.equal(out, expected)
    out.sum().backward()
    assert calls == ["forward", "forward"]  # run, then run again in backward
