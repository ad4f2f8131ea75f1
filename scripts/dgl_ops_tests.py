"""Run DGL's own ops tests (and, with ``--suite nn``, its nn tests) with DGL routed through dgl_exact.

Routing: every public name of ``dgl.ops`` is replaced by dgl_exact's (``dgl.ops.<name> = dgl_exact.ops.<name>``,
before DGL's test files import them), and every test runs inside ``dgl_exact.message_passing()``, so DGL's
``update_all``/``apply_edges`` with built-in functions and ``edge_softmax`` run dgl_exact's ops too. The test
files (``tests/python/common/ops/test_ops.py`` and ``test_edge_softmax.py`` of a DGL v2.1.0 source tree, or
``tests/python/pytorch/nn/test_nn.py``) are copied into a scratch folder with their helpers (``tests/utils``,
``tests/backend``), beside ``scripts/dgl_tests_conftest.py`` as their ``conftest.py``: it does the routing,
sets the compression and, with compression on, judges a test that fails DGL's fixed ``allclose`` tolerance
statistically (its module doc: the test rerun on the same inputs, once exact and K times compressed, the own
run included; the draws' mean must be the exact result within DGL's tolerance plus Student t times the noise's
standard error, measured over the draws; alpha 1e-3 per test). Nothing of DGL's test code is changed or kept
in this repository.

Get DGL's tests (any machine with the DGL repository; not downloaded by this script)::

    git clone --branch v2.1.0 --depth 1 https://github.com/dmlc/dgl /tmp/dgl   # or: git archive v2.1.0 tests
    python scripts/dgl_ops_tests.py --dgl-tests /tmp/dgl/tests --compression off
    python scripts/dgl_ops_tests.py --dgl-tests /tmp/dgl/tests --compression int8
    python scripts/dgl_ops_tests.py --dgl-tests /tmp/dgl/tests --suite nn -- -k "gat_conv or graph_conv"

``--no-route`` runs the same files on DGL's own ops (the baseline); ``--draws K`` (default 32; 0: DGL's fixed
tolerance only). Extra pytest arguments follow ``--``. DGL's ops tests feed leaf tensors, which dgl_exact keeps
exactly; their reference side, user-defined message functions (``edges.src["x"] * edges.data["w"]``), forms
edge-sized products that the scope keeps compressed (:mod:`dgl_exact.ops.products`), so at INT8 the
references carry quantization noise (a step is 1/255 of a row's range) above DGL's fixed tolerance (1e-4).
Measured on the 2-core development machine (AMD EPYC, ``-n 2``), DGL 2.1.0, torch 2.13.0: of the 2,181 ops
tests DGL does not skip, all pass with compression off (42 s); at INT8, 1,953 pass with DGL's fixed tolerance
and the other 228 (the ``mul``/``dot`` SDDMM and ``u_mul_e_sum`` cases, four ``edge_softmax`` gradients)
statistically: 204 at 32 draws, 24 at 128 (140 s in all). The nn suite (``--suite nn``): 2,963 pass
with compression off and at INT8, all within DGL's fixed tolerance; its four ``subgraphx`` tests fail in DGL's
own SubgraphX on NumPy 2 (``int()`` of a 1-element array), with ``--no-route`` too.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SUITES = {"ops": ("python/common/ops/test_ops.py", "python/common/ops/test_edge_softmax.py"),
          "nn": ("python/pytorch/nn/test_nn.py",)}

CONFTEST = Path(__file__).with_name("dgl_tests_conftest.py")  # the routing, compression and comparison


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dgl-tests", required=True, type=Path,
                        help="the tests/ folder of a DGL v2.1.0 source tree")
    parser.add_argument("--suite", default="ops", choices=sorted(SUITES))
    parser.add_argument("--compression", default="off", choices=("off", "int1", "int2", "int4", "int8"))
    parser.add_argument("--no-route", action="store_true", help="DGL's own ops (the baseline)")
    parser.add_argument("--draws", type=int, default=32,
                        help="compressed draws behind the statistical comparison of a test that fails DGL's fixed "
                             "tolerance with compression on (default 32; 0: DGL's fixed tolerance only)")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)

    src = args.dgl_tests
    files = [src / rel for rel in SUITES[args.suite]]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        print(f"error: {', '.join(missing)} not found: --dgl-tests must be the tests/ folder of a DGL v2.1.0 source "
              "tree", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="dgl-ops-tests-") as tmp:
        work = Path(tmp)
        for f in files:
            shutil.copy(f, work / f.name)
        shutil.copytree(src / "utils", work / "utils")
        shutil.copytree(src / "backend", work / "backend")
        shutil.copy(CONFTEST, work / "conftest.py")
        (work / "pytest.ini").write_text("[pytest]\n")
        env = dict(os.environ, DGLBACKEND="pytorch", DGL_EXACT_TESTS_COMPRESSION=args.compression,
                   DGL_EXACT_TESTS_ROUTE="0" if args.no_route else "1", DGL_EXACT_TESTS_DRAWS=str(args.draws),
                   PYTHONPATH=os.pathsep.join(
            [str(work)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(work / "pytest.ini"),
               "--rootdir", str(work), *[f.name for f in files], *args.pytest_args]
        route = "DGL's own ops" if args.no_route else "routed through dgl_exact"
        print(f"{args.suite} tests, {route}, compression {args.compression}: {' '.join(cmd[3:])}", flush=True)
        return subprocess.call(cmd, cwd=work, env=env)


if __name__ == "__main__":
    sys.exit(main())
