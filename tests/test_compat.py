"""The compatibility shims in dgl_exact._compat: DGL 2.1.0's graphbolt placeholder and numpy.row_stack."""
import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numpy
import pytest
import torch

import _dgl_exact_import_hook
import dgl_exact
from dgl_exact import _compat

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def run_fresh(code: str, timeout: int = 120, **environ) -> dict:
    """Run ``code`` in a fresh interpreter (stdin closed, repo importable, ``environ`` set); it prints one
    JSON line."""
    env = {**os.environ, **environ}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([PYTHON, "-c", textwrap.dedent(code)], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, cwd=str(REPO), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_dgl_exact_then_dgl_in_fresh_interpreter():
    out = run_fresh("""
        import json, sys
        import dgl_exact
        import dgl
        from dgl_exact import _compat
        g = dgl.graph(([0, 1, 2], [1, 2, 0]))
        try:
            dgl.graphbolt.ItemSampler
            msg = None
        except ImportError as exc:
            msg = str(exc)
        print(json.dumps({"version": dgl.__version__, "stubbed": _compat.graphbolt_stubbed(),
                          "edges": int(g.num_edges()), "msg": msg,
                          "same": sys.modules["dgl.graphbolt"] is dgl.graphbolt}))
    """)
    assert out["version"].startswith("2.")
    assert out["edges"] == 3
    if out["stubbed"]:
        assert out["same"]
        assert "graphbolt" in out["msg"] and torch.__version__ in out["msg"] and "dgl_exact" in out["msg"]


def test_graphbolt_stubbed_here():
    """DGL 2.1.0 ships graphbolt libraries only for torch 2.0.0 .. 2.2.1; this environment runs torch 2.13."""
    import dgl

    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version <= (2, 2) or _compat._graphbolt_library_present():
        pytest.skip("this torch has a graphbolt library: the placeholder is (correctly) not installed")
    assert _compat.graphbolt_stubbed() is True
    gb = sys.modules["dgl.graphbolt"]
    assert dgl.graphbolt is gb
    with pytest.raises(ImportError, match=r"dgl\.graphbolt\.anything is unavailable.*torch") as info:
        gb.anything
    assert "dgl_exact does not need it" in str(info.value)
    with pytest.raises(ImportError):
        from dgl.graphbolt import ItemSampler  # noqa: F401
    # dunder lookups stay AttributeErrors, so hasattr/copy/pickle/inspect keep working
    assert not hasattr(gb, "__path__") and not hasattr(gb, "__wrapped__")
    assert gb.__name__ == "dgl.graphbolt"


def test_import_dgl_is_idempotent_and_replaces_nothing():
    """dgl is already imported (conftest imports dgl_exact): calling the shim again returns the same module
    and leaves every registered module object in place."""
    import dgl

    before = {k: v for k, v in sys.modules.items() if k == "dgl" or k.startswith("dgl.")}
    assert _compat.import_dgl() is dgl
    after = {k: v for k, v in sys.modules.items() if k == "dgl" or k.startswith("dgl.")}
    assert all(after[k] is v for k, v in before.items())


def test_shim_decisions_in_fresh_interpreter():
    """The placeholder is installed only when needed and never over something already imported:
    * dgl already imported by the user (stand-in module): nothing registered, nothing bound;
    * the user registered their own ``dgl.graphbolt``: kept;
    * neither, and no graphbolt library (a stand-in ``dgl`` package on sys.path without one): the placeholder
      is registered and bound as ``dgl.graphbolt``, and touching it raises the explanatory ImportError.
    The shim is loaded from its file alone, because the package itself imports DGL's real submodules."""
    out = run_fresh(f"""
        import importlib.util, json, os, sys, tempfile, types
        spec = importlib.util.spec_from_file_location("compat_alone", {str(REPO / "dgl_exact" / "_compat.py")!r})
        compat = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(compat)
        out = {{}}

        fake = types.ModuleType("dgl")
        sys.modules["dgl"] = fake                                   # 1. dgl already imported
        out["returned_fake"] = compat.import_dgl() is fake
        out["untouched"] = "dgl.graphbolt" not in sys.modules and not hasattr(fake, "graphbolt")
        out["stubbed_1"] = compat.graphbolt_stubbed()
        del sys.modules["dgl"]

        root = tempfile.mkdtemp()                                   # a dgl package without graphbolt library
        os.makedirs(os.path.join(root, "dgl", "graphbolt"))
        open(os.path.join(root, "dgl", "__init__.py"), "w").close()
        sys.path.insert(0, root)
        own_gb = types.ModuleType("dgl.graphbolt")                  # 2. the user's own graphbolt
        sys.modules["dgl.graphbolt"] = own_gb
        dgl = compat.import_dgl()
        out["own_kept"] = sys.modules["dgl.graphbolt"] is own_gb and dgl.__file__.startswith(root)
        out["stubbed_2"] = compat.graphbolt_stubbed()
        del sys.modules["dgl"], sys.modules["dgl.graphbolt"]

        dgl = compat.import_dgl()                                   # 3. neither: placeholder
        out["stubbed_3"] = compat.graphbolt_stubbed()
        out["bound"] = dgl.graphbolt is sys.modules["dgl.graphbolt"]
        try:
            dgl.graphbolt.ItemSampler
        except ImportError as exc:
            out["msg"] = str(exc)
        print(json.dumps(out))
    """, DGL_EXACT_NO_IMPORT_HOOK="1")
    msg = out.pop("msg", "")
    assert out == {"returned_fake": True, "untouched": True, "stubbed_1": False, "own_kept": True,
                   "stubbed_2": False, "stubbed_3": True, "bound": True}
    assert "dgl.graphbolt.ItemSampler is unavailable" in msg and "dgl_exact does not need it" in msg


def test_library_detection(monkeypatch, tmp_path):
    lib_dir = tmp_path / "graphbolt"
    lib_dir.mkdir()
    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(_dgl_exact_import_hook.importlib.util, "find_spec",
                        lambda name: spec if name == "dgl" else None)
    monkeypatch.setattr(torch, "__version__", "2.1.1+cu121")
    assert _compat._graphbolt_library_present() is False
    (lib_dir / "libgraphbolt_pytorch_2.1.1.so").touch()
    assert _compat._graphbolt_library_present() is True  # the "+cu121" local tag is ignored
    monkeypatch.setattr(torch, "__version__", "2.13.0")
    assert _compat._graphbolt_library_present() is False
    # no dgl at all: nothing to fix
    monkeypatch.setattr(_dgl_exact_import_hook.importlib.util, "find_spec", lambda name: None)
    assert _compat._graphbolt_library_present() is True


def test_graphbolt_stubbed_reads_sys_modules(monkeypatch):
    monkeypatch.setitem(sys.modules, "dgl.graphbolt", types.ModuleType("dgl.graphbolt"))
    assert _compat.graphbolt_stubbed() is False
    monkeypatch.delitem(sys.modules, "dgl.graphbolt")
    assert _compat.graphbolt_stubbed() is False


def test_patch_numpy_adds_row_stack_only_when_missing(monkeypatch):
    monkeypatch.delattr(numpy, "row_stack", raising=False)
    assert not hasattr(numpy, "row_stack")
    _compat.patch_numpy_for_numba()
    assert numpy.row_stack is numpy.vstack
    sentinel = object()
    monkeypatch.setattr(numpy, "row_stack", sentinel)
    _compat.patch_numpy_for_numba()
    assert numpy.row_stack is sentinel  # an existing row_stack is never replaced


def test_package_metadata():
    assert dgl_exact.__version__
    for name in dgl_exact.__all__:
        assert hasattr(dgl_exact, name)


# --- the import hook: ``import dgl`` first, without dgl_exact ------------------------------------------------

_NEEDS_PLACEHOLDER = not _dgl_exact_import_hook.graphbolt_library_present()


def _hook_pth_installed() -> bool:
    import site

    folders = site.getsitepackages() + [site.getusersitepackages()]
    return any(os.path.exists(os.path.join(f, "dgl_exact-import-hook.pth")) for f in folders)


@pytest.mark.skipif(not _hook_pth_installed(), reason="dgl_exact-import-hook.pth is installed by `pip install .`; "
                    "this environment has none (a source checkout, or an editable install of an older build)")
def test_import_dgl_first_in_fresh_interpreter():
    """What a user's existing DGL script does: ``import dgl`` before (or without) dgl_exact."""
    out = run_fresh("""
        import json, sys
        import dgl
        g = dgl.graph(([0, 1, 2], [1, 2, 0]))
        stub = getattr(sys.modules.get("dgl.graphbolt"), "__dgl_exact_stub__", False)
        print(json.dumps({"edges": int(g.num_edges()), "stub": stub, "dgl_exact": "dgl_exact" in sys.modules,
                          "bound": getattr(dgl, "graphbolt", None) is sys.modules.get("dgl.graphbolt")}))
    """)
    assert out == {"edges": 3, "stub": _NEEDS_PLACEHOLDER, "dgl_exact": False, "bound": True}


def test_hook_finder_installs_the_placeholder_on_first_import_of_dgl():
    """The finder, installed by hand (as the .pth does), acts once on ``import dgl`` and removes itself; it
    imports nothing at install time."""
    out = run_fresh("""
        import json, sys
        import _dgl_exact_import_hook as hook
        hook.install(); hook.install()                   # idempotent
        n_finders = sum(isinstance(f, hook._FirstDGLImport) for f in sys.meta_path)
        light = "torch" not in sys.modules and "dgl" not in sys.modules
        import dgl
        import dgl_exact
        from dgl_exact import _compat
        try:
            dgl.graphbolt.ItemSampler
            msg = ""
        except ImportError as exc:
            msg = str(exc)
        print(json.dumps({"n_finders": n_finders, "light": light, "stubbed": _compat.graphbolt_stubbed(),
                          "left": any(isinstance(f, hook._FirstDGLImport) for f in sys.meta_path),
                          "msg": msg, "edges": int(dgl.graph(([0], [1])).num_edges())}))
    """, DGL_EXACT_NO_IMPORT_HOOK="0")
    msg = out.pop("msg")
    assert out == {"n_finders": 1, "light": True, "stubbed": _NEEDS_PLACEHOLDER, "left": False, "edges": 1}
    if _NEEDS_PLACEHOLDER:
        assert "dgl.graphbolt.ItemSampler is unavailable" in msg


def test_hook_switched_off_by_environment():
    out = run_fresh("""
        import json, sys
        import _dgl_exact_import_hook as hook
        hook.install()
        print(json.dumps({"finders": sum(isinstance(f, hook._FirstDGLImport) for f in sys.meta_path)}))
    """, DGL_EXACT_NO_IMPORT_HOOK="1")
    assert out == {"finders": 0}
