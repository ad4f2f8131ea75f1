"""Every public name of the documented modules has an entry in the API reference (``docs/api/*.rst``).

Reads the reference's sources, not a built site (Sphinx is not needed): a name is documented where it is listed
in an ``autosummary`` block under ``.. currentmodule:: <module>`` (Sphinx generates its page from the
docstring), or, for an object that several modules export, where the page of a module links to the module that
documents it (``:class:`dgl_exact.GraphConv <dgl_exact.nn.GraphConv>```); a subpackage where it has its own
``.. automodule::``. A new public name without an entry fails here; so does an entry for a name that is gone.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import types
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[2] / "docs" / "api"

MODULES = ["dgl_exact", "dgl_exact.nn", "dgl_exact.ops", "dgl_exact.memory", "dgl_exact.planning",
           "dgl_exact.compression", "dgl_exact.data", "dgl_exact.pyg"]

# modules that need an extra (setup.cfg): their entries are checked where it is installed (CI installs them all)
NEEDS = {"dgl_exact.pyg": ("torch_geometric", 'pip install ".[pyg]"')}

_ROLE = re.compile(r":(?:py:)?(?:class|func|obj|data|mod|meth|attr):`(?:[^`<]*<)?~?([\w.]+)>?`")


def public_names(module) -> list[str]:
    """The module's ``__all__`` (without dunders such as ``__version__``), else its non-underscored names."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return sorted(n for n in names if not (n.startswith("__") and n.endswith("__")))


def parse_reference(root: Path = API):
    """``(listed, linked, automodules)``: full names in autosummary blocks, full names in cross-references,
    modules given an ``automodule``; and ``pages``: which page lists each autosummary entry."""
    listed, linked, automodules = {}, set(), set()
    for page in sorted(root.glob("*.rst")):
        current, in_summary = None, False
        for line in page.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(".. currentmodule::"):
                current, in_summary = stripped.split("::", 1)[1].strip(), False
            elif stripped.startswith(".. automodule::"):
                automodules.add(stripped.split("::", 1)[1].strip())
                in_summary = False
            elif stripped.startswith(".. autosummary::"):
                in_summary = True
            elif in_summary:
                if not stripped or stripped.startswith(":"):
                    continue  # the directive's options and the blank line after them
                if not line.startswith("   "):
                    in_summary = False
                else:
                    assert current, f"{page.name}: autosummary entry {stripped} before any currentmodule"
                    listed.setdefault(f"{current}.{stripped.lstrip('~')}", page.name)
            linked.update(_ROLE.findall(line))
    return listed, linked, automodules


def _resolve(full: str):
    module, _, name = full.rpartition(".")
    return getattr(importlib.import_module(module), name)


def missing_entries(modules=MODULES, root: Path = API) -> list[str]:
    """Public names of ``modules`` that the reference under ``root`` neither lists nor links to."""
    listed, linked, automodules = parse_reference(root)
    missing = []
    for module_name in modules:
        module = importlib.import_module(module_name)
        for name in public_names(module):
            full, obj = f"{module_name}.{name}", getattr(module, name)
            if full in listed:
                continue
            if isinstance(obj, types.ModuleType) and obj.__name__ in automodules and full in linked:
                continue
            # documented where another module lists the same object, and this module's page links to it
            homes = [t for t in linked if t in listed and t.rpartition(".")[2] == name and _resolve(t) is obj]
            if homes and any(f"{module_name}.{name}" == alias for alias in _aliases(root, homes)):
                continue
            missing.append(full)
    return missing


def _aliases(root: Path, targets) -> set:
    """Names under which the reference links to ``targets`` (``:class:`ALIAS <TARGET>```)."""
    pattern = re.compile(r":(?:py:)?(?:class|func|obj|data):`([\w.]+) <([\w.]+)>`")
    out = set()
    for page in root.glob("*.rst"):
        for alias, target in pattern.findall(page.read_text()):
            if target in targets:
                out.add(alias)
    return out


def _importable(module_name: str) -> bool:
    need = NEEDS.get(module_name)
    return need is None or importlib.util.find_spec(need[0]) is not None


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_name_has_an_entry(module_name):
    if not _importable(module_name):
        pytest.skip(f"{module_name} needs {NEEDS[module_name][0]}: {NEEDS[module_name][1]}")
    missing = missing_entries([module_name])
    assert not missing, (f"public names without an entry in docs/api/*.rst: {missing}; add each to the "
                         "autosummary list of its module's page (docs/api/<module>.rst)")


def test_every_entry_names_an_existing_object():
    listed, _, _ = parse_reference()
    gone = []
    for full, page in listed.items():
        if not _importable(full.rpartition(".")[0]):
            continue
        try:
            _resolve(full)
        except (AttributeError, ImportError):
            gone.append(f"{page}: {full}")
    assert not gone, f"entries for names that do not exist (remove them): {gone}"


def test_an_unlisted_name_is_reported(tmp_path):
    """The check can fail: a page that leaves out one name of ``dgl_exact.memory`` reports exactly that name."""
    text = (API / "memory.rst").read_text()
    assert "   measure_step\n" in text
    (tmp_path / "memory.rst").write_text(text.replace("   measure_step\n", ""))
    before = set(missing_entries(["dgl_exact.memory"]))
    assert set(missing_entries(["dgl_exact.memory"], tmp_path)) - before == {"dgl_exact.memory.measure_step"}


def test_a_reexport_counts_only_with_its_link(tmp_path):
    """``dgl_exact.GraphConv`` is documented as ``dgl_exact.nn.GraphConv``; without the top-level page's link
    to it, it is reported."""
    for page in API.glob("*.rst"):
        (tmp_path / page.name).write_text(page.read_text())
    top = (tmp_path / "dgl_exact.rst").read_text()
    link = ":class:`dgl_exact.GraphConv <dgl_exact.nn.GraphConv>`"
    assert link in top
    (tmp_path / "dgl_exact.rst").write_text(top.replace(link, "GraphConv"))
    before = set(missing_entries(["dgl_exact"]))
    assert set(missing_entries(["dgl_exact"], tmp_path)) - before == {"dgl_exact.GraphConv"}
