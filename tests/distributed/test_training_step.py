"""Every knob of the training step trains the same model as the same setup by hand.

Two gloo ranks, one spawn. A small Llama (bias-free linears: selective checkpointing
recomputes every second matmul) planned once, one unit per block; each case trains
:data:`STEPS` SGD steps on each rank's half of the batch, once through execwrap
(``apply_fully_shard(..., checkpointing=..., mp_policy=...)``,
``ParamExecOrderWrapPolicy(checkpointing=...)`` with FSDP1's ``mixed_precision``,
:func:`execwrap.accumulate_gradients`) and once set up by hand (torch's
``checkpoint_wrapper`` on the blocks, ``fully_shard(..., mp_policy=...)`` /
``FullyShardedDataParallel(..., mixed_precision=...)``,
``set_requires_gradient_sync`` / ``no_sync``). The same ops run, so the losses of
every step are equal exactly (``==`` on floats), on each rank.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffload,
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.utils.checkpoint import create_selective_checkpoint_contexts

from execwrap import (
    CostModel,
    ModuleWrapPolicy,
    ParamExecOrderWrapPolicy,
    TracingConfig,
    TrainingStep,
    WrapPlan,
    accumulate_gradients,
    apply_fully_shard,
    plan_wrap,
    selective_checkpoint_policy,
)
from execwrap.demo_models import Llama, LlamaBlock, LlamaConfig
from tests._dist import run_ranks
from tracing import capture_execution_order

STEPS = 2
MICRO = 2
CONFIG = LlamaConfig(vocab_size=32, dim=16, n_heads=2, n_layers=3, mlp_hidden=24)
BF16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
BF16_FSDP1 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
CPU = torch.device("cpu")


def _model() -> Llama:
    torch.manual_seed(0)
    return Llama(CONFIG)


def _batches(rank: int, world_size: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(300)
    out = []
    for _ in range(n):
        x = torch.randint(0, CONFIG.vocab_size, (2 * world_size, 8), generator=g)
        y = torch.randint(0, CONFIG.vocab_size, (2 * world_size, 8), generator=g)
        out.append((x.chunk(world_size)[rank], y.chunk(world_size)[rank]))
    return out


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())


def _train(
    model: nn.Module,
    rank: int,
    world_size: int,
    step: Callable[[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]], float] | None = None,
) -> list[float]:
    """:data:`STEPS` SGD steps on the same data; ``step`` runs one step's forward and
    backward over :data:`MICRO` micro-batches (default: one batch), returning the loss."""
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    batches = _batches(rank, world_size, MICRO)  # the same each step: the loss falls
    losses = []
    for _ in range(STEPS):
        if step is None:
            loss = _loss(model, *batches[0])
            loss.backward()
            losses.append(float(loss))
        else:
            losses.append(step(model, batches))
        opt.step()
        opt.zero_grad()
    return losses


# ------------------------------------------------------------------ setups by hand
def _hand_checkpoint(model: Llama, modes: dict[int, str]) -> None:
    """torch's ``checkpoint_wrapper`` on ``model.layers[i]`` for each ``i: mode``."""
    for i, mode in modes.items():
        kwargs: dict[str, Any] = {}
        if mode == "selective":
            kwargs["context_fn"] = lambda: create_selective_checkpoint_contexts(
                selective_checkpoint_policy()
            )
        model.layers[i] = checkpoint_wrapper(model.layers[i], **kwargs)


def _hand_fsdp2(model: Llama, mesh: DeviceMesh, modes: dict[int, str], **kwargs: Any) -> Llama:
    _hand_checkpoint(model, modes)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    return model


def _hand_fsdp1(model: Llama, modes: dict[int, str], **kwargs: Any) -> nn.Module:
    _hand_checkpoint(model, modes)
    return FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({LlamaBlock}),
        use_orig_params=True,
        device_id=CPU,
        **kwargs,
    )


def _ours_fsdp1(**policy_and_fsdp: Any) -> tuple[nn.Module, ParamExecOrderWrapPolicy]:
    fsdp_kwargs = {k: policy_and_fsdp.pop(k) for k in ("mixed_precision",) if k in policy_and_fsdp}
    policy = ParamExecOrderWrapPolicy(
        ModuleWrapPolicy({LlamaBlock}), TracingConfig(), **policy_and_fsdp
    )
    model = FSDP(
        _model(), auto_wrap_policy=policy, use_orig_params=True, device_id=CPU, **fsdp_kwargs
    )
    return model, policy


