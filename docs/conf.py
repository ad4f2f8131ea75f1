"""Sphinx configuration of the dgl_exact documentation.

Why Sphinx (and not MkDocs with mkdocstrings): the package's docstrings are numpydoc, which Sphinx's
``napoleon`` renders as they are written; ``autosummary`` generates one page per public name from the lists in
``docs/api/*.rst`` (``tests/docs/test_api_reference.py`` checks those lists against the modules' public names);
and ``-W`` turns every warning (a broken docstring, a missing page, a dead cross-reference target) into a
failed build. The guide is Markdown (MyST) so that pages read the same on GitHub; its code blocks are
executed by ``tests/docs/test_guide.py``, not by Sphinx, so the build itself never trains anything.

Build: ``pip install ".[docs]" && python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""
from __future__ import annotations

import dgl_exact  # the installed package (pip install ".[docs]", or the dev venv's editable install)

project = "dgl_exact"
author = "dgl_exact authors"
copyright = "dgl_exact authors"
release = dgl_exact.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store"]
templates_path = ["_templates"]

# API reference: one generated page per public name (docs/api/generated/, not committed)
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "member-order": "bysource", "show-inheritance": True}
autodoc_typehints = "description"
autodoc_inherit_docstrings = False  # torch.nn.Module's own docstrings are not ours to render
autodoc_mock_imports: list[str] = []

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"dgl_exact {release}"
html_static_path: list[str] = []


def _drop_type_docstring(app, what, name, obj, options, lines):
    """A module-level constant (``DATASETS``, a dict) has no docstring of its own: autodoc would render its
    type's (``dict``'s), which is not about dgl_exact and not valid reStructuredText. Show none instead."""
    import inspect

    if what in ("data", "attribute") and obj is not None and not inspect.isclass(obj) and not callable(obj):
        own, of_type = inspect.getdoc(obj), inspect.getdoc(type(obj))
        if own and own == of_type:
            lines[:] = []


def setup(app):
    app.connect("autodoc-process-docstring", _drop_type_docstring)
