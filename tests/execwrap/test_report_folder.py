"""A report never deletes or replaces a file that execwrap did not write
(:mod:`execwrap.report.ownership`): the folder keeps the user's files byte for
byte and the command exits 2 naming them; an older release's report set is
recognised by its content and replaced; an empty ``--out`` is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap.cli import main
from execwrap.demo_models import Block, build_demo_model
from execwrap.planning.planner import plan_wrap
from execwrap.report import write_report
from execwrap.report.ownership import (
    SET_FOLDER,
    ForeignFilesError,
    foreign_files,
    is_report_file,
)
from tracing import trace_execution_order

USER_FILES = {
    "params.csv": b"name,value\nlr,0.1\n",
    "report.html": b"<html><body>my own report</body></html>\n",
    "report.json": b'{"mine": true}\n',
}


@pytest.fixture(scope="module")
def plan():
    model = build_demo_model(2)
    return plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))


def _user_folder(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    for name, data in USER_FILES.items():
        (path / name).write_bytes(data)
    return path


def _contents(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in path.iterdir()}


def test_cli_keeps_the_users_files_byte_for_byte_and_exits_2(tmp_path, monkeypatch, capsys):
    folder = _user_folder(tmp_path / "work")
    monkeypatch.chdir(folder)
    assert main(["report", "--out", ".", "--format", "json"]) == 2
    assert _contents(folder) == USER_FILES  # nothing added, nothing removed or changed
    err = capsys.readouterr().err.strip()
    assert err == (
        "execwrap: error: --out '.': report.json there was not written by execwrap, and "
        "execwrap never replaces or deletes files it did not write: choose a new folder, e.g. "
        "--out execwrap-report, or move those files away"
    )


def test_cli_names_every_file_in_the_way(tmp_path, capsys):
    folder = _user_folder(tmp_path / "work")
    (folder / "execwrap-report").mkdir()
    assert main(["report", "--out", str(folder), "--format", "json,csv,html"]) == 2
    assert {n: (folder / n).read_bytes() for n in USER_FILES} == USER_FILES
    assert capsys.readouterr().err.strip() == (
        f"execwrap: error: --out {str(folder)!r}: params.csv, report.html, report.json there "
        "were not written by execwrap, and execwrap never replaces or deletes files it did not "
        f"write: choose a new folder, e.g. --out {folder / 'execwrap-report-2'}, or move those "
        "files away"
    )


def test_cli_refuses_an_empty_out(capsys):
    assert main(["report", "--out", "", "--format", "json"]) == 2
    assert capsys.readouterr().err.strip() == (
        "execwrap: error: --out '' is empty: name the report folder, e.g. --out execwrap-report "
        "(or --out . for the current folder)"
    )


def test_write_report_refuses_and_touches_nothing(plan, tmp_path):
    folder = _user_folder(tmp_path / "work")
    with pytest.raises(ForeignFilesError) as info:
        write_report(plan, folder, formats=["json", "csv"])
    assert info.value.names == ["params.csv", "report.json"]
    assert str(info.value) == (
        f"params.csv, report.json in {str(folder)!r} were not written by execwrap, and a "
        "report never replaces or deletes files it did not write: choose a new folder for the "
        "report (e.g. --out / out_dir 'execwrap-report'), or move those files away"
    )
    assert _contents(folder) == USER_FILES


def test_write_report_refuses_an_empty_folder_name(plan):
    with pytest.raises(ValueError, match=r"^write_report: out_dir is empty; name the report"):
        write_report(plan, "", formats=["json"])


def test_a_users_file_not_written_by_this_report_is_left_alone(plan, tmp_path):
    folder = _user_folder(tmp_path / "work")
    (folder / "report.json").unlink()
    write_report(plan, folder, formats=["json"])
    assert (folder / "params.csv").read_bytes() == USER_FILES["params.csv"]
    assert (folder / "report.html").read_bytes() == USER_FILES["report.html"]
    assert not (folder / "params.csv").is_symlink()
    write_report(plan, folder, formats=["json"])  # the next run: the same
    assert (folder / "report.html").read_bytes() == USER_FILES["report.html"]


def test_an_older_releases_plain_report_files_are_recognised_and_replaced(plan, tmp_path):
    written = tmp_path / "written"
    write_report(plan, written)
    old = tmp_path / "old"
    old.mkdir()
    for name in ("calls.csv", "params.csv", "order.graphml", "report.html", "report.json"):
        data = (written / name).read_bytes()  # as a release before report sets wrote them
        if name == "report.html":  # releases before the generator tag: the footer only
            data = data.replace(b'<meta name="generator" content="execwrap">\n', b"")
        (old / name).write_bytes(data)
        assert is_report_file(old / name), name
    assert foreign_files(old, sorted(p.name for p in old.iterdir())) == []
    write_report(plan, old, formats=["json"])
    assert sorted(p.name for p in old.iterdir()) == [SET_FOLDER, "report.json"]
    assert json.loads((old / "report.json").read_text())["kind"] == "execwrap-report"


def test_a_link_to_a_file_elsewhere_is_refused_and_kept(plan, tmp_path):
    outside = tmp_path / "precious.json"
    outside.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(outside, out / "report.json")
    with pytest.raises(ForeignFilesError):
        write_report(plan, out, formats=["json"])
    assert os.readlink(out / "report.json") == str(outside)
    assert outside.read_text() == "keep me"


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("report.json", b'{"schema_version": 1, "kind": "other"}'),
        ("calls.csv", b"index,phase,fqn\n"),
        ("params.csv", b"fqn,forward_index\n"),
        ("order.graphml", b"<graphml><key for='node'/></graphml>"),
        ("report.html", b"<html><p>execwrap</p></html>"),
    ],
)
def test_lookalikes_are_not_report_files(tmp_path, name, data):
    (tmp_path / name).write_bytes(data)
    assert not is_report_file(tmp_path / name)
    assert foreign_files(tmp_path, [name]) == [name]
