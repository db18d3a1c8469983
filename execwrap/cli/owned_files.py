"""Files the command line writes where the user's own files may be: never replace one it
did not write.

``execwrap report`` keeps its folder's files in a set of its own
(:mod:`execwrap.report.file_set`), with the same :data:`MANIFEST` of digests, and
:mod:`execwrap.cli.report_out` refuses its ``--out`` by the same rule
(:mod:`execwrap.report.ownership`). ``execwrap fit --out FOLDER`` and
``execwrap calibrate --out FILE`` write plain files, so:

- a folder: :func:`write_owned_files` records each file it writes, with its SHA-256,
  in :data:`MANIFEST` inside the folder; a file already there is replaced only when the
  manifest lists it with the same digest (written by execwrap, not edited since);
- a single file: :func:`check_replaceable_file` lets ``--out`` replace only a file whose
  contents say execwrap wrote it (a cost model's ``"kind"``).

Either way, before anything is written, :class:`~execwrap.cli.errors.CLIError` (exit 2)
names the file and what to do instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from execwrap.cli.errors import CLIError
from execwrap.report.ownership import MANIFEST, read_manifest
from tracing.atomic import atomic_write_text

__all__ = ["MANIFEST", "check_replaceable_file", "write_owned_files"]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_owned_files(folder: Path, files: Mapping[str, str], option: str = "--out") -> None:
    """Write ``files`` (name -> UTF-8 text) into ``folder``, each atomically.

    Raises:
        CLIError: before writing anything, when one of the names is a file execwrap did
            not write there (or that was changed since), naming it; or a file cannot be
            written.
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        owned = read_manifest(folder)
        for name in files:
            path = folder / name
            if path.exists() and (not path.is_file() or owned.get(name) != _digest(path)):
                raise CLIError(
                    f"{option} {str(folder)!r}: {name} there was not written by execwrap (or was "
                    "changed since), and execwrap never replaces a file it did not write: "
                    f"choose another {option} folder, or move {name} away"
                )
        for name, text in files.items():
            atomic_write_text(folder / name, text)
            owned[name] = _digest(folder / name)
        atomic_write_text(folder / MANIFEST, json.dumps(owned, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        raise CLIError(f"{option} {str(folder)!r}: cannot write: {exc}") from exc


def check_replaceable_file(
    path: Path, is_ours: Callable[[Any], bool], what: str, option: str = "--out"
) -> None:
    """Refuse ``path`` as an output file when it exists and is not ``what`` as execwrap
    writes it (``is_ours`` of its parsed JSON is false, or it is not JSON).

    Raises:
        CLIError: naming the file and what to do instead.
    """
    if not path.exists():
        return
    try:
        ours = path.is_file() and is_ours(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise CLIError(
            f"{option} {str(path)!r}: the file exists and is not {what} execwrap wrote, and "
            f"execwrap never replaces a file it did not write: choose another {option}, or "
            "move the file away"
        )
