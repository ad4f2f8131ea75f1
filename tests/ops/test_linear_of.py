"""Ownership rule 10 (dgl_exact.ops.keep): an op whose backward is linear in a kept ``y`` keeps ``y = x W^T + b``,
made by dgl_exact's linear, through the linear's own kept ``x`` (:class:`LinearOf`) instead of a copy of ``y``:
no bytes of its own, the same draw as the linear's copy, unbiased gradients; and only where rule 6's condition
holds for ``x``."""
from __future__ import annotations

import pytest
import torch

import dgl_exact
from dgl_exact.ops import message_passing
from dgl_exact.ops.chunks import row_chunks
from dgl_exact.ops.dense import linear
from dgl_exact.ops.keep import LinearOf, as_kept, op_inputs, restore
from dgl_exact.compression import CompressedTensor
from tests.ops._helpers import INT2, INT8, OFF, kept_item, saved_tensors

pytestmark = pytest.mark.usefixtures("one_thread")

N, IN, H, D = 96, 8, 3, 16


def _layer(seed=0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    h0 = torch.randn(N, IN, generator=gen, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(H * D, IN, generator=gen) / IN ** 0.5)
    b = torch.nn.Parameter(torch.randn(H * D, generator=gen)) if bias else None
    p = torch.nn.Parameter(torch.randn(1, H, D, generator=gen))
    return h0, w, b, p


def test_attention_product_keeps_the_linears_copy():
    h0, w, b, p = _layer()
    with message_passing(), dgl_exact.config(INT2), saved_tensors() as saved:
        ft = linear(h0 * 1.0, w, b).view(-1, H, D)
        el = (ft * p).sum(-1)
        er = (p * ft).sum(-1)
    x_copy = kept_item(ft)
    assert isinstance(x_copy, CompressedTensor)
    for score in (el, er):
        item = kept_item(score, 0) if isinstance(kept_item(score, 0), LinearOf) else kept_item(score, 1)
        assert isinstance(item, LinearOf) and item.shape == ft.shape
        assert item.x.packed.data_ptr() == x_copy.packed.data_ptr()  # the linear's copy: no bytes of its own
    # nothing of ft's size is saved: the linear's copy of its input, the weight, bias and the parameter only
    assert not any(t.is_floating_point() and t.numel() >= ft.numel() for t in saved)
    assert not any(t.dtype == torch.uint8 and t.numel() >= x_copy.packed.numel() and
                   t.data_ptr() != x_copy.packed.data_ptr() for t in saved)
    # the decode is the linear of the decoded input, in the product's shape
    want = torch.nn.functional.linear(restore(x_copy), w, b).view(-1, H, D)
    torch.testing.assert_close(restore(kept_item(el, 0)), want)


def test_gradients_unbiased_at_int2():
    """Over 400 seeded draws the mean INT2 gradients of the attention vector (formed through the linear's kept
    input) and of the linear's weight (whose incoming gradient the product forms from the parameter only) are
    the exact ones: the mean squared z-score of the mean (per element, from the draws' own spread) is about 1
    for an unbiased estimate (chi-square over 48 and 128 elements: 1.5 is beyond 3 of its standard deviations)."""
    h0, w, b, p = _layer(2)
    gen = torch.Generator().manual_seed(3)
    c, r = torch.randn(N, H, generator=gen), torch.randn(N, H, D, generator=gen)

    def loss(ft):
        return ((ft * p).sum(-1) * c).sum() + (ft * r).sum()

    exact = torch.autograd.grad(loss(torch.nn.functional.linear(h0 * 1.0, w, b).view(-1, H, D)), [p, w])
    torch.manual_seed(4)
    draws = [[], []]
    for _ in range(400):
        with message_passing(), dgl_exact.config(INT2):
            ft = linear(h0 * 1.0, w, b).view(-1, H, D)
            out = loss(ft)
        for d, g in zip(draws, torch.autograd.grad(out, [p, w])):
            d.append(g)
    for d, e in zip(draws, exact):
        d = torch.stack(d)
        z = (d.mean(0) - e) / (d.std(0) / len(d) ** 0.5)
        assert float(z.square().mean()) < 1.5, float(z.square().mean())
        assert not torch.allclose(d[0], e)  # compressed: each draw differs from the exact gradient


def test_linear_of_data_is_exact_and_keeps_nothing_of_its_size():
    """``lin2(lin1(x))`` with ``x`` data: the second linear keeps the first's input by reference, so its weight
    gradient is torch's (up to float rounding) and nothing of the hidden layer's size is kept."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(N, IN, generator=gen, dtype=torch.float64)
    w1, w2 = (torch.nn.Parameter(torch.randn(a, b, generator=gen, dtype=torch.float64)) for a, b in ((64, IN), (4, 64)))
    with dgl_exact.config(INT2), saved_tensors() as saved:
        hid = linear(x, w1)
        out = linear(hid, w2)
    item = kept_item(out)
    assert isinstance(item, LinearOf) and item.x.data_ptr() == x.data_ptr()  # x itself, by reference
    assert not any(t.numel() >= hid.numel() for t in saved)
    got = torch.autograd.grad(out.square().sum(), [w1, w2])
    want = torch.autograd.grad(torch.nn.functional.linear(torch.nn.functional.linear(x, w1), w2).square().sum(),
                               [w1, w2])
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e)


def _product_item(a, b, cfg=INT2):
    with message_passing(), dgl_exact.config(cfg):
        return kept_item(a * b, 0)


def test_not_taken_where_rule_6_or_the_shape_forbids():
    h0, w, b, p = _layer()
    with message_passing(), dgl_exact.config(INT2):
        h = h0 * 1.0
        y = linear(h, w, b)
        ft = y.view(-1, H, D)
        assert isinstance(_product_item(ft, p), LinearOf)
        assert not isinstance(_product_item(ft, ft), LinearOf)           # reads y twice
        other = (h * 2.0)[:, :1].expand(N, H * D).reshape(N, H, D) + 0.0  # computed from x
        assert not isinstance(_product_item(ft, other), LinearOf)
        assert not isinstance(_product_item(ft[:10], p), LinearOf)        # part of the output
        assert not isinstance(_product_item(y.t(), torch.nn.Parameter(torch.randn(H * D, 1))),
                              LinearOf)                                  # not rows first
        assert not isinstance(_product_item(ft, p, INT8), LinearOf)      # another configuration
        with op_inputs(ft, p):
            assert not isinstance(as_kept(ft, INT2), LinearOf)           # the op did not ask
        with op_inputs(ft, other):
            assert not isinstance(as_kept(ft, INT2, via_linear=True, independent=True), LinearOf)
            assert isinstance(as_kept(ft, INT2, via_linear=True, independent=True, leaf_grads=True), LinearOf)
        ft2 = linear(h, w, b).view(-1, H, D)
        ft2.mul_(2.0)                                                      # changed since the linear
        assert not isinstance(_product_item(ft2, p), LinearOf)
    with dgl_exact.config(OFF):
        ft3 = linear(h0 * 1.0, w, b).view(-1, H, D)
        with op_inputs(ft3, p):
            assert as_kept(ft3, OFF, via_linear=True) is ft3              # compression off: by reference


def test_row_chunks_decode_as_the_whole():
    h0, w, b, p = _layer(6)
    with message_passing(), dgl_exact.config(INT2):
        ft = linear(h0 * 1.0, w, b).view(-1, H, D)
        item = _product_item(ft, p)
    assert isinstance(item, LinearOf)
    whole = restore(item)
    parts = list(row_chunks(item, chunk_elements=H * D * 10))
    assert len(parts) > 1 and parts[-1][1] == N
    torch.testing.assert_close(torch.cat([x for _, _, x in parts]), whole, rtol=1e-6, atol=1e-6)


def test_double_backward_refuses():
    h0, w, b, p = _layer()
    with message_passing(), dgl_exact.config(INT2):
        out = (linear(h0 * 1.0, w, b).view(-1, H, D) * p).sum()
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out, p, create_graph=True)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("grad_kind", ["through-sum", "full"])
def test_row_sum_through_the_input_equals_decoding(bias, grad_kind):
    """``(grad * y).sum(0)`` formed as ``W`` against ``grad^T x`` (a gradient through ``.sum(-1)`` narrowed to its
    distinct columns first) equals the sum over the decoded ``y``; so does a weight gradient as ``(grad^T x) W^T``."""
    from dgl_exact.ops.chunks import linear_of_row_sum, weight_grad

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(N, IN, generator=gen, dtype=torch.float64)
    w = torch.randn(H * D, IN, generator=gen, dtype=torch.float64)
    b = torch.randn(H * D, generator=gen, dtype=torch.float64) if bias else None
    item = LinearOf(x, w, b, (N, H, D))
    y = restore(item)
    g = (torch.randn(N, H, 1, generator=gen, dtype=torch.float64).expand(N, H, D) if grad_kind == "through-sum"
         else torch.randn(N, H, D, generator=gen, dtype=torch.float64))
    torch.testing.assert_close(linear_of_row_sum(g, item), (g * y).sum(0))
    flat, gr = LinearOf(x, w, b, (N, H * D)), torch.randn(N, 4, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(weight_grad(gr, flat), gr.t() @ restore(flat))


def test_gradients_through_the_input_equal_torchs_on_data():
    """Features of data (kept by reference): the attention vector's and the weights' gradients, formed through
    the linear's input without decoding ``ft``, are torch's (float64)."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(N, IN, generator=gen, dtype=torch.float64)
    w = torch.nn.Parameter(torch.randn(H * D, IN, generator=gen, dtype=torch.float64))
    b = torch.nn.Parameter(torch.randn(H * D, generator=gen, dtype=torch.float64))
    p = torch.nn.Parameter(torch.randn(1, H, D, generator=gen, dtype=torch.float64))
    w2 = torch.nn.Parameter(torch.randn(2, H * D, generator=gen, dtype=torch.float64))
    c = torch.randn(N, H, generator=gen, dtype=torch.float64)

    def loss(lin):
        ft = lin(x, w, b)
        return ((ft.view(-1, H, D) * p).sum(-1) * c).sum() + lin(ft, w2, None).square().sum()

    with message_passing(), dgl_exact.config(INT2):
        ours = torch.autograd.grad(loss(linear), [w, b, p, w2])
    theirs = torch.autograd.grad(loss(torch.nn.functional.linear), [w, b, p, w2])
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a, e)
