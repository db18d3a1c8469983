"""Sphinx extension: execwrap's API reference under its public paths.

The reference documents every public name where users import it from
(``execwrap.plan_wrap``, ``tracing.capture_execution_order``,
``execwrap.integrations.lightning.shard_lightning_module``), never the module
that happens to define it: those modules move (issue 35), the public paths do
not. This extension keeps the cross references right under that rule:

* A name several public modules export (``ExecutionOrder`` from ``tracing``
  and from ``execwrap``) is documented once, under the first module of
  ``public_api_modules`` that exports it; the other public paths become
  aliases of that entry (in the inventory, and for references).
* A reference Sphinx cannot resolve (type hints and docstrings name defining
  modules: ``execwrap.plan.WrapPlan``, or a short ``WrapPlan.to_dict``) is
  imported and, when it is a public object, pointed at its public name.
* A reference to an object that exists inside ``execwrap`` or ``tracing`` but
  is not public (a helper a docstring names, such as
  ``execwrap.fsdp.first_step.record_first_step``) is shown as code without a link:
  the reference does not document internals. A reference to something that
  does not exist stays a warning (the build runs nitpicky, warnings as errors).
* A constant's documentation is its ``#:`` comment where it is defined (the
  public path's module only re-exports it): :func:`attr_doc_comment`.
* NamedTuple fields ("Alias for field number N") are documented by their
  class's ``Attributes:`` section, not a second time as members; a field
  whose default is another project's function is not documented as a method.
* A dataclass field with a ``default_factory`` shows its default as ``...``,
  a function default by its name (their reprs would break the signature).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys
from typing import Any

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.domains.python import ObjectEntry, PythonDomain
from sphinx.environment import BuildEnvironment
from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer

__all__ = ["OWN_PACKAGES", "attr_doc_comment", "import_path", "public_names", "setup"]

#: Top-level packages whose internals a reference may name without linking.
OWN_PACKAGES = ("execwrap", "tracing")

_FUNCTION_REPR = re.compile(r"<function ([\w.]+)(?: at 0x[0-9a-f]+)?>")
_PLAIN_VALUES = (int, float, str, bytes, bool, tuple, frozenset, type(None))


def import_path(path: str) -> Any:
    """The object at dotted ``path`` (a module, then attributes), or ``None``."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def public_names(modules: list[str]) -> dict[int, str]:
    """``id(object) -> "module.name"`` for every name in each module's ``__all__``.

    The first module that exports an object names it. Plain values that many
    names may share (ints, strings, tuples) are left out.
    """
    names: dict[int, str] = {}
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if not isinstance(obj, _PLAIN_VALUES):
                names.setdefault(id(obj), f"{module_name}.{name}")
    return names


def attr_doc_comment(public_path: str) -> list[str]:
    """The ``#:`` comment lines that document the constant at ``public_path``.

    ``tracing.SCHEMA_VERSION`` is re-exported by ``tracing`` and defined, with
    its comment, in one of the package's modules; every module of the package
    is searched (by source, nothing else is imported). ``[]`` when none has one.
    """
    package_name, _, name = public_path.rpartition(".")
    package = importlib.import_module(package_name)
    candidates = [package_name]
    if hasattr(package, "__path__"):
        prefix = package_name + "."
        candidates += [m.name for m in pkgutil.walk_packages(package.__path__, prefix)]
    for module_name in candidates:
        try:
            docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        except PycodeError:
            continue
        lines = docs.get(("", name))
        if lines and any(line.strip() for line in lines):
            return list(lines)
    return []


