"""Checks shared by the case suite and the property suite: "capture did no harm"."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.modules.module as module_mod

__all__ = ["Snapshot", "hook_counts", "snapshot"]

_MODULE_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)
_GLOBAL_HOOK_DICTS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
    "_global_buffer_registration_hooks",
)


def hook_counts(model: nn.Module) -> dict[str, int]:
    """Every kind of hook that capture could leave behind, counted.

    Module hooks of every module, tensor hooks and post-accumulate-grad hooks
    of every parameter, torch's global module hooks, and the depth of the
    ``TorchFunctionMode`` stack.
    """
    counts: dict[str, int] = {}
    for name in _MODULE_HOOK_DICTS:
        counts[name] = sum(len(getattr(mod, name, None) or ()) for mod in model.modules())
    params = list(model.parameters())
    counts["param._backward_hooks"] = sum(len(p._backward_hooks or ()) for p in params)
    counts["param._post_accumulate_grad_hooks"] = sum(
        len(getattr(p, "_post_accumulate_grad_hooks", None) or ()) for p in params
    )
    for name in _GLOBAL_HOOK_DICTS:
        counts[name] = len(getattr(module_mod, name, None) or ())
    counts["torch_function_modes"] = len(torch.overrides._get_current_function_mode_stack())
    return counts


class Snapshot:
    """What capture must leave unchanged on a model: state, flags, attributes."""

    def __init__(self, model: nn.Module) -> None:
        self.state = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
        self.param_ids = [(n, id(p)) for n, p in model.named_parameters(remove_duplicate=False)]
        self.requires_grad = {n: p.requires_grad for n, p in model.named_parameters()}
        self.grads = {n: p.grad for n, p in model.named_parameters()}
        self.training = {n: mod.training for n, mod in model.named_modules()}
        self.attrs = {n: sorted(vars(mod)) for n, mod in model.named_modules()}
        self.param_attrs = {n: sorted(vars(p)) for n, p in model.named_parameters()}
        self.hooks = hook_counts(model)

    def assert_unchanged(self, model: nn.Module) -> None:
        after = Snapshot(model)
        assert after.param_ids == self.param_ids, "parameters were replaced"
        assert after.state.keys() == self.state.keys()
        for k, v in self.state.items():
            assert after.state[k].dtype == v.dtype and after.state[k].device == v.device, k
            assert torch.equal(after.state[k], v), f"state_dict entry {k!r} changed"
        assert after.requires_grad == self.requires_grad
        assert all(after.grads[n] is g for n, g in self.grads.items()), ".grad changed"
        assert after.training == self.training
        assert after.attrs == self.attrs, "module attributes added or removed"
        assert after.param_attrs == self.param_attrs, "parameter attributes added or removed"
        assert after.hooks == self.hooks, f"hooks left: {after.hooks} vs {self.hooks}"


def snapshot(model: nn.Module) -> Snapshot:
    return Snapshot(model)


def step(model: nn.Module, args: tuple[Any, ...]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward/backward (loss: sum of the output); the output and the gradients."""
    out = model(*args)
    out.sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads
