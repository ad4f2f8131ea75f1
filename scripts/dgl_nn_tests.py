"""Run DGL's own nn tests for the four drop-in convs against dgl_exact's modules.

DGL's test file (``tests/python/pytorch/nn/test_nn.py`` of a DGL source tree, v2.1.0 for the DGL this
project pins) is copied into a scratch folder with its helpers (``tests/utils``, ``tests/backend``); a
``conftest.py`` there replaces ``dgl.nn.pytorch.GraphConv``, ``SAGEConv``, ``GATConv`` and ``GCN2Conv`` (and
their ``dgl.nn`` aliases) by dgl_exact's before the test file is imported, and sets the compression. Nothing
of DGL's test code is changed or kept in this repository.

Get DGL's tests (any machine with the DGL repository; not downloaded by this script)::

    git clone --branch v2.1.0 --depth 1 https://github.com/dmlc/dgl /tmp/dgl   # or: git archive v2.1.0 tests
    python scripts/dgl_nn_tests.py --dgl-tests /tmp/dgl/tests --compression off
    python scripts/dgl_nn_tests.py --dgl-tests /tmp/dgl/tests --compression int2

Selected: every test of the four convs (``graph_conv``, ``sage_conv``, ``gat_conv``, ``gcn2conv``) and
``hetero_conv`` (which wraps GraphConv/SAGEConv/GATConv). ``gatv2``/``egat``/``edgegat`` are other modules
and are excluded. Extra pytest arguments follow ``--``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SELECT = ("(graph_conv or sage_conv or gat_conv or gcn2conv or hetero_conv) "
          "and not gatv2 and not egat and not edgegat and not dense")

CONFTEST = '''\
import dgl_exact  # first: installs the import shim DGL needs on a modern torch
import dgl
import dgl.nn
import dgl.nn.pytorch
import dgl.nn.pytorch.conv

COMPRESSION = {compression!r}
if COMPRESSION == "off":
    dgl_exact.set_config(dgl_exact.CompressionConfig(enabled=False))
else:
    dgl_exact.set_config(dgl_exact.CompressionConfig(bits=int(COMPRESSION[3:])))

for _name in ("GraphConv", "SAGEConv", "GATConv", "GCN2Conv"):
    _ours = getattr(dgl_exact, _name)
    for _module in (dgl.nn, dgl.nn.pytorch, dgl.nn.pytorch.conv):
        setattr(_module, _name, _ours)
assert dgl.nn.pytorch.GraphConv is dgl_exact.GraphConv
'''


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dgl-tests", required=True, type=Path,
                        help="the tests/ folder of a DGL v2.1.0 source tree")
    parser.add_argument("--compression", default="off", choices=("off", "int1", "int2", "int4", "int8"))
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    src = args.dgl_tests
    test_file = src / "python" / "pytorch" / "nn" / "test_nn.py"
    if not test_file.is_file():
        parser.error(f"{test_file} does not exist: --dgl-tests must be the tests/ folder of a DGL source tree")
    with tempfile.TemporaryDirectory(prefix="dgl-nn-tests-") as tmp:
        work = Path(tmp)
        shutil.copy(test_file, work / "test_nn.py")
        shutil.copytree(src / "utils", work / "utils")
        shutil.copytree(src / "backend", work / "backend")
        (work / "conftest.py").write_text(CONFTEST.format(compression=args.compression))
        (work / "pytest.ini").write_text("[pytest]\n")
        env = dict(os.environ, DGLBACKEND="pytorch", PYTHONPATH=os.pathsep.join(
            [str(work)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(work / "pytest.ini"),
               "--rootdir", str(work), "-k", SELECT, "test_nn.py", *args.pytest_args]
        print(f"compression {args.compression}: {' '.join(cmd[3:])}", flush=True)
        return subprocess.call(cmd, cwd=work, env=env)


if __name__ == "__main__":
    sys.exit(main())
