"""Ownership rule 11 (dgl_exact.ops.keep): dgl_exact's dropout of data (input features: alive anyway) is kept by
an op that may keep a derived item (``as_kept(..., via_linear=True)``: a linear's input, a product's operand, the
features of ``u_mul_e_sum``) as the data and the mask's seed (an :class:`ElementwiseOf` of the data): exact, no
bytes of its own.
A linear of such an input (rule 10's :class:`LinearOf` of an exact ``x``) is exact too, so it is taken even where
rule 6's condition fails (attention weights computed from the features, as in every GAT layer)."""
from __future__ import annotations

import pytest
import torch

import dgl_exact
from dgl_exact.compression import CompressedTensor
from dgl_exact.ops import dropout, linear, message_passing, relu, u_mul_e_sum
from dgl_exact.ops.chunks import row_chunks
from dgl_exact.ops.derived import ElementwiseOf, LinearOf, is_exact
from dgl_exact.ops.keep import as_kept, restore
from tests.ops._helpers import INT2, kept_item, saved_tensors

pytestmark = pytest.mark.usefixtures("one_thread")

N, IN, H, D = 200, 12, 2, 8


def _data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, IN, generator=gen)
    w = torch.nn.Parameter(torch.randn(H * D, IN, generator=gen) / IN ** 0.5)
    return x, w


def test_linear_keeps_the_data_and_the_seed_exactly():
    x, w = _data()
    with dgl_exact.config(INT2), saved_tensors() as saved:
        h = dropout(x, 0.4)
        y = linear(h, w)
    item = kept_item(y)
    assert isinstance(item, ElementwiseOf) and is_exact(item)
    assert item.root.data_ptr() == x.data_ptr()  # the data itself, by reference
    assert not any(t.numel() >= h.numel() and t.data_ptr() != x.data_ptr() for t in saved)  # nothing of h's size
    assert torch.equal(restore(item), h)  # the mask regenerated element for element
    rows = [r for _, _, r in row_chunks(item, chunk_elements=5 * IN)]
    assert len(rows) == N // 5 and torch.equal(torch.cat(rows), h)  # by rows, from each chunk's first element
    g = torch.randn(N, H * D, generator=torch.Generator().manual_seed(1))
    (gw,) = torch.autograd.grad(y, w, g)
    torch.testing.assert_close(gw, g.t() @ h, rtol=1e-5, atol=1e-5)  # the exact weight gradient


def test_taken_only_for_data_unchanged_and_compression_on():
    x, w = _data(2)
    with dgl_exact.config(INT2):
        x_grad = x.clone().requires_grad_()
        assert not isinstance(kept_item(linear(dropout(x_grad * 1.0, 0.4), w)), ElementwiseOf)  # x has history
        fresh = relu(x)  # a temporary dgl_exact made (rule 1): nobody else keeps it
        assert isinstance(kept_item(linear(dropout(fresh, 0.4), w)), CompressedTensor)
        twice = dropout(dropout(x, 0.4), 0.5)  # a dropout of a recorded dropout of data: exact, both masks
        item = kept_item(linear(twice, w))
        assert isinstance(item, ElementwiseOf) and is_exact(item) and torch.equal(restore(item), twice)
        changed = dropout(x, 0.4)
        changed.mul_(2.0)
        assert isinstance(kept_item(linear(changed, w)), CompressedTensor)  # changed in place since
        source = x.clone()
        h = dropout(source, 0.4)
        source.add_(1.0)
        assert isinstance(kept_item(linear(h, w)), CompressedTensor)  # the data changed since
        assert not isinstance(as_kept(dropout(x, 0.4), INT2), ElementwiseOf)  # the op did not ask for a derived item
    with dgl_exact.config(dgl_exact.CompressionConfig(enabled=False)):
        h = dropout(x, 0.4)
        assert kept_item(linear(h, w)) is h  # compression off: kept by reference, as autograd keeps it


def test_data_changed_after_the_forward_raises_torchs_error():
    x, w = _data(3)
    with dgl_exact.config(INT2):
        y = linear(dropout(x, 0.4), w)
    x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_double_backward_refused():
    x, w = _data(4)
    with dgl_exact.config(INT2):
        y = linear(dropout(x, 0.4), w)
    (gw,) = torch.autograd.grad(y.pow(2).sum(), w, create_graph=False)
    assert gw.shape == w.shape
    with dgl_exact.config(INT2):
        y = linear(dropout(x, 0.4), w)
    with pytest.raises(RuntimeError, match="compression"):
        torch.autograd.grad(y.pow(2).sum(), w, create_graph=True)


def test_attention_aggregation_keeps_an_exact_linear_of_the_features():
    """``update_all(fn.u_mul_e)`` written as GAT layers write it (``a`` computed from ``ft``): rule 6 refuses a
    shared draw of ``ft`` there, but ``ft = fc(dropout(features))`` is exact through the data and the seed, so
    the aggregation keeps it at no cost and its edge gradient is the exact one."""
    dgl = pytest.importorskip("dgl")
    gen = torch.Generator().manual_seed(5)
    src, dst = torch.randint(0, N, (900,), generator=gen), torch.randint(0, N, (900,), generator=gen)
    g = dgl.graph((src, dst), num_nodes=N)
    x, w = _data(6)
    attn = torch.nn.Parameter(torch.randn(1, H, D, generator=gen))
    with message_passing(), dgl_exact.config(INT2), saved_tensors() as saved:
        h = dropout(x, 0.3)
        ft = linear(h, w).view(N, H, D)
        score = (ft * attn).sum(-1)  # [N, H]
        a = score[src] + score[dst]  # edge weights computed from ft
        out = u_mul_e_sum(g, ft, a.unsqueeze(-1))
    item = kept_item(out)
    assert isinstance(item, LinearOf) and is_exact(item) and isinstance(item.x, ElementwiseOf)
    assert not any(t.is_floating_point() and t.numel() >= ft.numel() for t in saved)  # no copy of ft
    grad = torch.randn(out.shape, generator=gen)
    ga = torch.autograd.grad(out, a, grad)[0]
    ft_exact = (h @ w.t()).view(N, H, D).detach()
    want = (ft_exact[src] * grad[dst]).sum(-1)  # the per-edge, per-head dot product
    torch.testing.assert_close(ga.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
