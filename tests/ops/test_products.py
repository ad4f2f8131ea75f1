"""Elementwise products inside a converted model's scope (dgl_exact.ops.products, entered with
``message_passing()``): an activation operand is kept compressed, a parameter by reference; values are torch's,
gradients torch's with compression off and unbiased with it on; what the scope does not take runs as torch."""
from __future__ import annotations

import pytest
import torch

import dgl_exact
from dgl_exact.ops import message_passing
from dgl_exact.ops.products import Product
from tests.ops._helpers import INT2, OFF, saved_tensors

pytestmark = pytest.mark.usefixtures("one_thread")


def _operands(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 3, 16, generator=gen, requires_grad=True)
    p = torch.nn.Parameter(torch.randn(1, 3, 16, generator=gen))
    return x, p


def test_activation_kept_compressed_parameter_by_reference():
    x, p = _operands()
    ft = x * 1.0  # an activation
    with message_passing(), dgl_exact.config(INT2), saved_tensors() as saved:
        el = (ft * p).sum(-1)
        er = (p * ft).sum(-1)
    assert not any(t.is_floating_point() and t.numel() >= ft.numel() for t in saved), \
        [(t.dtype, tuple(t.shape)) for t in saved]
    assert sum(t is p for t in saved) == 2
    gx, gp = torch.autograd.grad((el + er).sum(), [x, p])
    torch.testing.assert_close(gx, 2 * p.detach().expand_as(x))  # reads only the parameter: exact


@pytest.mark.parametrize("shapes", [((64, 3, 16), (1, 3, 16)), ((64, 3, 16), (64, 3, 16)), ((16,), (64, 3, 16)),
                                    ((64, 1, 16), (1, 3, 1))], ids=["param-like", "same", "short", "both-broadcast"])
def test_values_and_gradients_are_torchs_with_compression_off(shapes):
    gen = torch.Generator().manual_seed(1)
    a0, b0 = (torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True) for s in shapes)
    want = a0 * 1.0 * (b0 * 1.0)
    with message_passing(), dgl_exact.config(OFF):
        got = Product.apply(a0 * 1.0, b0 * 1.0, OFF)
        routed = (a0 * 1.0) * (b0 * 1.0)
    r = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    for out in (got, routed):
        torch.testing.assert_close(out, want)
        expected = torch.autograd.grad(want, [a0, b0], r, retain_graph=True)
        for g_got, g_want in zip(torch.autograd.grad(out, [a0, b0], r), expected):
            torch.testing.assert_close(g_got, g_want)


@pytest.mark.parametrize("shapes", [((64, 3, 16), (1, 3, 16)), ((64, 3, 16), (64, 3, 16)), ((16,), (64, 3, 16)),
                                    ((64, 1, 16), (1, 3, 1)), ((64, 3, 16), (64, 3, 1)), ((1, 3, 16), (64, 3, 16))],
                         ids=["param-like", "same", "short", "both-broadcast", "row-broadcast", "vector"])
@pytest.mark.parametrize("compressed", [False, True])
def test_operand_gradient_in_row_chunks_is_the_whole_product(shapes, compressed, monkeypatch):
    """Chunked over the kept operand's rows (a chunk of 5 rows, not dividing 64) the operand's gradient is
    ``(grad * other).sum_to_size(shape)`` of the same decoded ``other``, up to float summation order."""
    from dgl_exact.compression import compress
    from dgl_exact.ops import chunks
    from dgl_exact.ops.keep import restore
    from dgl_exact.ops.products import operand_grad

    gen = torch.Generator().manual_seed(5)
    a_shape, b_shape = shapes
    out_shape = torch.broadcast_shapes(a_shape, b_shape)
    grad, b = torch.randn(out_shape, generator=gen), torch.randn(b_shape, generator=gen)
    kept = compress(b, INT2, seed=6) if compressed else b
    monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", 5 * b[0].numel())
    want = (grad * restore(kept)).sum_to_size(a_shape)
    got = operand_grad(grad, kept, torch.Size(a_shape))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_parameter_gradient_unbiased_at_int2():
    """Over 400 seeded draws the mean INT2 gradient of the parameter is the exact one: the mean squared
    z-score of the mean (per element, from the draws' own spread) is about 1 for an unbiased estimate."""
    x, p = _operands(2)
    r = torch.randn(64, 3, 16, generator=torch.Generator().manual_seed(3))
    exact = (r * x).sum(0, keepdim=True).detach()
    torch.manual_seed(4)
    draws = []
    for _ in range(400):
        with message_passing(), dgl_exact.config(INT2):
            out = (x * 1.0) * p
        draws.append(torch.autograd.grad(out, p, r)[0])
    d = torch.stack(draws)
    z = (d.mean(0) - exact) / (d.std(0) / len(draws) ** 0.5)
    assert float(z.square().mean()) < 1.5, float(z.square().mean())
    assert not torch.equal(d[0], exact)  # compressed: each draw differs from the exact gradient


def test_what_the_scope_does_not_take_runs_as_torch():
    x, p = _operands()
    ft = x * 1.0
    with message_passing(), dgl_exact.config(INT2):
        assert type((ft * 2.0).grad_fn).__name__ == "MulBackward0"               # a scalar
        assert type((ft * p.double().float()).grad_fn).__name__ == "ProductBackward"  # two activations: taken
        assert type((ft.double() * p).grad_fn).__name__ == "MulBackward0"         # mixed dtypes
        assert type((x * p).grad_fn).__name__ == "MulBackward0"                   # leaves only: nothing kept
        with torch.no_grad():
            assert (ft * p).grad_fn is None
        assert type(torch.mul(ft, p, out=None).grad_fn).__name__ == "MulBackward0"  # keyword arguments
        with message_passing(False):
            assert type((ft * p).grad_fn).__name__ == "MulBackward0"
    with message_passing(), dgl_exact.config(enabled=False):
        assert type((ft * p).grad_fn).__name__ == "MulBackward0"                  # compression off
    assert type((ft * p).grad_fn).__name__ == "MulBackward0"                      # outside the scope


def test_double_backward_refuses_compressed_operands():
    x, p = _operands()
    with message_passing(), dgl_exact.config(INT2):
        out = (x * 1.0) * p
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), p, create_graph=True)
