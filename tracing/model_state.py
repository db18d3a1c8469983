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

import torch
import torch.nn as nn

__all__ = ["ModuleSnapshot", "RngState", "SavedModelState"]


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


class ModuleSnapshot:
    """Every module's attributes and parameter/buffer/child entries, by reference.

    :meth:`restore` puts back the same objects under the same names: entries
    the run added are removed, entries it replaced (a parameter swapped for a
    stand-in, ``self.count = self.count + 1``) get their old object back. Values
    inside tensors are not saved (see :class:`SavedModelState` for buffers).
    The cost is one shallow ``dict`` copy per module and slot.

    Args:
        model: the model; every module reached by ``modules()`` is kept.
    """

    def __init__(self, model: nn.Module) -> None:
        self._saved = [
            (module, dict(vars(module)), [dict(getattr(module, slot)) for slot in _SLOTS])
            for module in model.modules()
        ]

    def restore(self) -> None:
        """Put every module's attributes and entries back as they were saved."""
        for module, attrs, slots in self._saved:
            current = vars(module)
            for name in [n for n in current if n not in attrs]:
                del current[name]
            for name, value in attrs.items():
                if current.get(name, _MISSING) is not value:
                    current[name] = value
            for slot, saved in zip(_SLOTS, slots, strict=True):
                entries = getattr(module, slot)
                if len(entries) != len(saved) or any(
                    entries.get(k, _MISSING) is not v for k, v in saved.items()
                ):
                    entries.clear()
                    entries.update(saved)


_MISSING = object()
