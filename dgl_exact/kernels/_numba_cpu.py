"""Numba CPU kernels (``njit(cache=True, nogil=True)``) for the compression and mask ops.

Also home of the scalar helpers shared with the Numba CUDA kernels (:mod:`._numba_gpu` calls the same
``njit`` helpers, which Numba compiles as device functions; its simulator runs their Python source), so
the hash and the rounding rule exist once. The helpers give identical results when jitted for the
CPU, jitted for CUDA, or run as plain Python on NumPy scalars:

* all integer hashing is done in ``uint64`` holding values below ``2**32`` (a product of two such values
  never overflows 64 bits), masked back to 32 bits after every multiply;
* all float arithmetic is ``float32``, with constants spelled ``np.float32(...)`` so neither Numba's
  typing nor NumPy 1.x's value-based casting promotes anything to ``float64``.

The array-level kernels take flat 1-D arrays and an element offset ``e0`` (the flat index of the
first element of ``x`` in the whole tensor), so a caller can process a tensor in chunks; a chunk must
start at a multiple of 8 elements, which makes every packed byte belong to exactly one chunk. Each
kernel ends with ``start, end``: the range of its work units (bytes it writes, or elements) to process,
so a caller can split one call across threads.

Importing this module imports Numba (compilation happens on first call, then comes from the on-disk
cache).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

_M32 = np.uint64(0xFFFFFFFF)
_C1 = np.uint64(0x85EBCA6B)
_C2 = np.uint64(0xC2B2AE35)
_S8 = np.uint64(8)
_S13 = np.uint64(13)
_S16 = np.uint64(16)
_S32 = np.uint64(32)
_TWO_M24 = np.float32(1.0 / (1 << 24))
# float32 constants the kernels of both backends compare and multiply with (:mod:`._numba_gpu` imports them)
HALF = np.float32(0.5)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)


# ----------------------------------------------------------------------------------------------------
# Scalar helpers: plain Python (the CUDA simulator runs them as is), jitted below; the CUDA kernels call
# the jitted ones, which Numba recompiles for the device.
# ----------------------------------------------------------------------------------------------------

def hash_u_py(e, s_lo, s_hi):
    """``hash_uniform(seed, e)`` for one element index ``e >= 0`` (``s_lo``/``s_hi``: uint64 < 2**32)."""
    eu = np.uint64(e)
    h = (eu & _M32) ^ s_lo
    # fmix32, first round
    h = h ^ (h >> _S16)
    h = (h * _C1) & _M32
    h = h ^ (h >> _S13)
    h = (h * _C2) & _M32
    h = h ^ (h >> _S16)
    h = h ^ (((eu >> _S32) + s_hi) & _M32)
    # fmix32, second round
    h = h ^ (h >> _S16)
    h = (h * _C1) & _M32
    h = h ^ (h >> _S13)
    h = (h * _C2) & _M32
    h = h ^ (h >> _S16)
    return np.float32(h >> _S8) * _TWO_M24


def code_uniform_py(xv, lo_g, inv_g, top, u):
    """The code of one value with uniform levels: fp32 ``xv``, its group's ``lo`` and ``1/step``."""
    t = (xv - lo_g) * inv_g
    if t != t:  # nan_to_num
        t = ZERO
    # clamp to [0, top] (spelled out: Numba's CUDA target implements min/max as device functions that
    # need a GPU context even to compile)
    if t < ZERO:
        t = ZERO
    if t > np.float32(top):
        t = np.float32(top)
    j = np.int64(t)  # floor: t >= 0 (math.floor types as float on the CUDA target, int on the CPU)
    if j > top - 1:
        j = top - 1
    frac = t - np.float32(j)
    if u < frac:
        return j + 1
    return j


