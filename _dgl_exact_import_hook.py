"""Make ``import dgl`` work on a torch DGL 2.1.0 ships no graphbolt library for, in any import order.

Installed with dgl_exact as a top-level module, and run at interpreter start by the one-line
``dgl_exact-import-hook.pth`` in site-packages (Python's ``site`` module executes ``import`` lines of
``.pth`` files). At start it only appends a finder to ``sys.meta_path``: nothing is imported, nothing is
changed until the first ``import dgl``. Then the finder removes itself and, if (and only if) DGL's graphbolt
library is missing for the running torch, registers a placeholder module as ``dgl.graphbolt`` before DGL's
own import runs, so ``import dgl`` succeeds (DGL 2.1.0 imports graphbolt unconditionally and raises
``FileNotFoundError`` without its library). A DGL whose library exists is never touched. Touching the
placeholder raises an ``ImportError`` that says why.

This file must not import ``dgl_exact`` (that package imports DGL). ``dgl_exact._compat`` uses the same
functions when DGL is first imported through dgl_exact. Set ``DGL_EXACT_NO_IMPORT_HOOK=1`` to start Python
without the finder.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import os
import sys
import types

GRAPHBOLT = "dgl.graphbolt"
STUB_FLAG = "__dgl_exact_stub__"


def graphbolt_library_present() -> bool:
    """True if DGL's graphbolt shared library exists for the running torch version (or there is no DGL)."""
    import torch

    spec = importlib.util.find_spec("dgl")
    if spec is None or not spec.submodule_search_locations:
        return True  # no DGL at all: nothing to fix, let the import error speak for itself
    version = torch.__version__.split("+", maxsplit=1)[0]
    for root in spec.submodule_search_locations:
        lib_dir = os.path.join(root, "graphbolt")
        for name in (f"libgraphbolt_pytorch_{version}.so", f"libgraphbolt_pytorch_{version}.dylib",
                     f"graphbolt_pytorch_{version}.dll"):
            if os.path.exists(os.path.join(lib_dir, name)):
                return True
    return False


class GraphboltUnavailable(types.ModuleType):
    """Placeholder for ``dgl.graphbolt`` when its native library does not exist for this torch."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        import torch

        raise ImportError(
            f"dgl.graphbolt.{name} is unavailable: DGL ships no graphbolt library for torch "
            f"{torch.__version__}. dgl_exact does not need it; to use graphbolt itself install DGL's "
            "native stack (torch==2.1.1 dgl==2.1.0 torchdata==0.7.1)."
        )


def install_placeholder():
    """Register the ``dgl.graphbolt`` placeholder if DGL is not imported yet and its library is missing.

    Returns the placeholder, or None when nothing was needed (or DGL, or a graphbolt, is already loaded).
    """
    if "dgl" in sys.modules or GRAPHBOLT in sys.modules or graphbolt_library_present():
        return None
    stub = GraphboltUnavailable(GRAPHBOLT, "placeholder installed by dgl_exact")
    setattr(stub, STUB_FLAG, True)
    sys.modules[GRAPHBOLT] = stub
    return stub


class _FirstDGLImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: on the first lookup of ``dgl`` it installs the placeholder (if needed),
    removes itself, and lets the regular finders load DGL."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "dgl":
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        try:
            stub = install_placeholder()
            spec = importlib.util.find_spec("dgl") if stub is not None else None
        except Exception:  # noqa: BLE001  (never break an import: DGL's own error then speaks)
            return None
        if spec is None or spec.loader is None:
            return None
        spec.loader = _BindingLoader(spec.loader, stub)
        return spec


class _BindingLoader(importlib.abc.Loader):
    """DGL's own loader, which afterwards binds the placeholder as ``dgl.graphbolt`` (a submodule found in
    ``sys.modules`` is not bound on its parent), so ``dgl.graphbolt.X`` raises the explanatory ImportError."""

    def __init__(self, loader, stub):
        self._loader = loader
        self._stub = stub

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        if "graphbolt" not in vars(module):
            module.graphbolt = self._stub

    def __getattr__(self, name):
        return getattr(self._loader, name)


def install() -> None:
    """Append the one-time ``dgl`` finder to ``sys.meta_path`` (idempotent; off with DGL_EXACT_NO_IMPORT_HOOK=1)."""
    if os.environ.get("DGL_EXACT_NO_IMPORT_HOOK") == "1" or "dgl" in sys.modules:
        return
    if not any(isinstance(f, _FirstDGLImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _FirstDGLImport())
