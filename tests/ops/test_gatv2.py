"""``ops.gatv2.gatv2_attention`` (dgl_exact.ops.gatv2) on structures built from index tensors (no DGL): the attention
and its gradients (float64 gradcheck, compression off) against torch's ops, what it keeps (no fp32 per-edge feature
tensor), and its shape errors. Unbiasedness at INT2 is tested through the PyG drop-in (tests/pyg/test_gatv2_conv.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact.ops.gatv2 import gatv2_attention
from dgl_exact.ops.index_structure import IndexStructure

OFF = dgl_exact.CompressionConfig(enabled=False)
INT2 = dgl_exact.CompressionConfig(bits=2)


def _graph(n_src=12, n_dst=9, e=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n_src, (e,), generator=g), torch.randint(0, n_dst - 2, (e,), generator=g)
    return IndexStructure.from_edges(src, dst, n_src, n_dst), src, dst  # the last two destinations: no in-edge


def _reference(src, dst, n_dst, x_l, x_r, att, slope):
    e = (F.leaky_relu(x_l[src] + x_r[dst], slope) * att).sum(-1)
    e = e - e.max()  # a constant shift: the softmax is unchanged
    w = e.exp()
    return w / torch.zeros(n_dst, w.shape[1], dtype=w.dtype).index_add_(0, dst, w)[dst]


@pytest.mark.parametrize("same", [False, True], ids=["pair", "shared"])
def test_values_and_gradients(same):
    n = 10 if same else 12
    st, src, dst = _graph(n_src=n, n_dst=n if same else 9)
    torch.manual_seed(0)
    x_l = torch.randn(st.num_src, 2, 3, dtype=torch.float64, requires_grad=True)
    x_r = x_l if same else torch.randn(st.num_dst, 2, 3, dtype=torch.float64, requires_grad=True)
    att = torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    expected = _reference(src, dst, st.num_dst, x_l, x_r, att, 0.3)
    torch.testing.assert_close(gatv2_attention(st, x_l, x_r, att, 0.3, config=OFF), expected)
    inputs = (x_l, att) if same else (x_l, x_r, att)

    def fn(*t):
        return gatv2_attention(st, t[0], t[0] if same else t[1], t[-1], 0.3, config=OFF)

    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


def test_keeps_bits_not_edge_features():
    """At INT2 the per-edge feature tensor [E, H, C] is kept as one bit per element; fp32 per edge: the attention."""
    st, _, _ = _graph(e=400)
    x_l0 = torch.randn(st.num_src, 4, 16, requires_grad=True)
    x_l, x_r = x_l0 * 1.0, torch.randn(st.num_dst, 4, 16) * 1.0  # activations: kept by the op itself
    att = torch.randn(1, 4, 16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        alpha = gatv2_attention(st, x_l, x_r, att, config=INT2)
    edge_bytes = 400 * 4 * 16 * 4
    assert sum(t.numel() * t.element_size() for t in saved if t is not att) < edge_bytes / 8
    (alpha * torch.randn_like(alpha)).sum().backward()  # from the kept bits and codes
    assert x_l0.grad.abs().sum() > 0 and att.grad.abs().sum() > 0


def test_errors():
    st, _, _ = _graph()
    with pytest.raises(ValueError, match="expects x_l"):
        gatv2_attention(st, torch.randn(12, 6), torch.randn(9, 6), torch.randn(1, 2, 3))
    with pytest.raises(ValueError, match="source and 9 destination"):
        gatv2_attention(st, torch.randn(11, 2, 3), torch.randn(9, 2, 3), torch.randn(1, 2, 3))


@pytest.mark.parametrize("budget", [8, 13, 30], ids=["8", "13-as-8", "30-as-24"])
@pytest.mark.parametrize("cfg", [OFF, INT2], ids=["off", "int2"])
def test_edge_ranges_give_the_same_results(budget, cfg):
    """Under an edge budget (``edge_chunks``) the [E, H, C] tensors are formed over edge ranges (a multiple of 8
    edges: the packed signs of a range start on a byte, also with H * C = 6): the attention is the unchunked
    one bit for bit; the gradients are too, but the attention vector's, a sum over the ranges in another order
    (equal to rounding); at INT2 from the same seed (the same compressed copies)."""
    from dgl_exact.ops.edge_chunks import edge_chunks

    st, _, _ = _graph(e=40)
    torch.manual_seed(0)
    x_l0 = torch.randn(st.num_src, 2, 3, requires_grad=True)
    x_r0 = torch.randn(st.num_dst, 2, 3, requires_grad=True)
    att = torch.randn(1, 2, 3, requires_grad=True)
    r = torch.randn(40, 2)
    results = []
    for max_edges in (None, budget):
        torch.manual_seed(1)
        with edge_chunks(max_edges):
            alpha = gatv2_attention(st, x_l0 * 1.0, x_r0 * 1.0, att, 0.2, config=cfg)
            grads = torch.autograd.grad((alpha * r).sum(), (x_l0, x_r0, att))
        results.append((alpha, *grads))
    (a0, gl0, gr0, gatt0), (a1, gl1, gr1, gatt1) = results
    torch.testing.assert_close(a1, a0, rtol=0, atol=0)
    torch.testing.assert_close(gl1, gl0, rtol=0, atol=0)
    torch.testing.assert_close(gr1, gr0, rtol=0, atol=0)
    torch.testing.assert_close(gatt1, gatt0)


def test_edge_ranges_gradcheck():
    """Float64, compression off, 8-edge ranges: first and second derivatives against finite differences."""
    from dgl_exact.ops.edge_chunks import edge_chunks

    st, _, _ = _graph(e=40)
    torch.manual_seed(0)
    x_l = torch.randn(st.num_src, 2, 3, dtype=torch.float64, requires_grad=True)
    x_r = torch.randn(st.num_dst, 2, 3, dtype=torch.float64, requires_grad=True)
    att = torch.randn(1, 2, 3, dtype=torch.float64, requires_grad=True)
    with edge_chunks(8):
        assert torch.autograd.gradcheck(lambda *t: gatv2_attention(st, *t, 0.3, config=OFF), (x_l, x_r, att))
