"""The README's framework recipes run, as written, so they cannot rot.

Each ``###`` subsection of the README's "Frameworks" section (and the
section's own text before them) is one case: its ```python blocks run in
order in a fresh folder with the repository on ``PYTHONPATH``; a block that
calls ``dist.init_process_group`` runs on 2 ranks under ``torchrun
--nproc_per_node=2`` (gloo, CPU), every other with ``python``. A block after
``<!-- skip: why -->`` is not run (a GPU-only recipe); after
``<!-- file: NAME.py -->`` it is written, not run. Every ``print(...)  # VALUE``
line's VALUE must appear in the block's output. A case whose blocks import a
package that is not installed is skipped (the integrations extra is not).

A 2-rank block that ends in gloo's teardown abort ("terminate called without
an active exception", the abort tests/_dist.py explains: a gloo worker thread
dropping a backward-time collective while the interpreter finalizes) is run
once more; any other failure, or that abort twice, fails the case.
The same markers as the runner of every README block in ``tests/test_readme.py``
(on main since this branch was made): where that runner exists, these cases
are skipped, so that no recipe runs twice in CI, and only the check that each
section's printed values are the ones its comments show remains here.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Frameworks"
_BLOCK = re.compile(r"(?:<!-- (skip|file): ?([^>]*?) -->\n)?```python\n(.*?)\n```", re.S)


def _cases() -> dict[str, list[tuple[str | None, str, str]]]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"\n### ", section)
    cases: dict[str, list[tuple[str | None, str, str]]] = {}
    for i, part in enumerate(parts):
        name = "intro" if i == 0 else part.split("\n", 1)[0].strip()
        blocks = [(m.group(1), m.group(2) or "", m.group(3)) for m in _BLOCK.finditer(part)]
        if blocks:
            cases[name] = blocks
    return cases


CASES = _cases()


def _missing(code: str) -> list[str]:
    roots = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return sorted(r for r in roots if importlib.util.find_spec(r) is None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_TEARDOWN_ABORT = "terminate called without an active exception"


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _expected_prints(code: str) -> list[str]:
    return [m.group(1).strip() for m in re.finditer(r"^\s*print\(.*\)\s+#\s*(.+)$", code, re.M)]


def test_the_section_has_a_case_per_framework() -> None:
    assert list(CASES) == ["intro", "Lightning", "accelerate", "HF Trainer", "torchtitan", "PEFT"]
    printed = {
        name: [v for _, _, code in blocks for v in _expected_prints(code)]
        for name, blocks in CASES.items()
    }
    assert all(printed[name] for name in CASES if name != "intro"), printed


RUN_BY_TEST_README = "def test_readme_section_runs" in (
    ROOT / "tests" / "test_readme.py"
).read_text(encoding="utf-8")


@pytest.mark.skipif(RUN_BY_TEST_README, reason="tests/test_readme.py runs every README block")
@pytest.mark.parametrize("name", list(CASES))
def test_readme_recipe_runs(name: str, tmp_path: Path) -> None:
    blocks = CASES[name]
    missing = sorted({m for kind, _, code in blocks if kind != "skip" for m in _missing(code)})
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("LOCAL_RANK", None)
    for i, (kind, arg, code) in enumerate(blocks):
        if kind == "skip":
            continue
        path = tmp_path / (arg.strip() if kind == "file" else f"block{i}.py")
        path.write_text(code + "\n", encoding="utf-8")
        if kind == "file":
            continue
        if "dist.init_process_group" in code:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node=2",
                f"--master_port={_free_port()}",
                path.name,
            ]
        else:
            command = [sys.executable, path.name]
        proc = _run(command, tmp_path, env)
        if proc.returncode != 0 and _TEARDOWN_ABORT in proc.stderr:
            proc = _run(command, tmp_path, env)
        assert proc.returncode == 0, (
            f"{name} block {i}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
        for value in _expected_prints(code):
            assert value in proc.stdout, f"{name} block {i}: {value!r} not printed:\n{proc.stdout}"
