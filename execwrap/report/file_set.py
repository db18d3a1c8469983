"""Write a set of files all or nothing: :func:`write_file_set`.

Every file is first written to a temporary name in its folder
(:func:`tracing.atomic.write_temp`); only when every file has been written are
they renamed into place. An interrupted or failed write leaves neither a
half-written file nor a temporary one, the targets keep their old content,
and the folders the call created are removed again. A folder in the way of a
file is found before anything is written.

(The renames themselves are one after another: a crash between two renames
can leave a mix of old and new files.)
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from tracing.atomic import write_temp

__all__ = ["write_file_set"]


def write_file_set(writers: Mapping[Path, Callable[[IO[bytes]], None]]) -> None:
    """Write every file to a temp name in its folder, then rename all into place.

    Args:
        writers: target path -> a function that writes the file's bytes.

    Raises:
        IsADirectoryError: a target exists as a folder (before anything is
            written; the error's ``filename`` is that target).
        OSError: a folder cannot be created, or a file written or renamed (the
            error names the target, not the temporary file).

    If any writer raises (``KeyboardInterrupt`` included), every temporary
    file is removed, no target is touched, the folders this call created are
    removed again, and the error propagates.
    """
    for path in writers:
        if path.is_dir():
            raise IsADirectoryError(
                errno.EISDIR, "a folder is in the way of a report file", str(path)
            )
    staged: list[tuple[Path, Path]] = []  # (temporary file, target)
    created: list[Path] = []  # folders this call made, outermost first
    try:
        for path, writer in writers.items():
            created += _make_folder(path.parent)
            staged.append((write_temp(path.parent, path.name, writer), path))
        for tmp, path in staged:
            try:
                os.replace(tmp, path)
            except OSError as exc:  # name the target, not our temporary file
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
    except BaseException:
        _clean_up(staged, created)
        raise


def _clean_up(staged: list[tuple[Path, Path]], created: list[Path]) -> None:
    """Remove the temporary files, then the created folders if no target was written."""
    for tmp, _ in staged:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    if any(path.exists() for _, path in staged):
        return
    for folder in reversed(created):
        try:
            folder.rmdir()  # only if still empty
        except OSError:
            break


def _make_folder(folder: Path) -> list[Path]:
    """``mkdir -p folder``; returns the folders it created, outermost first."""
    missing: list[Path] = []
    probe = folder
    while not probe.exists() and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    folder.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))
