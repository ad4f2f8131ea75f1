"""``scripts/dgl_tests_conftest.py``, the conftest with which ``scripts/dgl_ops_tests.py`` runs DGL's own tests
through dgl_exact, on a miniature of DGL's test layout (a ``backend`` package with DGL's ``allclose``, and
tests written the way DGL's ops tests are: dgl_exact's op on leaf tensors against a user-defined message
function). Its statistical comparison must pass quantization noise and fail a biased quantizer or a wrong
result."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("dgl")

ROOT = Path(__file__).resolve().parents[2]

BACKEND = '''\
import torch as th


def allclose(a, b, rtol=1e-4, atol=1e-4):
    return th.allclose(a.float().cpu(), b.float().cpu(), rtol=rtol, atol=atol)
'''

TESTS = '''\
import dgl
import dgl.ops
import numpy as np
import torch

import backend as F
import dgl_exact

g = dgl.graph((torch.tensor([0, 0, 1, 2, 3, 4, 4, 5]), torch.tensor([1, 2, 3, 3, 5, 0, 1, 2])))


def _both(udf_config=None):
    """DGL's pattern: the edge gradient of u_mul_e from dgl_exact's op (leaf inputs: kept exactly) and from a
    user-defined message function (its edge-sized product is kept compressed)."""
    x = torch.tensor(np.random.rand(6, 4) + 1, requires_grad=True)
    w = torch.tensor(np.random.rand(8, 4) + 1, requires_grad=True)
    dgl.ops.u_mul_e(g, x, w).sum().backward()
    ours = w.grad.clone()  # needs x gathered to the edges: kept exactly by dgl_exact's op, compressed in the UDF
    w.grad = None
    g.srcdata["x"], g.edata["w"] = x, w
    with dgl_exact.config(udf_config or dgl_exact.get_config()):
        g.apply_edges(lambda edges: {"m": edges.src["x"] * edges.data["w"]})
    g.edata["m"].sum().backward()
    return ours, w.grad


def test_exact():
    x = torch.tensor(np.random.rand(5, 3))
    assert F.allclose(x, x.clone())


def test_udf_gradient_with_noise():
    ours, udf = _both()
    assert F.allclose(ours, udf)


def test_noise_beside_infinities_and_an_asserted_difference():
    ours, udf = _both()
    assert not F.allclose(ours, udf + 1)
    inf = torch.full((1, 4), float("inf"), dtype=ours.dtype)
    assert F.allclose(torch.cat([ours, inf]), torch.cat([udf, inf]))


def test_udf_gradient_rounded_to_nearest():
    ours, udf = _both(dgl_exact.get_config().replace(stochastic=False))
    assert F.allclose(ours, udf)


def test_wrong_result():
    ours, udf = _both()
    assert F.allclose(ours, udf * 1.001)
'''


def _run(tmp_path, compression):
    work = tmp_path / compression
    (work / "backend").mkdir(parents=True)
    (work / "backend" / "__init__.py").write_text(BACKEND)
    (work / "test_mini.py").write_text(TESTS)
    shutil.copy(ROOT / "scripts" / "dgl_tests_conftest.py", work / "conftest.py")
    (work / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ, DGLBACKEND="pytorch", DGL_EXACT_TESTS_COMPRESSION=compression, DGL_EXACT_TESTS_DRAWS="32",
               PYTHONPATH=os.pathsep.join([str(work), str(ROOT)]))
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-p", "no:randomly", "-c", str(work / "pytest.ini"), "--rootdir", str(work), "test_mini.py"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300)
    results = dict((name, status) for status, name in re.findall(r"^(PASSED|FAILED) test_mini\.py::(\w+)",
                                                                  out.stdout, re.M))
    return results, out.stdout + out.stderr


@pytest.mark.parametrize("compression", ["int8", "off"])
def test_noise_passes_and_bias_fails(tmp_path, compression):
    results, log = _run(tmp_path, compression)
    expected = {"test_exact": "PASSED", "test_udf_gradient_with_noise": "PASSED", "test_wrong_result": "FAILED",
                "test_noise_beside_infinities_and_an_asserted_difference": "PASSED",
                # nearest rounding is biased: only the statistical comparison (compression on) can tell
                "test_udf_gradient_rounded_to_nearest": "FAILED" if compression == "int8" else "PASSED"}
    assert results == expected, log
    if compression == "int8":  # the noise needed the statistical comparison; the biased rounding failed it
        assert re.search(r"AssertionError: comparison 0, mean of 512 draws: t = inf", log), log
        assert re.search(r"int8: 1 tests passed with DGL's fixed tolerance, 1 failed before any statistical "
                         r"comparison; compared statistically \(alpha 0.001\): 2 passed \(.* draws\), 1 failed",
                         log), log
    else:
        assert "dgl_exact off: 4 tests passed with DGL's fixed tolerance, 1 failed\n" in log, log
