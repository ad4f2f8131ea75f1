"""``ops.gat_attention`` (dgl_exact.ops.gat): GAT's fused attention against DGL's ops (float64), gradcheck with
attention dropout, what it keeps (no per-edge tensor), unbiased gradients under compression, and gradients from
row chunks equal to decoding the whole kept tensor."""
from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from dgl_exact import ops

import dgl  # noqa: E402  (after dgl_exact)
from tests.ops._helpers import (INT2, INT8, OFF, _dgl_graph, _edge_values, _feat, assert_mean_converges, close,
                                compress_calls, hidden, saved_tensors)

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------
# fused GAT attention
# ---------------------------------------------------------------------------------------------------
def _gat_reference(g, fs, fd, al, ar, slope, ew):
    el = (fs * al).sum(-1, keepdim=True)
    er = (fd * ar).sum(-1, keepdim=True)
    a = dgl.ops.edge_softmax(g, F.leaky_relu(dgl.ops.u_add_v(g, el, er), slope))
    if ew is not None:
        a = a * ew.view(-1, 1, 1)
    return dgl.ops.u_mul_e_sum(g, fs, a), a


@pytest.mark.parametrize("kind", ["graph", "zero_in", "block", "graph-int32", "zero_in-int32"])
@pytest.mark.parametrize("with_ew", [False, True], ids=["plain", "edge_weight"])
def test_gat_attention_matches_dgl_ops(kind, with_ew, graphs, kernel_path):
    g = graphs[kind]
    heads, d = 2, 3
    fs = _feat(g.num_src_nodes(), (heads, d), 1)
    fd_shared = kind == "block"
    fd = fs[: g.num_dst_nodes()] if fd_shared else _feat(g.num_dst_nodes(), (heads, d), 2)
    al, ar = _feat(1, (heads, d), 3), _feat(1, (heads, d), 4)
    ew = _edge_values(g, (), 5) if with_ew else None
    out, a = ops.gat_attention(g, fs, fd, al, ar, 0.2, 0.0, ew, True, OFF)
    ref_out, ref_a = _gat_reference(_dgl_graph(graphs, kind), fs, fd, al, ar, 0.2, ew)
    close(out, ref_out, "gat out")
    close(a, ref_a, "gat attention")
    r1, r2 = torch.randn(out.shape, dtype=torch.float64), torch.randn(a.shape, dtype=torch.float64)
    leaves = [fs, al, ar] + ([] if fd_shared else [fd]) + ([ew] if with_ew else [])
    ours = torch.autograd.grad((out * r1).sum() + (a * r2).sum(), leaves)
    theirs = torch.autograd.grad((ref_out * r1).sum() + (ref_a * r2).sum(), leaves)
    for x, y in zip(ours, theirs):
        close(x, y, "gat grad")


def test_gat_attention_gradcheck_with_dropout(graphs):
    """attn_drop in training: the mask is regenerated from its seed in backward (same seed: same function)."""
    g = graphs["zero_in"]
    fs, al, ar = _feat(g.num_nodes(), (2, 2), 1), _feat(1, (2, 2), 2), _feat(1, (2, 2), 3)
    ew = _edge_values(g, (), 4)

    def fn(fs, al, ar, ew):
        torch.manual_seed(11)
        out, a = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.4, ew, True, OFF)
        return out, a

    assert torch.autograd.gradcheck(fn, (fs, al, ar, ew), eps=1e-6, atol=1e-7)
    torch.manual_seed(11)
    _, a1 = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.4, None, True, OFF)
    torch.manual_seed(12)
    _, a2 = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.4, None, True, OFF)
    assert not torch.equal(a1, a2) and bool(((a1 == 0).sum() > 0))
    _, a_eval = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.4, None, False, OFF)
    close(a_eval, _gat_reference(g, fs, fs, al, ar, 0.2, None)[1], "no dropout outside training")


def test_gat_attention_keeps_no_per_edge_tensor(graphs, kernel_path, monkeypatch):
    g = graphs["graph"]
    n, e = g.num_nodes(), g.num_edges()
    fs = hidden(torch.randn(n, 2, 4, requires_grad=True))
    al, ar = torch.randn(1, 2, 4, requires_grad=True), torch.randn(1, 2, 4, requires_grad=True)
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        out, _ = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.3, None, True, INT8)
    # the source features, twice with independent noise (unbiased attention-vector gradients; not shared)
    assert [c.shape for c in made] == [(n, 2, 4), (n, 2, 4)]
    assert not any(t.dim() > 0 and t.shape[0] == e for t in kept)
    float_kept = [t for t in kept if t.is_floating_point() and t.dtype != torch.bfloat16]
    assert sorted(tuple(t.shape) for t in float_kept if t.data_ptr() not in (al.data_ptr(), ar.data_ptr())) == \
        [(n, 2), (n, 2)]  # el and er
    out.sum().backward()
    # attention vectors frozen: a single compressed copy is enough (new features: the first call's copies are
    # still held here, and rule 6 would share them)
    fs = hidden(torch.randn(n, 2, 4, requires_grad=True))
    with compress_calls(monkeypatch) as made:
        ops.gat_attention(g, fs, fs, al.detach(), ar.detach(), 0.2, 0.0, None, True, INT8)
    assert len(made) == 1


