"""Models and a parity harness shared by the FSDP1/FSDP2 policy tests.

Every rank builds the same model (same seed) and an unwrapped reference copy;
the reference trains on the whole batch, each rank on its own half. FSDP
averages gradients over ranks, so with equal halves and a mean loss the
reference's loss and gradients are what the sharded model must reproduce.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.nn.modules import module as nn_module

from execwrap.demo_models import GPT, GPTConfig

__all__ = [
    "BranchModel",
    "L0L2L1",
    "Case",
    "dtensor_full_grads",
    "gpt_case",
    "hook_census",
    "l0l2l1_case",
    "branch_case",
    "run_parity",
]

STEPS = 3
LR = 0.1
RTOL = 1e-5
ATOL = 1e-6


class L0L2L1(nn.Module):
    """Defined layer0, layer1, layer2; runs layer0 -> layer2 -> layer1."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.layer0 = nn.Linear(dim, dim)
        self.layer1 = nn.Linear(dim, dim, bias=False)
        self.layer2 = nn.Sequential(
            nn.Linear(dim, dim, bias=False), nn.ReLU(), nn.Linear(dim, dim, bias=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer1(self.layer2(self.layer0(x)))


class BranchModel(nn.Module):
    """``inp`` -> ``pos`` or ``neg`` by the sign of the input's mean -> ``out``."""

    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.pos = nn.Linear(dim, dim)
        self.neg = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        h = self.pos(h) if x.mean() > 0 else self.neg(h)  # data-dependent
        return self.out(h)


class Case:
    """A model factory, a batch factory and a loss."""

    def __init__(
        self,
        name: str,
        make_model: Callable[[], nn.Module],
        make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
        loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> None:
        self.name = name
        self.make_model = make_model
        self.make_batch = make_batch
        self.loss = loss

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return self.make_model()

    def example(self, rank: int, world_size: int) -> tuple[torch.Tensor, ...]:
        x, _ = self.make_batch(0)
        return (x.chunk(world_size)[rank],)


def _dense_batch(
    step: int, dim: int = 8, n: int = 4, sign: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(n, dim, generator=g).abs() * sign
    return x, torch.randn(n, dim, generator=g)


def l0l2l1_case() -> Case:
    return Case("l0l2l1", L0L2L1, _dense_batch, F.mse_loss)


def branch_case(sign: float = 1.0) -> Case:
    return Case("branch", BranchModel, lambda s: _dense_batch(s, sign=sign), F.mse_loss)


GPT_CONFIG = GPTConfig(vocab_size=32, max_seq_len=8, dim=16, n_heads=2, n_blocks=2)


def _gpt_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(200 + step)
    idx = torch.randint(0, GPT_CONFIG.vocab_size, (4, 8), generator=g)
    return idx, torch.randint(0, GPT_CONFIG.vocab_size, (4, 8), generator=g)


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def gpt_case() -> Case:
    return Case("gpt", lambda: GPT(GPT_CONFIG), _gpt_batch, _lm_loss)


def run_parity(
    rank: int,
    world_size: int,
    case: Case,
    wrap: Callable[[nn.Module], nn.Module],
    full_grads: Callable[[nn.Module], dict[str, torch.Tensor | None]],
    after_step: Callable[[int, nn.Module], None] | None = None,
) -> dict[str, Any]:
    """Train ``wrap(model)`` and an unwrapped copy for :data:`STEPS` SGD steps.

    Asserts on every step that the mean loss over ranks equals the
    reference's loss and every full gradient equals the reference's
    (``None`` counts as zeros: a parameter unused in that step).

    Returns:
        ``{"losses": [...], "max_grad_diff": float, "wrapped": module}``.
    """
    model = case.model()
    ref = copy.deepcopy(model)
    wrapped = wrap(model)
    opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    losses: list[float] = []
    max_diff = 0.0
    for step in range(STEPS):
        x_full, y_full = case.make_batch(step)
        ref_loss = case.loss(ref(x_full), y_full)
        ref_loss.backward()
        x, y = x_full.chunk(world_size)[rank], y_full.chunk(world_size)[rank]
        loss = case.loss(wrapped(x), y)
        loss.backward()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        mean_loss /= world_size
        torch.testing.assert_close(mean_loss, ref_loss.detach(), rtol=RTOL, atol=ATOL)
        losses.append(float(mean_loss))
        grads = full_grads(wrapped)
        ref_grads = dict(ref.named_parameters())
        assert sorted(grads) == sorted(ref_grads), (case.name, sorted(grads), sorted(ref_grads))
        for name, p in ref_grads.items():
            expected = p.grad if p.grad is not None else torch.zeros_like(p)
            got = grads[name]
            got = got if got is not None else torch.zeros_like(p)
            torch.testing.assert_close(
                got,
                expected,
                rtol=RTOL,
                atol=ATOL,
                msg=lambda m, n=name, s=step: f"{case.name} step {s} grad {n}: {m}",
            )
            max_diff = max(max_diff, float((got - expected).abs().max()))
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        if after_step is not None:
            after_step(step, wrapped)
    return {"losses": losses, "max_grad_diff": max_diff, "wrapped": wrapped}


def dtensor_full_grads(model: nn.Module) -> dict[str, torch.Tensor | None]:
    """Each parameter's full gradient (or ``None``) by name; FSDP2's ``DTensor`` grads gathered."""
    grads: dict[str, torch.Tensor | None] = {}
    for name, p in model.named_parameters():
        g = p.grad
        if isinstance(g, DTensor):
            g = g.full_tensor()
        grads[name] = None if g is None else g.detach().clone()
    return grads


def hook_census(model: nn.Module) -> dict[str, int]:
    """Hook counts per module / parameter name (wrapper prefixes removed),
    plus torch's global module hooks."""
    counts: dict[str, int] = {}

    def clean(name: str) -> str:
        return ".".join(
            p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_flat_param")
        )

    for name, m in model.named_modules():
        key = "module:" + clean(name)
        counts[key] = counts.get(key, 0) + sum(
            len(d)
            for d in (
                m._forward_pre_hooks,
                m._forward_hooks,
                m._backward_hooks,
                m._backward_pre_hooks,
            )
        )
    for name, p in model.named_parameters():
        key = "param:" + clean(name)
        n = len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
        n += len(p._backward_hooks or {})
        counts[key] = counts.get(key, 0) + n
    counts["global"] = sum(
        len(d)
        for d in (
            nn_module._global_forward_pre_hooks,
            nn_module._global_forward_hooks,
            nn_module._global_backward_hooks,
            nn_module._global_backward_pre_hooks,
        )
    )
    return counts
