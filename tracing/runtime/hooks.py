"""Installing and removing the runtime recorder's hooks.

:class:`HookSet` installs hooks and keeps every handle, so that one
:meth:`HookSet.remove` (in ``finally``) takes them all off again: forward
pre-/post-hooks on modules and gradient-ready hooks on tensors. It knows how
to hook; what a hook records is the caller's (the
:class:`~tracing.runtime.recorder.RuntimeRecorder`). Nothing is stored on the
user's modules or parameters besides the hooks themselves.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

__all__ = ["ForwardHook", "GradReadyHook", "HookSet", "PostForwardHook"]

#: ``(fqn, module, args)``: a module's forward is about to run.
ForwardHook = Callable[[str, nn.Module, Any], None]
#: ``(fqn, module, args, output)``: a module's forward ended (also when it raised).
PostForwardHook = Callable[[str, nn.Module, Any, Any], None]
#: ``(fqn, tensor)``: the gradient of parameter ``fqn`` is ready.
GradReadyHook = Callable[[str, torch.Tensor], None]


class HookSet:
    """Hooks installed together and removed together."""

    def __init__(self) -> None:
        self._handles: list[RemovableHandle] = []

    def add_forward_hooks(
        self,
        modules: Iterable[tuple[str, nn.Module, bool]],
        *,
        pre_forward: ForwardHook,
        pre_wrapper: ForwardHook,
        post_forward: PostForwardHook,
    ) -> None:
        """Hook the forward of every module.

        Args:
            modules: ``(fqn, module, is_wrapper)`` per module; each hook gets
                ``fqn`` as its first argument.
            pre_forward: runs before the forward of a module that is not a wrapper.
            pre_wrapper: runs before the forward of a wrapper module.
            post_forward: runs after every forward, also when it raised
                (``always_call=True``).
        """
        for fqn, module, wrapper in modules:
            pre = pre_wrapper if wrapper else pre_forward
            self._handles.append(module.register_forward_pre_hook(functools.partial(pre, fqn)))
            self._handles.append(
                module.register_forward_hook(functools.partial(post_forward, fqn), always_call=True)
            )

    def add_grad_ready_hook(self, t: torch.Tensor, fqn: str, on_ready: GradReadyHook) -> None:
        """Call ``on_ready(fqn, ...)`` when ``t``'s gradient is ready (if it needs one).

        A leaf gets ``register_post_accumulate_grad_hook`` (``on_ready`` gets
        the parameter); a non-leaf (a view a wrapper swapped in, FSDP1
        ``use_orig_params=True``) a tensor hook (``on_ready`` gets the
        gradient). Hook each tensor once.
        """
        if not t.requires_grad:
            return
        if t.is_leaf:
            self._handles.append(
                t.register_post_accumulate_grad_hook(functools.partial(on_ready, fqn))
            )
        else:
            self._handles.append(t.register_hook(functools.partial(on_ready, fqn)))

    def keep(self, handle: RemovableHandle) -> None:
        """Keep a handle made elsewhere (e.g. ``register_multi_grad_hook``) to remove with the rest."""
        self._handles.append(handle)

    def remove(self) -> None:
        """Remove every hook added so far (safe to call more than once)."""
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()
