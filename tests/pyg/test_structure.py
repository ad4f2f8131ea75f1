import gc

import pytest
import torch

pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

from dgl_exact.pyg import structure as pyg_structure  # noqa: E402
from dgl_exact.pyg.structure import EdgeStructure, edge_structure  # noqa: E402
from tests.pyg._helpers import random_graph  # noqa: E402


def _dense(src, dst, n_src, n_dst, w=None):
    w = torch.ones(src.numel()) if w is None else w
    return torch.zeros(n_dst, n_src).index_put_((dst, src), w, accumulate=True)


@pytest.mark.parametrize("bipartite", [False, True])
def test_aggregations_match_dense_adjacency(bipartite):
    torch.manual_seed(0)
    ei = random_graph(20)
    n_src, n_dst = (20, 25) if bipartite else (20, 20)
    st = EdgeStructure(ei[0], ei[1], n_src, n_dst, "cpu")
    a = _dense(ei[0], ei[1], n_src, n_dst)
    w = torch.rand(ei.shape[1], 2)
    x = torch.randn(n_src, 2, 3)
    g = torch.randn(n_dst, 2, 3)
    torch.testing.assert_close(st.aggregate(x), torch.einsum("vu,uhd->vhd", a, x))
    torch.testing.assert_close(st.aggregate(g, transpose=True), torch.einsum("vu,vhd->uhd", a, g))
    for h in range(2):
        aw = _dense(ei[0], ei[1], n_src, n_dst, w[:, h])
        torch.testing.assert_close(st.aggregate(x, w)[:, h], aw.matmul(x[:, h]))
        torch.testing.assert_close(st.aggregate(g, w, transpose=True)[:, h], aw.t().matmul(g[:, h]))
    torch.testing.assert_close(st.edge_dot(x, g), (x[ei[0]] * g[ei[1]]).sum(-1))
    torch.testing.assert_close(st.in_degrees(), a.sum(1).long())
    torch.testing.assert_close(st.out_degrees(), a.sum(0).long())
    assert st.has_zero_in_degree


def test_cache_per_edge_index_object():
    pyg_structure.clear_cache()
    ei = random_graph(20)
    calls = []

    def endpoints(ei=ei):
        calls.append(1)
        return ei[0], ei[1]

    first = edge_structure(ei, "as_is", 20, 20, "cpu", endpoints)
    assert edge_structure(ei, "as_is", 20, 20, "cpu", endpoints) is first and len(calls) == 1
    assert edge_structure(ei, "other", 20, 20, "cpu", endpoints) is not first and len(calls) == 2
    assert edge_structure(ei.clone(), "as_is", 20, 20, "cpu", endpoints) is not first  # another tensor
    ei[0, 0] = (ei[0, 0] + 1) % 20  # edited in place: a new graph
    assert edge_structure(ei, "as_is", 20, 20, "cpu", endpoints) is not first
    del ei, endpoints
    gc.collect()
    assert pyg_structure.cache_size() == 0  # held weakly: the entries died with their tensors


def test_structure_does_not_keep_its_key_alive():
    pyg_structure.clear_cache()
    ei = random_graph(20)
    st = edge_structure(ei, "as_is", 20, 20, "cpu", lambda e=ei: (e[0], e[1]))
    del ei
    gc.collect()
    assert pyg_structure.cache_size() == 0
    assert st.num_edges > 0 and st.csc[0].numel() == 21  # the structure itself stays usable


def test_multi_head_sum_and_edge_dot_in_pieces(monkeypatch):
    """On the reference kernel: the weighted multi-head sum head by head and the edge dot products in edge
    ranges give the kernel's results."""
    from dgl_exact.ops import chunks as chunking

    torch.manual_seed(0)
    ei = random_graph(20, e=200)
    st = EdgeStructure(ei[0], ei[1], 20, 20, "cpu")
    x, g, w = torch.randn(20, 3, 4), torch.randn(20, 3, 4), torch.rand(ei.shape[1], 3)
    a = [_dense(ei[0], ei[1], 20, 20, w[:, h]) for h in range(3)]
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 50)  # edge ranges of 4 edges
    torch.testing.assert_close(st.aggregate(x, w), torch.stack([a[h].matmul(x[:, h]) for h in range(3)], 1))
    torch.testing.assert_close(st.aggregate(g, w, transpose=True),
                               torch.stack([a[h].t().matmul(g[:, h]) for h in range(3)], 1))
    torch.testing.assert_close(st.edge_dot(x, g), (x[ei[0]] * g[ei[1]]).sum(-1))