def _public_target(target: str, names: dict[int, str]) -> str | None:
    """``target`` rewritten to a public path (``execwrap.plan.WrapPlan.stats`` ->
    ``execwrap.WrapPlan.stats``), or ``None`` when no prefix of it is public."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        obj = import_path(".".join(parts[:cut]))
        if obj is not None and id(obj) in names:
            return ".".join([names[id(obj)], *parts[cut:]])
    return None


def _by_suffix(target: str, names: dict[int, str]) -> str | None:
    """A short ``WrapPlan.to_dict`` -> ``execwrap.WrapPlan.to_dict`` when exactly one
    public name ends in its first part."""
    head, _, rest = target.partition(".")
    found = {public for public in names.values() if public.rsplit(".", 1)[-1] == head}
    if len(found) != 1:
        return None
    return ".".join([found.pop(), rest]) if rest else found.pop()


def _context_candidates(node: pending_xref, target: str) -> list[str]:
    """Full paths a short ``target`` may mean where the docstring naming it is defined:
    the documented object's own module and class (``PLAN_FIELDS`` inside
    ``WrapPlan.from_dict`` -> ``execwrap.plan.PLAN_FIELDS``)."""
    module = node.get("py:module") or ""
    cls = node.get("py:class") or ""
    owner = import_path(f"{module}.{cls}" if cls else module) if module else None
    out = [f"{module}.{cls}.{target}", f"{module}.{target}"] if module else []
    real_module = getattr(owner, "__module__", None)
    if isinstance(real_module, str):
        out += [f"{real_module}.{cls}.{target}" if cls else "", f"{real_module}.{target}"]
    return [c for c in out if c]


def _resolve(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.TextElement
) -> nodes.Element | None:
    if node.get("refdomain") != "py":
        return None
    names: dict[int, str] = app.public_api_names  # type: ignore[attr-defined]
    target = node["reftarget"].lstrip("~.")
    candidates = [target, *_context_candidates(node, target)]
    domain = env.get_domain("py")
    for candidate in candidates:
        public = _public_target(candidate, names)
        if public is not None and public != target:
            ref = domain.resolve_xref(
                env, node.get("refdoc", ""), app.builder, node["reftype"], public, node, contnode
            )
            if ref is not None:
                return ref
    public = _by_suffix(target, names)
    if public is not None:
        ref = domain.resolve_xref(
            env, node.get("refdoc", ""), app.builder, node["reftype"], public, node, contnode
        )
        if ref is not None:
            return ref
    for candidate in candidates:
        if candidate.split(".")[0] in OWN_PACKAGES and import_path(candidate) is not None:
            return contnode  # an internal name: shown as code, not linked
    if _defined_inside(target):
        return contnode
    return None


def _defined_inside(target: str) -> bool:
    """Whether a module of :data:`OWN_PACKAGES` already loaded has ``target``
    (a short name such as ``FSDPTarget`` in a type hint, or ``Preset``)."""
    head, _, rest = target.partition(".")
    for module_name, module in list(sys.modules.items()):
        if module_name.split(".")[0] not in OWN_PACKAGES or module is None:
            continue
        obj = getattr(module, head, None)
        if obj is not None and (not rest or import_path(f"{module_name}.{target}") is not None):
            return True
    return False


def _collect(app: Sphinx) -> None:
    app.public_api_names = public_names(app.config.public_api_modules)  # type: ignore[attr-defined]


def _alias_reexports(app: Sphinx, env: BuildEnvironment) -> None:
    """Make every public path of an object documented under another one an alias."""
    domain: PythonDomain = env.get_domain("py")  # type: ignore[assignment]
    names: dict[int, str] = app.public_api_names  # type: ignore[attr-defined]
    for module_name in app.config.public_api_modules:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            full = f"{module_name}.{name}"
            owner = names.get(id(getattr(module, name)))
            if full in domain.objects or owner is None or owner not in domain.objects:
                continue
            entry = domain.objects[owner]
            domain.objects[full] = ObjectEntry(entry.docname, entry.node_id, entry.objtype, True)


def _constant_doc(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    if what != "data":
        return
    comment = attr_doc_comment(name)
    if comment:
        lines[:] = comment
    elif "\n".join(lines).strip() == (type(obj).__doc__ or "").strip():
        lines[:] = []  # the value's type's docstring says nothing of the constant


def _skip_member(
    app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any
) -> bool | None:
    doc = getattr(obj, "__doc__", None)
    if isinstance(doc, str) and doc.startswith("Alias for field number"):
        return True  # a NamedTuple field: its class's Attributes section has it
    module = getattr(obj, "__module__", None)
    if what == "class" and isinstance(module, str) and module.split(".")[0] not in OWN_PACKAGES:
        return True  # another project's function as a field default (init_policy)
    return None


def _signature(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    if signature is None or "<" not in signature:
        return None
    # A dataclass's generated __init__ shows defaults by repr: ``<factory>`` for a
    # default_factory, ``<function always_wrap_policy>``. Neither is Python, so
    # Sphinx would split the signature at every comma; ``...`` and the name are.
    signature = signature.replace("<factory>", "...")
    signature = _FUNCTION_REPR.sub(r"\1", signature)
    return signature, return_annotation


def setup(app: Sphinx) -> dict[str, Any]:
    """Register ``public_api_modules`` and the handlers above."""
    app.add_config_value("public_api_modules", [], "env")
    app.connect("builder-inited", _collect)
    app.connect("env-updated", _alias_reexports)
    app.connect("missing-reference", _resolve)
    app.connect("autodoc-process-docstring", _constant_doc)
    app.connect("autodoc-skip-member", _skip_member)
    app.connect("autodoc-process-signature", _signature)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
