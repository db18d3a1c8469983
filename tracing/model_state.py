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
not stay behind. :class:`ModuleSnapshot` lets every module work on copies of
its attribute dict and its ``_parameters`` / ``_buffers`` / ``_modules`` dicts
(shallow: references, no tensor copies) and gives it the untouched originals
back.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn as nn

from tracing.classes import could_be

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
#: The attributes every ``nn.Module`` has (``_parameters``, ``_buffers``, the hook
#: dicts, ``training``, ...; never tensors): what is left of ``vars(module)`` are
#: the module's own attributes.
MODULE_INTERNALS = frozenset(vars(nn.Module()))

_set_attr = object.__setattr__


class ModuleSnapshot:
    """Every module's attributes and parameter/buffer/child entries, kept untouched.

    From construction until :meth:`restore`, each module works on a copy of
    its instance dict, whose non-empty ``_parameters`` / ``_buffers`` /
    ``_modules`` entries are copies too (shallow: the same tensors,
    submodules and hook dicts). Whatever the run stores on a module
    (``self.cache = x``, a parameter swapped for a stand-in, a buffer
    reassigned, ``self.training`` flipped) lands in the copies; :meth:`restore`
    gives every module its original dict back, the very object it had, never
    written to. An empty slot dict is not copied: one the run filled is
    emptied again. Nothing is compared entry by entry: the cost is one
    shallow copy per module and non-empty slot, and two dict swaps.

    With ``values``, the values of buffers and plain tensor attributes are
    saved too (a clone each; tensors without data, on the meta device, are
    skipped) and copied back, for code that updates them in place
    (``self.count += 1`` while fx traces): an in-place update changes the
    shared tensor, not a dict entry. Plain tensor attributes are found by
    the classes of the attribute values (:func:`~tracing.classes.could_be`):
    only when one could be a tensor is each value asked.

    Args:
        model: the model; every module reached by ``modules()`` is kept.
        values: also save tensor values (see above).
        modules: ``model.modules()`` already listed (a capture's one walk,
            :func:`tracing.walk.walk_modules`), or ``None`` to list them here.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        values: bool = False,
        modules: Iterable[nn.Module] | None = None,
    ) -> None:
        self._modules = list(model.modules() if modules is None else modules)
        self._dicts: list[dict[str, Any]] = []
        #: slot dicts that were empty (not copied: shared with the working dicts)
        self._empty: list[dict[str, Any]] = []
        working: list[dict[str, Any]] = []
        classes: set[type] = set()  # of the attribute values, with values
        buffers: list[dict[str, Any]] = []  # the non-empty _buffers, with values
        for module in self._modules:
            attrs = module.__dict__
            work = attrs.copy()
            for slot in _SLOTS:
                entries = attrs[slot]
                if entries:
                    work[slot] = entries.copy()
                else:
                    self._empty.append(entries)
            if values:
                classes.update(map(type, attrs.values()))
                if attrs["_buffers"]:
                    buffers.append(attrs["_buffers"])
            self._dicts.append(attrs)
            working.append(work)
        self._values: list[tuple[torch.Tensor, torch.Tensor]] = []
        if values:
            self._save_values(buffers, classes)
        try:
            for module, work in zip(self._modules, working, strict=True):
                _set_attr(module, "__dict__", work)
        except BaseException:
            self._put_back()
            raise

    def _save_values(self, buffers: list[dict[str, Any]], classes: set[type]) -> None:
        """Clone every buffer and plain tensor attribute that holds data."""
        tensors = [b for entries in buffers for b in entries.values() if b is not None]
        if could_be(classes, torch.Tensor):  # the internals are never tensors
            values = (v for attrs in self._dicts for v in attrs.values())
            tensors += [v for v in values if isinstance(v, torch.Tensor)]
        for t in tensors:
            if t.device.type != "meta" and not isinstance(t, nn.Parameter):
                self._values.append((t, t.detach().clone()))

    def _put_back(self) -> None:
        for module, attrs in zip(self._modules, self._dicts, strict=True):
            _set_attr(module, "__dict__", attrs)

    def restore(self) -> None:
        """Give every module its original attributes back, and the saved tensor values."""
        self._put_back()
        for entries in self._empty:
            if entries:
                entries.clear()
        with torch.no_grad():
            for t, value in self._values:
                t.copy_(value)
