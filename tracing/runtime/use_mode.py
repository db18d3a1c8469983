"""Parameter uses at run time: a ``TorchFunctionMode`` that sees every torch call.

While a recorded module's forward runs, :class:`ParamUseMode` looks at each
torch call's arguments (positional and keyword, inside lists and tuples) for
tensors the :class:`~tracing.runtime.param_map.ParamMap` knows, and reports a
call that takes parameters as one use. So parameters used functionally at any
depth (root-level ``F.linear(x, self.weight)``, ``self.wpe[:n]``, parameters
inside lists or passed by keyword) are found as well as those of leaf modules.
Reading a parameter's metadata (``w.shape``, ``w.size(0)``, ``w.dtype``) is not
a use (:data:`~tracing.uses.METADATA_METHODS` and the properties below).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch.overrides import TorchFunctionMode

from tracing.uses import METADATA_METHODS

__all__ = ["ParamUseMode", "UseCallback", "find_params", "op_name"]

#: ``(target, op, fqns)``: the ``(module FQN, call index)`` whose forward made
#: the call, the op's name, and the canonical FQNs of its parameter arguments
#: (repeats kept, in argument order).
UseCallback = Callable[[tuple[str, int], str, list[str]], None]

# Tensor properties that read metadata, not values (``Tensor.shape``, ...).
_METADATA_ATTRIBUTES = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "requires_grad",
        "is_leaf",
        "grad",
        "grad_fn",
        "ndim",
        "layout",
        "is_cuda",
        "is_meta",
        "is_cpu",
        "is_sparse",
        "is_quantized",
        "names",
        "_version",
        "_base",
        "itemsize",
        "nbytes",
        "data",
    }
)
_CONTAINERS = (list, tuple)


class ParamUseMode(TorchFunctionMode):
    """Sees every torch call and reports those that take a parameter.

    Per call it does one attribute read when no module forward is being
    recorded (:attr:`target` is ``None``), else one ``dict`` lookup of
    ``id(arg)`` per argument (lists and tuples are looked into); only calls
    that have a parameter among their arguments do more work.

    Args:
        fqn_of: ``id(tensor)`` -> canonical FQN (:attr:`ParamMap.fqn_of`,
            read live: tensors added later are seen).
        on_use: called once per use (see :data:`UseCallback`); metadata reads
            are not reported.

    Attributes:
        target: ``(module FQN, call index)`` whose torch calls are uses now,
            or ``None`` (backward, a wrapper's own calls, the recorder's own
            calls). Set by the :class:`~tracing.runtime.call_stack.CallStack`.
    """

    def __init__(self, fqn_of: dict[int, str], on_use: UseCallback) -> None:
        super().__init__()
        self.target: tuple[str, int] | None = None
        self._fqn_of = fqn_of
        self._on_use = on_use

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Iterable[type],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        target = self.target
        if target is not None:
            get = self._fqn_of.get
            found = find_params(args, get, None)
            if kwargs:
                found = find_params(kwargs.values(), get, found)
            if found is not None:
                op = op_name(func)
                if op is not None:
                    self._on_use(target, op, found)
        return func(*args, **kwargs)


def find_params(
    values: Iterable[Any], get: Callable[[int], str | None], found: list[str] | None
) -> list[str] | None:
    """Append the FQN of every parameter in ``values`` (lists/tuples looked into).

    Returns:
        ``found`` with the FQNs appended (a new list if ``found`` is ``None``
        and one is found), or ``None`` when there is none.
    """
    for a in values:
        fqn = get(id(a))
        if fqn is not None:
            if found is None:
                found = [fqn]
            else:
                found.append(fqn)
        elif type(a) in _CONTAINERS:
            found = find_params(a, get, found)
    return found


def op_name(func: Callable[..., Any]) -> str | None:
    """A readable op name, or ``None`` for metadata reads (not uses).

    >>> import torch
    >>> op_name(torch.nn.functional.linear), op_name(torch.Tensor.__getitem__)
    ('linear', 'getitem')
    """
    name = getattr(func, "__name__", None) or type(func).__name__
    if name == "__get__":  # property getter: Tensor.T, Tensor.shape, ...
        attr = getattr(getattr(func, "__self__", None), "__name__", "__get__")
        return None if attr in _METADATA_ATTRIBUTES else attr
    if name in METADATA_METHODS:
        return None
    if name.startswith("__") and name.endswith("__") and len(name) > 4:
        return name[2:-2]  # __getitem__ -> getitem, like operator.getitem
    return name
