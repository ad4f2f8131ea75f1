"""The package root, dgl_exact/__init__.py: what ``import dgl_exact`` makes reachable."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dgl_exact

REPO = Path(__file__).resolve().parents[1]


def run_fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (repo importable); it prints one JSON line."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=180, cwd=str(REPO), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_unknown_attribute_still_raises_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'not_a_module'"):
        dgl_exact.not_a_module
    assert not hasattr(dgl_exact, "datasets")


def test_dir_lists_lazy_subpackages():
    assert {"data", "training", "planning", "bench", "cli", "ops", "nn"} <= set(dir(dgl_exact))


def test_plain_import_is_light_and_every_public_name_resolves_in_fresh_interpreter():
    """``import dgl_exact`` imports neither torch nor DGL nor its subpackages (PEP 562: names load on first use);
    the documented subpackages are reachable as attributes and are the modules in ``sys.modules``; ``import *``
    gives every name of ``__all__``; a plain ``import dgl`` afterwards works (the graphbolt finder is installed).
    One fresh interpreter for all of it (each start imports torch and DGL again)."""
    out = run_fresh("""
        import json, sys
        import dgl_exact
        light = sorted(m for m in ("torch", "dgl", "dgl_exact.nn", "dgl_exact.ops", "dgl_exact.data")
                       if m in sys.modules)
        fns = {
            "data": dgl_exact.data.load_dataset.__name__,
            "training": dgl_exact.training.__name__,
            "planning": dgl_exact.planning.__name__,
            "bench": dgl_exact.bench.__name__,
            "cli": dgl_exact.cli.__name__,
            "errors": dgl_exact.errors.__name__,
        }
        names = {}
        exec("from dgl_exact import *", names)
        import dgl
        edges = int(dgl.graph(([0, 1], [1, 2])).num_edges())
        print(json.dumps({"light": light, "missing": sorted(set(dgl_exact.__all__) - set(names)), "edges": edges,
                          "same": names["GraphConv"] is dgl_exact.nn.GraphConv, "fns": fns,
                          "same_data": dgl_exact.data is sys.modules["dgl_exact.data"],
                          "listed": sorted(set(dgl_exact.__all__) - set(dir(dgl_exact)))}))
    """)
    assert out.pop("fns") == {"data": "load_dataset", "training": "dgl_exact.training",
                              "planning": "dgl_exact.planning", "bench": "dgl_exact.bench", "cli": "dgl_exact.cli",
                              "errors": "dgl_exact.errors"}
    assert out == {"light": [], "missing": [], "edges": 2, "same": True, "same_data": True, "listed": []}
