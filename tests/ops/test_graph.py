"""``u_mul_e_sum`` keeps its edge values exactly, whatever their rank: the feature gradient (which reads
only the edge values) is the same with compression on as off, bit for bit, for ``w`` of shape ``[E]``,
``[E, H]`` and ``[E, H, 1]`` (the first is reshaped by a view made inside forward: such a view must not be
what is kept, nor be compressed)."""
from __future__ import annotations

import pytest
import torch

import dgl_exact
from dgl_exact.ops.graph import u_mul_e_sum

dgl = pytest.importorskip("dgl")


@pytest.mark.parametrize("w_shape", [(), (2,), (2, 1)], ids=["E", "ExH", "ExHx1"])
def test_edge_values_are_kept_exactly_for_every_rank(w_shape, kernel_path):
    torch.manual_seed(0)
    g = dgl.rand_graph(40, 300)
    # [E, H, 1] against [N, H, D] (the fused kernel); [E, H] against [N, D, H] (DGL's right alignment:
    # the general path); [E] against [N, D]
    x0 = {(): torch.randn(40, 8), (2,): torch.randn(40, 8, 2), (2, 1): torch.randn(40, 2, 8)}[w_shape]
    w0 = torch.rand((300,) + w_shape)
    grads = {}
    for name, cfg in (("exact", dgl_exact.CompressionConfig(enabled=False)),
                      ("int2", dgl_exact.CompressionConfig(bits=2, kept_frac=0.5))):
        xl, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        x = xl * 1.0  # a temporary (a leaf is alive anyway and kept by reference, never compressed)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = u_mul_e_sum(g, x, w, config=cfg)
        del x
        out.square().sum().backward()
        grads[name] = (xl.grad, w.grad)
        # the edge values are among the saved tensors as themselves (not a copy, not a code buffer)
        assert any(t is w for t in saved), [tuple(t.shape) for t in saved]
    torch.testing.assert_close(grads["int2"][0], grads["exact"][0], rtol=0, atol=0)
    assert not torch.equal(grads["int2"][1], grads["exact"][1])  # the features were compressed
