"""Where in the model's code an error was raised: file, line and source text.

A failure inside a trace or a fake run is raised deep in torch (fx's
``Proxy.__bool__``, a fake kernel); the line that matters is the innermost
one in the model's own code (``if attn_mask is not None:``,
``expert_hit = torch.nonzero(...)``). :func:`source_line` finds it: the
innermost traceback frame outside torch, outside this package and outside
generated code.

>>> try:
...     int("x")
... except ValueError as e:
...     print(source_line(e))
None
"""

from __future__ import annotations

import linecache
import os
import sys
from pathlib import Path

import torch

__all__ = ["source_line", "stack_source_line"]

_SKIP_ROOTS = tuple(
    str(Path(p).resolve()) + os.sep
    for p in (os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__)))
)


def _short_path(filename: str) -> str:
    """``filename`` relative to the deepest ``sys.path`` entry holding it."""
    best = filename
    for entry in sys.path:
        if not entry:
            continue
        root = str(Path(entry).resolve()) + os.sep
        if filename.startswith(root) and len(filename) - len(root) < len(best):
            best = filename[len(root) :]
    return best


def source_line(error: BaseException, *, width: int = 80) -> str | None:
    """``"pkg/module.py:292 (`if mask is None:`)"`` for the innermost model frame of ``error``.

    Frames in torch, in ``tracing`` and in generated code (``<...>`` file
    names, e.g. fx's) are skipped; the code is cut to ``width`` characters.

    Returns:
        The location, or ``None`` when every frame is skipped (or the error
        has no traceback).
    """
    found: tuple[str, int] | None = None
    tb = error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith("<"):
            resolved = str(Path(filename).resolve())
            if not resolved.startswith(_SKIP_ROOTS):
                found = (resolved, tb.tb_lineno)
        tb = tb.tb_next
    return _describe(found, width)


def stack_source_line(*, width: int = 80) -> str | None:
    """:func:`source_line` for the code running now: the innermost model frame of the stack.

    Returns:
        The location (``"pkg/module.py:292 (`if mask is None:`)"``), or ``None``
        when every frame is skipped.
    """
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith("<"):
            resolved = str(Path(filename).resolve())
            if not resolved.startswith(_SKIP_ROOTS):
                return _describe((resolved, frame.f_lineno), width)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def _describe(found: tuple[str, int] | None, width: int) -> str | None:
    if found is None:
        return None
    filename, lineno = found
    code = linecache.getline(filename, lineno).strip()
    if len(code) > width:
        code = code[: width - 3] + "..."
    where = f"{_short_path(filename)}:{lineno}"
    return f"{where} (`{code}`)" if code else where
