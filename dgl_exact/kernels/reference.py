"""Pure-torch reference kernels (any device). This module *is* the contract every backend follows.

Compression (``quantize_pack`` / ``unpack_dequantize``)
    ``x`` is an ``[N, k]`` float tensor (fp32, fp16 or bf16; arithmetic in fp32). Rows are grouped in
    blocks of ``block_rows`` consecutive rows; group ``g = row // block_rows`` has fp32 ``lo[g]`` and
    ``step[g]`` (already rounded to their storage precision by the caller). With ``M = 2**bits - 1``:

    * ``inv = 1 / step`` (``0`` where ``step == 0``), ``t = clamp((x - lo) * inv, 0, M)``;
    * uniform levels: ``j = min(floor(t), M - 1)``, ``frac = t - j``; with a level table ``L`` (fp32,
      ascending, ``L[0] = 0``, ``L[M] = M``): ``j`` is the last index with ``L[j] <= t`` capped at
      ``M - 1``, ``frac = (t - L[j]) / (L[j + 1] - L[j])``;
    * ``q = j + (u < frac)`` where ``u = hash_uniform(seed, e)`` for stochastic rounding and
      ``u = 0.5`` otherwise; ``e = row * k + col`` is the element's flat index;
    * code ``e`` occupies bits ``[(e * bits) % 8, +bits)`` of byte ``(e * bits) // 8`` (little-endian
      within the byte); the buffer is ``ceil(N * k * bits / 8)`` bytes, unused high bits are zero.

    Decoding: ``x_hat = lo + L[q] * step`` (``L[q] = q`` for uniform levels), cast to ``dtype``.

Group metadata (``group_meta``): from the fp32 per-group minimum ``mn`` and maximum ``mx``, ``[2, G]``
    fp32 rows ``lo``, ``step`` (values bf16 holds exactly). On the fp32 bit patterns, ``lo`` is ``mn``
    rounded down to bf16 (``b + 0xFFFF`` first when the sign bit is set, then ``& 0xFFFF0000``);
    ``span = mx - lo``; ``step`` is ``span * f`` rounded up to bf16 (``(max(b, 0x00800000) + 0xFFFF) & 0xFFFF0000``: at least 2^-126, so
    ``1 / step`` stays finite), with
    ``f = fp32((1 + 2^-20) / M)`` (so every value lands in ``[0, M]`` despite fp32 rounding). Where
    ``span`` is not finite (the group holds a NaN or an inf) ``lo = NaN, step = 0``; where ``span == 0``
    (a constant group bf16 holds) ``step = 0``.

Masks (``pack_mask`` / ``unpack_mask``): one bit per element, same bit order as 1-bit codes.

Random numbers (``hash_uniform``): ``u(seed, e)`` in ``[0, 1)`` with 24 random bits, from two rounds of
MurmurHash3's 32-bit finaliser: ``h = fmix32(fmix32(e_lo ^ s_lo) ^ ((e_hi + s_hi) mod 2^32))``,
``u = (h >> 8) * 2^-24``, where ``s_lo, s_hi`` are the low/high 32 bits of the 64-bit seed and
``e_lo, e_hi`` those of the element index. Dropout keeps element ``e`` iff ``u(seed, e) >= p``.

Graph kernels take the graph as CSR over destination nodes (``indptr [n_dst + 1]``, ``indices`` =
source node of each stored edge, ``eids`` = edge id of each stored edge or ``None`` for identity),
features as ``[n_src, H, D]`` and per-edge values as ``[E, H]`` indexed by edge id.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from . import register

_MASK32 = 0xFFFFFFFF
_C1 = 0x85EBCA6B
_C2 = 0xC2B2AE35


def _to_i32(v: int) -> int:
    """Reinterpret an unsigned 32-bit constant as signed int32 (torch has no uint32 arithmetic)."""
    return v - (1 << 32) if v >= (1 << 31) else v


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    # int32 arithmetic wraps like uint32 for xor and multiply; right shifts are masked to act logically.
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h * _to_i32(_C1)
    h = h ^ ((h >> 13) & 0x7FFFF)
    h = h * _to_i32(_C2)
    h = h ^ ((h >> 16) & 0xFFFF)
    return h


def split_seed(seed: int) -> tuple:
    seed = int(seed) & 0xFFFFFFFFFFFFFFFF
    return seed & _MASK32, (seed >> 32) & _MASK32


def _as_i32(v: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^32) -> int32 with the same 32 bits."""
    return torch.where(v >= (1 << 31), v - (1 << 32), v).to(torch.int32)