def code_levels_py(xv, lo_g, inv_g, levels, top, u):
    """The code of one value with the level table ``levels`` (fp32, ascending, ``top + 1`` entries)."""
    t = (xv - lo_g) * inv_g
    if t != t:
        t = ZERO
    if t < ZERO:
        t = ZERO
    if t > np.float32(top):
        t = np.float32(top)
    # last j with levels[j] <= t (levels[0] == 0 <= t): branch-free binary search over top + 1 entries
    j = 0
    s = (top + 1) >> 1
    while s > 0:
        j += s * np.int64(levels[j + s] <= t)
        s >>= 1
    if j > top - 1:
        j = top - 1
    la = levels[j]
    frac = (t - la) / (levels[j + 1] - la)
    if u < frac:
        return j + 1
    return j


def code_levels4_py(xv, lo_g, inv_g, l0, l1, l2, l3, u):
    """:func:`code_levels_py` for a 4-entry table held in scalars (2-bit codes: i-EXACT's non-uniform
    levels), branch-free: ``j`` = the number of interior levels ``<= t``."""
    t = (xv - lo_g) * inv_g
    if t != t:
        t = ZERO
    if t < ZERO:
        t = ZERO
    if t > np.float32(3.0):
        t = np.float32(3.0)
    j = np.int64(l1 <= t) + np.int64(l2 <= t)
    la = l0 if j == 0 else (l1 if j == 1 else l2)
    lb = l1 if j == 0 else (l2 if j == 1 else l3)
    frac = (t - la) / (lb - la)
    if u < frac:
        return j + 1
    return j


# Group metadata without bit casts (Numba has no scalar float <-> int reinterpretation on the CPU): a
# rounding to bf16 is a rounding to 8 significant bits, or to a multiple of 2^-133 (bf16's denormal
# spacing) below 2^-126, done exactly in float64 with frexp / ldexp / floor / ceil.
_TWO_M133 = 2.0**-133
_MIN_NORMAL = np.float32(2.0**-126)
_TINY_SCALE = np.float32(2.0**24)  # reference.TINY_SCALE
_NAN32 = np.float32(np.nan)
_INF32 = np.float32(np.inf)
_DECODE_MAX = np.float32(3.4028232635611926e38)  # reference.DECODE_MAX
_FLOAT_MAX = np.float32(3.4028234663852886e38)  # reference.FLOAT_MAX
_TWO_133 = 2.0**133
_WIDE_STEP = np.float32(2.0**126)  # reference.WIDE_STEP
_WIDE_INV = np.float32(1.0 / 16.0)  # 1 / reference.WIDE_SCALE


def group_meta1_py(mnv, mxv, factor, top):
    """(lo, step) of one group from its fp32 min and max (``reference.group_meta``). One function (the
    jitted helpers cannot call plain-Python ones): lo = the largest bf16 <= min (inf and NaN pass through,
    zeros keep their sign); step = the smallest bf16 >= span * factor (a product below 2^-126 computed
    exactly in fp64, rounded up to bf16's denormal grid 2^-133). A finite group whose top code
    ``lo + top * step`` would not decode finite (``reference.DECODE_MAX``) or whose step's reciprocal would not
    be normal is wide: redone once from its min and max divided by 16, its step returned negated."""
    if mnv - mnv != ZERO or mxv - mxv != ZERO:  # the group holds a NaN or an inf
        return _NAN32, ZERO
    lo = mnv
    step = ZERO
    for attempt in range(2):
        lo = mnv
        if mnv != ZERO:
            a = np.float64(abs(mnv))
            q = math.ldexp(1.0, math.frexp(a)[1] - 8)  # a = m 2^e with 0.5 <= m < 1: 8 significant bits
            if q < _TWO_M133:
                q = _TWO_M133
            if mnv > ZERO:
                lo = np.float32(math.floor(a / q) * q)
            else:
                lo = np.float32(-(math.ceil(a / q) * q))  # may round to -inf, as the bit pattern does
        span = mxv - lo
        if span - span != ZERO:  # overflowed (the bit-pattern path: lo NaN-free, step inf)
            step = _INF32
        elif not span > ZERO:
            step = ZERO
        else:
            p = span * factor
            if p < _MIN_NORMAL:  # the fp32 product lost bits: exact in fp64, up to a multiple of 2^-133
                step = np.float32(math.ceil(np.float64(span) * np.float64(factor) * _TWO_133) * _TWO_M133)
            elif p - p != ZERO:  # overflowed to inf
                step = p
            else:
                a = np.float64(p)
                q = math.ldexp(1.0, math.frexp(a)[1] - 8)
                step = np.float32(math.ceil(a / q) * q)
        if attempt == 1:
            return lo, -step
        p = step * top
        if step <= _WIDE_STEP and p <= _DECODE_MAX and p <= _DECODE_MAX - lo:
            break
        mnv = mnv * _WIDE_INV
        mxv = mxv * _WIDE_INV
    return lo, step


