"""Backward of linear and batch norm from the compressed input in row chunks (so that no full-size
decompressed copy is alive at the backward's peak). Chunks must decode exactly as the whole tensor does, at awkward
sizes (one row, chunk and block boundaries, a last chunk shorter than a block, projection, fp16/bf16)."""
import pytest
import torch

import dgl_exact
from dgl_exact.compression import compress, decompress
from dgl_exact.ops import keep as keeping
from dgl_exact.ops.keep import row_chunks


def _cfg(**kw):
    return dgl_exact.CompressionConfig(**{"bits": 2, **kw})


CONFIGS = {
    "int2": _cfg(),
    "int2-blocks64-optimal": _cfg(block_rows=64, levels="optimal"),
    "int4-blocks3": _cfg(bits=4, block_rows=3),
    "int1-odd-width": _cfg(bits=1),
    "int2-rp-blocks64": _cfg(kept_frac=0.125, block_rows=64, levels="optimal"),
    "int8": _cfg(bits=8),
    "off-rp": dgl_exact.CompressionConfig(enabled=False, kept_frac=0.5),
}


@pytest.mark.parametrize("rows", [1, 2, 7, 63, 64, 65, 200, 257])
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("chunk_elements", [1, 40 * 9, 10**9])
def test_row_chunks_decode_as_the_whole(name, rows, chunk_elements):
    width = 9 if name == "int1-odd-width" else 16
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rows))
    c = compress(x, CONFIGS[name], seed=3)
    whole = decompress(c)
    parts = list(row_chunks(c, chunk_elements))
    assert parts[0][0] == 0 and parts[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    torch.testing.assert_close(torch.cat([p for _, _, p in parts]), whole, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_row_chunks_dtypes_and_3d(dtype):
    x = torch.randn(70, 3, 5).to(dtype)
    c = compress(x, _cfg(block_rows=4), seed=1)
    parts = list(row_chunks(c, 60))
    assert len(parts) > 1 and all(p.dtype == dtype and p.shape[1:] == (3, 5) for _, _, p in parts)
    torch.testing.assert_close(torch.cat([p for _, _, p in parts]), decompress(c), rtol=0, atol=0)
    exact = list(row_chunks(x, 60))
    assert all(p.data_ptr() == x[r0].data_ptr() for r0, _, p in exact)  # exact tensors: views


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few rows, so the sizes below cross many chunk boundaries."""
    real = keeping.row_chunks
    monkeypatch.setattr("dgl_exact.ops.dense.row_chunks", lambda item: real(item, 5 * 16))


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 33])
@pytest.mark.parametrize("name", ["int2", "int2-blocks64-optimal", "int2-rp-blocks64"])
def test_linear_chunked_weight_grad(rows, name, small_chunks, kept_compressed):
    kept = kept_compressed
    x = (torch.randn(rows, 16) * 1.0).requires_grad_()
    h = x * 2.0  # not a leaf: kept compressed
    w = torch.randn(7, 16, requires_grad=True)
    b = torch.randn(7, requires_grad=True)
    out = dgl_exact.ops.linear(h, w, b, CONFIGS[name])
    g = torch.randn(out.shape)
    out.backward(g)
    (c,) = kept
    torch.testing.assert_close(w.grad, g.t() @ decompress(c), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, 2.0 * g @ w.detach(), rtol=0, atol=0)  # input gradient: no activation
    torch.testing.assert_close(b.grad, g.sum(0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_chunked_half(dtype, small_chunks):
    _skip_without_cpu_fp16_matmul(dtype)
    x = torch.randn(23, 16).to(dtype).requires_grad_()
    w = torch.randn(4, 16).to(dtype).requires_grad_()
    out = dgl_exact.ops.linear(x * 1, w, None, _cfg(bits=8))
    out.float().sum().backward()
    assert w.grad.dtype == dtype
    torch.testing.assert_close(w.grad.float(), (torch.ones(23, 4).t() @ x.float()).to(dtype).float(),
                               rtol=5e-2, atol=5e-1)


@pytest.mark.parametrize("rows", [2, 5, 6, 33])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_batch_norm_chunked_matches_aten_on_the_same_input(rows, training, affine, dtype, small_chunks,
                                                           kept_compressed):
    """The chunked backward equals ATen's batch-norm backward run on the decompressed input."""
    kept = kept_compressed
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 16, generator=gen) * 3 + 1).to(dtype).requires_grad_()
    pdt = torch.float64 if dtype == torch.float64 else torch.float32  # parameters and buffers, as a module's
    w = torch.randn(16, generator=gen).to(pdt).requires_grad_() if affine else None
    b = torch.randn(16, generator=gen).to(pdt).requires_grad_() if affine else None
    rm, rv = torch.randn(16, generator=gen).to(pdt), (torch.rand(16, generator=gen) + 0.5).to(pdt)
    out = dgl_exact.ops.batch_norm(x * 1, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5, _cfg(block_rows=4))
    g = torch.randn(out.shape, generator=gen).to(dtype)
    grads = torch.autograd.grad(out, [x] + ([w, b] if affine else []), g)
    (c,) = kept
    # today's backward: ATen's kernel on the whole decompressed input, with the statistics forward kept
    cdt = torch.promote_types(dtype, torch.float32)
    wc = None if w is None else w.detach().to(cdt)
    _, save_mean, save_invstd = torch.native_batch_norm(x.detach().to(cdt), wc, None, rm.clone().to(cdt),
                                                        rv.clone().to(cdt), training, 0.1, 1e-5)
    stats = (None, None, save_mean, save_invstd) if training else (rm.to(cdt), rv.to(cdt), None, None)
    want = torch.ops.aten.native_batch_norm_backward(g.to(cdt), decompress(c).to(cdt), wc, *stats, training, 1e-5,
                                                     [True, affine, affine])
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    assert grads[0].dtype == dtype
    for got, exp in zip(grads, want):
        torch.testing.assert_close(got.to(cdt), exp.to(cdt), **tol)


def _skip_without_cpu_fp16_matmul(dtype):
    if dtype == torch.float16 and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 2):
        pytest.skip("torch < 2.2 has no fp16 matmul on the CPU (addmm_impl_cpu_)")
