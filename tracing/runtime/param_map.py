"""Which parameter is this tensor? The runtime recorder's map from tensors to FQNs.

The recorder sees tensors, not names: its ``TorchFunctionMode`` gets the
arguments of every torch call and a gradient hook gets a tensor.
:class:`ParamMap` answers by ``id()`` with the *canonical* FQN of the
*original* model:

* wrapper components are removed from every name (:func:`~tracing.fqn.clean_fqn`:
  FSDP1's ``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.``,
  ``_orig_mod.``), and wrapper modules are flagged so that the recorder can
  skip them;
* a tied tensor's canonical FQN is its first name in ``named_modules()`` order;
  its other names are in :attr:`ParamMap.shared`;
* tensors that a wrapper swaps in for a module's parameters during forward
  (FSDP2's unsharded parameters, FSDP1's unsharded views with
  ``use_orig_params=True``) are recognised by module and attribute name when
  the module is called (:meth:`ParamMap.swapped_in`), and their full shapes
  replace the sharded ones in :meth:`ParamMap.param_infos`.

Every tensor in the map is kept alive until :meth:`ParamMap.clear`, so that its
``id()`` cannot be reused by another object while recording.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn

from tracing.fqn import clean_fqn, is_wrapper_module, join_fqn, original_class_name
from tracing.order import ParamInfo, param_info

__all__ = ["ParamMap"]

_NOTHING_NEW: tuple[tuple[torch.Tensor, str], ...] = ()


class ParamMap:
    """Canonical FQNs of a model's parameters and of the tensors seen as them.

    Built in one pass over ``model.named_modules(remove_duplicate=False)``.

    Args:
        model: the model (wrapped or not).

    Attributes:
        modules: ``(clean FQN, module, is_wrapper)`` of every module under its
            first name, in ``named_modules()`` order.
        module_classes: clean FQN -> original class name
            (:func:`~tracing.fqn.original_class_name`) of every module that is
            not a wrapper.
        names: ``(clean FQN, canonical FQN)`` of every parameter name, tied
            names included.
        shared: canonical FQN -> the other clean FQNs of the same tensor.
        tensors: canonical FQN -> the parameter tensor when the map was built.
        fqn_of: ``id(tensor)`` -> canonical FQN of every tensor known; the
            use mode looks every torch call's arguments up here.
    """

    def __init__(self, model: nn.Module) -> None:
        self.modules: list[tuple[str, nn.Module, bool]] = []
        self.module_classes: dict[str, str] = {}
        self.names: list[tuple[str, str]] = []
        self.shared: dict[str, list[str]] = {}
        self.tensors: dict[str, torch.Tensor] = {}
        self.fqn_of: dict[int, str] = {}
        self._keep: list[torch.Tensor] = []
        # id(module) -> [(attribute name, canonical FQN)] of its direct parameters.
        self._direct: dict[int, list[tuple[str, str]]] = {}
        # canonical FQN -> shape of the tensor a wrapper swapped in.
        self._live_shapes: dict[str, tuple[int, ...]] = {}
        self._walk(model)
        for canonical, p in self.tensors.items():
            self._add(p, canonical)

    def _walk(self, model: nn.Module) -> None:
        id_to_canonical: dict[int, str] = {}
        seen_modules: set[int] = set()
        for name, module in model.named_modules(remove_duplicate=False):
            wrapper = is_wrapper_module(module)
            fqn = clean_fqn(name)
            if id(module) not in seen_modules:  # like named_modules(): first name only
                seen_modules.add(id(module))
                self.modules.append((fqn, module, wrapper))
                if not wrapper and fqn not in self.module_classes:
                    self.module_classes[fqn] = original_class_name(module)
            direct: list[tuple[str, str]] = []
            for pname, p in module._parameters.items():
                if p is None:
                    continue
                pfqn = join_fqn(fqn, pname)
                canonical = id_to_canonical.setdefault(id(p), pfqn)
                if canonical == pfqn:
                    self.tensors[canonical] = p
                elif pfqn not in self.shared.get(canonical, ()):
                    self.shared.setdefault(canonical, []).append(pfqn)
                self.names.append((pfqn, canonical))
                direct.append((pname, canonical))
            if direct:
                self._direct[id(module)] = direct

    def _add(self, t: torch.Tensor, fqn: str) -> None:
        self.fqn_of[id(t)] = fqn
        self._keep.append(t)

    def swapped_in(self, module: nn.Module) -> tuple[tuple[torch.Tensor, str], ...]:
        """Learn the tensors a wrapper swapped in for ``module``'s own parameters.

        Call when ``module``'s forward starts. Each tensor is returned once,
        the first time it is seen (the caller hooks its gradient); tensors
        already known are skipped.

        Returns:
            ``(tensor, canonical FQN)`` of each tensor new to the map.
        """
        direct = self._direct.get(id(module))
        if direct is None:
            return _NOTHING_NEW
        params = module._parameters
        attrs = module.__dict__
        new: list[tuple[torch.Tensor, str]] = []
        for name, fqn in direct:
            t = params.get(name)
            if t is None:
                t = attrs.get(name)
            if t is None or id(t) in self.fqn_of or not isinstance(t, torch.Tensor):
                continue
            self._add(t, fqn)
            self._live_shapes[fqn] = tuple(t.shape)
            new.append((t, fqn))
        return tuple(new)

    def param_infos(self) -> dict[str, ParamInfo]:
        """ParamInfo per canonical FQN; full shapes of tensors a wrapper swapped in."""
        infos: dict[str, ParamInfo] = {}
        for fqn, p in self.tensors.items():
            info = param_info(p)
            shape = self._live_shapes.get(fqn)
            if shape is not None and shape != info.shape:
                info = dataclasses.replace(info, numel=math.prod(shape), shape=shape)
            infos[fqn] = info
        return infos

    def clear(self) -> None:
        """Forget every tensor (names and shapes stay); releases the tensors kept alive."""
        self._keep.clear()
        self.fqn_of.clear()
