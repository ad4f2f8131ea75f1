"""Run PyTorch Geometric's own conv tests against dgl_exact.pyg's drop-ins.

Patching: before PyG's test files import them, ``torch_geometric.nn.<Conv>`` (and
``torch_geometric.nn.conv.<Conv>``) are replaced by ``dgl_exact.pyg.<Conv>`` for every conv with a drop-in
(``GCNConv``, ``SAGEConv``, ``GATConv``, ``GATv2Conv``, ``GCN2Conv``), so ``from torch_geometric.nn import GCNConv``
gets ours; everything else (PyG's utilities, ``gcn_norm``, other convs) stays PyG's. The test files
(``test/nn/conv/test_<conv>.py`` of a PyG source tree at the installed version, with its ``test/conftest.py``)
are copied into a scratch folder with a pytest plugin that patches and sets the compression. Nothing of PyG's
test code is changed or kept in this repository.

Get PyG's tests (any machine with the PyG repository; not downloaded by this script)::

    git clone https://github.com/pyg-team/pytorch_geometric /tmp/pyg-repo
    mkdir /tmp/pyg && git -C /tmp/pyg-repo archive 2.8.0.post1 test torch_geometric/__init__.py | tar -x -C /tmp/pyg
    python scripts/pyg_conv_tests.py --pyg-tests /tmp/pyg
    python scripts/pyg_conv_tests.py --pyg-tests /tmp/pyg --compression int2

``--no-patch`` runs the same files on PyG's own convs (the baseline); ``--convs`` picks some of the files.
Extra pytest arguments follow ``--``. Every constructor argument PyG's convs take is accepted by the drop-ins: a
setting without a compressed path (``decomposed_layers > 1``, SAGE's ``lstm``, MLP and multiple aggregations,
GAT's and GATv2's ``edge_dim``) runs PyG's code, what it saves compressed by :func:`dgl_exact.compress_saved`
(:func:`dgl_exact.pyg.pyg_code`); ``torch.jit.script`` compiles PyG's class over the drop-in's weights.

On PyG 2.8.0.post1's tests with PyG 2.8.1: 31 of 31 pass with ``--compression`` off, ``int2`` and ``int8``, as with
``--no-patch``. With ``FULL_TEST=1`` in the environment (PyG's full suite: it also scripts every conv) 27 of 31
pass, with and without ``--no-patch``: TorchScript fails on PyG's own ``GATConv`` and ``GATv2Conv`` there.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: conv -> its PyG test file (test/nn/conv/)
CONVS = {"GCNConv": "test_gcn_conv.py", "SAGEConv": "test_sage_conv.py", "GATConv": "test_gat_conv.py",
         "GATv2Conv": "test_gatv2_conv.py", "GCN2Conv": "test_gcn2_conv.py"}

PLUGIN = '''\
"""Loaded before PyG's conftest and test files (pytest -p): the drop-ins replace PyG's convs."""
import pytest
import torch_geometric.nn
import torch_geometric.nn.conv

import dgl_exact
import dgl_exact.pyg

CONVS = {convs!r}
COMPRESSION = {compression!r}
PATCH = {patch!r}

if PATCH:
    for _name in CONVS:
        setattr(torch_geometric.nn, _name, getattr(dgl_exact.pyg, _name))
        setattr(torch_geometric.nn.conv, _name, getattr(dgl_exact.pyg, _name))
    assert torch_geometric.nn.GCNConv is dgl_exact.pyg.GCNConv or "GCNConv" not in CONVS


@pytest.fixture(autouse=True)
def _dgl_exact_compression():
    cfg = (dgl_exact.CompressionConfig(enabled=False) if COMPRESSION == "off"
           else dgl_exact.CompressionConfig(bits=int(COMPRESSION[3:])))
    with dgl_exact.config(cfg):
        yield
'''


def installed_version() -> str:
    import torch_geometric

    return torch_geometric.__version__


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyg-tests", required=True, type=Path,
                        help="the root of a PyG source tree (holding test/nn/conv/) at the installed version")
    parser.add_argument("--convs", default=",".join(CONVS),
                        help=f"comma-separated, of {', '.join(CONVS)} (default: all)")
    parser.add_argument("--compression", default="off", choices=("off", "int1", "int2", "int4", "int8"))
    parser.add_argument("--no-patch", action="store_true", help="PyG's own convs (the baseline)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    convs = [c.strip() for c in args.convs.split(",") if c.strip()]
    unknown = [c for c in convs if c not in CONVS]
    if unknown or not convs:
        print(f"error: --convs {args.convs!r}: pick from {', '.join(CONVS)}", file=sys.stderr)
        return 2
    root = args.pyg_tests
    files = [root / "test" / "nn" / "conv" / CONVS[c] for c in convs]
    conftest = root / "test" / "conftest.py"
    missing = [str(f) for f in [*files, conftest] if not f.is_file()]
    if missing:
        print(f"error: {', '.join(missing)} not found: --pyg-tests must be the root of a PyG source tree (see "
              "this script's docstring)", file=sys.stderr)
        return 2
    try:
        installed = installed_version()
    except ImportError:
        print("error: torch_geometric is not installed: pip install 'dgl-exact[pyg]'", file=sys.stderr)
        return 2
    init = root / "torch_geometric" / "__init__.py"
    found = re.search(r"__version__ = ['\"]([^'\"]+)", init.read_text()) if init.is_file() else None
    if found is None:
        print(f"warning: cannot tell the version of {root} (no torch_geometric/__init__.py); installed: {installed}",
              file=sys.stderr)
    elif found.group(1).split(".")[:2] != installed.split(".")[:2]:
        print(f"warning: the tests are PyG {found.group(1)}'s, the installed PyG is {installed}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="pyg-conv-tests-") as tmp:
        work = Path(tmp)
        for f in files:
            shutil.copy(f, work / f.name)
        shutil.copy(conftest, work / "conftest.py")
        (work / "dgl_exact_pyg_patch.py").write_text(PLUGIN.format(convs=convs, compression=args.compression,
                                                                   patch=not args.no_patch))
        (work / "pytest.ini").write_text("[pytest]\n")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(work)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-p", "dgl_exact_pyg_patch",
               "-c", str(work / "pytest.ini"), "--rootdir", str(work), *[f.name for f in files], *args.pytest_args]
        which = "PyG's own convs" if args.no_patch else "dgl_exact.pyg's drop-ins"
        print(f"PyG conv tests on {which}, compression {args.compression}: {' '.join(cmd[3:])}", flush=True)
        return subprocess.call(cmd, cwd=work, env=env)


if __name__ == "__main__":
    sys.exit(main())
