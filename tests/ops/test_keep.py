"""Ownership rule 6 (dgl_exact/ops/keep.py): one compressed copy per tensor, shared by the ops that keep it under
an equal configuration, held only by the autograd nodes that keep it; unbiased for each consumer and for their
sum."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import dgl_exact
from dgl_exact import CompressionConfig
from dgl_exact.ops import keep as keeping
from dgl_exact.ops.products import Product
from tests.ops._helpers import INT2, compress_calls, saved_tensors

pytestmark = pytest.mark.usefixtures("one_thread")


def _activation(rows=32, cols=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen, requires_grad=True) * 1.0  # has autograd history


def _codes(item):
    return item.packed if item.packed is not None else item.raw


def _keep(x, cfg, **kwargs):
    """``default_keep`` as an op reading only ``x`` calls it (rule 6 shares only for a known op)."""
    with keeping.op_inputs(x):
        return keeping.default_keep(x, cfg, **kwargs)


def _product(a, b, cfg=INT2):
    with keeping.op_inputs(a, b):
        return Product.apply(a, b, cfg)


def test_later_keepers_under_an_equal_config_share_the_first_copy():
    x = _activation()
    first = _keep(x, INT2)
    again = _keep(x, CompressionConfig(bits=2))  # equal, another object
    assert _codes(again) is _codes(first) and again.lo is first.lo and again.step is first.step


@pytest.mark.parametrize("other", [CompressionConfig(bits=4), INT2.replace(block_rows=4),
                                   INT2.replace(kept_frac=0.5), INT2.replace(levels="optimal")],
                         ids=["bits", "blocks", "projection", "levels"])
def test_another_config_makes_its_own_copy(other):
    x = _activation()
    first = _keep(x, INT2)
    second = _keep(x, other)
    assert _codes(second) is not _codes(first)
    assert _codes(_keep(x, other)) is _codes(second)  # and shares that one
    assert _codes(_keep(x, INT2)) is _codes(first)


def test_an_inplace_change_makes_a_new_copy():
    x = _activation()
    first = _keep(x, INT2)
    with torch.no_grad():
        x.mul_(2.0)
    second = _keep(x, INT2)
    assert _codes(second) is not _codes(first)
    torch.testing.assert_close(keeping.restore(second), x.detach(), atol=float(x.detach().abs().max()), rtol=0)


def test_not_shared_without_autograd_history_nor_for_a_keeper_that_overwrites_nor_an_unknown_op():
    t = torch.randn(32, 8)  # an op's own buffer: rule 4 does not vouch for its version counter
    assert _codes(_keep(t, INT2, force=True)) is not _codes(_keep(t, INT2, force=True))
    x = _activation()
    first = _keep(x, INT2)
    with keeping.op_inputs(x):
        kept = keeping.as_kept(x, INT2, overwritten=True)  # rule 3: it writes into x next, perhaps without a bump
    assert _codes(kept) is _codes(first)  # x is still what the copy holds
    with keeping.op_inputs(x):
        assert keeping.shared_copy(x, INT2) is None
    assert _codes(_keep(x, INT2)) is not _codes(first)
    y = _activation()
    assert _codes(keeping.default_keep(y, INT2)) is not _codes(keeping.default_keep(y, INT2))  # no op_inputs


def test_not_shared_on_one_backward_path_nor_where_the_op_asks(monkeypatch):
    """A keeper whose other operand was computed from x (scores from ft, then ft * scores: GAT's aggregation)
    gets a copy of its own; so does ``as_kept(..., independent=True)``; a parallel keeper shares."""
    x = _activation(64, 16)
    p1, p2 = (torch.nn.Parameter(torch.randn(1, 16)) for _ in range(2))
    with compress_calls(monkeypatch) as made:
        score = _product(x, p1).sum(-1, keepdim=True)
        parallel = _product(x, p2)
        out = _product(x, score)  # x is kept here beside a tensor computed from it
    assert [tuple(c.shape) for c in made].count((64, 16)) == 2
    with compress_calls(monkeypatch) as made:
        with keeping.op_inputs(x):
            first = keeping.as_kept(x, INT2)
            second = keeping.as_kept(x, INT2, independent=True)
    assert len(made) == 1 and _codes(second) is not _codes(first)  # the first shares the products' copy
    (out + parallel).sum().backward()


def test_not_shared_inside_a_captured_op():
    x = _activation()
    with keeping.alive_override(()):
        first = _keep(x, INT2)
        assert _codes(_keep(x, INT2)) is not _codes(first)
    with keeping.op_inputs(x):
        assert keeping.shared_copy(x, INT2) is None


def test_nothing_but_the_keepers_holds_the_copy():
    x = _activation()
    p = torch.nn.Parameter(torch.randn(1, 8))
    y = _product(x, p, INT2)
    with keeping.op_inputs(x):
        held = keeping.shared_copy(x, INT2)
    assert held is not None
    codes = weakref.ref(_codes(held))
    del held
    gc.collect()
    assert codes() is not None  # the product's node keeps it
    del y
    gc.collect()
    assert codes() is None
    with keeping.op_inputs(x):
        assert keeping.shared_copy(x, INT2) is None


def test_an_offered_copy_is_shared():
    x = torch.randn(20, 8, requires_grad=True)
    with dgl_exact.config(INT2):
        h = dgl_exact.ops.relu_dropout(x, 0.5, True, compress_for=INT2)
    offered = keeping.offered(h)
    taken = _keep(h, INT2)
    assert taken is offered and keeping.offered(h) is None
    assert _codes(_keep(h, INT2)) is _codes(offered)


def test_two_products_compress_their_operand_once(monkeypatch):
    x = _activation(64, 16)
    p1, p2 = (torch.nn.Parameter(torch.randn(1, 16)) for _ in range(2))
    with compress_calls(monkeypatch) as made, saved_tensors() as saved:
        y = _product(x, p1, INT2) + _product(x, p2, INT2)
    assert len(made) == 1
    codes = [t for t in saved if t.dtype == torch.uint8]
    assert len(codes) == 2 and codes[0] is codes[1]
    y.sum().backward()


def test_each_consumer_and_their_sum_unbiased():
    """Two products keep one copy of ``x`` (one draw): ``grad p1 = sum_rows(r1 * x_hat)``, ``grad p2`` likewise,
    and a parameter read by both gets ``sum_rows((r1 + r2) * x_hat)``. Each is unbiased. Over ``D`` draws the
    mean's error per element has variance ``sum_i w_i**2 Var(e_i) / D``, with stochastic rounding's
    ``Var(e_i) <= gap_i**2 / 4``, ``gap_i`` the distance of two levels in row ``i`` (one group per row, uniform
    levels: its range over ``2**bits - 1``, 2 % added for the bf16 scale): 5 of those standard deviations."""
    gen = torch.Generator().manual_seed(3)
    rows, cols, draws = 64, 16, 400
    x0 = torch.randn(rows, cols, generator=gen, requires_grad=True)
    r1, r2 = torch.randn(rows, cols, generator=gen), torch.randn(rows, cols, generator=gen)
    p1, p2, q = (torch.nn.Parameter(torch.randn(1, cols, generator=gen)) for _ in range(3))
    sums = [torch.zeros(cols, dtype=torch.float64) for _ in range(3)]
    for _ in range(draws):
        x = x0 * 1.0
        loss = ((r1 * _product(x, p1, INT2)).sum() + (r2 * _product(x, p2, INT2)).sum()
                + (r1 * _product(x, q, INT2)).sum() + (r2 * _product(x, q, INT2)).sum())
        for s, g in zip(sums, torch.autograd.grad(loss, [p1, p2, q])):
            s += g.reshape(-1).double()
    xd = x0.detach().double()
    gap = 1.02 * (xd.amax(1, keepdim=True) - xd.amin(1, keepdim=True)) / (2 ** INT2.bits - 1)
    for s, w in zip(sums, (r1, r2, r1 + r2)):
        exact = (w.double() * xd).sum(0)
        bound = 5 * ((gap ** 2 / 4 * w.double() ** 2).sum(0) / draws).sqrt()
        assert ((s / draws - exact).abs() <= bound).all(), ((s / draws - exact).abs() / bound).max()


def test_a_keeper_on_the_backward_path_stays_unbiased():
    """``s = sum_d (x * p)`` then ``x * s``: ``grad p_d = sum_n ds_n * x_hat_A[n, d]`` with ``ds_n = sum_d
    r_nd * x_hat_B[n, d]``. From one shared draw ``E[x_hat_B x_hat_A] = x x + Var(e)``: biased by about
    ``sum_n Var(e_nd)`` per element (``r = 1``); the second product keeps a copy of its own (rule 6), so the mean
    over ``D`` draws converges. Its variance per element is at most ``sum_n (v_n w_n + v_n x_nd**2 + m_n**2
    w_n) / D`` (a product of two independent factors: ``m_n``, ``v_n`` the mean and variance bound of ``ds_n``,
    ``w_n = gap_n**2 / 4`` that of ``x_hat``): 5 of those standard deviations."""
    gen = torch.Generator().manual_seed(4)
    rows, cols, draws = 64, 16, 400
    x0 = torch.randn(rows, cols, generator=gen, requires_grad=True)
    p = torch.nn.Parameter(torch.randn(1, cols, generator=gen))
    total = torch.zeros(cols, dtype=torch.float64)
    for _ in range(draws):
        x = x0 * 1.0
        out = _product(x, _product(x, p).sum(-1, keepdim=True))
        total += torch.autograd.grad(out.sum(), p)[0].reshape(-1).double()
    xd, pd = x0.detach().double(), p.detach().double().requires_grad_()
    exact = torch.autograd.grad((xd * (xd * pd).sum(-1, keepdim=True)).sum(), pd)[0].reshape(-1)
    gap = 1.02 * (xd.amax(1, keepdim=True) - xd.amin(1, keepdim=True)) / (2 ** INT2.bits - 1)
    w = gap ** 2 / 4                       # [rows, 1]
    m, v = xd.sum(1, keepdim=True), cols * w
    bound = 5 * ((v * w + v * xd ** 2 + m ** 2 * w).sum(0) / draws).sqrt()
    assert ((total / draws - exact).abs() <= bound).all(), ((total / draws - exact).abs() / bound).max()
