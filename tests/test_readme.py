"""README and CI stay in step: .ci/run runs the README's test command verbatim."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def test_readme_has_two_setup_commands() -> None:
    commands = _setup_commands()
    assert len(commands) == 2
    assert all("pip install torch==2.13.0" in c for c in commands)
    assert commands[0].endswith("execwrap report")
    assert commands[1].endswith("python -m pytest")


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert ci.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in ci
    assert _setup_commands()[1] in ci.splitlines()
