"""The report's files are written as one set (execwrap.report.file_set).

A reader sees the old complete set or the new one whenever the writer stops,
``kill -9`` included, and the next run leaves no temporary file behind. The
kill tests run ``tests/execwrap/_kill_loop.py`` in a fresh process (it forks
the runs it kills).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap.demo_models import Block, build_demo_model
from execwrap.planning.planner import plan_wrap
from execwrap.report import file_set, write_report
from execwrap.report.file_set import SET_FOLDER
from execwrap.report.ownership import MANIFEST
from execwrap.report.writer import FILE_WRITERS
from tracing import trace_execution_order

REPO = Path(__file__).resolve().parents[2]
ALL_FILES = ["calls.csv", "order.graphml", "params.csv", "report.html", "report.json"]


@pytest.fixture(scope="module")
def plan():
    model = build_demo_model(2)
    return plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))


def _loop(tmp_path: Path, *args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.execwrap._kill_loop", str(tmp_path / "out"), *args],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_sigkill_at_random_points_leaves_one_complete_set(tmp_path):
    counts = _loop(tmp_path, "50", "15")
    print(counts)
    assert counts["kills"] >= 50
    assert counts["old"] >= 1 and counts["new"] >= 1  # kills landed before and after commits
    assert counts["old"] + counts["new"] == counts["runs"]


@pytest.mark.parametrize("start", ["crash-points", "crash-points-legacy"])
def test_a_crash_at_every_file_system_change_leaves_one_complete_set(tmp_path, start):
    counts = _loop(tmp_path, start)
    print(counts)
    assert counts["points"] >= (20 if start.endswith("legacy") else 10)
    assert counts["old"] >= 1 and counts["new"] >= 1


# ------------------------------------------------------------------ layout
def test_layout_one_link_per_file_and_one_commit_link(plan, tmp_path):
    paths = write_report(plan, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*ALL_FILES, SET_FOLDER])
    for name in ALL_FILES:
        assert os.readlink(tmp_path / name) == f"{SET_FOLDER}/current/{name}"
    current = os.readlink(tmp_path / SET_FOLDER / "current")
    assert current.startswith("set-")
    assert sorted(p.name for p in (tmp_path / SET_FOLDER).iterdir()) == sorted(["current", current])
    # each set records its files' SHA-256 (a file changed since is never replaced)
    assert sorted(p.name for p in (tmp_path / SET_FOLDER / current).iterdir()) == sorted(
        [*ALL_FILES, MANIFEST]
    )
    assert json.loads(paths["json"].read_text())["kind"] == "execwrap-report"

    write_report(plan, tmp_path, prefetch=2)  # a new set; the old one is removed
    newer = os.readlink(tmp_path / SET_FOLDER / "current")
    assert newer != current
    assert sorted(p.name for p in (tmp_path / SET_FOLDER).iterdir()) == sorted(["current", newer])
    assert json.loads(paths["json"].read_text())["prefetch"] == 2


def test_fewer_formats_make_a_smaller_set_and_other_files_stay(plan, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "sub").mkdir()
    write_report(plan, tmp_path)
    write_report(plan, tmp_path, formats=["json"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        SET_FOLDER,
        "notes.txt",
        "report.json",
        "sub",
    ]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_files_of_an_older_release_are_adopted_and_its_temp_files_removed(plan, tmp_path):
    old = tmp_path.parent / f"{tmp_path.name}-old"
    write_report(plan, old)
    for name in ALL_FILES:  # plain files, as releases before report sets wrote them
        (tmp_path / name).write_bytes((old / name).read_bytes())
    (tmp_path / ".report.json.abc123.tmp").write_text("{half")  # a killed one-by-one write
    (tmp_path / ".other.tmp").write_text("not ours")
    write_report(plan, tmp_path, formats=["json", "csv"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".other.tmp", SET_FOLDER, "calls.csv", "params.csv", "report.json"]
    )
    assert all((tmp_path / n).is_symlink() for n in ("calls.csv", "params.csv", "report.json"))
    assert json.loads((tmp_path / "report.json").read_text())["kind"] == "execwrap-report"


def test_leftovers_of_an_interrupted_run_are_removed(plan, tmp_path):
    write_report(plan, tmp_path, formats=["json"])
    sets = tmp_path / SET_FOLDER
    (sets / "set-dead").mkdir()
    (sets / "set-dead" / "report.json").write_text("{half")
    os.symlink("set-dead", sets / "current.1234.tmp")
    os.symlink(f"{SET_FOLDER}/current/x", sets / "link.5678.tmp")
    write_report(plan, tmp_path, formats=["json"])
    current = os.readlink(sets / "current")
    assert sorted(p.name for p in sets.iterdir()) == sorted(["current", current])


def test_a_failed_write_keeps_the_old_set_and_leaves_nothing(plan, tmp_path, monkeypatch):
    write_report(plan, tmp_path, formats=["json"])
    before = (tmp_path / "report.json").read_bytes()
    current = os.readlink(tmp_path / SET_FOLDER / "current")

    def boom(ctx, f):
        f.write(b"<!DOCTYPE html>")
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(FILE_WRITERS, "html", boom)
    with pytest.raises(OSError, match="No space left on device"):
        write_report(plan, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [SET_FOLDER, "report.json"]
    assert (tmp_path / "report.json").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / SET_FOLDER).iterdir()) == sorted(["current", current])


def test_concurrent_runs_take_turns(plan, tmp_path):
    errors: list[BaseException] = []

    def write(prefetch: int) -> None:
        try:
            for _ in range(3):
                write_report(plan, tmp_path, formats=["json", "csv"], prefetch=prefetch)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(p,)) for p in (0, 1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    current = os.readlink(tmp_path / SET_FOLDER / "current")
    assert sorted(p.name for p in (tmp_path / SET_FOLDER).iterdir()) == sorted(["current", current])
    assert json.loads((tmp_path / "report.json").read_text())["prefetch"] in (0, 1, 2)


def test_without_symbolic_links_files_are_replaced_one_by_one(plan, tmp_path, monkeypatch, caplog):
    def no_links(*args, **kwargs):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(file_set.os, "symlink", no_links)
    (tmp_path / ".calls.csv.zz.tmp").write_text("x")
    with caplog.at_level(logging.WARNING, logger="execwrap.report.file_set"):
        write_report(plan, tmp_path, formats=["json", "csv"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        MANIFEST,  # the files' SHA-256: a file changed since is never replaced
        "calls.csv",
        "params.csv",
        "report.json",
    ]
    assert not (tmp_path / "report.json").is_symlink()
    assert caplog.messages == [
        f"{tmp_path}: no symbolic links or flock here; report files are replaced one by one "
        "(a crash between two can leave old and new files side by side)"
    ]
