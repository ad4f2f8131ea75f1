"""``ops.batch_norm_relu_dropout`` against the composed ops ``ops.relu_dropout(ops.batch_norm(x))``: the same
output bit for bit for the same random state, the same gradients, the running statistics updated the same,
on the reference (torch) and the numba kernels, small and row-chunked; one layer-sized buffer fewer."""
from __future__ import annotations

import pytest
import torch

import dgl_exact
from dgl_exact import CompressionConfig, kernels, ops
from dgl_exact.ops.chunks import CHUNK_ELEMENTS

BACKENDS = ["torch", pytest.param("numba", marks=pytest.mark.filterwarnings("ignore::UserWarning"))]


def _inputs(n, c, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, c, generator=g) * 2 + 0.3).requires_grad_()
    w = (torch.rand(c, generator=g) + 0.5).requires_grad_()
    b = (torch.randn(c, generator=g) * 0.1).requires_grad_()
    return x, w, b


def _run(fused, x, w, b, rm, rv, training, p, cfg, seed=7):
    h = x * 1.0  # a tensor with autograd history: kept compressed (an input leaf would be kept by reference)
    torch.manual_seed(seed)
    if fused:
        y = ops.batch_norm_relu_dropout(h, rm, rv, w, b, training, 0.1, 1e-5, p, config=cfg)
    else:
        y = ops.relu_dropout(ops.batch_norm(h, rm, rv, w, b, training, 0.1, 1e-5, cfg), p)
    g = torch.Generator().manual_seed(3)
    grad = torch.randn(y.shape, generator=g)
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), grad)
    return y.detach(), gx, gw, gb


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,c,p,bits", [(7, 5, 0.5, 2), (2, 3, 0.0, 2), (33, 16, 0.3, 8), (9, 4, 0.5, None),
                                         (CHUNK_ELEMENTS // 64 + 37, 64, 0.5, 2)])  # the last: row chunks
def test_equals_the_composed_ops(backend, n, c, p, bits):
    cfg = CompressionConfig(bits=bits) if bits else CompressionConfig(enabled=False)
    x, w, b = _inputs(n, c)
    with kernels.use_backend(backend):
        stats = [(torch.zeros(c), torch.ones(c)) for _ in range(2)]
        got = _run(True, x, w, b, *stats[0], True, p, cfg)
        want = _run(False, x, w, b, *stats[1], True, p, cfg)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
    torch.testing.assert_close(stats[0], stats[1], rtol=0, atol=0)  # running statistics updated alike
    assert not torch.equal(stats[0][0], torch.zeros(c))


def test_without_running_statistics_and_without_affine():
    x, _, _ = _inputs(10, 6)
    cfg = CompressionConfig(bits=2)
    torch.manual_seed(1)
    y = ops.batch_norm_relu_dropout(x * 1.0, None, None, None, None, True, 0.1, 1e-5, 0.5, config=cfg)
    (gx,) = torch.autograd.grad(y.sum(), x)
    torch.manual_seed(1)
    y2 = ops.relu_dropout(ops.batch_norm(x * 1.0, None, None, None, None, True, 0.1, 1e-5, cfg), 0.5)
    (gx2,) = torch.autograd.grad(y2.sum(), x)
    assert torch.equal(y, y2) and torch.equal(gx, gx2)


def test_one_layer_sized_buffer_fewer():
    """Composed, batch norm's output and ReLU+dropout's output are alive at once; fused, one buffer."""
    from tests._op_census import Census

    n, c = 256, 64
    x, w, b = _inputs(n, c)
    h = x * 1.0
    peaks = []
    for fused in (True, False):
        cfg = CompressionConfig(bits=2)
        with Census(min_bytes=n * c * 4) as census:
            if fused:
                y = ops.batch_norm_relu_dropout(h, None, None, w, b, True, 0.1, 1e-5, 0.5, config=cfg)
            else:
                y = ops.relu_dropout(ops.batch_norm(h, None, None, w, b, True, 0.1, 1e-5, cfg), 0.5)
        peaks.append(census.best["forward"])
        del y
    assert peaks[0] + n * c * 4 <= peaks[1], peaks


def test_double_backward_exact_with_compression_off_and_raises_with_it_on():
    x, w, b = _inputs(12, 5)
    for fused in (True, False):
        torch.manual_seed(4)
        h = x * 1.0
        off = CompressionConfig(enabled=False)
        y = (ops.batch_norm_relu_dropout(h, None, None, w, b, True, 0.1, 1e-5, 0.5, config=off) if fused
             else ops.relu_dropout(ops.batch_norm(h, None, None, w, b, True, 0.1, 1e-5, off), 0.5))
        (gx,) = torch.autograd.grad((y * torch.arange(5.0)).sum(), x, create_graph=True)
        penalty = gx.square().sum()
        got = torch.autograd.grad(penalty, (x, w))
        if fused:
            fused_result = got
        else:
            for a, e in zip(fused_result, got):
                torch.testing.assert_close(a, e)
    assert fused_result[0].abs().sum() > 0
    y = ops.batch_norm_relu_dropout(x * 1.0, None, None, w, b, True, 0.1, 1e-5, 0.5, config=CompressionConfig(bits=2))
    with pytest.raises(RuntimeError, match=r"batch_norm_relu_dropout: double backward.*enabled=False"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


def test_refuses_what_it_does_not_cover():
    x, w, b = _inputs(6, 3)
    with pytest.raises(ValueError, match="fp32"):
        ops.batch_norm_relu_dropout(x.double(), None, None, None, None, True)
    with pytest.raises(ValueError, match="fp32"):
        ops.batch_norm_relu_dropout(x[:, :, None], None, None, None, None, True)
    with pytest.raises(ValueError, match="more than 1 value"):
        ops.batch_norm_relu_dropout(x[:1], None, None, None, None, True)
    with pytest.raises(ValueError, match="probability"):
        ops.batch_norm_relu_dropout(x, None, None, None, None, True, p=1.0)
    assert "batch_norm_relu_dropout" in dgl_exact.ops.__all__
