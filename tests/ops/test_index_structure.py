"""Graph structures built from index tensors, without DGL (``IndexStructure`` of ops/index_structure.py): built from
edge endpoints, PyG's ``edge_index``, a CSC or a CSR (with or without edge ids), the graph ops take one in
place of a DGL graph and give the dense adjacency's results and gradients. Runs without DGL installed (the
CI's no-DGL job)."""
from __future__ import annotations

import pytest
import torch

import dgl_exact
from dgl_exact import CompressionConfig, ops
from dgl_exact.ops.index_structure import IndexStructure
from dgl_exact.ops.structure import structure_of

N_SRC, N_DST = 9, 7
OFF = CompressionConfig(enabled=False)


def _edges(n_src=N_SRC, n_dst=N_DST, e=30, seed=5):
    """Random edges in no order (repeated edges and nodes without in-edges included)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n_src, (e,), generator=g)
    dst = torch.randint(0, n_dst - 2, (e,), generator=g)  # the last two destinations have no in-edge
    return src, dst


def _dense(src, dst, w, n_src, n_dst):
    """``A[v, u]``: the summed weight of the edges ``u -> v``."""
    a = torch.zeros(n_dst, n_src, dtype=w.dtype)
    return a.index_put_((dst, src), w, accumulate=True)


def _builds(src, dst, n_src, n_dst):
    """The same graph built every way, each with the permutation from its edge ids to ``(src, dst)``'s edges
    (per-edge values are given in the structure's edge-id order)."""
    identity = torch.arange(src.numel())
    out = {"edges": (IndexStructure.from_edges(src, dst, n_src, n_dst), identity)}
    # a CSC and a CSR in stored order, without edge ids: edge e of the structure is stored edge e
    by_dst = torch.sort(dst, stable=True).indices
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(dst, minlength=n_dst).cumsum(0)])
    out["csc"] = (IndexStructure.from_csc(indptr, src[by_dst], n_src), by_dst)
    by_src = torch.sort(src, stable=True).indices
    indptr_r = torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(src, minlength=n_src).cumsum(0)])
    out["csr"] = (IndexStructure.from_csr(indptr_r, dst[by_src], n_dst), by_src)
    # with edge ids: stored edge p is edge eids[p], i.e. the edge ids are (src, dst)'s own
    out["csc+eids"] = (IndexStructure.from_csc(indptr, src[by_dst], n_src, eids=by_dst), identity)
    out["csr+eids"] = (IndexStructure.from_csr(indptr_r, dst[by_src], n_dst, eids=by_src), identity)
    return out


@pytest.mark.parametrize("build", ["edges", "csc", "csr", "csc+eids", "csr+eids"])
def test_weighted_sum_and_gradients_equal_the_dense_adjacency(build):
    src, dst = _edges()
    st, perm = _builds(src, dst, N_SRC, N_DST)[build]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N_SRC, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w_orig = torch.rand(src.numel(), dtype=torch.float64, generator=g)  # in (src, dst)'s edge order
    w = w_orig[perm].clone().requires_grad_(True)  # in the structure's edge-id order
    with dgl_exact.config(OFF):
        out = ops.u_mul_e_sum(st, x, w.unsqueeze(1))
    x_ref = x.detach().clone().requires_grad_(True)
    w_ref = w_orig.clone().requires_grad_(True)
    ref = _dense(src, dst, w_ref, N_SRC, N_DST) @ x_ref
    torch.testing.assert_close(out, ref)
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=g)
    out.backward(upstream)
    ref.backward(upstream)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(w.grad, w_ref.grad[perm])


