"""Frameworks are imported only by the integration module that uses them.

``import execwrap`` and ``import execwrap.integrations`` (and its
framework-free helpers) load no framework; outside ``execwrap/integrations/``
no module of execwrap or tracing imports one, and inside it each framework is
imported only by its own module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = ("lightning", "pytorch_lightning", "accelerate", "transformers", "peft", "torchtitan")
#: integration module -> the frameworks it may import
OWNERS = {
    "lightning": {"lightning", "pytorch_lightning"},
    "accelerate": {"accelerate"},
    "hf_trainer": {"transformers", "accelerate"},
    "torchtitan": {"torchtitan"},
    "peft": {"peft"},
    "transformers": {"transformers"},  # a package: every module in it
}


def test_importing_execwrap_and_integrations_loads_no_framework() -> None:
    code = (
        "import sys, execwrap, execwrap.integrations\n"
        "from execwrap.integrations import fsdp_groups, lift_order, lift_plan\n"
        "from execwrap.watch.hints import ignored_by\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FRAMEWORKS!r}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert proc.stdout.strip() == "[]"


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_only_each_frameworks_own_module_imports_it() -> None:
    found: dict[str, list[str]] = {}
    for path in sorted([*ROOT.glob("execwrap/**/*.py"), *ROOT.glob("tracing/**/*.py")]):
        rel = path.relative_to(ROOT)
        integration = rel.parts[2].removesuffix(".py") if len(rel.parts) > 2 else ""
        allowed = (
            OWNERS.get(integration, set())
            if rel.parts[:2] == ("execwrap", "integrations")
            else set()
        )
        bad = sorted((_imported(path) & set(FRAMEWORKS)) - allowed)
        if bad:
            found[str(rel)] = bad
    assert found == {}
