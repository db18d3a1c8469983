"""The example inputs of ``execwrap report``: tensors built from a parsed ``--input`` SPEC.

:func:`build_inputs` makes ``(args, kwargs)`` for one forward from the items
of :func:`execwrap.cli.input_spec.parse_input_spec`: seeded random tensors,
or tensors loaded from ``@FILE.pt`` (``torch.load(..., weights_only=True)``)
and checked to hold what the SPEC allows. Every failure is a ``ValueError``
naming the item, in one line.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from execwrap.cli.input_spec import InputItem, check_input_file, is_arg_name
from execwrap.cli.text import article, exc_line
from execwrap.util.formatting import format_bytes
from tracing.checks import is_int

__all__ = ["build_inputs"]

_LOAD_HINT = "is it a file written by torch.save of a tensor or a tuple/dict of tensors?"


def build_inputs(
    items: Sequence[InputItem], model: Any, device: str, *, seed: int = 0
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Materialise parsed input items into ``(args, kwargs)`` on ``device``.

    Args:
        items: the parsed SPEC.
        model: the model; integer tensors without HIGH draw from
            ``[0, model.config.vocab_size)`` when it has one, else ``[0, 2)``.
        device: ``"cpu"``, or ``"meta"`` (shapes only, no memory).
        seed: seed of the random tensors (the same SPEC gives the same tensors).

    Raises:
        ValueError: an item cannot be built (a tensor larger than this
            machine's memory, or torch fails to allocate or convert it), or a
            file cannot be loaded or holds something other than the SPEC
            allows; the message names the item.
    """
    gen = torch.Generator().manual_seed(seed)
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for item in items:
        label = _label(item)
        if item.path is not None:
            _add_file_inputs(item.path, item.name, label, device, args, kwargs)
            continue
        tensor = _random_tensor(item, label, model, device, gen)
        if item.name is None:
            args.append(tensor)
        else:
            kwargs[item.name] = tensor
    return tuple(args), kwargs


def _label(item: InputItem) -> str:
    """The item as written, for messages."""
    return item.text or (f"{item.name}=" if item.name else "") + (
        f"@{item.path}" if item.path is not None else ""
    )


def _random_tensor(
    item: InputItem, label: str, model: Any, device: str, gen: torch.Generator
) -> torch.Tensor:
    dtype = item.dtype
    nbytes = math.prod(item.shape) * dtype.itemsize
    limit = _machine_memory_bytes()
    if device != "meta" and limit is not None and nbytes > limit:
        raise ValueError(
            f"input item {label!r}: the tensor needs {format_bytes(nbytes)}, more than "
            f"this machine's memory ({format_bytes(limit)}); use a smaller SHAPE"
        )
    try:
        if device == "meta":
            tensor = torch.empty(item.shape, dtype=dtype, device="meta")
        elif dtype == torch.bool:
            tensor = torch.randint(0, 2, item.shape, generator=gen).bool()
        elif dtype.is_floating_point or dtype.is_complex:
            tensor = torch.randn(item.shape, generator=gen).to(dtype)
        else:
            high = item.high or _int_high(model)
            tensor = torch.randint(0, high, item.shape, generator=gen).to(dtype)
        return tensor.to(device)
    except (RuntimeError, MemoryError, ValueError) as exc:
        raise ValueError(
            f"input item {label!r}: cannot create the tensor ({format_bytes(nbytes)}): "
            f"{exc_line(exc)}"
        ) from exc


def _int_high(model: Any) -> int:
    config = getattr(model, "config", None)
    vocab: Any = getattr(config, "vocab_size", None)
    return int(vocab) if is_int(vocab) and vocab > 0 else 2


def _add_file_inputs(
    path: str, name: str | None, label: str, device: str, args: list[Any], kwargs: dict[str, Any]
) -> None:
    """Load an ``@FILE`` item and add what it holds to ``args`` / ``kwargs``."""
    value = _load_input_file(path, name, label)
    try:
        if isinstance(value, dict):
            kwargs.update({k: _to_device(v, device) for k, v in value.items()})
        elif isinstance(value, (list, tuple)):
            args.extend(_to_device(v, device) for v in value)
        elif name is not None:
            kwargs[name] = _to_device(value, device)
        else:
            args.append(_to_device(value, device))
    except (RuntimeError, MemoryError, ValueError) as exc:
        raise ValueError(
            f"input item {label!r}: cannot move it to {device}: {exc_line(exc)}"
        ) from exc


def _load_input_file(path: str, name: str | None, label: str) -> Any:
    """``torch.load`` an ``@FILE`` input and check it holds what the SPEC allows:
    one tensor for ``NAME=@FILE``; a tensor, a list/tuple of tensors or a dict
    NAME -> tensor for a positional ``@FILE``."""
    check_input_file(path)
    try:
        value = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:
        raise ValueError(
            f"input item {label!r}: cannot load {path!r}: {exc_line(exc)}; {_LOAD_HINT}"
        ) from exc
    if name is not None:
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"input item {label!r}: {path!r} holds {article(type(value).__name__)}; "
                f"{name}=@FILE needs a file holding one tensor (for several inputs use "
                "a positional @FILE holding a tuple or dict of tensors)"
            )
        return value
    _check_file_value(value, path, label)
    return value


def _check_file_value(value: Any, path: str, label: str) -> None:
    """A positional ``@FILE`` holds a tensor, a list/tuple of tensors or a dict NAME -> tensor."""
    if isinstance(value, torch.Tensor):
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if not isinstance(v, torch.Tensor):
                raise ValueError(
                    f"input item {label!r}: {path!r} holds a {type(value).__name__} whose "
                    f"item {i} is {article(type(v).__name__)}; expected tensors only"
                )
        return
    if isinstance(value, dict):
        for k, v in value.items():
            if not (isinstance(k, str) and is_arg_name(k)):
                raise ValueError(
                    f"input item {label!r}: {path!r} holds a dict with key {k!r}, "
                    "which is not an argument name"
                )
            if not isinstance(v, torch.Tensor):
                raise ValueError(
                    f"input item {label!r}: {path!r} holds a dict whose entry {k!r} is "
                    f"{article(type(v).__name__)}; expected tensors only"
                )
        return
    raise ValueError(
        f"input item {label!r}: {path!r} holds {article(type(value).__name__)}; expected a "
        "tensor, a list/tuple of tensors or a dict NAME -> tensor"
    )


def _to_device(value: Any, device: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def _machine_memory_bytes() -> int | None:
    """Physical memory of this machine in bytes, or ``None`` when unknown."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None
