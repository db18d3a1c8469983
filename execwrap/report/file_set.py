"""Write a report's files as one set: :func:`write_file_set`.

A reader of the report folder sees either the old complete set of files or
the new complete set, never a mix, whenever the writing process is stopped
(an exception, Ctrl-C, ``kill -9``, a power cut once the data is on disk).
The files are reached through one symbolic link, and replacing that link
(``rename(2)``, atomic on POSIX) switches every file at once::

    OUT/report.json -> .execwrap-report/current/report.json   one link per report file
    OUT/calls.csv   -> .execwrap-report/current/calls.csv
    OUT/.execwrap-report/current -> set-<id>                  the one commit point
    OUT/.execwrap-report/set-<id>/report.json, calls.csv, ... the complete set

(``os.replace`` cannot replace a non-empty folder, so the folder itself cannot
be swapped; a link can. The report folder stays a plain folder: other files
in it, and a shell whose working folder it is, are left alone.)

The steps, under an exclusive ``flock`` on ``.execwrap-report`` (two runs
into one folder take turns):

0. refuse, before anything is touched, to write over a file execwrap did not
   write, or to write over or remove one changed since execwrap wrote it
   (:func:`~execwrap.report.ownership.check_report_folder`: the links of a set
   are the marker; plain files are recognised by their content; each set's
   :data:`~execwrap.report.ownership.MANIFEST` holds its files' SHA-256);
1. clean up what interrupted runs left: every entry of ``.execwrap-report``
   but ``current`` and the set it names (a half-written set, a temporary
   link), and ``.<name>.*.tmp`` files of releases that wrote files one by one;
2. adopt plain files that hold an execwrap report file (an older release's
   report, a copy): each is linked (or copied) into the current set and
   replaced by its link, showing the same content at every step. Files with
   report names that are not execwrap's and are not written by this call are
   left alone;
3. write the new set into a new ``set-<id>`` folder, each file fsynced, and
   its manifest (each file's SHA-256);
4. add the link of each new file name (it shows nothing until step 5);
5. commit: a new ``current`` link, made under a temporary name, renamed over
   the old one;
6. tidy: remove the links of names the new set does not have, and the old set.

On a file system without symbolic links (FAT, some network shares) or a
platform without ``flock``, the files are written to temporary names and
renamed into place one by one (:func:`write_one_by_one`), then their SHA-256
is recorded in the folder's own manifest: no file is ever half-written, but a
crash between two renames can leave old and new files side by side. A warning
says so.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import IO

from execwrap.report.ownership import (
    MANIFEST,
    SET_FOLDER,
    check_report_folder,
    file_digest,
    is_report_file,
    is_set_link,
    read_manifest,
)
from tracing.atomic import atomic_write_text, write_temp

__all__ = ["SET_FOLDER", "write_file_set", "write_one_by_one"]

logger = logging.getLogger(__name__)

_CURRENT = "current"

Writer = Callable[[IO[bytes]], None]


def write_file_set(
    folder: Path, writers: Mapping[str, Writer], *, known_names: Collection[str] = ()
) -> None:
    """Write the files ``writers`` names into ``folder`` as one set (see the module docstring).

    Args:
        folder: the report folder; created (with its parents) if missing.
        writers: file name -> a function that writes the file's bytes.
        known_names: every file name a set may hold (``writers``' names are
            added). Links of known names the new set lacks are removed with
            the old set, and plain files with known names that hold an execwrap
            report file (:func:`~execwrap.report.ownership.is_report_file`) are
            adopted; other files are never touched.

    Raises:
        IsADirectoryError: a file name is a folder in ``folder`` (before
            anything is written; ``filename`` is that path).
        execwrap.report.ownership.ForeignFilesError: a file of ``writers``
            exists and execwrap did not write it, or a file of ``writers`` or
            ``known_names`` was changed since execwrap wrote it (a
            ``FileExistsError``, before anything is written; nothing in
            ``folder`` changes).
        OSError: a folder cannot be created or a file written (naming it).

    If a writer raises (``KeyboardInterrupt`` included), the new set is
    removed, the folder shows the old set, the folders this call created are
    removed again, and the error propagates.
    """
    names = set(known_names) | set(writers)
    for name in writers:
        if (folder / name).is_dir():
            raise IsADirectoryError(
                errno.EISDIR, "a folder is in the way of a report file", str(folder / name)
            )
    check_report_folder(folder, writers, names - set(writers))
    created = _make_folders(folder)
    try:
        _remove_old_temp_files(folder, names)
        sets = folder / SET_FOLDER
        made_sets = not os.path.lexists(sets)
        sets.mkdir(exist_ok=True)
        if not _supports_sets(sets):
            if made_sets:
                shutil.rmtree(sets, ignore_errors=True)
            logger.warning(
                "%s: no symbolic links or flock here; report files are replaced one by one "
                "(a crash between two can leave old and new files side by side)",
                folder,
            )
            write_one_by_one({folder / n: w for n, w in writers.items()})
            _record(folder, writers)
            return
        _FileSet(folder, names).write(writers, made_sets=made_sets)
    except BaseException:
        _remove_empty(created)
        raise


def write_one_by_one(writers: Mapping[Path, Writer]) -> None:
    """Write every file to a temporary name in its folder, then rename each into place.

    The fallback of :func:`write_file_set` where sets cannot be linked. If a
    writer raises, every temporary file is removed and no target is touched.

    Raises:
        OSError: a file cannot be written or renamed (naming the target).
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for path, writer in writers.items():
            staged.append((write_temp(path.parent, path.name, writer), path))
        for tmp, path in staged:
            try:
                os.replace(tmp, path)
            except OSError as exc:  # name the target, not our temporary file
                raise OSError(exc.errno, exc.strerror, str(path)) from exc
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise


class _FileSet:
    """One run of steps 1 to 6 on ``folder`` (see the module docstring)."""

    def __init__(self, folder: Path, names: Collection[str]) -> None:
        self.folder = folder
        self.names = sorted(names)
        self.sets = folder / SET_FOLDER
        self.current = self.sets / _CURRENT

    def link_target(self, name: str) -> str:
        """What the link of report file ``name`` points to (relative)."""
        return f"{SET_FOLDER}/{_CURRENT}/{name}"

    def write(self, writers: Mapping[str, Writer], *, made_sets: bool) -> None:
        """Steps 1 to 6; ``made_sets``: this call created the sets folder."""
        lock = os.open(self.sets, os.O_RDONLY)
        new_links: list[Path] = []
        new_set: Path | None = None
        try:
            _flock(lock)
            # again, now that no other run writes
            check_report_folder(self.folder, writers, set(self.names) - set(writers))
            self._clean_up()
            self._adopt()
            new_set = self._new_set_folder()
            self._write_set(new_set, writers)
            new_links = self._link(writers)
            self._commit(new_set.name)
            new_set, new_links = None, []  # committed: the folder shows them now
            self._tidy(set(writers))
        except BaseException:
            for link in new_links:
                link.unlink(missing_ok=True)
            if new_set is not None:
                shutil.rmtree(new_set, ignore_errors=True)
            if made_sets and not os.path.lexists(self.current):
                shutil.rmtree(self.sets, ignore_errors=True)
            raise
        finally:
            os.close(lock)

    # -------------------------------------------------------------- the steps
    def _current_set(self) -> str | None:
        """The set folder ``current`` names, or ``None``."""
        try:
            return os.readlink(self.current)
        except OSError:
            return None

    def _clean_up(self) -> None:
        """Step 1: everything in the sets folder but ``current`` and its set."""
        keep = {_CURRENT, self._current_set()}
        for entry in os.scandir(self.sets):
            if entry.name in keep and entry.is_symlink() == (entry.name == _CURRENT):
                continue
            logger.debug("removing %s, left by an interrupted report", entry.path)
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                Path(entry.path).unlink(missing_ok=True)

    def _adopt(self) -> None:
        """Step 2: plain files holding execwrap report files join the current set."""
        strays = [
            n
            for n in self.names
            if not (self.folder / n).is_symlink()
            and (self.folder / n).is_file()
            and is_report_file(self.folder / n)
        ]
        if not strays:
            return
        current = self._current_set()
        if current is None:  # a folder of an older release: make its files a set first
            current = self._new_set_folder().name
            self._commit(current)
        for name in strays:
            path, kept = self.folder / name, self.sets / current / name
            tmp = kept.with_name(f".{name}.{secrets.token_hex(4)}.tmp")
            try:
                os.link(path, tmp)
            except OSError:
                shutil.copy2(path, tmp)
            os.replace(tmp, kept)
            self._replace_with_link(name)
        _record(self.sets / current, strays)

    def _write_set(self, new_set: Path, writers: Mapping[str, Writer]) -> None:
        """Step 3: the new set, complete and on disk."""
        for name, writer in writers.items():
            path = new_set / name
            try:
                with open(path, "xb") as f:
                    writer(f)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as exc:  # name the report file, not the set's copy
                raise OSError(exc.errno, exc.strerror, str(self.folder / name)) from exc
        _record(new_set, writers)
        _fsync_folder(new_set)

    def _link(self, writers: Mapping[str, Writer]) -> list[Path]:
        """Step 4: links for the new names (they point into ``current``)."""
        made: list[Path] = []
        for name in writers:
            if not self._ours(name):
                self._replace_with_link(name)
                made.append(self.folder / name)
        _fsync_folder(self.folder)
        return made

    def _commit(self, set_name: str) -> None:
        """Step 5: point ``current`` at ``set_name`` with one rename."""
        tmp = self.sets / f"{_CURRENT}.{secrets.token_hex(4)}.tmp"
        os.symlink(set_name, tmp)
        os.replace(tmp, self.current)
        _fsync_folder(self.sets)

    def _tidy(self, written: Collection[str]) -> None:
        """Step 6: links of names the new set lacks, and the old sets."""
        for name in self.names:
            if name not in written and self._ours(name):
                (self.folder / name).unlink(missing_ok=True)
        self._clean_up()

    # --------------------------------------------------------------- helpers
    def _ours(self, name: str) -> bool:
        return is_set_link(self.folder, name)

    def _replace_with_link(self, name: str) -> None:
        tmp = self.sets / f"link.{secrets.token_hex(4)}.tmp"
        os.symlink(self.link_target(name), tmp)
        os.replace(tmp, self.folder / name)

    def _new_set_folder(self) -> Path:
        path = self.sets / f"set-{time.time_ns():x}-{secrets.token_hex(3)}"
        path.mkdir()
        return path


