"""Sphinx configuration of execwrap's documentation site.

Why Sphinx with MyST Markdown, autodoc and napoleon: it is what the PyTorch
projects our users read build their documentation with (torch, torchao,
torchtune), so the reference looks and links like theirs; MyST lets the guides
stay plain Markdown that GitHub renders too (and that the tests run, block by
block); autodoc builds the API reference from the docstrings, which are
Google style (napoleon reads them as written, no second copy to keep in step).
The theme is furo: maintained, readable code blocks, navigation in a sidebar,
nothing fetched from the network when the pages are viewed.

Build: ``sphinx-build -W --keep-going -n docs docs/_build/html`` (the test
suite runs the same build, ``tests/test_docs.py``). Every warning is an error
there, and ``-n`` (nitpicky) reports every cross reference that does not
resolve, except references into the packages listed in ``nitpick_ignore_regex``
below, whose documentation is not part of this site (no network access for
intersphinx during the build).
"""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

project = "execwrap"
author = "execwrap contributors"
copyright = "2026, execwrap contributors"  # noqa: A001 (Sphinx's setting name)

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "public_api",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
# docs/README.md says how to build the site; it is not a page of it.
exclude_patterns = ["_build", "README.md", "_ext"]

# Markdown: heading anchors for links like [x](capture.md#the-capture-ladder);
# ```{directive} fences for autodoc and toctrees.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# The API reference: Google-style docstrings, signatures with their type hints.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_default_options = {"members": True, "show-inheritance": True}

#: The public modules: each name in their ``__all__`` is documented at
#: ``module.name`` (docs/api/), and references to where it is defined are
#: pointed there (docs/_ext/public_api.py). Order: the first module that
#: exports a name owns it.
public_api_modules = [
    "tracing",
    "execwrap",
    "execwrap.cost",
    "execwrap.simulate",
    "execwrap.sizing",
    "execwrap.report",
    "execwrap.integrations",
    "execwrap.integrations.accelerate",
    "execwrap.integrations.hf_trainer",
    "execwrap.integrations.lightning",
    "execwrap.integrations.peft",
    "execwrap.integrations.torchtitan",
    "execwrap.integrations.transformers",
]

nitpicky = True
nitpick_ignore_regex = [
    # Other projects' names (no intersphinx: the build needs no network).
    (
        r"py:.*",
        r"(~?)(torch|nn|fx|dist|networkx|nx|numpy|np|matplotlib|transformers|accelerate|"
        r"lightning|L|peft|torchtitan|psutil)(\..*)?",
    ),
    # The standard library (likewise).
    (
        r"py:.*",
        r"(~?)(collections|typing|typing_extensions|pathlib|os|io|logging|enum|"
        r"dataclasses|functools|inspect|contextlib|weakref|types|abc|re|json|argparse)\..*",
    ),
    # Modules inside the packages: the reference documents public names, not the
    # modules that define them (they move; docstrings still name them in prose).
    (r"py:mod", r"~?\.?(execwrap|tracing)(\..*)?"),
]

html_theme = "furo"
html_title = "execwrap"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
