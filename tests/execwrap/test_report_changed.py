"""A report never replaces or removes a report file the user changed after execwrap wrote
it (:func:`execwrap.report.ownership.changed_files`): each set records its files' SHA-256,
an edit through the link or a plain copy is refused like a file execwrap did not write,
with the same rule and the same kind of message as ``execwrap fit --out``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from execwrap.cli import main
from execwrap.demo_models import Block, build_demo_model
from execwrap.planning.planner import plan_wrap
from execwrap.report import file_set, write_report
from execwrap.report.ownership import MANIFEST, SET_FOLDER, ForeignFilesError, changed_files
from tracing import trace_execution_order


@pytest.fixture(scope="module")
def plan():
    model = build_demo_model(2)
    return plan_wrap(model, trace_execution_order(model), ModuleWrapPolicy({Block}))


def _edit(path: Path) -> bytes:
    """Append a line to ``path`` through its link (as an editor saving in place does)."""
    with open(path, "ab") as f:
        f.write(b"# my note\n")
    return path.read_bytes()


def test_each_set_records_its_files_digests_and_an_unchanged_report_is_replaced(plan, tmp_path):
    write_report(plan, tmp_path, formats=["json", "csv"])
    manifest = json.loads((tmp_path / SET_FOLDER / "current" / MANIFEST).read_text())
    assert sorted(manifest) == ["calls.csv", "params.csv", "report.json"]
    assert changed_files(tmp_path, ["calls.csv", "params.csv", "report.json"]) == []
    write_report(plan, tmp_path, formats=["json", "csv"])  # execwrap's own files: replaced


def test_an_edit_through_the_link_is_refused_and_kept(plan, tmp_path):
    write_report(plan, tmp_path, formats=["json", "csv"])
    edited = _edit(tmp_path / "calls.csv")
    assert changed_files(tmp_path, ["calls.csv", "report.json"]) == ["calls.csv"]
    with pytest.raises(ForeignFilesError) as info:
        write_report(plan, tmp_path, formats=["json", "csv"])
    assert (info.value.names, info.value.changed) == (["calls.csv"], ["calls.csv"])
    assert str(info.value) == (
        f"calls.csv in {str(tmp_path)!r} was changed since execwrap wrote it, and a report "
        "never replaces or deletes files it did not write or that were changed since: choose "
        "a new folder for the report (e.g. --out / out_dir 'execwrap-report'), or copy those "
        "files elsewhere with cp -L (report files are links) and remove them"
    )
    assert (tmp_path / "calls.csv").read_bytes() == edited


def test_a_changed_file_the_run_would_only_remove_is_refused_too(plan, tmp_path):
    write_report(plan, tmp_path, formats=["json", "csv"])
    edited = _edit(tmp_path / "params.csv")
    with pytest.raises(ForeignFilesError) as info:
        write_report(plan, tmp_path, formats=["json"])  # would remove the csv files
    assert info.value.names == ["params.csv"]
    assert (tmp_path / "params.csv").read_bytes() == edited


def test_an_edited_plain_copy_in_place_of_the_link_is_refused(plan, tmp_path):
    write_report(plan, tmp_path, formats=["json"])
    data = (tmp_path / "report.json").read_bytes()
    os.unlink(tmp_path / "report.json")  # an editor that saves a new file over the link
    (tmp_path / "report.json").write_bytes(data.replace(b'"kind"', b'"note": 1, "kind"', 1))
    assert changed_files(tmp_path, ["report.json"]) == ["report.json"]
    with pytest.raises(ForeignFilesError, match=r"^report\.json in .* was changed since"):
        write_report(plan, tmp_path, formats=["json"])
    (tmp_path / "report.json").write_bytes(data)  # the same bytes again: execwrap's
    write_report(plan, tmp_path, formats=["json"])
    assert (tmp_path / "report.json").is_symlink()


def test_cli_names_changed_and_foreign_files_and_exits_2(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["report", "--out", str(out), "--format", "json,csv"]) == 0
    edited = _edit(out / "calls.csv")
    os.unlink(out / "params.csv")
    (out / "params.csv").write_text("name,value\n")  # the user's own file
    capsys.readouterr()
    assert main(["report", "--out", str(out), "--format", "json,csv"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"execwrap: error: --out {str(out)!r}: params.csv there was not written by execwrap "
        "and calls.csv there was changed since execwrap wrote it, and execwrap never replaces "
        "or deletes files it did not write or that were changed since: choose a new folder, "
        f"e.g. --out {out / 'execwrap-report'}, or copy those files elsewhere with cp -L "
        "(report files are links) and remove them"
    )
    assert (out / "calls.csv").read_bytes() == edited
    assert (out / "params.csv").read_text() == "name,value\n"


def test_without_symbolic_links_an_edited_file_is_refused_too(plan, tmp_path, monkeypatch):
    def no_links(*args, **kwargs):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(file_set.os, "symlink", no_links)
    write_report(plan, tmp_path, formats=["json", "csv"])
    assert sorted(json.loads((tmp_path / MANIFEST).read_text())) == [
        "calls.csv",
        "params.csv",
        "report.json",
    ]
    write_report(plan, tmp_path, formats=["json", "csv"])  # unchanged: replaced
    edited = _edit(tmp_path / "params.csv")
    with pytest.raises(ForeignFilesError) as info:
        write_report(plan, tmp_path, formats=["json", "csv"])
    assert (info.value.names, info.value.changed) == (["params.csv"], ["params.csv"])
    assert (tmp_path / "params.csv").read_bytes() == edited
