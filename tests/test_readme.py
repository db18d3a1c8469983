"""The README and the docs stay true: CI runs the README's test command verbatim,
and every code example of the README and of the pages under ``docs/`` runs.

Every ```python block of README.md and of ``docs/**/*.md`` runs as a script in a
fresh folder with the repository first on ``PYTHONPATH``: a block that calls
``dist.init_process_group`` runs on 2 ranks under ``torchrun`` (gloo, CPU), any
other block with ``python``. Markers on the line before a fence:

- ``<!-- file: NAME.py -->``: write the block to ``NAME.py`` (a module a later
  block imports); do not run it;
- ``<!-- run -->`` before a ```bash block: run it (after the files before it);
- ``<!-- skip: why -->``: do not run the block (e.g. a GPU-only recipe);
- ``<!-- continue: HEADING -->`` before a ```python block: the example goes on
  from section HEADING of the same page: the block runs as one script after that
  section's last python block (itself with what it continued), so a page can
  capture in one section and predict in the next.

A section whose code imports a framework of the ``[integrations]`` extra that
is not installed is skipped (the ``[test]`` extra, which CI installs, has them).

Blocks under one heading (of level 1 to 3) share a folder and run in order; a
heading's blocks that are the same as another's already collected (the README's
examples are also on the Getting started page) run once, under the first. A line
``print(...)  # VALUE`` promises VALUE in the output (``...`` in VALUE stands
for anything): the runner checks it. A 2-rank block that ends in gloo's
teardown abort ("terminate called without an active exception", a torch 2.13
race that ``tests/_dist.py`` explains and that the FSDP1 guide describes) runs once more; that abort twice, or any other failure, fails.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The pages whose examples run: the README first, then the docs in name order.
PAGES = [ROOT / "README.md"] + sorted(
    p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.relative_to(ROOT).parts
)
# A fence's info string may be a MyST directive (```{eval-rst}); only its first
# word counts as the language.
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*\n", re.S | re.M)
_MARK = re.compile(r"<!--\s*(file|run|skip|continue)\s*:?\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    mark: str  # "", "file", "run" or "skip"
    arg: str  # file name for "file", reason for "skip"


def _setup_commands() -> list[str]:
    section = README.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, flags=re.S)


def _sections(text: str) -> dict[str, list[Block]]:
    """Heading -> its code blocks in order (headings of level 1 to 3)."""
    out: dict[str, list[Block]] = {}
    last_script: dict[str, str] = {}  # heading -> its last python block, as it runs
    heading = "(top)"
    pos = 0
    for match in _FENCE.finditer(text):
        before = text[pos : match.start()]
        for line in before.splitlines():
            if re.match(r"#{1,3} ", line):
                heading = line.lstrip("#").strip()
        last = before.rstrip("\n").splitlines()[-1] if before.strip() else ""
        mark, arg = _MARK.search(last).groups() if _MARK.search(last) else ("", "")
        lang = (match.group(1).split() or [""])[0]
        code = match.group(2)
        if mark == "continue":
            assert arg in last_script, f"<!-- continue: {arg} -->: no python block under {arg!r}"
            code, mark, arg = last_script[arg] + "\n" + code, "", ""
        if lang == "python" and mark == "":
            last_script[heading] = code
        out.setdefault(heading, []).append(Block(lang, code, mark, arg))
        pos = match.end()
    return out


def _runnable(blocks: list[Block]) -> bool:
    return any(
        (b.lang == "python" and b.mark == "") or (b.lang == "bash" and b.mark == "run")
        for b in blocks
    )


def _all_sections() -> dict[str, list[Block]]:
    """``"PAGE: heading"`` -> its blocks, for every runnable section of every page,
    each distinct section once (the first page that has it names it)."""
    out: dict[str, list[Block]] = {}
    seen: set[tuple[Block, ...]] = set()
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for heading, blocks in _sections(page.read_text(encoding="utf-8")).items():
            if not _runnable(blocks) or (name == "README.md" and heading == "Set-up"):
                continue
            if tuple(blocks) not in seen:
                seen.add(tuple(blocks))
                out[f"{name}: {heading}"] = blocks
    return out


SECTIONS = _all_sections()


#: Top-level modules of the ``[integrations]`` extra's frameworks.
FRAMEWORKS = {"lightning", "accelerate", "peft", "torchtitan", "triton"}


def _missing_frameworks(blocks: list[Block]) -> list[str]:
    names: set[str] = set()
    for block in blocks:
        if block.lang != "python":
            continue
        for node in ast.walk(ast.parse(block.code)):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return sorted(n for n in names & FRAMEWORKS if importlib.util.find_spec(n) is None)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


_TEARDOWN_ABORT = "terminate called without an active exception"


def _run(cmd: list[str], cwd: Path, what: str) -> str:
    """Run ``cmd`` (once more after gloo's teardown abort); return its stdout."""
    for _ in range(2):
        done = subprocess.run(
            cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600, check=False
        )
        if done.returncode == 0 or _TEARDOWN_ABORT not in done.stderr:
            break
    assert done.returncode == 0, (
        f"example failed ({what}), exit {done.returncode}:\n{done.stdout[-3000:]}\n"
        f"{done.stderr[-3000:]}"
    )
    return done.stdout


def _promised_prints(code: str) -> list[str]:
    """VALUE of every ``print(...)  # VALUE`` line (the comment on the print's own
    line: a comment on the next line is no promise)."""
    return [
        m.group(1).strip() for m in re.finditer(r"^[ \t]*print\(.*\)[ \t]+#[ \t]*(.+)$", code, re.M)
    ]


def _check_prints(code: str, stdout: str, what: str) -> None:
    for value in _promised_prints(code):
        pattern = ".*?".join(re.escape(piece) for piece in value.split("..."))
        assert re.search(pattern, stdout), f"{what}: {value!r} not printed:\n{stdout}"


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


def _requirements() -> dict[str, str]:
    """Package name -> its requirement in pyproject.toml (``"transformers>=5.0"``)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    found = re.findall(r'^\s*"([A-Za-z0-9_.-]+)([<>=!~][^";]*)[";]', text, flags=re.M)
    return {name.lower(): name + spec for name, spec in found}


def _install_lines() -> list[tuple[str, str]]:
    """``(page, package as written)`` of every package named in a ``pip install`` of the
    README and the docs (not an editable install, an extra of execwrap, or torch)."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for command in re.findall(r"pip install ([^`\n&]+)", text):
            for word in command.split():
                word = word.strip("'\"),;")
                if word.startswith("-") or word.startswith(".") or "execwrap" in word:
                    continue
                out.append((page.relative_to(ROOT).as_posix(), word))
    return out


def test_install_lines_name_the_required_versions() -> None:
    """``pip install transformers`` where pyproject needs ``transformers>=5.0`` installs a
    version execwrap does not support: every install line says what pyproject says."""
    required = _requirements()
    assert required["transformers"] == "transformers>=5.0"
    lines = _install_lines()
    assert ("README.md", "transformers>=5.0") in lines
    wrong = [
        f"{page}: pip install {word} (pyproject.toml: {required[name]})"
        for page, word in lines
        if (name := re.split(r"[<>=!~\[]", word)[0].lower()) in required
        and name != "torch"
        and word != required[name]
    ]
    assert wrong == []


def test_readme_has_runnable_examples() -> None:
    readme = [h for h in SECTIONS if h.startswith("README.md: ")]
    assert len(readme) >= 3, sorted(SECTIONS)


def test_docs_examples_are_collected() -> None:
    pages = {h.split(": ", 1)[0] for h in SECTIONS}
    assert {"docs/guide/fsdp1.md", "docs/guide/cost-model.md"} <= pages, sorted(pages)


@pytest.mark.parametrize("heading", sorted(SECTIONS))
def test_readme_section_runs(heading: str, tmp_path: Path) -> None:
    missing = _missing_frameworks(SECTIONS[heading])
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (pip install -e '.[integrations]')")
    for i, block in enumerate(SECTIONS[heading]):
        what = f"{heading!r}, block {i + 1}"
        if block.mark == "skip":
            continue
        if block.mark == "file":
            (tmp_path / block.arg).write_text(block.code, encoding="utf-8")
        elif block.lang == "python":
            script = tmp_path / f"block{i + 1}.py"
            script.write_text(block.code, encoding="utf-8")
            if "dist.init_process_group" in block.code:
                # --tee 3: torchrun writes each rank's output line by line, prefixed with its
                # rank, so two ranks' prints never interleave mid-line (they did once in CI:
                # "symbolic symbolic[[...]]"); the teardown abort still shows in stderr
                cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--tee", "3"]
                stdout = _run([*cmd, "--nproc_per_node=2", script.name], tmp_path, what)
            else:
                stdout = _run([sys.executable, script.name], tmp_path, what)
            _check_prints(block.code, stdout, what)
        elif block.lang == "bash" and block.mark == "run":
            _run(["bash", "-euo", "pipefail", "-c", block.code], tmp_path, what)
