"""The double-backward test every Function's backward makes (``ops.double_backward``): inside a backward grad
mode is on exactly when the caller asked for ``create_graph=True``; a compressed kept item then raises one
message naming the op, an exact one lets the differentiable path run; a backward that is not differentiable
refuses."""
import pytest
import torch

from dgl_exact import CompressionConfig
from dgl_exact.compression import compress
from dgl_exact.ops.double_backward import double_backward, refuse_double_backward


def test_double_backward_asks_and_checks_in_one_call():
    exact = torch.randn(8, 4)
    compressed = compress(exact, CompressionConfig(bits=2))
    with torch.no_grad():  # a plain backward: no check, whatever is kept
        assert double_backward("linear", exact, compressed, None) is False
        refuse_double_backward("sage_mean")
    with torch.enable_grad():  # create_graph=True
        assert double_backward("linear", exact, None) is True
        assert double_backward("relu") is True
        with pytest.raises(RuntimeError, match=r"^dgl_exact\.linear: double backward .*enabled=False"):
            double_backward("linear", exact, compressed)
        with pytest.raises(RuntimeError, match=r"^dgl_exact\.sage_mean: double backward"):
            refuse_double_backward("sage_mean")
        with pytest.raises(RuntimeError, match="^recompute: train without it$"):
            refuse_double_backward("recompute", "recompute: train without it")


def test_inside_a_function_backward_create_graph_decides():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            if double_backward("square", x):
                return 2 * x * grad  # differentiable
            return (2 * x * grad).detach()

    x = torch.randn(5, requires_grad=True)
    (g,) = torch.autograd.grad(Square.apply(x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(gg, torch.full_like(x, 2.0))
    (g,) = torch.autograd.grad(Square.apply(x).sum(), x)
    assert not g.requires_grad
