"""The ``--input SPEC`` language: what the example inputs of one forward are.

:data:`INPUT_SPEC_HELP` is the grammar as ``execwrap report --help`` shows it;
:func:`parse_input_spec` turns a SPEC into :class:`InputItem` objects. Parsing
needs no torch: dtype names are checked against :data:`DTYPE_NAMES`, and
torch is imported only when an item's :attr:`InputItem.dtype` is read (by
:func:`execwrap.cli.inputs.build_inputs`, which makes the tensors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DTYPE_NAMES",
    "INPUT_SPEC_HELP",
    "InputItem",
    "check_input_file",
    "is_arg_name",
    "parse_input_spec",
]

INPUT_SPEC_HELP = """\
input SPEC: the example inputs for one forward, items separated by ';'
(quote SPEC in the shell when it has several items):
  DTYPE:SHAPE[:HIGH]   a random tensor, e.g. long:2x16, float:2x3x32, bool:4.
                       DTYPE is a torch dtype name (long, int, float, half,
                       bfloat16, float64, bool, ...); SHAPE is sizes joined by
                       'x'. Integer tensors draw from [0, HIGH); without HIGH,
                       from [0, model.config.vocab_size) when the model has
                       one, else [0, 2). Floats are standard normal. Seeded.
  NAME=ITEM            pass ITEM as keyword argument NAME of forward,
                       e.g. input_ids=long:2x16;attention_mask=long:2x16:2
  @FILE.pt             a file written by torch.save, read with
                       torch.load(FILE.pt, weights_only=True): a tensor (one
                       positional input), a list/tuple of tensors (positional
                       inputs) or a dict NAME -> tensor (keyword inputs).
  NAME=@FILE.pt        keyword argument NAME; FILE.pt must hold one tensor."""

#: DTYPE name in a SPEC -> the ``torch`` attribute it names: every torch dtype
#: that a random input tensor can be drawn in, by its name and its aliases.
#: (Sub-byte, bit and quantized dtypes are left out: torch cannot draw them.)
DTYPE_NAMES: dict[str, str] = {
    "bool": "bool",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "int8": "int8",
    "int16": "int16",
    "short": "int16",
    "int32": "int32",
    "int": "int32",
    "int64": "int64",
    "long": "int64",
    "float16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float": "float32",
    "float64": "float64",
    "double": "float64",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e4m3fnuz": "float8_e4m3fnuz",
    "float8_e5m2": "float8_e5m2",
    "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e8m0fnu": "float8_e8m0fnu",
    "complex32": "complex32",
    "chalf": "complex32",
    "complex64": "complex64",
    "cfloat": "complex64",
    "complex128": "complex128",
    "cdouble": "complex128",
}

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_arg_name(text: str) -> bool:
    """Whether ``text`` can name a keyword argument (a Python identifier, ASCII)."""
    return bool(_NAME_RE.match(text))


@dataclass
class InputItem:
    """One parsed item of an input SPEC (see :data:`INPUT_SPEC_HELP`).

    Attributes:
        name: the keyword argument of ``forward``; ``None`` for a positional input.
        dtype_name: the ``torch`` dtype attribute (``"int64"``); ``None`` for a file.
        shape: the tensor's sizes.
        high: integer tensors draw from ``[0, high)``; ``None``: the model's default.
        path: the ``@FILE`` to load; ``None`` for a random tensor.
        text: the item as written in the SPEC, for messages.
    """

    name: str | None
    dtype_name: str | None = None
    shape: tuple[int, ...] = ()
    high: int | None = None
    path: str | None = None
    text: str = ""

    @property
    def dtype(self) -> Any:
        """The ``torch.dtype`` (imports torch); ``None`` for a file item."""
        if self.dtype_name is None:
            return None
        import torch  # only the inputs' builder reads it, after the arguments are checked

        return getattr(torch, self.dtype_name)


def parse_input_spec(spec: str) -> list[InputItem]:
    """Parse an input SPEC (see :data:`INPUT_SPEC_HELP`) into items.

    Example:
        >>> [(i.name, i.dtype_name, i.shape) for i in parse_input_spec("long:2x16;m=bool:4")]
        [(None, 'int64', (2, 16)), ('m', 'bool', (4,))]

    Raises:
        ValueError: the spec is empty, an item is malformed, or two items give
            the same keyword; the message names the items and what was expected.
    """
    items = [_parse_item(raw.strip()) for raw in spec.split(";") if raw.strip()]
    if not items:
        raise ValueError(f"input spec {spec!r} has no items (e.g. long:2x16)")
    seen: dict[str, InputItem] = {}
    for item in items:
        if item.name is None:
            continue
        if item.name in seen:
            raise ValueError(
                f"input items {seen[item.name].text!r} and {item.text!r} both give keyword "
                f"{item.name!r}; give each forward argument once"
            )
        seen[item.name] = item
    return items


def check_input_file(path: str) -> None:
    """Raise ``ValueError`` unless ``path`` (of an ``@FILE`` item) is an existing file."""
    if not Path(path).exists():
        raise ValueError(f"input file {path!r} does not exist")
    if not Path(path).is_file():
        raise ValueError(f"input file {path!r} is not a file")


def _parse_item(item: str) -> InputItem:
    name: str | None = None
    head, eq, rest = item.partition("=")
    body = item
    if eq:
        if not is_arg_name(head.strip()):
            raise ValueError(f"input item {item!r}: {head!r} is not an argument name")
        name, body = head.strip(), rest.strip()
    if body.startswith("@"):
        if not body[1:]:
            raise ValueError(f"input item {item!r}: '@' needs a file name")
        return InputItem(name=name, path=body[1:], text=item)
    parts = body.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise ValueError(
            f"input item {item!r}: expected DTYPE:SHAPE[:HIGH] (e.g. long:2x16), "
            "NAME=DTYPE:SHAPE or @FILE.pt"
        )
    return InputItem(
        name=name,
        dtype_name=_dtype_name(parts[0].strip(), item),
        shape=_shape(parts[1], item),
        high=_high(parts[2], item) if len(parts) == 3 else None,
        text=item,
    )


def _dtype_name(name: str, item: str) -> str:
    resolved = DTYPE_NAMES.get(name)
    if resolved is None:
        raise ValueError(
            f"input item {item!r}: unknown dtype {name!r} (use a torch dtype such as "
            "long, int, float, half, bfloat16, bool)"
        )
    return resolved


def _shape(text: str, item: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in text.lower().split("x"))
    except ValueError:
        raise ValueError(
            f"input item {item!r}: shape {text!r} must be sizes joined by 'x', e.g. 2x16"
        ) from None
    if any(s < 0 for s in shape):
        raise ValueError(f"input item {item!r}: negative size in shape {text!r}")
    return shape


def _high(text: str, item: str) -> int:
    try:
        high = int(text)
    except ValueError:
        raise ValueError(f"input item {item!r}: HIGH {text!r} must be an integer") from None
    if high <= 0:
        raise ValueError(f"input item {item!r}: HIGH must be > 0, got {high}")
    return high
