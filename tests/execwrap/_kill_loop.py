"""Kill ``execwrap report`` with SIGKILL at random points, again and again, and check the folder.

Run as ``python -m tests.execwrap._kill_loop OUT_DIR KILLS SEED`` from the
repository root (``tests/execwrap/test_report_set.py`` does); prints one JSON
line with the counts and exits 0, or prints what went wrong and exits 1.

The process imports torch and execwrap once and runs the report once itself
(so that every module a run needs is loaded), then forks one child per run;
each child runs the real command line, ``execwrap.cli.main.main(["report",
...])``, on a small model whose module names carry the run's number (the
``marker_<k>_`` module), so every file of a set says which run wrote it. The
parent kills most children after a random delay between 0 and the length
of an unkilled run (the median of three, measured first), lets the others
finish, and after each run checks the folder:

* it holds one complete set: all five report files, every one from the same
  run, and either byte for byte the set seen before the run (old), or the
  set of this run (new) with every file complete (the JSON and GraphML parse,
  the CSVs have a row per call or parameter, the page ends with ``</html>``);
* after a run that was not killed, nothing else is left: no temporary file,
  no set but the current one.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import networkx as nx
import torch
import torch.nn as nn

from execwrap.cli.main import main
from execwrap.report.file_set import SET_FOLDER
from execwrap.report.files import REPORT_FILES

__all__ = ["crash_points", "marked_model", "run"]

NAMES = sorted(name for files in REPORT_FILES.values() for name in files.values())
_MARK = re.compile(rb"marker_(\d+)_")
_ENV = "EXECWRAP_KILL_LOOP_RUN"


class _Marked(nn.Module):
    def __init__(self, run: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(2 + run % 3))
        self.add_module(f"marker_{run}_", nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return getattr(self, next(n for n, _ in self.named_children() if n.startswith("marker")))(x)


def marked_model() -> nn.Module:
    """The model of run ``$EXECWRAP_KILL_LOOP_RUN`` (``--model`` factory)."""
    return _Marked(int(os.environ[_ENV]))


def _report(out: Path, run: int, crash_at: int | None = None) -> int:
    """Fork a child that runs ``execwrap report`` for ``run``; return its pid.

    With ``crash_at``, the child ends with ``os._exit(_CRASHED)`` (no cleanup,
    like a kill) just before its ``crash_at``-th file system change in ``out``."""
    pid = os.fork()
    if pid == 0:  # the child: the real command line, then exit without cleanup
        if crash_at is not None:
            _crash_before(crash_at, out)
        os.environ[_ENV] = str(run)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            rc = main(["report", "--model", f"{__name__}:marked_model", "--out", str(out)])
        except BaseException:  # noqa: BLE001 - reported through the exit status
            rc = 99
        os._exit(rc)
    return pid


_CRASHED = 77
#: The calls that change the file system (``open`` when it writes).
_CHANGES = (
    (os, "replace"),
    (os, "rename"),
    (os, "symlink"),
    (os, "link"),
    (os, "unlink"),
    (os, "mkdir"),
    (os, "rmdir"),
    (shutil, "rmtree"),
    (shutil, "copy2"),
)


def _crash_before(n: int, out: Path) -> None:
    """Make the ``n``-th change to a path under ``out`` end the process instead."""
    import builtins

    seen = [0]
    root = str(out.parent)

    def counted(fn: Any, writes: Any = None) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if args and str(args[0]).startswith(root) and (writes is None or writes(args)):
                seen[0] += 1
                if seen[0] == n:
                    os._exit(_CRASHED)
            return fn(*args, **kwargs)

        return wrapper

    for module, name in _CHANGES:
        setattr(module, name, counted(getattr(module, name)))
    builtins.open = counted(builtins.open, lambda a: len(a) > 1 and set(a[1]) & set("wxa+"))


def _read_set(out: Path) -> dict[str, bytes]:
    """Report file name -> bytes, for the report files the folder shows."""
    files: dict[str, bytes] = {}
    for name in NAMES:
        try:
            files[name] = (out / name).read_bytes()
        except FileNotFoundError:
            pass
    return files


def _check_complete(files: dict[str, bytes], run: int, out: Path) -> None:
    """Raise AssertionError unless ``files`` is run ``run``'s complete set."""
    assert sorted(files) == NAMES, f"files {sorted(files)}, expected {NAMES}"
    for name, data in files.items():
        marks = set(_MARK.findall(data))
        assert marks == {str(run).encode()}, f"{name}: runs {marks}, expected {run}"
    calls = 2 + 2 + run % 3  # root, the ModuleList's layers, the marker
    report = json.loads(files["report.json"])
    assert len(report["order"]["module_forward_order"]) == calls, "report.json: calls"
    assert files["calls.csv"].count(b"\n") == 1 + calls, "calls.csv: rows"
    assert files["params.csv"].count(b"\n") == 1 + 2 * (calls - 1), "params.csv: rows"
    nx.read_graphml(out / "order.graphml")
    assert files["report.html"].endswith(b"</html>\n"), "report.html: cut short"


