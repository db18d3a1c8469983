"""Which files in a report folder execwrap wrote: :func:`foreign_files`.

A report never deletes or replaces a file that execwrap did not write. A file
with a report name (``report.json``, ``calls.csv``, ...) counts as execwrap's
when it is

* a link of the current report set, the marker every write leaves:
  ``OUT/<name> -> .execwrap-report/current/<name>`` (see
  :mod:`~execwrap.report.file_set`); or
* a plain file whose content is an execwrap report file of this or an earlier
  release (written before report sets, copied with ``cp -L``, or written one
  by one where symbolic links are missing), recognised by the signature
  every release has written into it:

  - ``report.json``: ``"kind": "execwrap-report"`` in its first 4 KiB;
  - ``calls.csv`` / ``params.csv``: the exact header row of
    :data:`~execwrap.report.tables.CALLS_COLUMNS` /
    :data:`~execwrap.report.tables.PARAMS_COLUMNS`;
  - ``order.graphml``: a GraphML file whose graph attributes include
    ``model_class`` and ``method`` (the keys of the order graph);
  - ``report.html``: ``<meta name="generator" content="execwrap">`` in its
    first 4 KiB or the footer ``execwrap report schema`` in its last 4 KiB.

Anything else with a report name is the user's: :func:`check_report_folder`
refuses to write over it. Importing this module loads no torch (the command
line checks ``--out`` with it before capture).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "GENERATOR_META",
    "SET_FOLDER",
    "ForeignFilesError",
    "check_report_folder",
    "foreign_files",
    "is_report_file",
    "is_set_link",
]

#: The hidden folder inside the report folder that holds the report sets.
SET_FOLDER = ".execwrap-report"
#: The ``<meta>`` tag :mod:`~execwrap.report.html_page` writes into the page's head.
GENERATOR_META = '<meta name="generator" content="execwrap">'

_HEAD = 4096
_CALLS_HEADER = "index,phase,fqn,class,unit,own_numel"
_PARAMS_HEADER = (
    "fqn,forward_index,first_forward_call,backward_index,unit,numel,dtype,shape,"
    "requires_grad,shared_with"
)
_JSON_KIND = re.compile(rb'"kind"\s*:\s*"execwrap-report"')


class ForeignFilesError(FileExistsError):
    """Files execwrap did not write are where a report would write its own.

    Attributes:
        folder: the report folder.
        names: the file names in the way, sorted.
    """

    def __init__(self, folder: Path, names: list[str]) -> None:
        listed = ", ".join(names)
        verb = "was" if len(names) == 1 else "were"
        super().__init__(
            errno.EEXIST,
            f"{listed} in {str(folder)!r} {verb} not written by execwrap, and a report never "
            "replaces or deletes files it did not write: choose a new folder for the report "
            "(e.g. --out / out_dir 'execwrap-report'), or move those files away",
        )
        self.folder = folder
        self.names = names

    def __str__(self) -> str:
        return str(self.strerror)


def is_set_link(folder: Path, name: str) -> bool:
    """Whether ``folder/name`` is the link a report set put there (the marker)."""
    try:
        return os.readlink(folder / name) == f"{SET_FOLDER}/current/{name}"
    except OSError:
        return False


def is_report_file(path: Path) -> bool:
    """Whether the plain file ``path`` holds an execwrap report file of its name
    (see the module docstring); ``False`` for a name that is no report file's,
    a folder, or a file that cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD)
            if path.name == "report.html":
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - _HEAD))
                tail = f.read(_HEAD)
    except OSError:
        return False
    name = path.name
    if name == "report.json":
        return _JSON_KIND.search(head) is not None
    if name in ("calls.csv", "params.csv"):
        first = head.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", "replace")
        return first == (_CALLS_HEADER if name == "calls.csv" else _PARAMS_HEADER)
    if name == "order.graphml":
        return (
            b"<graphml" in head
            and b'for="graph" attr.name="model_class"' in head
            and b'for="graph" attr.name="method"' in head
        )
    if name == "report.html":
        return GENERATOR_META.encode() in head or b"<p>execwrap report schema " in tail
    return False


def foreign_files(folder: Path, names: Iterable[str]) -> list[str]:
    """The ``names`` in ``folder`` that exist and are not execwrap's, sorted.

    A name that does not exist, a folder (refused on its own, as "in the way"),
    a report set's link, or a plain file recognised by :func:`is_report_file`
    is not foreign. Any other link is foreign, also a dangling one.
    """
    out = []
    for name in names:
        path = folder / name
        if not os.path.lexists(path) or is_set_link(folder, name):
            continue
        if path.is_symlink() or not path.is_file():
            if path.is_dir() and not path.is_symlink():
                continue
            out.append(name)
        elif not is_report_file(path):
            out.append(name)
    return sorted(out)


def check_report_folder(folder: Path, names: Iterable[str]) -> None:
    """Refuse to write report files ``names`` into ``folder`` over files that
    execwrap did not write.

    Raises:
        ForeignFilesError: naming every such file (a ``FileExistsError``).
    """
    foreign = foreign_files(folder, names)
    if foreign:
        raise ForeignFilesError(folder, foreign)