# ------------------------------------------------------------------ accumulation
def _accumulated(sync: str, reshard_after_backward: bool = True) -> Callable[..., float]:
    def step(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        total = 0.0
        for x, y in accumulate_gradients(
            model, batches, sync=sync, reshard_after_backward=reshard_after_backward
        ):
            loss = _loss(model, x, y) / len(batches)
            loss.backward()
            total += float(loss)
        return total

    return step


def _hand_accumulated_fsdp2(sync: str, reshard: bool) -> Callable[..., float]:
    """torch's accumulation test: the flags off before all but the last micro-batch."""

    def step(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        assert isinstance(model, FSDPModule)
        total = 0.0
        for i, (x, y) in enumerate(batches):
            last = i == len(batches) - 1
            model.set_requires_gradient_sync(last or sync == "every")
            model.set_reshard_after_backward(last or reshard)
            loss = _loss(model, x, y) / len(batches)
            loss.backward()
            total += float(loss)
        return total

    return step


def _hand_accumulated_fsdp1(model: nn.Module, batches: list[Any]) -> float:
    assert isinstance(model, FSDP)
    total = 0.0
    for i, (x, y) in enumerate(batches):
        loss = _loss(model, x, y) / len(batches)
        if i < len(batches) - 1:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
        total += float(loss)
    return total


# ------------------------------------------------------------------ the worker
def _fsdp2_cases(rank: int, world_size: int, mesh: DeviceMesh, plan: WrapPlan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    unwrapped = _model()
    cases: dict[str, tuple[dict[str, Any], dict[int, str], dict[str, Any]]] = {
        # name: (apply_fully_shard kwargs, hand checkpointing {layer: mode}, fully_shard kwargs)
        "bf16": ({"mp_policy": BF16}, {}, {"mp_policy": BF16}),
        "full": ({"checkpointing": "full"}, {0: "full", 1: "full", 2: "full"}, {}),
        "selective_bf16": (
            {"checkpointing": "selective", "mp_policy": BF16},
            {0: "selective", 1: "selective", 2: "selective"},
            {"mp_policy": BF16},
        ),
        "every_2nd": ({"checkpointing": "full", "checkpoint_every": 2}, {1: "full"}, {}),
        "per_module": (
            {"checkpointing": {"layers.0": "selective", "layers.2": "full"}},
            {0: "selective", 2: "full"},
            {},
        ),
    }
    for name, (ours_kwargs, modes, hand_kwargs) in cases.items():
        ours = _model()
        apply_fully_shard(ours, plan, mesh=mesh, **ours_kwargs)
        if name == "selective_bf16":
            out["names"] = {
                "params": [n for n, _ in ours.named_parameters()]
                == [n for n, _ in unwrapped.named_parameters()],
                "modules": [n for n, _ in ours.named_modules()]
                == [n for n, _ in unwrapped.named_modules()],
                "state_dict": list(ours.state_dict()) == list(unwrapped.state_dict()),
            }
        hand = _hand_fsdp2(_model(), mesh, modes, **hand_kwargs)
        out[name] = (_train(ours, rank, world_size), _train(hand, rank, world_size))

    # a policy with nothing to capture records the order during step 1 (checked across
    # ranks after it), through the checkpointed blocks: forward calls only, names unchanged
    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({LlamaBlock}), checkpointing="selective")
    ours = _model()
    apply_fully_shard(ours, policy, mesh=mesh, mp_policy=BF16)
    hand = _hand_fsdp2(
        _model(), mesh, {0: "selective", 1: "selective", 2: "selective"}, mp_policy=BF16
    )
    out["recorded_selective_bf16"] = (
        _train(ours, rank, world_size),
        _train(hand, rank, world_size),
    )
    assert policy.order is not None and policy.plan is not None
    out["recorded_order"] = list(policy.order.module_forward_order) == list(
        plan.order.module_forward_order
    )
    out["recorded_groups"] = policy.plan.groups

    model = _model()
    with pytest.raises(ValueError) as refused:
        apply_fully_shard(model, plan, mesh=mesh, offload_policy=CPUOffloadPolicy())
    out["offload_refused"] = str(refused.value)
    out["offload_left_alone"] = not any(isinstance(m, FSDPModule) for m in model.modules())

    for sync, reshard in (("last", True), ("last", False), ("every", False)):
        ours = _model()
        apply_fully_shard(ours, plan, mesh=mesh, mp_policy=BF16)
        ours_losses = _train(ours, rank, world_size, _accumulated(sync, reshard))
        hand = _hand_fsdp2(_model(), mesh, {}, mp_policy=BF16)
        hand_losses = _train(hand, rank, world_size, _hand_accumulated_fsdp2(sync, reshard))
        out[f"accumulate_{sync}_reshard_{reshard}"] = (ours_losses, hand_losses)
    return out


def _fsdp1_cases(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, policy_kwargs, modes in (
        ("fsdp1_bf16_full", {"checkpointing": "full"}, {0: "full", 1: "full", 2: "full"}),
        (
            "fsdp1_bf16_selective_every_2nd",
            {"checkpointing": "selective", "checkpoint_every": 2},
            {1: "selective"},
        ),
    ):
        ours, policy = _ours_fsdp1(mixed_precision=BF16_FSDP1, **policy_kwargs)
        hand = _hand_fsdp1(_model(), modes, mixed_precision=BF16_FSDP1)
        out[name] = (_train(ours, rank, world_size), _train(hand, rank, world_size))
        out[name + "_groups"] = policy.plan.groups if policy.plan is not None else None
    ours, _ = _ours_fsdp1(mixed_precision=BF16_FSDP1)
    hand = _hand_fsdp1(_model(), {}, mixed_precision=BF16_FSDP1)
    out["fsdp1_accumulate_last"] = (
        _train(ours, rank, world_size, _accumulated("last")),
        _train(hand, rank, world_size, _hand_accumulated_fsdp1),
    )
    with pytest.raises(ValueError) as refused:
        accumulate_gradients(ours, [], reshard_after_backward=False)
    out["fsdp1_reshard_refused"] = str(refused.value)
    with pytest.raises(ValueError) as refused:
        next(accumulate_gradients(ours, []))
    out["empty_refused"] = str(refused.value)
    model = _model()
    policy = ParamExecOrderWrapPolicy(ModuleWrapPolicy({LlamaBlock}), TracingConfig())
    with pytest.raises(ValueError) as refused:
        FSDP(model, auto_wrap_policy=policy, device_id=CPU, cpu_offload=CPUOffload(True))
    out["fsdp1_offload_refused"] = str(refused.value)
    out["fsdp1_offload_left_alone"] = not any(isinstance(m, FSDP) for m in model.modules())
    return out


def _worker(rank: int, world_size: int) -> dict[str, Any]:
    # FSDP2 warns that grouped modules return views; FSDP1 warns about CPU devices.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    warnings.filterwarnings("ignore", category=UserWarning)
    mesh = init_device_mesh("cpu", (world_size,))
    model = _model()
    plan = plan_wrap(
        model,
        capture_execution_order(model, tracing_config=TracingConfig()),
        ModuleWrapPolicy({LlamaBlock}),
    )
    return {
        "groups": plan.groups,
        **_fsdp2_cases(rank, world_size, mesh, plan),
        **_fsdp1_cases(rank, world_size),
    }


def _no_accelerator() -> str:
    return (
        "" if torch.accelerator.is_available() else " (torch.accelerator.is_available() is False)"
    )


def _both_worker(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    return {
        "knobs": _worker(rank, world_size),
        "plan_offload": _plan_offload_worker(rank, world_size),
    }


@pytest.fixture(scope="module")
def two_ranks() -> dict[str, list[dict[str, Any]]]:
    """Worker -> ``[rank 0's result, rank 1's]``: every knob, then the plan's CPU offload,
    in one spawn of 2 ranks."""
    results = run_ranks(_both_worker, world_size=2, timeout_s=120)
    return {name: [r[name] for r in results] for name in results[0]}


def test_every_knob_trains_like_the_setup_by_hand(
    two_ranks: dict[str, list[dict[str, Any]]],
) -> None:
    results = two_ranks["knobs"]
    for rank, out in enumerate(results):
        assert out["groups"] == [[""], ["layers.0"], ["layers.1"], ["layers.2"]]
        assert out["names"] == {"params": True, "modules": True, "state_dict": True}
        for name, value in out.items():
            if isinstance(value, tuple):
                ours, hand = value
                print(rank, name, ours)
                assert len(ours) == STEPS and ours == hand, (rank, name, ours, hand)
                assert ours[-1] < ours[0], (rank, name, ours)  # it trains
        for name in ("fsdp1_bf16_full_groups", "fsdp1_bf16_selective_every_2nd_groups"):
            assert out[name] == [[""], ["layers.0"], ["layers.1"], ["layers.2"]]
        assert out["fsdp1_reshard_refused"] == (
            "accumulate_gradients: reshard_after_backward=False is FSDP2's "
            "set_reshard_after_backward; FSDP1 has no such setting (its no_sync() keeps the "
            "unsharded gradients, not the parameters). Leave it True with FSDP1"
        )
        assert out["fsdp1_offload_refused"] == (
            "ParamExecOrderWrapPolicy: cpu_offload=CPUOffload(offload_params=True) keeps the "
            "sharded parameters, gradients and optimizer state in host memory and copies them "
            "to an accelerator for each all-gather, but the device is the CPU "
            "(torch.accelerator.is_available() is False): the parameters already live in host "
            "memory and there is no accelerator to copy them to (torch would fail later with "
            '"Cannot access accelerator device when none is available."); nothing has been '
            "wrapped. Leave cpu_offload out on a CPU-only device, or shard onto an accelerator "
            "(device_id=...)"
        )
        assert out["fsdp1_offload_left_alone"]
        assert out["empty_refused"] == (
            "accumulate_gradients: micro_batches is empty; an optimizer step needs at least "
            "one micro-batch"
        )
        assert out["recorded_order"]
        assert out["recorded_groups"] == [[""], ["layers.0"], ["layers.1"], ["layers.2"]]
        assert out["offload_refused"] == (
            "apply_fully_shard: offload_policy=CPUOffloadPolicy(pin_memory=True) keeps the "
            "sharded parameters, gradients and optimizer state in host memory and copies them "
            "to an accelerator for each all-gather, but the mesh is on 'cpu'"
            f"{_no_accelerator()}: the parameters already live in host memory and there is no "
            'accelerator to copy them to (torch would fail later with "Cannot access '
            'accelerator device when none is available."); nothing has been wrapped. Leave '
            "offload_policy out on a CPU-only device, or shard onto an accelerator "
            '(init_device_mesh("cuda", ...))'
        )
        assert out["offload_left_alone"]
    # the ranks train on different halves of the batches
    assert results[0]["full"][0] != results[1]["full"][0]


# ------------------------------------------------------------------ the plan's offload on a CPU mesh
class _Lines(logging.Handler):
    """The INFO-and-above messages of ``execwrap.fsdp.plan_step`` (to return from a rank)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []
        self._logger = logging.getLogger("execwrap.fsdp.plan_step")

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname}: {record.getMessage()}")

    def __enter__(self) -> _Lines:
        self._level = self._logger.level
        self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


def _offloading_plan(model: nn.Module) -> WrapPlan:
    """A joint plan for 8 H100s that chose CPU offload: the budget is 1 byte under the
    smallest peak of any candidate without offload."""
    order = capture_execution_order(model, tracing_config=TracingConfig())
    kwargs: dict[str, Any] = {
        "bucket_numel": "auto",
        "cost_model": CostModel.preset("h100-nvlink-8"),
        "training": TrainingStep(),
    }
    policy = ModuleWrapPolicy({LlamaBlock})
    search = plan_wrap(model, order, policy, **kwargs).search
    assert search is not None
    budget = min(c.peak_memory_bytes for c in search.candidates if c.offload == "none") - 1
    return plan_wrap(model, order, policy, memory_budget=budget, **kwargs)


def _plan_offload_worker(rank: int, world_size: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore", category=UserWarning)
    mesh = init_device_mesh("cpu", (world_size,))
    model = _model()
    plan = _offloading_plan(model)
    assert plan.training is not None and plan.search is not None
    out: dict[str, Any] = {"offload": plan.training.offload, "planned_for": plan.search.cost_model}
    with pytest.raises(ValueError) as refused:
        apply_fully_shard(model, plan, mesh=mesh, prefetch="auto")
    out["refused"] = str(refused.value)
    out["left_alone"] = not any(isinstance(m, FSDPModule) for m in model.modules())
    with _Lines() as lines:
        apply_fully_shard(model, plan, mesh=mesh, prefetch="auto", offload_policy=OffloadPolicy())
    out["lines"] = lines.messages
    out["sharded"] = isinstance(model, FSDPModule)
    out["losses"] = _train(model, rank, world_size)
    out.update(_plan_offload_fsdp1(plan))
    return out


def _plan_offload_fsdp1(plan: WrapPlan) -> dict[str, Any]:
    """The same plan through FSDP1 on the CPU: refused, then applied without offload."""
    model = _model()
    with pytest.raises(ValueError) as refused:
        FSDP(model, auto_wrap_policy=ParamExecOrderWrapPolicy(pinned_plan=plan), device_id=CPU)
    out: dict[str, Any] = {"fsdp1_refused": str(refused.value)}
    out["fsdp1_left_alone"] = not any(isinstance(m, FSDP) for m in model.modules())
    with _Lines() as lines:
        model = FSDP(
            _model(),
            auto_wrap_policy=ParamExecOrderWrapPolicy(pinned_plan=plan),
            device_id=CPU,
            cpu_offload=CPUOffload(offload_params=False),
        )
    out["fsdp1_lines"] = lines.messages
    out["fsdp1_units"] = sum(isinstance(m, FSDP) for m in model.modules())
    return out


def test_the_plans_cpu_offload_on_a_cpu_mesh_is_refused_naming_the_plan(
    two_ranks: dict[str, list[dict[str, Any]]],
) -> None:
    for out in two_ranks["plan_offload"]:
        assert out["offload"] == "cpu"
        assert out["planned_for"].startswith("preset h100-nvlink-8: ")
        assert out["refused"] == (
            "apply_fully_shard: the plan's training step chose CPU offload "
            f"(plan.training.offload='cpu', planned for {out['planned_for']}), which keeps the "
            "sharded parameters, gradients and optimizer state in host memory and copies them "
            "to an accelerator for each all-gather, but the mesh is on 'cpu'"
            f"{_no_accelerator()}: the parameters already live in host memory and there is no "
            'accelerator to copy them to (torch would fail later with "Cannot access '
            'accelerator device when none is available."); nothing has been wrapped. Pass '
            "offload_policy=OffloadPolicy() (torch.distributed.fsdp) to apply the plan without "
            "offload, or plan again with a cost model of this device (CostModel.calibrate() on "
            "it)"
        )
        assert out["left_alone"]
        assert out["lines"] == [
            "INFO: apply_fully_shard: offload_policy=OffloadPolicy() given on a CPU device: the "
            "plan is applied without its training step's CPU offload "
            "(plan.training.offload='cpu'), which needs an accelerator to copy to; "
            "plan.estimate and the memory budget it was planned under describe the step with "
            "offload"
        ]
        assert out["sharded"]
        assert len(out["losses"]) == STEPS and out["losses"][-1] < out["losses"][0]
        assert out["fsdp1_refused"] == (
            "ParamExecOrderWrapPolicy: the plan's training step chose CPU offload "
            f"(plan.training.offload='cpu', planned for {out['planned_for']}), which keeps the "
            "sharded parameters, gradients and optimizer state in host memory and copies them "
            f"to an accelerator for each all-gather, but the device is the CPU{_no_accelerator()}"
            ": the parameters already live in host memory and there is no accelerator to copy "
            'them to (torch would fail later with "Cannot access accelerator device when none '
            'is available."); nothing has been wrapped. Pass FullyShardedDataParallel(..., '
            "cpu_offload=CPUOffload(offload_params=False)) to apply the plan without offload, "
            "or plan again with a cost model of this device (CostModel.calibrate() on it)"
        )
        assert out["fsdp1_left_alone"]
        assert out["fsdp1_lines"] == [
            "INFO: ParamExecOrderWrapPolicy: cpu_offload=CPUOffload(offload_params=False) given "
            "on a CPU device: the plan is applied without its training step's CPU offload "
            "(plan.training.offload='cpu'), which needs an accelerator to copy to; "
            "plan.estimate and the memory budget it was planned under describe the step with "
            "offload"
        ]
        assert out["fsdp1_units"] == 4  # the root and the three blocks