@pytest.mark.parametrize("cfg", [INT2, INT2.replace(kept_frac=0.5)], ids=["int2", "int2-kf0.5"])
def test_gat_attention_vector_gradients_unbiased(cfg, graphs):
    """The attention vectors' gradient multiplies the features by a gradient linear in the (decompressed)
    features: from one compressed copy it is biased (E[x_hat x_hat^T] != x x^T, ~100% of the gradient
    with projection). Averaged over K independent compressions it must converge to the exact gradient."""

    g = graphs["graph"]
    torch.manual_seed(0)
    base = torch.randn(g.num_nodes(), 2, 4) * 2
    al, ar = torch.randn(1, 2, 4, requires_grad=True), torch.randn(1, 2, 4, requires_grad=True)
    r = torch.randn(g.num_nodes(), 2, 4)

    def attn_grads(c, seed):
        torch.manual_seed(seed)
        fs = hidden(base.clone().requires_grad_())
        out, _ = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.0, None, True, c)
        return torch.cat([t.flatten() for t in torch.autograd.grad((out * r).sum(), [al, ar])]).double()

    assert_mean_converges([attn_grads(cfg, 100 + i) for i in range(160)], attn_grads(OFF, 0))


def test_gat_attention_second_copy_through_the_linear_unbiased(monkeypatch):
    """Features made by dgl_exact's linear, parameters as attention vectors: the second copy is the linear's kept
    input (ownership rule 10, no compression of its own), and the attention vectors' gradients averaged over K
    draws converge to the exact ones (Student t bound per element, Bonferroni over the elements; a float32
    rounding floor for elements whose exact value is zero up to rounding: a head whose scores all pass leaky
    ReLU's positive side has an ``er`` gradient of exactly zero in exact arithmetic). A graph of its own, seeded
    with torch's generator (``dgl.rand_graph`` draws from DGL's, unseeded: another graph in every process), so
    the draws are the same in every run."""
    from dgl_exact.ops.dense import linear
    from dgl_exact.ops.keep import LinearOf
    from dgl_exact.ops.saved import load_kept

    gen = torch.Generator().manual_seed(0)
    g = dgl.add_self_loop(dgl.graph((torch.randint(0, 24, (70,), generator=gen),
                                     torch.randint(0, 24, (70,), generator=gen)), num_nodes=24))
    torch.manual_seed(0)
    base = torch.randn(g.num_nodes(), 5) * 2
    w = torch.nn.Parameter(torch.randn(8, 5))
    al, ar = torch.nn.Parameter(torch.randn(1, 2, 4)), torch.nn.Parameter(torch.randn(1, 2, 4))
    r = torch.randn(g.num_nodes(), 2, 4)

    def attn_grads(c, seed, check=False):
        torch.manual_seed(seed)
        with compress_calls(monkeypatch) as made:
            fs = linear(hidden(base.clone().requires_grad_()), w, None, config=c).view(-1, 2, 4)
            out, _ = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.0, None, True, c)
        if check:
            kept = load_kept(out.grad_fn)
            assert isinstance(kept[1], LinearOf) and len(made) == 2  # the linear's copy and the first copy
        return torch.cat([t.flatten() for t in torch.autograd.grad((out * r).sum(), [al, ar])]).double()

    exact = attn_grads(OFF, 0)
    attn_grads(INT2, 1, check=True)
    assert_mean_converges([attn_grads(INT2, 100 + i) for i in range(320)], exact, floor=1e-5, mean_square=None)


@pytest.mark.parametrize("cfg", [INT2, INT2.replace(block_rows=64, levels="optimal")], ids=["int2", "blocks"])
def test_gat_attention_gradients_from_row_chunks_equal_whole_decoding(cfg):
    """The backward decodes the second compressed copy row chunk by row chunk (no whole copy): the same
    gradients as one chunk, for features of both ends and both attention vectors (same compression draws)."""
    from dgl_exact.ops import chunks as chunking

    gen = torch.Generator().manual_seed(0)
    g = dgl.add_self_loop(dgl.graph((torch.randint(0, 1000, (6000,), generator=gen),
                                     torch.randint(0, 1000, (6000,), generator=gen)), num_nodes=1000))
    torch.manual_seed(0)
    base = torch.randn(g.num_nodes(), 3, 8)
    al, ar = torch.randn(1, 3, 8, requires_grad=True), torch.randn(1, 3, 8, requires_grad=True)
    r = torch.randn(g.num_nodes(), 3, 8)

    def grads(scale):
        with chunking.sample_chunking(scale):
            torch.manual_seed(5)
            fs = hidden(base.clone().requires_grad_())
            out, _ = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.0, None, True, cfg)
            return torch.autograd.grad((out * r).sum(), [fs, al, ar])

    assert chunking.chunk_rows(1000, 24, "cpu", 64) >= 1000  # the default: one chunk at this size
    with chunking.sample_chunking(0.001):
        assert chunking.chunk_rows(1000, 24, "cpu", 64) < 500  # several chunks
    for x, y in zip(grads(1.0), grads(0.001)):  # fp32 sums over 1000 rows in another order
        assert float((x - y).norm()) <= 1e-5 * float(y.norm()), (x - y).abs().max()
