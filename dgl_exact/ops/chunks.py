"""Row chunks of a kept item: what a backward decodes at a time, so that no full-size decompressed copy of a
compressed activation exists (the chunk size, on the CPU and on a GPU, and a planner's scaled sample runs).

A chunked loop's body ends with ``del`` of every chunk (see :func:`row_chunks`); :func:`weight_grad` is the
loop every linear-like backward runs for its weight gradient."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Optional

import torch

from ..compression import CompressedTensor, decompress
from .derived import ElementwiseOf, LinearOf
from .keep import Kept, restore

__all__ = ["CHUNK_ELEMENTS", "CUDA_CHUNK_ELEMENTS", "gpu_chunk_policy", "sample_chunking", "chunk_scale",
           "chunk_elements_for", "chunk_rows", "needs_chunks", "row_chunks", "rows_together", "weight_grad",
           "linear_of_row_sum"]

#: elements (not bytes) of one decompressed row chunk in a chunked backward on the CPU: 4 MiB of fp32
CHUNK_ELEMENTS = 1 << 20
# a planner's sample run: chunk sizes scaled with the sample (see dgl_exact.planning.predict)
_chunk_scale = contextvars.ContextVar("dgl_exact_chunk_scale", default=1.0)
# ... and at most this many chunks per tensor (0: no limit), so that a small sample runs few chunk loops
_max_chunks = contextvars.ContextVar("dgl_exact_max_chunks", default=0)
#: the same on a GPU: 1 GiB of fp32. Every chunk costs its kernel launches and the chunked batch-norm
#: backward reads the input twice, so on a GPU a tensor is chunked only when its decompressed copy is
#: large enough to matter for the step peak (a products-sized 2.4 M x 256 activation: 3 chunks; an
#: arxiv-sized one: none, and batch norm takes ATen's fused kernel).
CUDA_CHUNK_ELEMENTS = 1 << 28

_gpu_policy_on_cpu = contextvars.ContextVar("dgl_exact_gpu_chunk_policy", default=False)


@contextlib.contextmanager
def gpu_chunk_policy():
    """Within this scope CPU tensors are chunked as CUDA tensors would be (the GPU code path, emulated
    on the CPU by :mod:`dgl_exact.bench.opcount`)."""
    token = _gpu_policy_on_cpu.set(True)
    try:
        yield
    finally:
        _gpu_policy_on_cpu.reset(token)


@contextlib.contextmanager
def sample_chunking(scale: float, max_chunks: int = 0):
    """Within this scope chunk sizes are scaled by ``scale`` (a planner's sample run of a graph ``scale`` times
    the full size: :mod:`dgl_exact.planning.predict`), and a tensor is split into at most ``max_chunks``
    chunks (0: no limit; see :func:`chunk_rows`)."""
    tokens = (_chunk_scale.set(scale), _max_chunks.set(max_chunks))
    try:
        yield
    finally:
        _chunk_scale.reset(tokens[0])
        _max_chunks.reset(tokens[1])


def chunk_scale() -> float:
    """The factor chunk sizes are scaled by in this context (1.0 outside :func:`sample_chunking`)."""
    return _chunk_scale.get()


def chunk_elements_for(device) -> int:
    """Elements of one decompressed row chunk in a chunked backward for tensors on ``device``."""
    base = CUDA_CHUNK_ELEMENTS if torch.device(device).type == "cuda" or _gpu_policy_on_cpu.get() else CHUNK_ELEMENTS
    scale = _chunk_scale.get()
    return base if scale == 1.0 else max(1, int(base * scale))


def chunk_rows(n_rows: int, per_row: int, device, align: int = 1) -> int:
    """Rows per chunk of a row-chunked loop over ``n_rows`` rows of ``per_row`` elements on ``device``: as
    many as :func:`chunk_elements_for` allows, a multiple of ``align`` (at least ``align``).

    In a planner's sample run (:mod:`dgl_exact.planning.predict`, chunks scaled with the sample) the loop
    instead runs as many chunks as the full-size tensor would, rounded down to a power of two and capped,
    ``n_rows / k`` rows each: the sample sizes are multiples of ``k * align``, so both samples run the same
    operators and every point of the step's memory timeline can be extrapolated."""
    cap = _max_chunks.get()
    if cap:
        full = n_rows * per_row / _chunk_scale.get()
        gpu = torch.device(device).type == "cuda" or _gpu_policy_on_cpu.get()
        k = min(cap, max(1, math.ceil(full / (CUDA_CHUNK_ELEMENTS if gpu else CHUNK_ELEMENTS))))
        k = 1 << (k.bit_length() - 1)
        rows = -(-n_rows // k)
        return max(align, -(-rows // align) * align)
    return max(align, (chunk_elements_for(device) // max(1, per_row)) // align * align)


def _item_numel_device(item: "Kept"):
    if isinstance(item, torch.Tensor):
        return item.numel(), item.device
    if isinstance(item, (LinearOf, ElementwiseOf)):
        return item.shape.numel(), item.device
    return item.n_rows * item.orig_width, item.device


def needs_chunks(item: "Kept") -> bool:
    """Whether :func:`row_chunks` would split ``item`` into more than one chunk on its device."""
    if item is None:
        return False
    numel, device = _item_numel_device(item)
    return numel > chunk_elements_for(device)


def row_chunks(item: Kept, chunk_elements: Optional[int] = None):
    """``(r0, r1, x_hat[r0:r1])`` over consecutive row ranges of a kept item (dim 0), so a backward can
    work from a compressed activation without a full-size decompressed copy. Each chunk decodes exactly
    as the same rows of :func:`~.keep.restore`: chunks start at block (group) boundaries and at whole bytes of
    the packed codes, and hold at least one whole block (the non-uniform level table depends on the group
    size); a projected item is unprojected row by row. An exact tensor is sliced (views, no copy).

    The next chunk is decoded when the loop asks for it, while the loop's own names still hold the previous
    one: a loop body ends with ``del x`` (and whatever else holds the chunk), or two decoded chunks are alive
    at once at the backward's peak. A :class:`~.derived.LinearOf` is decoded through its linear from row chunks of
    its kept input, each holding about as many of its own elements as a chunk of another item; a
    :class:`~.derived.ElementwiseOf` from the same row chunks of its root, each step applied from the chunk's
    first element on."""
    if item is None:
        return
    if isinstance(item, LinearOf):
        yield from _linear_chunks(item, chunk_elements)
        return
    if isinstance(item, ElementwiseOf):
        for r0, r1, x in row_chunks(item.root, chunk_elements):
            yield r0, r1, item.rows(x, r0)
            del x
        return
    n = item.shape[0] if len(item.shape) else 1
    per_row = max(1, (item.numel() if isinstance(item, torch.Tensor) else
                      (item.n_rows * item.orig_width)) // max(n, 1))
    device = _item_numel_device(item)[1]
    if isinstance(item, torch.Tensor) or item.packed is None:
        x = restore(item)
        step = max(1, chunk_elements // per_row) if chunk_elements is not None else chunk_rows(n, per_row, device)
        for r0 in range(0, n, step):
            yield r0, min(n, r0 + step), x[r0:r0 + step]
        return
    if len(item.shape) < 2 or item.n_rows != n or n * item.width == 0:
        yield 0, n, restore(item)
        return
    align = math.lcm(item.block_rows, 8)  # 8 rows of codes always end on a byte
    step = (max(align, (chunk_elements // per_row) // align * align) if chunk_elements is not None
            else chunk_rows(n, per_row, device, align))
    starts = _chunk_starts(n, step, item.block_rows)
    for i, r0 in enumerate(starts):
        r1 = starts[i + 1] if i + 1 < len(starts) else n
        yield r0, r1, _decode_rows(item, r0, r1)


def _linear_chunks(item: LinearOf, chunk_elements: Optional[int]):
    n = max(1, item.shape[0] if len(item.shape) else 1)
    per_row = max(1, item.shape.numel() // n)
    x_numel = _item_numel_device(item.x)[0]
    budget = chunk_elements if chunk_elements is not None else chunk_elements_for(item.device)
    for r0, r1, x in row_chunks(item.x, max(1, budget * max(1, x_numel // n) // per_row)):
        yield r0, r1, item.rows(x)
        del x


def _contracts(grad: torch.Tensor, item: LinearOf) -> bool:
    """Whether ``grad^T y`` for a kept ``y = x W^T + b`` (``[N, out]``) is cheaper as ``(grad^T x) W^T``."""
    n, (out, inp) = item.shape[0], item.weight.shape
    if (grad.dim() != 2 or grad.shape[0] != n or tuple(item.shape) != (n, out) or len(item.x.shape) != 2
            or item.x.shape[1] != inp):
        return False
    cols = grad.shape[1]
    return n * cols * inp + cols * inp * out < n * inp * out + n * out * cols


def _rows_contracted(g: torch.Tensor, item: LinearOf) -> torch.Tensor:
    """``g^T x_hat`` (``[C, in]``) for ``g [N, C]`` and the kept input ``x`` of ``item``, row chunk by row chunk."""
    out = None
    for r0, r1, x in row_chunks(item.x):
        part = g[r0:r1].t().matmul(x.to(g.dtype))
        out = part if out is None else out.add_(part)
        del x, part  # before the next chunk is decoded (see row_chunks)
    return out if out is not None else g.new_zeros((g.shape[1], item.weight.shape[1]))


def linear_of_row_sum(grad: torch.Tensor, item: LinearOf) -> Optional[torch.Tensor]:
    """``(grad * y).sum(0)`` for a kept ``y = x W^T + b`` of ``grad``'s shape (``[N, ...]``, ``out`` values a row)
    without decoding ``y``: ``sum_k W[j, k] (g^T x)[c(j), k] + b_j sum_n g[n, c(j)]``, where ``g`` is ``grad``
    with its broadcast dims (stride 0: a gradient through ``.sum(-1)``) narrowed to one, so ``g^T x`` costs
    ``N x C x in`` (``C``: ``g``'s columns) instead of the ``N x out x in`` of decoding ``y``. The same sum up to
    float summation order. None where ``item`` is not a linear of a 2-D input of ``grad``'s rows."""
    n, (out, inp) = item.shape[0], item.weight.shape
    if (tuple(grad.shape) != tuple(item.shape) or len(item.x.shape) != 2 or item.x.shape[1] != inp
            or grad.dim() < 1 or item.shape.numel() != n * out):
        return None
    g = grad
    for d in range(1, grad.dim()):
        if grad.stride(d) == 0 and grad.shape[d] > 1:
            g = g.narrow(d, 0, 1)
    compact = g.shape[1:]
    g2 = g.reshape(n, -1)
    m = _rows_contracted(g2, item).view(tuple(compact) + (inp,)).expand(tuple(item.shape[1:]) + (inp,))
    w = item.weight.to(m.dtype)
    total = (m.reshape(out, inp) * w).sum(1)
    if item.bias is not None:
        total = total + g2.sum(0).view(compact).expand(item.shape[1:]).reshape(out) * item.bias.to(m.dtype)
    return total.view(item.shape[1:])


def _chunk_starts(n: int, step: int, block_rows: int) -> list:
    starts = list(range(0, n, step))
    if len(starts) > 1 and n - starts[-1] < block_rows:
        starts.pop()  # a last chunk shorter than a block would pick another level table: merge it
    return starts


def _row_wise(item: Kept) -> bool:
    """Whether rows of ``item`` decode on their own (:func:`_decode_rows`) rather than from a whole copy."""
    return (isinstance(item, CompressedTensor) and item.packed is not None and len(item.shape) >= 2
            and item.n_rows == item.shape[0] and item.n_rows * item.width > 0)


def _decode_rows(item: CompressedTensor, r0: int, r1: int) -> torch.Tensor:
    """Rows ``r0:r1`` of a row-wise compressed item (:func:`_row_wise`), decoded as the same rows of
    :func:`~.keep.restore`: ``r0`` on a block boundary and a whole byte, ``r1`` too or the last row."""
    n = item.n_rows
    bits_per_row = item.width * item.bits  # byte offset of row r: r * bits_per_row // 8
    b0 = r0 * bits_per_row // 8
    b1 = r1 * bits_per_row // 8 if r1 < n else item.packed.numel()
    g0, g1 = r0 // item.block_rows, -(-r1 // item.block_rows)
    part = dataclasses.replace(item, shape=torch.Size((r1 - r0,) + tuple(item.shape[1:])), n_rows=r1 - r0,
                               packed=item.packed[b0:b1], lo=item.lo[g0:g1], step=item.step[g0:g1])
    return decompress(part)


def rows_together(items, n_rows: int, device):
    """``(r0, r1, [rows r0:r1 of each item])`` over row chunks common to several kept items of ``n_rows``
    rows each (``None`` items give ``None``), for a backward that combines them row by row: each item's rows
    decode exactly as the same rows of :func:`~.keep.restore` (chunks start on every compressed item's block
    boundaries and at multiples of 8 rows: whole bytes of codes and of one-bit masks over any width), and
    the decoded chunks of all items together stay within :func:`chunk_rows`' budget. The rule of
    :func:`row_chunks` holds: the loop body ends with ``del`` of every chunk."""
    wise = [_row_wise(it) for it in items]
    whole = [None if it is None or w else restore(it) for it, w in zip(items, wise)]
    per_row = sum(max(1, _item_numel_device(it)[0] // max(n_rows, 1)) for it in items if it is not None)
    blocks = [it.block_rows for it, w in zip(items, wise) if w]
    align = math.lcm(8, *blocks)
    starts = _chunk_starts(n_rows, chunk_rows(n_rows, max(per_row, 1), device, align), max(blocks, default=1))
    for i, r0 in enumerate(starts):
        r1 = starts[i + 1] if i + 1 < len(starts) else n_rows
        yield r0, r1, [_decode_rows(it, r0, r1) if w else (None if x is None else x[r0:r1])
                       for it, w, x in zip(items, wise, whole)]


def weight_grad(grad: torch.Tensor, item: Kept, kept_first: bool = False) -> Optional[torch.Tensor]:
    """A weight gradient from a kept input, one decoded row chunk at a time (:func:`row_chunks`): ``grad^T x``
    (``[out, in]``, a linear's weight), or ``x^T grad`` with ``kept_first`` (``[in, out]``, a weight applied as
    ``x @ W``), summed over the chunks (the same product up to float summation order). Leading dimensions of
    ``grad`` and ``x`` are flattened into rows; ``x`` is cast to ``grad``'s dtype. None where ``item`` has
    no rows to chunk. A :class:`~.derived.LinearOf` ``y = x W^T + b`` (``[N, out]``) gives ``(grad^T x) W^T + g_sum b``
    where that takes fewer operations than decoding ``y`` (a narrow ``grad``: ``Linear(Linear(x))`` to a few
    columns), the same product up to float summation order."""
    if isinstance(item, LinearOf) and not kept_first and _contracts(grad, item):
        gx = _rows_contracted(grad.reshape(grad.shape[0], -1), item)
        out = gx.matmul(item.weight.to(gx.dtype).t())
        if item.bias is not None:
            out.add_(grad.sum(0).unsqueeze(1) * item.bias.to(gx.dtype))
        return out
    out = None
    for r0, r1, x in row_chunks(item):
        g, x = grad[r0:r1], x.to(grad.dtype)
        g, x = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        part = x.t().matmul(g) if kept_first else g.t().matmul(x)
        out = part if out is None else out.add_(part)
        del x, g, part  # before the next chunk is decoded (see row_chunks)
    return out