def _check_clean(out: Path) -> None:
    """Nothing but the report files and the sets folder with ``current`` and its set."""
    entries = sorted(p.name for p in out.iterdir())
    assert entries == sorted([*NAMES, SET_FOLDER]), f"folder holds {entries}"
    sets = out / SET_FOLDER
    current = os.readlink(sets / "current")
    assert sorted(p.name for p in sets.iterdir()) == sorted(["current", current])


def _one_run(
    out: Path, run: int, delay: float | None, crash_at: int | None = None
) -> tuple[bool, int]:
    """Run ``run``, killed after ``delay`` seconds (``None``: not killed);
    returns ``(killed, exit status)``."""
    pid = _report(out, run, crash_at)
    killed = False
    if delay is not None:
        time.sleep(delay)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done == 0:
            os.kill(pid, signal.SIGKILL)
            killed = True
        else:
            return False, os.waitstatus_to_exitcode(status)
    _, status = os.waitpid(pid, 0)
    return killed, os.waitstatus_to_exitcode(status)


def _warm_up(out: Path) -> None:
    """Run the report once in this process, so the children fork with everything loaded."""
    torch.set_num_threads(1)
    warm = out.with_name(out.name + "-warm-up")
    os.environ[_ENV] = "0"
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        assert main(["report", "--model", f"{__name__}:marked_model", "--out", str(warm)]) == 0
    shutil.rmtree(warm)


def _make_legacy(out: Path, files: dict[str, bytes]) -> None:
    """The folder as a release that wrote plain files left it: ``files``, plus
    a temporary file of an interrupted one-by-one write."""
    shutil.rmtree(out / SET_FOLDER, ignore_errors=True)
    for name, data in files.items():
        (out / name).unlink(missing_ok=True)
        (out / name).write_bytes(data)
    (out / ".report.json.x1y2z3.tmp").write_bytes(b'{"half')


def crash_points(out: Path, *, legacy: bool = False, limit: int = 200) -> dict[str, Any]:
    """Crash run after run at every file system change in turn (the 1st, the
    2nd, ...) until a run gets through; check the folder after each crash.

    With ``legacy``, every run starts from a folder of plain files (as an
    older release wrote them): the crash points of adopting them are tried."""
    _warm_up(out)
    assert _one_run(out, 0, None) == (False, 0)
    seen = _read_set(out)
    counts = {"points": 0, "old": 0, "new": 0}
    for n in range(1, limit):
        if legacy:
            _make_legacy(out, seen)
        _, rc = _one_run(out, n, None, crash_at=n)
        files = _read_set(out)
        if files == seen:
            counts["old"] += 1
        else:
            _check_complete(files, n, out)
            seen = files
            counts["new"] += 1
        if rc != _CRASHED:  # got through: every change point was tried
            assert rc == 0, f"run {n} exited {rc}"
            _check_clean(out)
            counts["points"] = n - 1
            return counts
    raise AssertionError(f"no run got through in {limit} tries")


def run(out: Path, kills: int, seed: int, budget_s: float = 120.0) -> dict[str, Any]:
    """The loop; see the module docstring. Returns the counts."""
    rng = random.Random(seed)
    _warm_up(out)
    t0 = time.perf_counter()
    lengths = []
    for run_id in range(3):  # unkilled runs: how long one takes
        start = time.perf_counter()
        assert _one_run(out, run_id, None) == (False, 0)
        lengths.append(time.perf_counter() - start)
    length = sorted(lengths)[1]
    seen, seen_run = _read_set(out), run_id
    _check_complete(seen, run_id, out)
    counts = {"kills": 0, "old": 0, "new": 0, "completed": 0, "runs": 0}
    while counts["kills"] < kills and time.perf_counter() - t0 < budget_s:
        run_id += 1
        delay = rng.uniform(0.0, length) if rng.random() < 0.85 else None  # some run through
        killed, rc = _one_run(out, run_id, delay)
        counts["runs"] += 1
        files = _read_set(out)
        if files == seen:
            assert killed, f"run {run_id} exited {rc} and left the old set"
            counts["old"] += 1
        else:
            _check_complete(files, run_id, out)
            seen, seen_run = files, run_id
            counts["new"] += 1
        if killed:
            counts["kills"] += 1
        else:
            assert rc == 0, f"run {run_id} exited {rc}"
            counts["completed"] += 1
            _check_clean(out)
    run_id += 1
    assert _one_run(out, run_id, None) == (False, 0)  # the next run cleans up
    _check_complete(_read_set(out), run_id, out)
    _check_clean(out)
    counts["seconds"] = round(time.perf_counter() - t0, 1)
    counts["run_length_s"] = round(length, 3)
    counts["last_new_run"] = seen_run
    return counts


if __name__ == "__main__":
    try:
        if sys.argv[2].startswith("crash-points"):
            result = crash_points(Path(sys.argv[1]), legacy=sys.argv[2].endswith("legacy"))
        else:
            result = run(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
    except AssertionError as e:
        print(f"FAILED: {e}")
        sys.exit(1)
    print(json.dumps(result))
