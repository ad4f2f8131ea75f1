"""Row chunks of a kept tensor (``ops.chunks.row_chunks``, what backward decodes so that no full-size decompressed
copy is alive at its peak) decode exactly as the whole tensor does, at awkward sizes (one row, chunk and block
boundaries, a last chunk shorter than a block, projection, fp16/bf16); the weight gradient summed over chunks
(``weight_grad``) and a planner's sample scope (``sample_chunking``). Linear's and batch norm's chunked backward:
tests/ops/test_dense.py."""
import pytest
import torch

from dgl_exact.compression import compress, decompress
from dgl_exact import CompressionConfig
from dgl_exact.ops import chunks as chunking
from dgl_exact.ops.chunks import row_chunks
from tests.ops._helpers import CONFIGS, _cfg


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


@pytest.mark.parametrize("chunk", [40, 1000, 10 ** 6])
def test_rows_together_decodes_each_item_as_restore(chunk, monkeypatch):
    """Common row chunks over several kept items (different block sizes, a projected one, an exact tensor,
    None): each item's chunks put together are its :func:`restore` bit for bit, chunks start on multiples of
    8 rows and of every item's block rows, and a short tail is merged. (A projected item's rows are
    unprojected by a product per chunk: equal up to the product's summation order.)"""
    from dgl_exact.ops.keep import restore
    from dgl_exact.ops.chunks import rows_together

    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", chunk)
    torch.manual_seed(0)
    n = 247
    items = [compress(torch.randn(n, 9), CompressionConfig(bits=2, block_rows=3)),
             compress(torch.randn(n, 16), CompressionConfig(bits=4, block_rows=5, levels="optimal")),
             compress(torch.randn(n, 32), CompressionConfig(bits=2, kept_frac=0.25)),
             torch.randn(n, 4), None]
    parts = [[] for _ in items]
    last = 0
    for r0, r1, rows in rows_together(items, n, "cpu"):
        assert r0 == last and r0 % 120 == 0 and r1 > r0
        last = r1
        for acc, r in zip(parts, rows):
            acc.append(r)
        del rows
    assert last == n
    for item, acc in zip(items, parts):
        if item is None:
            assert all(r is None for r in acc)
        elif getattr(item, "proj_seed", None) is not None:
            torch.testing.assert_close(torch.cat(acc), restore(item), rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(torch.cat(acc), restore(item))


@pytest.mark.parametrize("kept_first", [False, True])
@pytest.mark.parametrize("shape", [(130, 6), (45, 3, 6)])
def test_weight_grad_is_the_product_over_all_rows(shape, kept_first, monkeypatch):
    """``grad^T x`` (``x^T grad`` with ``kept_first``) summed over row chunks equals the product over all rows
    of the decoded item (fp32 sums in another order: a few ulps), leading dimensions flattened; an exact
    tensor's chunks are views, a compressed one's decode chunk by chunk."""
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 16 * shape[-1])  # several chunks
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen)
    grad = torch.randn(*shape[:-1], 4, generator=gen, dtype=torch.float64)
    for item in (x, compress(x, _cfg(block_rows=4), seed=2)):
        assert len(list(row_chunks(item))) > 1
        xd = decompress(item) if item is not x else x
        g2, x2 = grad.reshape(-1, 4), xd.reshape(-1, shape[-1]).to(grad.dtype)
        want = x2.t().matmul(g2) if kept_first else g2.t().matmul(x2)
        got = chunking.weight_grad(grad, item, kept_first=kept_first)
        assert got.dtype == grad.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_weight_grad_of_no_rows_is_none():
    assert chunking.weight_grad(torch.randn(0, 3), torch.randn(0, 5)) is None


def test_sample_chunking_scales_and_caps_the_chunks_within_its_scope():
    base = chunking.CHUNK_ELEMENTS
    per_row = base // 64      # 1024 rows of this width: 16 full-size chunks
    assert chunking.chunk_rows(1024, per_row, "cpu") == 64 and chunking.chunk_scale() == 1.0
    with chunking.sample_chunking(0.25):
        assert chunking.chunk_scale() == 0.25 and chunking.chunk_elements_for("cpu") == base // 4
        with chunking.sample_chunking(1.0, 4):  # at most 4 chunks: 1024 / 4 rows each
            assert chunking.chunk_rows(1024, per_row, "cpu") == 256
        assert chunking.chunk_scale() == 0.25
    assert chunking.chunk_scale() == 1.0 and chunking.chunk_elements_for("cpu") == base
