"""The ``LICENSE`` file is the license ``pyproject.toml`` declares (BSD-3-Clause)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_license_file_matches_pyproject() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()  # no tomllib on Python 3.10
    assert re.findall(r"^license = (.*)$", pyproject, flags=re.MULTILINE) == [
        '{ text = "BSD-3-Clause" }'
    ]
    text = (ROOT / "LICENSE").read_text()
    assert text.splitlines()[0] == "BSD 3-Clause License"
    clauses = re.findall(r"^(\d)\. ", text, flags=re.MULTILINE)
    assert clauses == ["1", "2", "3"]
    assert "Neither the name of the copyright holder nor the names of its" in text