def hash_uniform(seed: int, start: int, count: int, device) -> torch.Tensor:
    """Uniforms ``u(seed, e)`` for ``e`` in ``[start, start + count)`` as fp32 on ``device``."""
    s_lo, s_hi = split_seed(seed)
    if start + count <= (1 << 31):  # common case: e_hi == 0, stay in int32
        e = torch.arange(start, start + count, device=device, dtype=torch.int32)
        h = _fmix32(_fmix32(e ^ _to_i32(s_lo)) ^ _to_i32(s_hi))
    else:
        e = torch.arange(start, start + count, device=device, dtype=torch.int64)
        h = _fmix32(_as_i32((e & _MASK32) ^ s_lo))
        h = _fmix32(h ^ _as_i32(((e >> 32) + s_hi) & _MASK32))
    return ((h >> 8) & 0xFFFFFF).to(torch.float32) * (1.0 / (1 << 24))


def _group_expand(v: torch.Tensor, n_rows: int, block_rows: int) -> torch.Tensor:
    if block_rows == 1:
        return v[:, None]
    return v.repeat_interleave(block_rows)[:n_rows, None]


def _chunks(n_rows: int, k: int, target: int = 1 << 22):
    """Row ranges that keep temporaries near ``target`` elements."""
    rows = max(1, target // max(k, 1))
    for start in range(0, n_rows, rows):
        yield start, min(n_rows, start + rows)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack flat uint8 codes (< 2**bits) densely, ``8 // bits`` per byte, little-endian."""
    per_byte = 8 // bits
    n = codes.numel()
    pad = (-n) % per_byte
    c = codes.reshape(-1)
    if pad:
        c = torch.cat([c, c.new_zeros(pad)])
    if per_byte == 1:
        return c.clone() if c.data_ptr() == codes.data_ptr() else c
    c = c.view(-1, per_byte).to(torch.int32)
    shifts = torch.arange(0, 8, bits, device=c.device, dtype=torch.int32)
    return (c << shifts).sum(dim=1).to(torch.uint8)


def unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: the first ``n`` codes as int64."""
    per_byte = 8 // bits
    if per_byte == 1:
        return packed[:n].to(torch.int64)
    shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.int32)
    codes = (packed.to(torch.int32)[:, None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(-1)[:n].to(torch.int64)


_LOW16 = 0xFFFF
_HIGH16 = -65536  # 0xFFFF0000 as int32: bf16 keeps the top 16 bits of an fp32
_MIN_NORMAL = 0x00800000  # bits of the smallest normal fp32, 2^-126


def meta_factor(bits: int) -> float:
    """``(1 + 2^-20) / M`` rounded to fp32 (as torch rounds a Python scalar multiplying an fp32 tensor)."""
    return float(torch.tensor((1.0 + 2.0**-20) / ((1 << bits) - 1), dtype=torch.float32))


@register("group_meta", "torch")
def group_meta(mn: torch.Tensor, mx: torch.Tensor, bits: int) -> torch.Tensor:
    mn, mx = mn.float().reshape(-1), mx.float().reshape(-1)
    b = mn.contiguous().view(torch.int32)
    lo = torch.where(b < 0, b + _LOW16, b).bitwise_and_(_HIGH16).view(torch.float32)
    span = mx - lo
    finite = torch.isfinite(span)
    # at least the smallest normal fp32 (a bf16): 1 / step must not overflow for a denormal span
    step = (span * meta_factor(bits)).view(torch.int32).clamp_(min=_MIN_NORMAL).add_(_LOW16).bitwise_and_(_HIGH16)
    step = step.view(torch.float32)
    step = torch.where(finite & (span > 0), step, torch.zeros_like(step))
    lo = torch.where(finite, lo, torch.full_like(lo, float("nan")))
    return torch.stack([lo, step])


@register("quantize_pack", "torch")
def quantize_pack(x: torch.Tensor, lo: torch.Tensor, step: torch.Tensor, levels: Optional[torch.Tensor],
                  bits: int, block_rows: int, seed: int, stochastic: bool) -> torch.Tensor:
    n_rows, k = x.shape
    top = (1 << bits) - 1
    inv_all = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    out = []
    per_byte = 8 // bits
    for start, end in _chunks(n_rows, k):
        # chunk starts are multiples of per_byte elements only if k*start is; pack the whole at the end
        # when that fails (tiny tensors), else pack per chunk to bound memory.
        xs = x[start:end].float()
        rows = torch.arange(start, end, device=x.device) // block_rows
        lo_r, inv_r = lo[rows][:, None], inv_all[rows][:, None]
        t = ((xs - lo_r) * inv_r).nan_to_num_(0.0).clamp_(0.0, float(top))
        if levels is None:
            j = t.floor().clamp_(max=top - 1)
            frac = t - j
        else:
            lv = levels.float()
            j = (torch.searchsorted(lv, t, right=True) - 1).clamp_(0, top - 1)
            a, b = lv[j], lv[j + 1]
            frac = (t - a) / (b - a)
            j = j.float()
        if stochastic:
            u = hash_uniform(seed, start * k, (end - start) * k, x.device).view(end - start, k)
        else:
            u = torch.full_like(frac, 0.5)
        q = (j + (u < frac).float()).to(torch.uint8)
        out.append(q.reshape(-1))
    codes = torch.cat(out) if len(out) > 1 else out[0]
    del per_byte
    return pack_codes(codes, bits)


@register("unpack_dequantize", "torch")
def unpack_dequantize(packed: torch.Tensor, lo: torch.Tensor, step: torch.Tensor, levels: Optional[torch.Tensor],
                      bits: int, block_rows: int, n_rows: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    q = unpack_codes(packed, bits, n_rows * k).view(n_rows, k)
    vals = q.float() if levels is None else levels.float()[q]
    return (_group_expand(lo, n_rows, block_rows) + vals * _group_expand(step, n_rows, block_rows)).to(dtype)


@register("pack_mask", "torch")
def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    return pack_codes(mask.reshape(-1).to(torch.uint8), 1)


@register("unpack_mask", "torch")
def unpack_mask(packed: torch.Tensor, numel: int) -> torch.Tensor:
    return unpack_codes(packed, 1, numel).bool()


def dropout_keep(seed: int, numel: int, p: float, device) -> torch.Tensor:
    return hash_uniform(seed, 0, numel, device) >= p


@register("dropout", "torch")
def dropout(x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
    """``x * keep / (1 - p)`` with ``keep`` regenerated from ``seed`` (used for forward and backward)."""
    keep = dropout_keep(seed, x.numel(), p, x.device).view(x.shape)
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


@register("relu_dropout", "torch")
def relu_dropout(x: torch.Tensor, p: float, seed: int):
    """Fused ReLU then dropout (``p = 0``: plain ReLU). Returns ``(y, packed)`` where ``packed`` holds the
    single bit ``x > 0 and kept`` per element: all the backward pass needs."""
    mask = x > 0
    if p > 0:
        mask &= dropout_keep(seed, x.numel(), p, x.device).view(x.shape)
    y = x * mask.to(x.dtype)
    if p > 0:
        y = y * (1.0 / (1.0 - p))
    return y, pack_mask(mask)


@register("masked_scale", "torch")
def masked_scale(g: torch.Tensor, packed: torch.Tensor, on: float, off: float) -> torch.Tensor:
    """``g * (on if bit else off)`` elementwise, bits from ``packed``."""
    mask = unpack_mask(packed, g.numel()).view(g.shape)
    if off == 0.0:
        return g * mask.to(g.dtype) * on if on != 1.0 else g * mask.to(g.dtype)
    return g * torch.where(mask, torch.tensor(on, dtype=g.dtype, device=g.device),
                           torch.tensor(off, dtype=g.dtype, device=g.device))


# ----------------------------------------------------------------------------------------------------
# Graph kernels (CSR over destination nodes).
# ----------------------------------------------------------------------------------------------------

def csr_rows(indptr: torch.Tensor) -> torch.Tensor:
    """Destination node of each stored edge."""
    n = indptr.numel() - 1
    counts = indptr[1:] - indptr[:-1]
    return torch.repeat_interleave(torch.arange(n, device=indptr.device, dtype=indptr.dtype), counts)


def _edge_values(w: Optional[torch.Tensor], eids: Optional[torch.Tensor]):
    if w is None:
        return None
    return w if eids is None else w[eids]


@register("spmm_sum", "torch")
def spmm_sum(indptr, indices, eids, x, w, n_dst):
    """``out[v] = sum_{(u,v)} w[e] * x[u]``; ``x [n_src, H, D]``, ``w [E, H]`` or None -> ``[n_dst, H, D]``."""
    n_src, heads, dim = x.shape
    wv = _edge_values(w, eids)
    if wv is None or heads == 1:
        values = (torch.ones(indices.numel(), dtype=x.dtype, device=x.device) if wv is None
                  else wv.reshape(-1).to(x.dtype))
        if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
            # sparse CSR matmul lacks low-precision CPU kernels: accumulate in fp32
            return spmm_sum(indptr, indices, eids, x.float(), None if w is None else w.float(), n_dst).to(x.dtype)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
            adj = torch.sparse_csr_tensor(indptr, indices, values, size=(n_dst, n_src), check_invariants=False)
            return (adj @ x.reshape(n_src, heads * dim)).view(n_dst, heads, dim)
    rows = csr_rows(indptr)
    msg = x[indices] * wv.to(x.dtype)[:, :, None]
    out = x.new_zeros(n_dst, heads, dim)
    return out.index_add_(0, rows, msg)


@register("spmm_minmax", "torch")
def spmm_minmax(indptr, indices, eids, x, reduce: str, n_dst):
    """``out[v] = max/min_{(u,v)} x[u]`` and the source node index attaining it (``-1`` for nodes
    without in-edges, whose output is 0). Returns ``(out [n_dst, H, D], arg [n_dst, H, D] int64)``."""
    n_src, heads, dim = x.shape
    rows = csr_rows(indptr).long()
    fill = float("-inf") if reduce == "max" else float("inf")
    out = x.new_full((n_dst, heads, dim), fill)
    msg = x[indices.long()]
    idx = rows[:, None, None].expand_as(msg)
    out.scatter_reduce_(0, idx, msg, reduce="amax" if reduce == "max" else "amin", include_self=True)
    # arg: the smallest source index among the edges attaining the extremum
    hit = msg == out[rows]
    src = indices.long()[:, None, None].expand_as(msg)
    big = torch.iinfo(torch.int64).max
    arg = torch.full((n_dst, heads, dim), big, dtype=torch.int64, device=x.device)
    arg.scatter_reduce_(0, idx, torch.where(hit, src, torch.full_like(src, big)), reduce="amin", include_self=True)
    empty = (indptr[1:] == indptr[:-1])
    out[empty] = 0
    arg[arg == big] = -1
    return out, arg


@register("sddmm_dot", "torch")
def sddmm_dot(indptr, indices, eids, a, b):
    """Per-edge ``<a[u], b[v]>`` over the last dim: ``a [n_src, H, D]``, ``b [n_dst, H, D]`` -> ``[E, H]``
    in edge-id order."""
    rows = csr_rows(indptr).long()
    vals = (a[indices.long()] * b[rows]).sum(-1)
    if eids is None:
        return vals
    out = torch.empty_like(vals)
    out[eids.long()] = vals
    return out