# The jitted helpers: the CPU kernels below call them, and :mod:`._numba_gpu` calls them from its CUDA kernels
# (Numba recompiles each as a device function).
hash_u = njit(inline="always", cache=True)(hash_u_py)
code_levels4 = njit(inline="always", cache=True)(code_levels4_py)
code_uniform = njit(inline="always", cache=True)(code_uniform_py)
code_levels = njit(inline="always", cache=True)(code_levels_py)
group_meta1 = njit(inline="always", cache=True)(group_meta1_py)


_SEG = 1024  # codes computed per segment before packing (a segment never crosses a row)
_KERNEL = dict(cache=True, nogil=True, error_model="numpy")


# ----------------------------------------------------------------------------------------------------
# Kernels. Each is serial and processes the range [start, end) of its work units (bytes or elements,
# as documented); the caller splits the units across threads (the kernels release the GIL), so no
# Numba threading layer is involved (fork-safe, no second OpenMP runtime next to torch's).
# ----------------------------------------------------------------------------------------------------

@njit(inline="always", cache=True)
def _pack_run(buf, j, n_full, out, bi, BITS):
    """``out[bi + bb]`` = the ``8 // BITS`` codes ``buf[j + bb * (8 // BITS) ...]`` for ``bb < n_full``."""
    for bb in range(n_full):
        base = j + bb * (8 // BITS)
        v = 0
        for i in range(8 // BITS):
            v |= np.int64(buf[base + i]) << (i * BITS)
        out[bi + bb] = v


@njit(inline="always", cache=True)
def _decode1(lo_g, step_g, post_g, vmax, level):
    """``reference.unpack_dequantize`` of one code: ``(lo + level * step) * post``, clamped to ``[-vmax, vmax]``
    (NaN passes)."""
    v = (lo_g + level * step_g) * post_g
    if v > vmax:
        return vmax
    if v < -vmax:
        return -vmax
    return v


@njit(inline="always", cache=True)
def _unpack_run(packed, byte0, n_full, out, base, lo_g, step_g, post_g, vmax, table, BITS):
    """Decode the ``n_full`` whole bytes from ``packed[byte0]`` into ``out[base ...]``."""
    for bb in range(n_full):
        v = np.int64(packed[byte0 + bb])
        for i in range(8 // BITS):
            out[base + bb * (8 // BITS) + i] = _decode1(lo_g, step_g, post_g, vmax,
                                                        table[(v >> (i * BITS)) & ((1 << BITS) - 1)])


@njit(**_KERNEL)
def group_meta(mn, mx, factor, top, out, start, end):
    """``out[i], out[G + i]`` = lo, step of group ``i`` (``G = mn.size``). Units: groups."""
    g = mn.size
    for i in range(start, end):
        lo, step = group_meta1(mn[i], mx[i], factor, top)
        out[i] = lo
        out[g + i] = step


@njit(**_KERNEL)
def quantize_pack(x, e0, k, block_rows, lo, inv, pre, levels, has_levels, bits, s_lo, s_hi, stochastic, out,
                  start, end):
    """Codes of ``x`` (fp32, flat elements ``e0 ..``) packed into ``out`` (the bytes of those elements);
    ``pre, lo, inv``: each group's ``reference.quant_params`` (code position ``(x * pre - lo) * inv``).
    Units: bytes of ``out``."""
    n = x.size
    per_byte = 8 // bits
    top = (1 << bits) - 1
    e = start * per_byte
    e_b = min(n, end * per_byte)
    buf = np.empty(_SEG, np.uint8)
    u_mul = ONE if stochastic else ZERO
    u_add = ZERO if stochastic else HALF
    acc = 0
    sh = 0
    bi = start
    while e < e_b:
        ge = e0 + e
        row = ge // k
        m = min(e_b - e, k - (ge - row * k), _SEG)
        g = row // block_rows
        lo_g = lo[g]
        inv_g = inv[g]
        pre_g = pre[g]
        # u = hash (stochastic) or 0.5 (nearest), written branch-free (both products are exact) so
        # one loop serves both roundings and still vectorizes
        if has_levels and bits == 2:
            l0, l1, l2, l3 = levels[0], levels[1], levels[2], levels[3]
            for j in range(m):
                u = hash_u(ge + j, s_lo, s_hi) * u_mul + u_add
                buf[j] = code_levels4(x[e + j] * pre_g, lo_g, inv_g, l0, l1, l2, l3, u)
        elif has_levels:
            for j in range(m):
                u = hash_u(ge + j, s_lo, s_hi) * u_mul + u_add
                buf[j] = code_levels(x[e + j] * pre_g, lo_g, inv_g, levels, top, u)
        else:
            for j in range(m):
                u = hash_u(ge + j, s_lo, s_hi) * u_mul + u_add
                buf[j] = code_uniform(x[e + j] * pre_g, lo_g, inv_g, top, u)
        # pack: single codes until byte-aligned, then whole bytes, then the tail
        j = 0
        while j < m and sh != 0:
            acc |= np.int64(buf[j]) << sh
            sh += bits
            j += 1
            if sh == 8:
                out[bi] = acc
                bi += 1
                acc = 0
                sh = 0
        n_full = (m - j) // per_byte
        # literal bit widths let LLVM unroll and vectorize the byte loop
        if bits == 1:
            _pack_run(buf, j, n_full, out, bi, 1)
        elif bits == 2:
            _pack_run(buf, j, n_full, out, bi, 2)
        elif bits == 4:
            _pack_run(buf, j, n_full, out, bi, 4)
        else:
            _pack_run(buf, j, n_full, out, bi, 8)
        bi += n_full
        j += n_full * per_byte
        while j < m:  # fewer than per_byte codes: never completes a byte
            acc |= np.int64(buf[j]) << sh
            sh += bits
            j += 1
        e += m
    if sh != 0:
        out[bi] = acc


_BATCH = 1 << 14  # elements per batch of groups in compress_groups: 64 KiB of fp32, cached for the second pass


@njit(**_KERNEL)
def compress_groups(x, n_rows, k, block_rows, levels, has_levels, bits, factor, top_f, s_lo, s_hi, stochastic,
                    meta, lo, inv, pre, out, start, end):
    """``reference.compress_rows`` of fp32 ``x`` (flat, ``n_rows * k`` elements) in one read from memory: for
    each batch of whole groups (about :data:`_BATCH` elements), every group's min and max (a NaN makes the
    group NaN, as torch's ``aminmax``), its ``(lo, step)`` (:func:`group_meta1`, into ``meta[0, g]``,
    ``meta[1, g]``) and ``reference.quant_params`` (into ``lo``, ``inv``, ``pre``), then
    :func:`quantize_pack` of the batch while its values are still cached. Every group must begin on a whole
    byte of ``out`` (``block_rows * k * bits`` a multiple of 8), so that threads never share a byte. Units:
    groups."""
    n = n_rows * k
    per_group = block_rows * k
    batch = max(1, _BATCH // per_group)
    g0 = start
    while g0 < end:
        g1 = min(end, g0 + batch)
        for g in range(g0, g1):
            a = g * per_group
            b = min(n, a + per_group)
            mn = x[a]
            mx = x[a]
            nan = False
            for i in range(a, b):
                v = x[i]
                nan |= v != v
                mn = v if v < mn else mn
                mx = v if v > mx else mx
            if nan:
                mn = _NAN32
                mx = _NAN32
            lo_g, step_g = group_meta1(mn, mx, factor, top_f)
            meta[0, g] = lo_g
            meta[1, g] = step_g
            # reference.quant_params: every scaling by a power of two
            s = step_g
            pre_g = ONE
            if step_g < ZERO:  # wide
                pre_g = _WIDE_INV
                s = -step_g
            elif step_g > ZERO and step_g < _MIN_NORMAL:  # tiny
                pre_g = _TINY_SCALE
                lo_g = lo_g * _TINY_SCALE
                s = step_g * _TINY_SCALE
            lo[g] = lo_g
            pre[g] = pre_g
            inv[g] = ONE / s if s > ZERO else ZERO
        quantize_pack(x, 0, k, block_rows, lo, inv, pre, levels, has_levels, bits, s_lo, s_hi, stochastic, out,
                      g0 * per_group * bits // 8, -(-min(n, g1 * per_group) * bits // 8))
        g0 = g1


@njit(**_KERNEL)
def unpack_dequantize(packed, e0, k, block_rows, lo, step, post, vmax, table, bits, out, start, end):
    """``out[i] = (lo + table[q] * step) * post`` (fp32) clamped to ``[-vmax, vmax]`` for flat elements
    ``e0 + i`` (``lo, step, post``: ``reference.decode_params``); ``packed`` is the whole buffer, ``table`` the
    level table (``0, 1, ..., top`` for uniform levels: the same values as ``float(q)``). Units: elements of
    ``out``."""
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    e = start
    while e < end:
        ge = e0 + e
        row = ge // k
        m = min(end - e, k - (ge - row * k))
        g = row // block_rows
        lo_g = lo[g]
        step_g = step[g]
        post_g = post[g]
        bit = ge * bits
        # single codes until byte-aligned, then whole bytes, then the tail
        j = 0
        while j < m and ((bit + j * bits) & 7) != 0:
            b = bit + j * bits
            out[e + j] = _decode1(lo_g, step_g, post_g, vmax, table[(np.int64(packed[b >> 3]) >> (b & 7)) & mask])
            j += 1
        n_full = (m - j) // per_byte
        byte0 = (bit + j * bits) >> 3
        if bits == 1:
            _unpack_run(packed, byte0, n_full, out, e + j, lo_g, step_g, post_g, vmax, table, 1)
        elif bits == 2:
            _unpack_run(packed, byte0, n_full, out, e + j, lo_g, step_g, post_g, vmax, table, 2)
        elif bits == 4:
            _unpack_run(packed, byte0, n_full, out, e + j, lo_g, step_g, post_g, vmax, table, 4)
        else:
            _unpack_run(packed, byte0, n_full, out, e + j, lo_g, step_g, post_g, vmax, table, 8)
        j += n_full * per_byte
        while j < m:
            b = bit + j * bits
            out[e + j] = _decode1(lo_g, step_g, post_g, vmax, table[(np.int64(packed[b >> 3]) >> (b & 7)) & mask])
            j += 1
        e += m


@njit(inline="always", cache=True)
def _mask_byte(mask, e, cnt):
    acc = 0
    for i in range(cnt):
        acc |= np.int64(mask[e + i] != 0) << i
    return acc


@njit(**_KERNEL)
def pack_mask(mask, out, start, end):
    """``mask``: uint8 0/1 per element; ``out``: ``ceil(n / 8)`` bytes. Units: bytes of ``out``."""
    n = mask.size
    full = min(end, n // 8)
    for b in range(start, full):
        out[b] = _mask_byte(mask, b * 8, 8)
    for b in range(max(start, full), end):
        out[b] = _mask_byte(mask, b * 8, n - b * 8)


@njit(**_KERNEL)
def unpack_mask(packed, out, start, end):
    """``out``: uint8 0/1 per element (a bool tensor's bytes). Units: elements."""
    for e in range(start, end):
        out[e] = (packed[e >> 3] >> (e & 7)) & 1


@njit(**_KERNEL)
def dropout(x, e0, p, s_lo, s_hi, scale, out, start, end):
    """``out = (x * keep) * scale``, ``keep = u(seed, e) >= p`` (fp32, flat elements ``e0 ..``). Units:
    elements."""
    for e in range(start, end):
        keep = ONE if hash_u(e0 + e, s_lo, s_hi) >= p else ZERO
        out[e] = (x[e] * keep) * scale


@njit(inline="always", cache=True)
def _relu_dropout_byte(x, e, cnt, e0, use_p, p, s_lo, s_hi, scale, out):
    acc = 0
    for i in range(cnt):
        xv = x[e + i]
        on = xv > ZERO
        if use_p:
            on = on & (hash_u(e0 + e + i, s_lo, s_hi) >= p)
        acc |= np.int64(on) << i
        out[e + i] = (xv * (ONE if on else ZERO)) * scale
    return acc


@njit(**_KERNEL)
def relu_dropout(x, e0, use_p, p, s_lo, s_hi, scale, out, packed, start, end):
    """``m = x > 0 and keep``; ``out = (x * m) * scale``; ``packed``: the bytes of ``m`` for this chunk.
    Units: bytes of ``packed``."""
    n = x.size
    full = min(end, n // 8)  # bytes with all 8 elements (constant trip count: unrolled, vectorized)
    if use_p:
        for b in range(start, full):
            packed[b] = _relu_dropout_byte(x, b * 8, 8, e0, True, p, s_lo, s_hi, scale, out)
    else:
        for b in range(start, full):
            packed[b] = _relu_dropout_byte(x, b * 8, 8, e0, False, p, s_lo, s_hi, scale, out)
    for b in range(max(start, full), end):
        packed[b] = _relu_dropout_byte(x, b * 8, n - b * 8, e0, use_p, p, s_lo, s_hi, scale, out)


@njit(**_KERNEL)
def masked_scale(g, e0, packed, a_on, a_off, c, out, start, end):
    """``out = (g * (a_on if bit else a_off)) * c`` for flat elements ``e0 ..``. Units: elements."""
    for e in range(start, end):
        ge = e0 + e
        a = a_on if (packed[ge >> 3] >> (ge & 7)) & 1 else a_off
        out[e] = (g[e] * a) * c


@njit(**_KERNEL)
def hash_uniform(e0, s_lo, s_hi, out, start, end):
    """``out[i] = u(seed, e0 + i)``. Units: elements."""
    for i in range(start, end):
        out[i] = hash_u(e0 + i, s_lo, s_hi)


@njit(**_KERNEL)
def rademacher(s_lo, s_hi, v, out, start, end):
    """``out[e] = v if u(seed, e) < 0.5 else -v`` (the flat ``[d, k]`` projection matrix). Units: elements."""
    for e in range(start, end):
        out[e] = v if hash_u(e, s_lo, s_hi) < HALF else -v


@njit(**_KERNEL)
def spmm_weighted_rows(indptr, indices, eids, has_eids, x, w, out, bounds, start, end):
    """``out[r, h, :] += w[eid(e), h] * x[indices[e], h, :]`` over each row's stored edges, in storage order
    (DGL's CPU kernel's order and rounding: the product rounded, then added). ``x [n, H, D]``, ``w [E, H]`` or
    ``[E, 1]`` (one weight for every head) in edge-id order, ``out [rows, H, D]`` zeroed; ``eid(e)`` is
    ``eids[e]`` if ``has_eids`` else ``e``. Units: parts of about equal edge counts, rows ``bounds[p] ..
    bounds[p + 1]``."""
    heads, dim = x.shape[1], x.shape[2]
    per_head = w.shape[1] > 1
    for p in range(start, end):
        for r in range(bounds[p], bounds[p + 1]):
            o = out[r]
            for e in range(indptr[r], indptr[r + 1]):
                xu = x[indices[e]]
                ei = eids[e] if has_eids else e
                for h in range(heads):
                    wv = w[ei, h if per_head else 0]
                    for d in range(dim):
                        o[h, d] += wv * xu[h, d]
