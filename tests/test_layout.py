"""The house rules of the source tree, checked on every run.

- no module in ``execwrap/`` or ``tracing/`` over 500 lines;
- no function over 80 lines (docstring included), argparse tables excepted;
- every module has ``__all__``;
- no ``from X import _name`` and no private module imported across modules;
- no import cycle between our modules, type-only (``if TYPE_CHECKING:``) imports included;
- ``tracing`` never imports ``execwrap``;
- ``execwrap/`` holds only packages and four modules (``__init__``, ``__main__``, ``errors``,
  ``demo_models``), and the layer contract written in ``pyproject.toml``
  (``[tool.importlinter]``: the layers, no cycles, no framework imported by the core) holds,
  checked by import-linter.

The import graph is read from the sources with ``ast`` (imports inside
functions count: a lazy import does not make a cycle go away) and checked with
networkx.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("execwrap", "tracing")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
#: Functions that are argparse tables (one add_argument call after another).
ARGPARSE_TABLES = {"execwrap.cli.parser.build_parser"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, *, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement; ``if TYPE_CHECKING:`` blocks only with ``type_checking``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) pairs of one statement."""
    if isinstance(node, ast.Import):
        return [(alias.name, None) for alias in node.names]
    source = _resolve(module, node)
    return [(source, alias.name) for alias in node.names]


def _ours(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def _import_graph(*, type_checking: bool = True) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(MODULES)
    for module, path in MODULES.items():
        for node in _imports(ast.parse(path.read_text()), type_checking=type_checking):
            for source, name in _targets(module, node):
                if not _ours(source):
                    continue
                target = f"{source}.{name}" if name and f"{source}.{name}" in MODULES else source
                if target in MODULES and target != module:
                    graph.add_edge(module, target)
    return graph


def test_no_module_over_500_lines() -> None:
    long = {
        m: n
        for m, p in MODULES.items()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_over_80_lines() -> None:
    long: dict[str, int] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        stack: list[tuple[ast.AST, str]] = [(tree, module)]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                name = prefix
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}.{child.name}"
                    if not isinstance(child, ast.ClassDef):
                        lines = (child.end_lineno or child.lineno) - child.lineno + 1
                        if lines > MAX_FUNCTION_LINES and name not in ARGPARSE_TABLES:
                            long[name] = lines
                stack.append((child, name))
    assert long == {}


def test_every_module_has_all() -> None:
    missing = [
        m
        for m, p in MODULES.items()
        if not any(
            isinstance(n, (ast.Assign, ast.AnnAssign))
            and any(
                isinstance(t, ast.Name) and t.id == "__all__"
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            )
            for n in ast.parse(p.read_text()).body
        )
    ]
    assert missing == []


def test_no_private_import_across_modules() -> None:
    private: list[str] = []
    for module, path in MODULES.items():
        for node in _imports(ast.parse(path.read_text())):
            for source, name in _targets(module, node):
                if not _ours(source):
                    continue
                parts = [*source.split("."), *([name] if name else [])]
                if any(p.startswith("_") and not p.startswith("__") for p in parts):
                    private.append(f"{module}: {source} {name or ''}".strip())
    assert private == []


def test_no_import_cycle() -> None:
    # type-only imports count: an annotation that needs the other module is a dependency
    graph = _import_graph(type_checking=True)
    graph.remove_node("execwrap")  # the lazy re-exports of the package's public names
    cycles = sorted(sorted(c) for c in nx.simple_cycles(graph))
    assert cycles == []


#: What ``execwrap/`` holds beside its packages (each package a layer, see pyproject.toml).
TOP_LEVEL_MODULES = {"__init__.py", "__main__.py", "errors.py", "demo_models.py"}


def test_execwrap_top_level_holds_packages_and_four_modules() -> None:
    top = ROOT / "execwrap"
    modules = {p.name for p in top.glob("*.py")}
    packages = {p.name for p in top.iterdir() if (p / "__init__.py").is_file()}
    assert modules == TOP_LEVEL_MODULES
    assert packages == {
        "cli", "cost", "distributed", "fsdp", "integrations", "order", "plan", "planning", "report",
        "simulate", "util", "watch",
    }  # fmt: skip


def test_layer_contract_holds() -> None:
    # in a subprocess: import-linter configures logging (it would disable our loggers here)
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True))",
            str(ROOT / "pyproject.toml"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 4 kept, 0 broken." in run.stdout


def test_tracing_never_imports_execwrap() -> None:
    graph = _import_graph()
    bad = [(a, b) for a, b in graph.edges if a.startswith("tracing") and b.startswith("execwrap")]
    assert bad == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_docstring(module: str) -> None:
    assert ast.get_docstring(ast.parse(MODULES[module].read_text())), module
