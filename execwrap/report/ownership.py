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
refuses to write over it.

Every write also records the SHA-256 of each file it wrote in :data:`MANIFEST`
(``{name: sha256 hex}``): inside each report set's folder, and in the report folder
itself where files are written one by one. A report file of execwrap's whose
content no longer matches what was recorded for it (the user edited it, through
its link or as a plain copy) is :func:`changed_files`: it is refused like a
file execwrap did not write, also when the run would only remove it (a format
it does not write again). A plain file with no recorded digest (an older
release's report, a copy) is recognised by its content alone. Importing this
module loads no torch (the command line checks ``--out`` with it before capture).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "GENERATOR_META",
    "MANIFEST",
    "SET_FOLDER",
    "ForeignFilesError",
    "changed_files",
    "check_report_folder",
    "foreign_files",
    "is_report_file",
    "is_set_link",
]

#: The hidden folder inside the report folder that holds the report sets.
SET_FOLDER = ".execwrap-report"
#: The ``<meta>`` tag :mod:`~execwrap.report.html_page` writes into the page's head.
GENERATOR_META = '<meta name="generator" content="execwrap">'
#: The record of the files execwrap wrote into a folder, ``{name: sha256 hex}`` (the same
#: file ``execwrap fit --out`` keeps, :mod:`execwrap.cli.owned_files`).
MANIFEST = ".execwrap-written.json"

_HEAD = 4096
_CALLS_HEADER = "index,phase,fqn,class,unit,own_numel"
_PARAMS_HEADER = (
    "fqn,forward_index,first_forward_call,backward_index,unit,numel,dtype,shape,"
    "requires_grad,shared_with"
)
_JSON_KIND = re.compile(rb'"kind"\s*:\s*"execwrap-report"')


class ForeignFilesError(FileExistsError):
    """Files execwrap did not write, or changed since it wrote them, are where a
    report would write (or remove) its own.

    Attributes:
        folder: the report folder.
        names: the file names in the way, sorted (``changed`` included).
        changed: those of ``names`` that execwrap wrote and that were changed since, sorted.
    """

    def __init__(self, folder: Path, names: list[str], changed: list[str] | None = None) -> None:
        self.folder = folder
        self.names = names
        self.changed = sorted(changed or [])
        what = refusal_phrase(names, self.changed, f" in {str(folder)!r}")
        super().__init__(
            errno.EEXIST,
            f"{what}, and a report never replaces or deletes files it did not write"
            f"{' or that were changed since' if self.changed else ''}: choose a new folder for "
            f"the report (e.g. --out / out_dir 'execwrap-report'), or {refusal_fix(self.changed)}",
        )

    def __str__(self) -> str:
        return str(self.strerror)


def refusal_fix(changed: list[str]) -> str:
    """The other way out: move the files away, or, when some were ``changed`` (a link
    moved elsewhere would lose the edits with the old set), copy them first."""
    if not changed:
        return "move those files away"
    return "copy those files elsewhere with cp -L (report files are links) and remove them"


def refusal_phrase(names: list[str], changed: list[str], where: str) -> str:
    """``"a, b<where> were not written by execwrap"``, and/or ``"c<where> was changed since
    execwrap wrote it"`` for the ``changed`` ones among ``names``."""
    foreign = [n for n in names if n not in changed]
    parts = []
    if foreign:
        verb = "was" if len(foreign) == 1 else "were"
        parts.append(f"{', '.join(foreign)}{where} {verb} not written by execwrap")
    if changed:
        verb, it = ("was", "it") if len(changed) == 1 else ("were", "them")
        parts.append(f"{', '.join(changed)}{where} {verb} changed since execwrap wrote {it}")
    return " and ".join(parts)


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


def file_digest(path: Path) -> str:
    """The SHA-256 (hex) of the file ``path`` (a link: of what it names).

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict[str, str]:
    """``folder``'s :data:`MANIFEST` (``{}`` when missing or unreadable)."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def changed_files(folder: Path, names: Iterable[str]) -> list[str]:
    """The ``names`` in ``folder`` that are execwrap's (a report set's link, or a plain
    report file) but differ from the digest recorded when execwrap wrote them, sorted.

    A link is held against the current set's :data:`MANIFEST`; a plain file against
    that and the folder's own (files written one by one). No record: not changed.
    """
    current = read_manifest(folder / SET_FOLDER / "current")
    own = read_manifest(folder)
    out = []
    for name in names:
        path = folder / name
        if is_set_link(folder, name):
            records = [current[name]] if name in current else []
        elif path.is_file() and not path.is_symlink() and is_report_file(path):
            records = [r[name] for r in (current, own) if name in r]
        else:
            continue
        try:
            if records and file_digest(path) not in records:
                out.append(name)
        except OSError:  # a dangling link of the set: nothing of the user's to keep
            continue
    return sorted(out)


def check_report_folder(folder: Path, names: Iterable[str], removed: Iterable[str] = ()) -> None:
    """Refuse to write report files ``names`` into ``folder`` over files that
    execwrap did not write, or that were changed since it wrote them; and to remove
    the ``removed`` ones (report files of formats this run does not write) when
    changed since.

    Raises:
        ForeignFilesError: naming every such file (a ``FileExistsError``).
    """
    names = list(names)
    changed = changed_files(folder, dict.fromkeys([*names, *removed]))
    foreign = sorted(set(foreign_files(folder, names)) | set(changed))
    if foreign:
        raise ForeignFilesError(folder, foreign, changed)
