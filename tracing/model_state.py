"""What a capture may change, saved before and put back after.

Capture must leave the model as it found it. Running a forward and backward
changes three things besides the hooks: the parameters' ``.grad``, buffers
that the forward updates (BatchNorm running statistics, counters), and the
random number generators that dropout and other random ops draw from.
:class:`SavedModelState` saves them and restores them. The training flag and
``requires_grad`` are never touched by capture, so they are not saved.

Symbolic capture and the zero-cost shadow run the model's Python with stand-in
tensors (Proxies, fake tensors); whatever a forward stores on a module then
(``self.cache = x``, a buffer reassigned, a submodule registered lazily) must
not stay behind. :class:`ModuleSnapshot` keeps each module's attributes and its
``_parameters`` / ``_buffers`` / ``_modules`` entries (references, no copies)
and puts exactly those back.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn as nn

__all__ = ["MODULE_INTERNALS", "ModuleSnapshot", "RngState", "SavedModelState"]


class RngState:
    """CPU (and initialised CUDA) RNG states, restored on :meth:`restore`."""

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda: list[torch.Tensor] | None = None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.cuda = torch.cuda.get_rng_state_all()

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


class SavedModelState:
    """A model's gradients, buffers and the RNG states, as they were when saved.

    :meth:`restore` puts back every parameter's ``.grad`` exactly (``None``
    stays ``None``; an existing gradient keeps its tensor and values), every
    buffer (the same tensor object, with its saved values) and the CPU and
    CUDA RNG states, so the user's random stream does not shift.

    Args:
        model: the model; each parameter tensor is saved once, tied ones included.
        tensor_attributes: also save the values of plain tensor attributes
            (``self.scale = torch.tensor(2.0)``, neither parameter nor buffer),
            which symbolic tracing computes on for real. Leave it off for a
            model wrapped by FSDP, which keeps views of its flat parameters there.
    """

    def __init__(self, model: nn.Module, *, tensor_attributes: bool = False) -> None:
        self._params = list(model.parameters())
        self._grads = [(p, p.grad) for p in self._params]
        self._buffers = [
            (module, name, b, b.detach().clone())
            for module in model.modules()
            for name, b in module._buffers.items()
            if b is not None
        ]
        self._attrs = [
            (module, name, t, t.detach().clone())
            for module in (model.modules() if tensor_attributes else ())
            for name, t in vars(module).items()
            if isinstance(t, torch.Tensor)
        ]
        self._rng = RngState()

    def clear_grads(self) -> None:
        """Set every parameter's ``.grad`` to ``None`` (fresh gradients for a capture)."""
        for p in self._params:
            p.grad = None

    def restore(self) -> None:
        """Put the buffers, gradients and RNG states back as they were saved."""
        with torch.no_grad():
            for module, name, b, saved in self._buffers:
                module._buffers[name] = b
                b.copy_(saved)
            for module, name, t, saved in self._attrs:
                vars(module)[name] = t
                t.copy_(saved)
        for p, g in self._grads:
            p.grad = g
        self._rng.restore()


_SLOTS = ("_parameters", "_buffers", "_modules")
#: Stands for an empty slot dict (no copy needed).
_EMPTY: dict[str, Any] = {}
#: Attributes every ``nn.Module`` has (hook dicts, ``training``, ...): never tensors.
#: The attributes every ``nn.Module`` has (``_parameters``, ``_buffers``, the hook
#: dicts, ...): what is left of ``vars(module)`` are the module's own attributes.
MODULE_INTERNALS = frozenset(vars(nn.Module()))


def _changed(current: dict[str, Any], saved: dict[str, Any]) -> bool:
    """Whether ``current`` differs from ``saved`` by keys or by the identity of a value.

    Equal keys in the same order (reassigning a key keeps its place) are
    compared value by value with ``operator.is_not``, all in C.
    """
    if len(current) != len(saved) or current.keys() != saved.keys():
        return True
    return any(map(operator.is_not, current.values(), saved.values()))


class ModuleSnapshot:
    """Every module's attributes and parameter/buffer/child entries, by reference.

    :meth:`restore` puts back the same objects under the same names: entries
    the run added are removed, entries it replaced (a parameter swapped for a
    stand-in, ``self.count = self.count + 1``) get their old object back. With
    ``values``, the values of buffers and plain tensor attributes are saved
    too (a clone each; tensors without data, on the meta device, are
    skipped) and copied back, for code that updates them in place
    (``self.count += 1`` while fx traces). The cost is one shallow ``dict``
    copy per module and slot; only what changed is written back.

    Args:
        model: the model; every module reached by ``modules()`` is kept.
        values: also save tensor values (see above).
    """

    def __init__(self, model: nn.Module, *, values: bool = False) -> None:
        # (module.__dict__, its copy, copies of its _parameters/_buffers/_modules)
        self._saved: list[tuple[dict[str, Any], ...]] = []
        self._values: list[tuple[torch.Tensor, torch.Tensor]] = []
        saved = self._saved
        for module in model.modules():
            attrs = vars(module)
            params, buffers, children = attrs["_parameters"], attrs["_buffers"], attrs["_modules"]
            saved.append(
                (
                    attrs,
                    attrs.copy(),
                    params.copy() if params else _EMPTY,
                    buffers.copy() if buffers else _EMPTY,
                    children.copy() if children else _EMPTY,
                )
            )
            if values:
                self._save_values(attrs)

    def _save_values(self, attrs: dict[str, Any]) -> None:
        tensors = [b for b in attrs["_buffers"].values() if b is not None]
        for name in attrs.keys() - MODULE_INTERNALS:  # the module's own attributes only
            if isinstance(attrs[name], torch.Tensor):
                tensors.append(attrs[name])
        for t in tensors:
            if t.device.type != "meta" and not isinstance(t, nn.Parameter):
                self._values.append((t, t.detach().clone()))

    def restore(self) -> None:
        """Put every module's attributes, entries and saved values back."""
        for attrs, saved, *slots in self._saved:
            if _changed(attrs, saved):
                for name in attrs.keys() - saved.keys():
                    del attrs[name]
                attrs.update(saved)
            for slot, entries in zip(_SLOTS, slots, strict=True):
                current = attrs[slot]
                if (current or entries) and _changed(current, entries):
                    current.clear()
                    current.update(entries)
        with torch.no_grad():
            for t, value in self._values:
                t.copy_(value)
