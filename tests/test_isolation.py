"""The suite's own guard (``tests/conftest.py``): every test starts from seeded generators, a test that leaves
dgl_exact's global state changed is restored and reported, and ``--reverse`` runs the tests backwards."""
import os

import pytest

pytest_plugins = ["pytester"]

CONFTEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")


@pytest.fixture
def suite(pytester):
    with open(CONFTEST, encoding="utf-8") as f:
        pytester.makeconftest(f.read())
    pytester.makepyfile(test_cases='''
import numpy as np
import torch

import dgl
import dgl_exact
from dgl_exact import kernels
from dgl_exact.ops import chunks

OPEN = []


def test_a_leaks_a_config():
    print("RUN a")
    dgl_exact.set_config(bits=1)


def test_b_leaks_a_context_variable():
    print("RUN b")
    chunks._chunk_scale.set(0.5)


def test_c_leaks_a_backend():
    print("RUN c")
    OPEN.append(kernels.use_backend("torch"))
    OPEN[-1].__enter__()  # never left (the reference keeps the scope from closing when collected)


def test_d_restores_what_it_changes():
    print("RUN d")
    with dgl_exact.config(bits=4), kernels.use_backend("torch"):
        pass
    chunks._chunk_scale.reset(chunks._chunk_scale.set(0.25))


def test_e_starts_from_the_defaults_and_the_seeded_generators():
    print("RUN e")
    assert dgl_exact.get_config() == dgl_exact.CompressionConfig() and chunks._chunk_scale.get() == 1.0
    assert getattr(kernels._local, "forced", None) is None
    assert torch.equal(torch.rand(3), torch.rand(3, generator=torch.Generator().manual_seed(0)))
    assert np.random.rand() == np.random.RandomState(0).rand()
    first = dgl.rand_graph(10, 20).edges()
    dgl.seed(0)
    again = dgl.rand_graph(10, 20).edges()
    assert all(torch.equal(a, b) for a, b in zip(first, again))
''')
    return pytester


def test_leaks_are_reported_and_restored(suite):
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "-n", "0", "-s")
    result.assert_outcomes(passed=5, errors=3)
    for name, leaked in (("a_leaks_a_config", "compression_config._global_config"),
                         ("b_leaks_a_context_variable", "dgl_exact.ops.chunks._chunk_scale"),
                         ("c_leaks_a_backend", "kernels forced")):
        result.stdout.fnmatch_lines([f"*ERROR at teardown of test_{name}*", f"*left global state changed*{leaked}*"])
    result.stdout.fnmatch_lines([f"*RUN {c}*" for c in "abcde"])    # e after the leaks: none reached it


def test_reverse_runs_the_tests_backwards(suite):
    result = suite.runpytest_inprocess("-p", "no:cacheprovider", "-n", "0", "-s", "--reverse")
    result.assert_outcomes(passed=5, errors=3)
    result.stdout.fnmatch_lines([f"*RUN {c}*" for c in "edcba"])
