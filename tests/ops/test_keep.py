"""Row chunks of a kept tensor (``ops.keep.row_chunks``, what backward decodes so that no full-size decompressed
copy is alive at its peak) decode exactly as the whole tensor does, at awkward sizes (one row, chunk and block
boundaries, a last chunk shorter than a block, projection, fp16/bf16). Linear's and batch norm's chunked backward:
tests/ops/test_dense.py."""
import pytest
import torch

from dgl_exact.compression import compress, decompress
from dgl_exact.ops.keep import row_chunks
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


def test_reclaim_takes_back_a_donated_tensor_that_was_not_released():
    from dgl_exact.ops.keep import Donated, Released, donate, reclaim, release
    t = torch.randn(3, 2) * 1.0
    values = t.clone()
    assert type(donate(t)) is Donated
    assert reclaim(t) is t and type(t) is torch.Tensor and torch.equal(t, values)
    plain = torch.ones(2)
    assert reclaim(plain) is plain and type(plain) is torch.Tensor
    gone = donate(torch.randn(4) * 1.0)
    assert release(gone) and type(gone) is Released
    with pytest.raises(RuntimeError, match="released"):
        reclaim(gone)