# ------------------------------------------------------------------ helpers
def _supports_sets(sets: Path) -> bool:
    """Whether ``flock`` exists and a symbolic link can be made in the sets folder."""
    try:
        import fcntl  # noqa: F401  (POSIX only)
    except ImportError:
        return False
    probe = sets / f"probe.{secrets.token_hex(4)}.tmp"  # step 1 removes a leftover
    try:
        os.symlink(SET_FOLDER, probe)
    except (OSError, NotImplementedError):
        return False
    probe.unlink(missing_ok=True)
    return True


def _record(folder: Path, names: Collection[str]) -> None:
    """Add the SHA-256 of ``folder``'s files ``names`` to its manifest (atomically)."""
    digests = read_manifest(folder)
    digests.update({name: file_digest(folder / name) for name in names})
    atomic_write_text(folder / MANIFEST, json.dumps(digests, indent=1, sort_keys=True) + "\n")


def _flock(fd: int) -> None:
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX)


def _remove_old_temp_files(folder: Path, names: Collection[str]) -> None:
    """``.<name>.*.tmp`` files left by one-by-one writes that were killed."""
    for name in names:
        for path in folder.glob(f".{name}.*.tmp"):
            logger.debug("removing %s, left by an interrupted report", path)
            path.unlink(missing_ok=True)


def _fsync_folder(folder: Path) -> None:
    """Make the folder's entries durable (renames and new files survive a power cut)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder
        pass
    finally:
        os.close(fd)


def _make_folders(folder: Path) -> list[Path]:
    """``mkdir -p folder``; returns the folders it created, outermost first."""
    missing: list[Path] = []
    probe = folder
    while not probe.exists() and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    folder.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def _remove_empty(created: list[Path]) -> None:
    for path in reversed(created):
        try:
            path.rmdir()  # only if still empty
        except OSError:
            break