@pytest.mark.parametrize("build", ["edges", "csc", "csr+eids"])
def test_copy_sum_mean_and_degrees(build):
    src, dst = _edges()
    st = _builds(src, dst, N_SRC, N_DST)[build][0]
    x = torch.randn(N_SRC, 3, 2, dtype=torch.float64, requires_grad=True)
    a = _dense(src, dst, torch.ones(src.numel(), dtype=torch.float64), N_SRC, N_DST)
    deg = a.sum(1)
    torch.testing.assert_close(st.in_degrees(), torch.bincount(dst, minlength=N_DST))
    torch.testing.assert_close(st.out_degrees(), torch.bincount(src, minlength=N_SRC))
    assert st.has_zero_in_degree
    with dgl_exact.config(OFF):
        total = ops.copy_u_sum(st, x)
        mean = ops.copy_u_mean(st, x)
    torch.testing.assert_close(total, torch.einsum("vu,uhd->vhd", a, x))
    torch.testing.assert_close(mean, torch.einsum("vu,uhd->vhd", a / deg.clamp(min=1)[:, None], x))
    (total.sum() + mean.sum()).backward()
    torch.testing.assert_close(x.grad, (a.sum(0) + (a / deg.clamp(min=1)[:, None]).sum(0))[:, None, None]
                               .expand_as(x))


def test_edge_softmax_over_each_destinations_in_edges():
    src, dst = _edges()
    st = IndexStructure.from_edge_index(torch.stack([src, dst]), N_SRC)
    e = torch.randn(src.numel(), 2, dtype=torch.float64)
    with dgl_exact.config(OFF):
        out = ops.edge_softmax(st, e)
    for v in range(N_SRC):
        into = dst == v
        if into.any():
            torch.testing.assert_close(out[into], torch.softmax(e[into], 0))


def test_compressed_feature_gradient_is_exact():
    """Under compression (INT2) the op keeps the node features compressed for the edge gradient and the edge
    weights exactly for the feature gradient: the feature gradient equals the dense one."""
    src, dst = _edges(e=200)
    st = IndexStructure.from_edges(src, dst, N_SRC, N_DST)
    x = torch.randn(N_SRC, 16, requires_grad=True)
    w = torch.rand(src.numel(), 1, requires_grad=True)
    with dgl_exact.config(CompressionConfig(bits=2)):
        out = ops.u_mul_e_sum(st, x, w)
    out.sum().backward()
    ref = _dense(src, dst, w.detach()[:, 0], N_SRC, N_DST).sum(0)[:, None].expand_as(x)
    torch.testing.assert_close(x.grad, ref, rtol=1e-5, atol=1e-5)
    assert w.grad.shape == w.shape and bool(torch.isfinite(w.grad).all())


def test_structure_is_its_own_structure_on_its_device():
    src, dst = _edges()
    st = IndexStructure.from_edges(src, dst, N_SRC, N_DST)
    assert structure_of(st, "cpu") is st
    with pytest.raises(ValueError, match="build it on the features' device"):
        structure_of(st, "meta")
    with pytest.raises(TypeError, match="no DGL graph index"):
        st.reverse_gidx


@pytest.mark.parametrize("bad, match", [
    (lambda: IndexStructure.from_edges(torch.tensor([0, 9]), torch.tensor([1, 2]), 9, 7), "outside the graph"),
    (lambda: IndexStructure.from_edges(torch.tensor([0, 1]), torch.tensor([-1, 2]), 9, 7), "outside the graph"),
    (lambda: IndexStructure.from_edges(torch.tensor([0.0]), torch.tensor([1.0]), 9, 7), "integer vectors"),
    (lambda: IndexStructure.from_edges(torch.tensor([0, 1]), torch.tensor([1]), 9, 7), "same length"),
    (lambda: IndexStructure.from_edge_index(torch.tensor([0, 1, 2]), 3), r"\[2, E\]"),
    (lambda: IndexStructure.from_csc(torch.tensor([0, 2, 1]), torch.tensor([0, 1]), 3), "rises from 0"),
    (lambda: IndexStructure.from_csc(torch.tensor([0, 1, 3]), torch.tensor([0, 1]), 3), "rises from 0"),
    (lambda: IndexStructure.from_csr(torch.tensor([0, 1, 2]), torch.tensor([0, 1]), 3, eids=torch.tensor([1, 1])),
     "each edge id"),
])
def test_malformed_indices_are_refused_with_what_to_fix(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()
