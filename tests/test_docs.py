"""The documentation site builds clean, and its API reference is complete.

* The site (``docs/``) builds with ``sphinx-build -W --keep-going -n``: every
  warning is an error, every cross reference (between pages, to headings, to
  API names) must resolve. It is built once, into a temp dir, with parallel
  reading off; nothing is executed by the build (the pages' code examples run
  in ``tests/test_readme.py``).
* Every name of every public module's ``__all__`` (``public_api_modules`` in
  ``docs/conf.py``) is in the built reference, under its public path
  (``execwrap.plan_wrap``, not the module that defines it), and nothing of
  ``execwrap``/``tracing`` is documented under any other path.
* Every public name has a docstring of its own (a constant: a ``#:`` comment
  where it is defined).
"""

from __future__ import annotations

import importlib
import inspect
import runpy
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sphinx", reason="needs the docs extra: pip install -e '.[docs]'")
pytest.importorskip("myst_parser", reason="needs the docs extra: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

from public_api import OWN_PACKAGES, attr_doc_comment  # noqa: E402

PUBLIC_MODULES: list[str] = runpy.run_path(str(DOCS / "conf.py"))["public_api_modules"]


def _public_paths() -> list[str]:
    paths = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        paths += [f"{module_name}.{name}" for name in module.__all__]
    return paths


def _inventory(path: Path) -> dict[str, tuple[str, int]]:
    """Sphinx's ``objects.inv``: name -> (``domain:role``, priority)."""
    header_lines = 4
    raw = path.read_bytes().split(b"\n", header_lines)
    assert raw[0] == b"# Sphinx inventory version 2", raw[0]
    out: dict[str, tuple[str, int]] = {}
    for line in zlib.decompress(raw[header_lines]).decode("utf-8").splitlines():
        name, role, priority, _ = line.split(" ", 3)
        out[name] = (role, int(priority))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs-html")
    cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-q"]
    cmd += ["-j", "1", "-d", str(out / ".doctrees"), str(DOCS), str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (
        f"the documentation does not build clean (exit {done.returncode}):\n"
        f"{done.stderr[-6000:]}\n{done.stdout[-2000:]}"
    )
    return out


def test_docs_build_with_warnings_as_errors(built: Path) -> None:
    for page in ("index", "getting-started", "api/execwrap", "benchmarks/autoplan"):
        assert (built / f"{page}.html").is_file(), page


def test_every_public_name_is_in_the_reference(built: Path) -> None:
    inventory = _inventory(built / "objects.inv")
    missing = [p for p in _public_paths() if not inventory.get(p, ("", 0))[0].startswith("py:")]
    assert not missing, (
        f"public names missing from the API reference (docs/api/*.md): {missing}; "
        "add an autodoc directive under the public path, e.g. "
        "'.. autofunction:: execwrap.plan_wrap'"
    )


def test_reference_documents_public_paths_only(built: Path) -> None:
    public = set(_public_paths())
    inventory = _inventory(built / "objects.inv")
    internal = [
        name
        for name, (role, priority) in inventory.items()
        if role.startswith("py:")
        and priority >= 0  # aliases (-1) point at a public entry
        and name.split(".")[0] in OWN_PACKAGES
        and not any(name == p or name.startswith(p + ".") for p in public)
    ]
    assert not internal, (
        f"documented under a module path instead of the public one: {internal}; "
        "document them as 'module.name' with module one of docs/conf.py's public_api_modules"
    )


def _own_docstring(obj: Any) -> str:
    if inspect.isclass(obj) or inspect.isroutine(obj):
        doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
        doc = (doc or "").strip()
        if inspect.isclass(obj) and doc.startswith(f"{obj.__name__}("):
            return ""  # a dataclass's generated signature, not a docstring
        return doc
    return ""


def test_every_public_name_has_a_docstring() -> None:
    undocumented = []
    for path in _public_paths():
        module_name, _, name = path.rpartition(".")
        obj = getattr(importlib.import_module(module_name), name)
        if inspect.isclass(obj) or inspect.isroutine(obj):
            documented = bool(_own_docstring(obj))
        else:
            documented = bool(attr_doc_comment(path))
        if not documented:
            undocumented.append(path)
    assert not undocumented, (
        f"public names without a docstring of their own: {undocumented} "
        "(a constant needs a '#:' comment where it is defined)"
    )
