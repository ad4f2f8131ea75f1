"""``ops.batch_norm``'s chunked backward from a compressed input: the arithmetic runs in the decoded chunk itself
(this backward's own buffer), so at its peak one chunk besides the input gradient, not two."""
import torch

import dgl_exact
from tests._op_census import Census
from dgl_exact.ops import chunks as chunking


def test_chunked_backward_holds_one_chunk_beside_the_input_gradient(monkeypatch):
    rows, width, chunk_rows = 4096, 64, 256
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", chunk_rows * width)
    torch.manual_seed(0)
    h = torch.randn(rows, width, requires_grad=True) * 1.0  # a hidden activation: kept compressed
    w, b = torch.ones(width, requires_grad=True), torch.zeros(width, requires_grad=True)
    out = dgl_exact.ops.batch_norm(h, torch.zeros(width), torch.ones(width), w, b, True, 0.1, 1e-5,
                                   dgl_exact.CompressionConfig(bits=2))
    g = torch.randn_like(out)
    chunk = chunk_rows * width * 4
    census = Census(min_bytes=chunk // 2)
    with census:
        census.phase = "backward"
        gx = torch.autograd.grad(out, [h], g)[0]  # the batch norm's backward only
    assert gx.shape == h.shape
    # what the backward allocated at its peak (the census also lists views of storages made before it: slices)
    peak = sum(e["bytes"] for e in census.snapshot["backward"][2] if e["op"] != "slice")
    assert peak <= rows * width * 4 + 1.5 * chunk, peak / chunk  # gx and one chunk
