"""``dgl-exact bench kernels``' graph rows (:mod:`dgl_exact.bench.graph_kernels`): the weighted sum on every
backend serving it, DGL's CPU kernel given the same weights, and the unweighted sum, all on one graph."""
from __future__ import annotations

import torch

from dgl_exact import kernels
from dgl_exact.bench.graph_kernels import SHAPES, graph_kernel_grid


class _Sink:
    def __init__(self):
        self.rows = []

    def add(self, row):
        self.rows.append(row)


def test_rows_per_shape_and_backend():
    sink = _Sink()
    rows = graph_kernel_grid(sink, "cpu", nodes=300, degree=5, cols=12, repeats=1, progress=False)
    assert rows == sink.rows and {r["setting"] for r in rows} == {s for s, _ in SHAPES}
    status = kernels.available_backends()
    for setting, _ in SHAPES:
        got = {(r["backend"], r["op"]) for r in rows if r["setting"] == setting}
        assert ("torch", "spmm_weighted_sum") in got
        assert (kernels.chosen("spmm_sum", "cpu"), "spmm_sum (no weights)") in got
        if status["numba"] == "available":
            assert ("numba", "spmm_weighted_sum") in got
        if status["dgl"] == "available":
            assert ("dgl (u_mul_e)", "spmm_weighted_sum") in got
    assert all(r["ms"] > 0 and r["GB_per_s"] > 0 and r["shape"].startswith("300 nodes x 5") for r in rows)


def test_fewer_features_than_heads_skips_the_multi_head_shape():
    rows = graph_kernel_grid(_Sink(), torch.device("cpu"), nodes=50, degree=2, cols=2, repeats=1, progress=False)
    assert {r["setting"] for r in rows} == {SHAPES[0][0]}
