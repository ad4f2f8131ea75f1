"""The ``numba`` backend's graph kernel (``spmm_weighted_sum``, CPU) against the torch reference, and against
DGL's own CPU kernel, whose order of summation and rounding it follows (bit for bit where DGL is installed)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba")

from dgl_exact import kernels  # noqa: E402
from dgl_exact.kernels import numba_kernels as NC  # noqa: E402
from dgl_exact.kernels import reference as R  # noqa: E402


def _csc(n_src: int, n_dst: int, edges: int, positional: bool, idx_dtype, seed: int):
    """A random multigraph's CSC (destinations as rows; some rows empty), with its edge ids: positional
    (``eids`` None) or a permutation, as DGL's CSC of a graph built from a COO stores them."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n_src, (edges,), generator=g)
    dst = torch.randint(0, max(1, n_dst - 3), (edges,), generator=g)  # the last rows have no in-edge
    order = torch.argsort(dst, stable=True)
    indptr = torch.zeros(n_dst + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.bincount(dst, minlength=n_dst), 0)
    eids = None if positional else order.to(idx_dtype)
    return indptr.to(idx_dtype), src[order].to(idx_dtype), eids, src, dst


@pytest.mark.parametrize("positional", [True, False])
@pytest.mark.parametrize("heads,dim", [(1, 33), (3, 16)])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_sum_matches_reference(positional, heads, dim, idx_dtype, dtype):
    """On two threads (enough edges to split into parts), with empty rows and a bipartite shape."""
    indptr, indices, eids, _, _ = _csc(700, 900, 30_000, positional, idx_dtype, seed=heads + dim)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(700, heads, dim, generator=g, dtype=dtype)
    w = torch.randn(30_000, heads, generator=g, dtype=dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = NC.get_ops("cpu").spmm_weighted_sum(indptr, indices, eids, x, w, 900)
    finally:
        torch.set_num_threads(threads)
    want = R.spmm_weighted_sum(indptr, indices, eids, x, w, 900)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)  # the reference's sparse product sums in another order
    assert torch.equal(got[-3:], torch.zeros_like(got[-3:]))


def test_one_weight_for_every_head():
    """``w [E, 1]`` weighs every head alike (GraphConv's edge norm on ``[N, A, B]`` features)."""
    indptr, indices, eids, _, _ = _csc(300, 200, 5000, False, torch.int64, seed=4)
    x, w = torch.randn(300, 3, 5), torch.rand(5000, 1)
    got = NC.get_ops("cpu").spmm_weighted_sum(indptr, indices, eids, x, w, 200)
    torch.testing.assert_close(got, R.spmm_weighted_sum(indptr, indices, eids, x, w, 200))


def test_shapes_are_checked_before_the_kernel_reads():
    """The kernel reads without bounds checks: a weight tensor of the wrong shape is refused first."""
    ops = NC.get_ops("cpu")
    indptr, indices, eids, _, _ = _csc(30, 20, 100, True, torch.int64, seed=6)
    x = torch.randn(30, 3, 4)
    for w in (torch.rand(100, 2), torch.rand(99, 3), torch.rand(100)):
        with pytest.raises(ValueError, match="spmm_weighted_sum"):
            ops.spmm_weighted_sum(indptr, indices, eids, x, w, 20)
    with pytest.raises(ValueError, match="spmm_weighted_sum"):
        ops.spmm_weighted_sum(indptr, indices, eids, x, torch.rand(100, 3), 21)


def test_weighted_sum_edge_cases():
    ops = NC.get_ops("cpu")
    indptr, indices, eids, _, _ = _csc(5, 4, 0, True, torch.int64, seed=0)
    x, w = torch.randn(5, 2, 3), torch.randn(0, 2)
    assert torch.equal(ops.spmm_weighted_sum(indptr, indices, eids, x, w, 4), torch.zeros(4, 2, 3))
    # half precision: the reference serves (no fp16/bf16 kernel), same contract
    indptr, indices, eids, _, _ = _csc(50, 40, 400, False, torch.int64, seed=2)
    x, w = torch.randn(50, 1, 8).half(), torch.rand(400, 1).half()
    want = R.spmm_weighted_sum(indptr, indices, eids, x, w, 40)
    torch.testing.assert_close(ops.spmm_weighted_sum(indptr, indices, eids, x, w, 40), want)
    with pytest.raises(ValueError, match="edge weights"):
        R.spmm_weighted_sum(indptr, indices, eids, x, None, 40)


def test_weighted_sum_is_dgls_bit_for_bit():
    """The numba kernel sums in DGL's order with DGL's rounding: switching a model between the two changes
    no bit of its aggregations."""
    dgl = pytest.importorskip("dgl")
    from dgl_exact.kernels import dgl_graph

    if dgl_graph.load() is not None:
        pytest.skip("DGL's kernels are not importable")
    _, _, _, src, dst = _csc(3000, 3000, 60_000, True, torch.int64, seed=5)
    graph = dgl.graph((src, dst), num_nodes=3000)
    indptr, indices, eids = graph.adj_tensors("csc")
    g = torch.Generator().manual_seed(3)
    for heads, dim in ((1, 64), (3, 16)):
        x, w = torch.randn(3000, heads, dim, generator=g), torch.randn(60_000, heads, generator=g)
        got = NC.get_ops("cpu").spmm_weighted_sum(indptr, indices, eids, x, w, 3000)
        assert torch.equal(got, dgl_graph.spmm_sum(graph._graph, x, w, 3000))


def test_registry_serves_weighted_sums_with_numba_on_the_cpu():
    """DGL's kernel serves the unweighted sum, numba's the weighted one; CUDA tensors never reach numba's."""
    status = kernels.available_backends()
    assert kernels.chosen("spmm_weighted_sum", "cpu") == "numba"
    if status["dgl"] == "available":
        assert kernels.chosen("spmm_sum", "cpu") == "dgl"
    fn, devices = kernels._REGISTRY["spmm_weighted_sum"]["numba"]
    assert devices == ("cpu",)
