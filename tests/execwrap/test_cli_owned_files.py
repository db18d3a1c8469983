"""execwrap.cli.owned_files: fit --out and calibrate --out never replace a user's file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from execwrap.cli.errors import CLIError
from execwrap.cli.owned_files import MANIFEST, check_replaceable_file, write_owned_files
from execwrap.cost import CostModel
from execwrap.cost.model import COST_MODEL_KIND


def test_a_folder_keeps_the_users_files(tmp_path: Path) -> None:
    out = tmp_path / "fit"
    write_owned_files(out, {"plan.json": "{}\n", "recipe_fsdp2.py": "a = 1\n"})
    write_owned_files(out, {"plan.json": "{}\n", "recipe_fsdp2.py": "a = 2\n"})  # ours: again
    assert (out / "recipe_fsdp2.py").read_text() == "a = 2\n"
    assert sorted(json.loads((out / MANIFEST).read_text())) == ["plan.json", "recipe_fsdp2.py"]
    (out / "recipe_fsdp2.py").write_text("a = 2  # my edit\n")  # edited since: the user's now
    (out / "notes.txt").write_text("mine\n")
    with pytest.raises(CLIError) as e:
        write_owned_files(out, {"plan.json": "[]\n", "recipe_fsdp2.py": "a = 3\n"})
    assert str(e.value) == (
        f"--out {str(out)!r}: recipe_fsdp2.py there was not written by execwrap (or was "
        "changed since), and execwrap never replaces a file it did not write: choose "
        "another --out folder, or move recipe_fsdp2.py away"
    )
    assert (out / "plan.json").read_text() == "{}\n"  # nothing written: checked first
    assert (out / "recipe_fsdp2.py").read_text() == "a = 2  # my edit\n"
    assert (out / "notes.txt").read_text() == "mine\n"


def test_a_users_file_in_a_new_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text('{"mine": true}')
    with pytest.raises(CLIError, match=r"plan.json there was not written by execwrap"):
        write_owned_files(tmp_path, {"plan.json": "{}\n"})
    assert (tmp_path / "plan.json").read_text() == '{"mine": true}'


def _is_cost_model(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == COST_MODEL_KIND


def test_calibrate_replaces_only_a_cost_model(tmp_path: Path) -> None:
    ours = tmp_path / "cost.json"
    CostModel.preset("h100-nvlink-8").save(ours)
    check_replaceable_file(ours, _is_cost_model, "a cost model")  # ours: replaced
    check_replaceable_file(tmp_path / "new.json", _is_cost_model, "a cost model")  # absent
    mine = tmp_path / "mine.json"
    for text in ('{"mine": true}', "not json"):
        mine.write_text(text)
        with pytest.raises(CLIError) as e:
            check_replaceable_file(mine, _is_cost_model, "a cost model")
        assert str(e.value) == (
            f"--out {str(mine)!r}: the file exists and is not a cost model execwrap wrote, "
            "and execwrap never replaces a file it did not write: choose another --out, or "
            "move the file away"
        )
        assert mine.read_text() == text
