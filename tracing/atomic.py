"""Atomic file writes: a temporary file in the target's folder, then a rename.

A reader sees either the old file or the complete new one, never a partial
write (``os.replace`` is atomic on POSIX and Windows within one file system).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["atomic_write", "atomic_write_text", "file_mode", "refuse_folder", "write_temp"]


def file_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666 & ~umask``."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def refuse_folder(path: Path, what: str, example: str) -> None:
    """Raise before writing when ``path`` is a folder, naming it and a file path to pass.

    Args:
        path: where the caller will write a file.
        what: the caller, for the message (``"CostModel.save"``).
        example: a file name to suggest inside the folder (``"cost.json"``).

    Raises:
        IsADirectoryError: ``path`` is an existing folder.

    >>> refuse_folder(Path("/"), "ExecutionOrder.save", "order.json")
    Traceback (most recent call last):
    ...
    IsADirectoryError: ExecutionOrder.save: '/' is a folder; pass the path of the file to write, e.g. '/order.json'
    """
    if path.is_dir():
        raise IsADirectoryError(
            f"{what}: {str(path)!r} is a folder; pass the path of the file to write, e.g. "
            f"{str(path / example)!r}"
        )


def write_temp(folder: Path, name: str, writer: Callable[[IO[bytes]], None]) -> Path:
    """Write a temporary file ``.<name>.<random>.tmp`` in ``folder`` with ``writer``.

    The file gets :func:`file_mode` (``mkstemp`` creates ``0600``). If
    ``writer`` raises, the temporary file is removed and the error propagates.

    Returns:
        The temporary file's path; rename it into place with ``os.replace``.
    """
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            writer(f)
        os.chmod(tmp, file_mode())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def atomic_write(path: Path, writer: Callable[[IO[bytes]], None]) -> None:
    """Write ``path`` atomically: ``writer`` fills a temporary file in the same
    folder (created if missing), which then replaces ``path``.

    Raises:
        OSError: the folder cannot be created or the rename fails; the
            temporary file is removed and ``path`` keeps its old content.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = write_temp(path.parent, path.name, writer)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` of ``text`` encoded as UTF-8."""
    data = text.encode("utf-8")

    def write(f: IO[bytes]) -> None:
        f.write(data)

    atomic_write(path, write)
