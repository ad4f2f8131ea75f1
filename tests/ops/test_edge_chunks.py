"""GAT's attention in edge chunks (dgl_exact.ops.edge_chunks): the same forward and gradients as over all edges
at once, for any chunk budget (down to one edge, below a destination's degree), with isolated nodes, several
heads, edge weights, blocks and the device kernels' path; against DGL's GATConv; fallbacks."""
import pytest
import torch

import dgl_exact  # noqa: F401  (before dgl)
import dgl
from dgl_exact import ops
from dgl_exact.compression_config import CompressionConfig
from dgl_exact.ops.edge_chunks import chunk_bounds, edge_chunk_budget, edge_chunks
from dgl_exact.ops.structure import device_kernels_only

OFF = CompressionConfig(enabled=False)


def _graph(seed=0):
    """60 nodes, random edges, node 3 with 50 extra in-edges (a degree above small budgets), nodes 55-59
    isolated."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 55, (400,), generator=gen)
    dst = torch.randint(0, 55, (400,), generator=gen)
    src = torch.cat([src, torch.randint(0, 55, (50,), generator=gen)])
    dst = torch.cat([dst, torch.full((50,), 3)])
    return dgl.graph((src, dst), num_nodes=60)


def _run(g, budget, heads=3, edge_weight=None, cfg=OFF, feat=None, get_attention=True):
    torch.manual_seed(1)
    conv = dgl_exact.GATConv(8, 5, num_heads=heads, allow_zero_in_degree=True, compression=cfg)
    x = torch.randn(g.num_src_nodes(), 8) if feat is None else feat.clone()
    x.requires_grad_(True)
    w = None if edge_weight is None else edge_weight.clone().requires_grad_(True)
    with edge_chunks(budget):
        res = conv(g, x, edge_weight=w, get_attention=get_attention)
    out, att = res if get_attention else (res, None)
    torch.manual_seed(2)
    loss = (out * torch.randn_like(out)).sum()
    if att is not None:
        loss = loss + (att * torch.randn_like(att)).sum()
    loss.backward()
    grads = [x.grad] + [p.grad for p in conv.parameters()] + ([w.grad] if w is not None else [])
    return out.detach(), None if att is None else att.detach(), grads


def _assert_same(ref, got, atol=1e-5):
    torch.testing.assert_close(got[0], ref[0], atol=atol, rtol=1e-5)
    if ref[1] is not None:
        torch.testing.assert_close(got[1], ref[1], atol=atol, rtol=1e-5)
    assert len(ref[2]) == len(got[2])
    for a, b in zip(ref[2], got[2]):
        torch.testing.assert_close(b, a, atol=atol, rtol=1e-5)


def test_chunk_bounds_cover_rows_and_isolate_high_degrees():
    indptr = torch.tensor([0, 2, 2, 12, 13, 15, 15])  # row 2 has degree 10
    bounds = chunk_bounds(indptr, 4)
    assert bounds[0][0] == 0 and bounds[-1][1] == 6
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert (2, 3) in bounds  # the row above the budget alone
    for r0, r1 in bounds:
        assert r1 - r0 == 1 or int(indptr[r1] - indptr[r0]) <= 4


@pytest.mark.parametrize("heads,budget", [(3, 1), (1, 7), (3, 40), (3, 449)])
def test_chunked_equals_unchunked(heads, budget):
    g = _graph()
    _assert_same(_run(g, None, heads), _run(g, budget, heads))


@pytest.mark.parametrize("shape", ["scalar", "per_head"])
def test_chunked_edge_weights(shape):
    g = _graph()
    gen = torch.Generator().manual_seed(3)
    w = torch.rand(g.num_edges(), 1 if shape == "scalar" else 3, generator=gen) + 0.1
    _assert_same(_run(g, None, 3, w), _run(g, 9, 3, w))


def test_chunked_block_and_bipartite_features():
    g = _graph()
    block = dgl.to_block(dgl.in_subgraph(g, torch.arange(30)), torch.arange(30))
    _assert_same(_run(block, None), _run(block, 11))


def test_chunked_compressed_same_kept_tensors():
    """INT2: the chunked op makes the same keep calls, so the same compressed copies serve backward."""
    g = _graph()
    cfg = CompressionConfig(bits=2)
    _assert_same(_run(g, None, cfg=cfg), _run(g, 13, cfg=cfg), atol=1e-4)


def test_chunked_device_kernels_path():
    g = _graph()
    with device_kernels_only():
        _assert_same(_run(g, None), _run(g, 6))


def test_chunked_without_attention_output():
    g = _graph()
    ref, got = _run(g, None, get_attention=False), _run(g, 10, get_attention=False)
    _assert_same(ref, got)
    with edge_chunks(10):
        out, att = ops.gat_attention(g, torch.randn(60, 2, 4), torch.randn(60, 2, 4), torch.randn(1, 2, 4),
                                     torch.randn(1, 2, 4), need_attention=False)
    assert att is None and out.shape == (60, 2, 4)


def test_chunked_matches_dgl_gatconv():
    g = dgl.add_self_loop(_graph())
    torch.manual_seed(4)
    ref = dgl.nn.GATConv(8, 5, num_heads=3)
    ours = dgl_exact.GATConv(8, 5, num_heads=3, compression=OFF)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(60, 8)
    xr, xo = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out_ref = ref(g, xr)
    with edge_chunks(17):
        out = ours(g, xo)
    torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
    go = torch.randn_like(out)
    out_ref.backward(go)
    out.backward(go)
    torch.testing.assert_close(xo.grad, xr.grad, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_chunked_folded_features():
    g = _graph()
    gen = torch.Generator().manual_seed(5)
    fs = torch.randn(60, 2, 3, 4, generator=gen)
    al, ar = torch.randn(1, 3, 4, generator=gen), torch.randn(1, 3, 4, generator=gen)
    ref = ops.gat_attention(g, fs, fs, al, ar)
    with edge_chunks(8):
        got = ops.gat_attention(g, fs, fs, al, ar)
    for a, b in zip(ref, got):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


def test_double_backward_exact_and_refused_when_compressed():
    g = _graph()
    gen = torch.Generator().manual_seed(6)
    results = []
    for budget in (None, 12):
        fs = torch.randn(60, 2, 4, generator=torch.Generator().manual_seed(7)).requires_grad_(True)
        al = torch.randn(1, 2, 4, generator=torch.Generator().manual_seed(8)).requires_grad_(True)
        with edge_chunks(budget):
            out, _ = ops.gat_attention(g, fs * 1.0, fs * 1.0, al, al, config=OFF, need_attention=False)
        (gfs,) = torch.autograd.grad(out.pow(2).sum(), fs, create_graph=True)
        (gal,) = torch.autograd.grad(gfs.pow(2).sum(), al)
        results.append((gfs.detach(), gal))
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    fs = torch.randn(60, 2, 4, generator=gen).requires_grad_(True)
    al = torch.randn(1, 2, 4, generator=gen).requires_grad_(True)
    with edge_chunks(12):
        out, _ = ops.gat_attention(g, fs * 1.0, fs * 1.0, al, al, config=CompressionConfig(bits=2),
                                   need_attention=False)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(out.pow(2).sum(), fs, create_graph=True)


def test_attention_dropout_runs_over_all_edges():
    """Attention dropout draws its mask over all edges: chunking does not apply (the same result)."""
    g = _graph()
    from dgl_exact.ops.gat import attention_chunk_budget
    from dgl_exact.ops.structure import structure_of

    st = structure_of(g, torch.device("cpu"))
    with edge_chunks(10):
        assert attention_chunk_budget(st, 0.5) is None
        assert attention_chunk_budget(st, 0.0) == 10
    with edge_chunks(None):
        assert edge_chunk_budget() is None and attention_chunk_budget(st, 0.0) is None
    with pytest.raises(ValueError):
        with edge_chunks(0):
            pass


def test_default_chunks_only_where_edge_tensors_dominate():
    """Outside any ``edge_chunks`` scope the default budget applies only where the per-edge tensors outweigh
    the node-sized ones (more than ``EDGE_DOMINANCE * N_src * D`` edges): a dense graph is chunked, an
    ogbn-arxiv-like one (14 edges per node, 128-wide heads) is not; an explicit scope always decides."""
    from dgl_exact.ops.edge_chunks import DEFAULT_EDGE_CHUNK, EDGE_DOMINANCE, chunk_budget_for

    dense = (20000 * 400, 20000, 128)
    arxiv = (2_484_941, 169_343, 128)
    assert dense[0] > EDGE_DOMINANCE * dense[1] * dense[2] and chunk_budget_for(*dense) == DEFAULT_EDGE_CHUNK
    assert chunk_budget_for(*arxiv) is None
    assert chunk_budget_for(DEFAULT_EDGE_CHUNK, 10, 1) is None  # one chunk would hold every edge
    with edge_chunks(1000):
        assert chunk_budget_for(*arxiv) == 1000 and chunk_budget_for(999, 10, 1) is None
    with edge_chunks(None):
        assert chunk_budget_for(*dense) is None


def test_planner_sample_runs_the_full_graphs_chunks():
    """In a planner's sample run (a graph ``s`` times the full one) the chunking decision is the full graph's
    and the budget is ``s`` times the full one: the sample runs as many chunks as the full graph, so its
    memory timeline extrapolates (unchunked samples made the planner predict 131 MiB for a measured 88)."""
    from dgl_exact.ops.edge_chunks import DEFAULT_EDGE_CHUNK, chunk_budget_for
    from dgl_exact.ops.chunks import sample_chunking

    dense, s = (20000 * 400, 20000, 128), 0.01
    sample = (int(dense[0] * s), int(dense[1] * s), 128)  # 80,000 edges: fewer than one default chunk
    assert chunk_budget_for(*sample) is None
    with sample_chunking(s, 16):
        assert chunk_budget_for(*sample) == round(DEFAULT_EDGE_CHUNK * s)
        assert chunk_budget_for(int(2_484_941 * s), int(169_343 * s), 128) is None  # arxiv-like: not chunked
        with edge_chunks(1000):  # an explicit budget: decided and scaled the same way
            assert chunk_budget_for(12, 5, 1) == 10 and chunk_budget_for(9, 5, 1) is None
