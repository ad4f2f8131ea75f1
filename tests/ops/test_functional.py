"""torch's functional activations and dropout on dgl_exact's ops inside a scope (dgl_exact/ops/functional.py):
the same outputs and gradients as torch with compression off, dgl_exact's ops (what they keep) inside a
converted model's forward, torch's own outside, in place, for subclasses and under ``functional_ops(False)``."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl_exact
from dgl_exact import CompressionConfig
from dgl_exact.ops.functional import functional_ops, functional_ops_active

OFF = CompressionConfig(enabled=False)
CALLS = {
    "F.relu": (F.relu, {}), "torch.relu": (torch.relu, {}), "Tensor.relu": (torch.Tensor.relu, {}),
    "F.leaky_relu": (F.leaky_relu, dict(negative_slope=0.1)), "F.elu": (F.elu, dict(alpha=0.7)),
    "F.gelu": (F.gelu, dict(approximate="tanh")), "F.silu": (F.silu, {}), "F.dropout": (F.dropout, dict(p=0.3)),
    "torch.dropout": (torch.dropout, dict(p=0.3, train=True)),
}
#: the backward class of the dgl_exact op each call runs in the scope
OURS = {"F.relu": "_ReLUDropout", "torch.relu": "_ReLUDropout", "Tensor.relu": "_ReLUDropout",
        "F.leaky_relu": "_LeakyReLU", "F.elu": "_ELU", "F.gelu": "_GELU", "F.silu": "_SiLU",
        "F.dropout": "_TorchDropout", "torch.dropout": "_TorchDropout"}


def _run(fn, kw, x, w, scope):
    torch.manual_seed(1)
    with scope:
        y = fn(x * 1.0, **kw)  # a non-leaf input: an activation, kept as the ops keep activations
    (grad,) = torch.autograd.grad((y * w).sum(), x)
    return y, grad


@pytest.mark.parametrize("name", sorted(CALLS))
def test_routed_call_computes_what_torch_computes_with_compression_off(name):
    fn, kw = CALLS[name]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=g).requires_grad_()
    w = torch.randn(64, 48, generator=g)
    y0, g0 = _run(fn, kw, x, w, torch.enable_grad())
    with dgl_exact.config(OFF):
        y1, g1 = _run(fn, kw, x, w, functional_ops())
    assert type(y1.grad_fn).__name__ == OURS[name] + "Backward"
    assert torch.equal(y0, y1)  # dropout: torch's own mask with compression off
    # elu's backward is grad * (y + alpha) where torch's is grad * alpha * exp(x): a rounding apart
    torch.testing.assert_close(g1, g0, rtol=0, atol=0 if name != "F.elu" else 1e-6)


def test_inside_a_converted_model_functional_activations_keep_no_fp32():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(32, 32)

        def forward(self, x):
            return F.dropout(F.relu(self.lin(x)), 0.5, self.training)

    model = dgl_exact.compress_model(Net(), config=CompressionConfig(bits=2))
    x = torch.randn(512, 32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = model(x)
    assert type(y.grad_fn).__name__ == "_DropoutBackward"  # dgl_exact's: a seed, no mask
    assert type(y.grad_fn.next_functions[0][0]).__name__ == "_ReLUDropoutBackward"
    # what is kept: the input data (by reference), the linear's parameters and relu's bits; no float activation
    data = x.untyped_storage().data_ptr()
    assert not [t for t in saved if t.is_floating_point() and t.numel() >= y.numel()
                and t.untyped_storage().data_ptr() != data]
    y.sum().backward()
    # outside the forward: torch's own
    assert not functional_ops_active() and type(F.relu(x.requires_grad_() * 1).grad_fn).__name__ == "ReluBackward0"


def test_relu_gradient_in_a_compressed_model_is_exact():
    """relu keeps an exact mask: with compression on its gradient is torch's, whatever the bits."""
    class Act(nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2.0

    model = dgl_exact.compress_model(Act(), config=CompressionConfig(bits=1))
    x = torch.randn(256, 16, requires_grad=True)
    w = torch.randn(256, 16)
    (ours,) = torch.autograd.grad((model(x * 1.0) * w).sum(), x)
    (theirs,) = torch.autograd.grad((torch.relu(x * 1.0) * 2.0 * w).sum(), x)
    assert torch.equal(ours, theirs)


def test_what_is_not_routed():
    x = torch.randn(8, 4, requires_grad=True)

    class Sub(torch.Tensor):
        pass

    with functional_ops():
        assert functional_ops_active()
        assert type(F.relu(x * 1, inplace=True).grad_fn).__name__ != "_ReLUDropoutBackward"
        assert type(F.leaky_relu(x * 1, -0.5).grad_fn).__name__ == "LeakyReluBackward0"  # negative slope
        assert "_ReLUDropout" not in type(torch.relu((x * 1).as_subclass(Sub)).grad_fn).__name__
        with functional_ops(False):
            assert not functional_ops_active()
            assert type(F.relu(x * 1).grad_fn).__name__ == "ReluBackward0"
        with functional_ops():  # nested: one mode, still active after the inner scope
            pass
        assert type(F.relu(x * 1).grad_fn).__name__ == "_ReLUDropoutBackward"
    assert type(F.relu(x * 1).grad_fn).__name__ == "ReluBackward0"
    with pytest.raises(TypeError, match="True or False"):
        with functional_ops("yes"):
            pass
