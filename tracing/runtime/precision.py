"""Capture a model "as if" it ran in lower precision, without converting it.

FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)`` (and FSDP1's
``MixedPrecision``) all-gathers each unit's parameters cast to ``param_dtype``
and runs the forward and backward on them, so the activations, their
gradients and the compute are in that dtype while the sharded parameters stay
float32. :func:`cast_parameters` reproduces that for one recorded step: every
floating-point parameter is swapped, for the block only, for a new leaf
parameter of the same shape in ``dtype`` (tied weights stay tied), as FSDP2
swaps in its unsharded parameters; the recorder recognises the stand-ins by
module and attribute name (:meth:`tracing.runtime.param_map.ParamMap.swapped_in`)
and reports the original parameters' dtypes. On the meta device and under fake
tensors the cast allocates nothing; on a real model it makes a copy in
``dtype``. :func:`cast_inputs` casts floating-point inputs as FSDP2's
``cast_forward_inputs=True`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["as_dtype", "cast_inputs", "cast_parameters", "check_compute_dtype"]


def check_compute_dtype(dtype: Any, where: str) -> torch.dtype | None:
    """``dtype`` if it is ``None`` or a floating-point ``torch.dtype``.

    Raises:
        TypeError: anything else, naming ``where``.
    """
    if dtype is None or (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        return dtype
    raise TypeError(
        f"{where}: param_dtype must be None or a floating-point torch.dtype (e.g. "
        f"torch.bfloat16), got {dtype!r}"
    )


@contextmanager
def cast_parameters(model: nn.Module, dtype: torch.dtype | None) -> Iterator[None]:
    """Swap every floating-point parameter of ``model`` for a ``dtype`` copy, for the block.

    ``None`` (or parameters already in ``dtype``) changes nothing. The stand-ins
    are new leaf :class:`torch.nn.Parameter` objects with the originals'
    ``requires_grad``; the originals are put back afterwards, also when the
    block raises, and their ``.grad`` is never touched.

    Example:
        >>> with torch.device("meta"):
        ...     model = nn.Linear(4, 4)
        >>> with cast_parameters(model, torch.bfloat16):
        ...     model.weight.dtype
        torch.bfloat16
        >>> model.weight.dtype
        torch.float32
    """
    if dtype is None:
        yield
        return
    swapped: list[tuple[dict[str, Any], str, Any]] = []
    stand_ins: dict[int, nn.Parameter] = {}
    try:
        for module in model.modules():
            slot = module._parameters
            for name, p in list(slot.items()):
                if p is None or not p.is_floating_point() or p.dtype == dtype:
                    continue
                new = stand_ins.get(id(p))
                if new is None:
                    # the cast is FSDP's, not the model's: no dispatch mode (the
                    # recorder's roofline and memory count) sees it
                    with torch.no_grad(), _disable_current_modes():
                        data = p.detach().to(dtype)
                    new = stand_ins[id(p)] = nn.Parameter(data, requires_grad=p.requires_grad)
                swapped.append((slot, name, p))
                slot[name] = new
        yield
    finally:
        for slot, name, p in reversed(swapped):
            slot[name] = p


def cast_inputs(inputs: Any, dtype: torch.dtype | None) -> Any:
    """``inputs`` with every floating-point tensor cast to ``dtype`` (others as they are)."""
    if dtype is None:
        return inputs

    def cast(t: torch.Tensor) -> torch.Tensor:
        return t.to(dtype) if t.is_floating_point() else t

    with _disable_current_modes():  # the inputs' cast is not the model's work either
        return pytree.tree_map_only(torch.Tensor, cast, inputs)


@contextmanager
def as_dtype(model: nn.Module, inputs: Any, dtype: Any, where: str) -> Iterator[Any]:
    """:func:`cast_parameters` of ``model`` for the block, yielding :func:`cast_inputs`
    of ``inputs``; ``dtype`` checked first (:func:`check_compute_dtype`, naming ``where``)."""
    dtype = check_compute_dtype(dtype, where)
    with cast_parameters(model, dtype):
        yield cast_inputs(inputs, dtype)
