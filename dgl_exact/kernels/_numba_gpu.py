"""Numba CUDA kernels for the compression and mask ops (same array-level API as :mod:`._numba_cpu`).

The scalar helpers (hash, rounding rule) are those of :mod:`._numba_cpu`: its ``njit`` helpers, which
Numba compiles as device functions when a kernel calls them, so both backends share one source. Every
kernel uses a grid-stride loop, and a thread that packs writes whole bytes (one output byte per
iteration): no atomics. Arguments are as in :mod:`._numba_cpu` minus the trailing ``start, end``.
Nothing here uses ``min``/``max``: Numba's CUDA target implements them as device functions, which
need a GPU context even to compile (tests compile every kernel to PTX on machines without a GPU).

Under ``NUMBA_ENABLE_CUDASIM=1`` the same kernels run in Numba's CUDA simulator on NumPy arrays (slow:
one Python thread per CUDA thread; tests keep inputs tiny).

Float contract: decoding computes ``(lo + L[q] * step) * post`` with three roundings (the reference's torch ops).
NVVM contracts ``a + b * c`` into an FMA by default, so the product goes through libdevice's
``fmul_rn``, which NVVM never contracts.
"""
from __future__ import annotations

import numpy as np
from numba import config as _numba_config
from numba import cuda

from . import _numba_cpu
from ._numba_cpu import HALF, ONE, ZERO

SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

if SIMULATOR:
    # the simulator runs kernels as Python: the helpers are the plain Python functions
    _hash_u = _numba_cpu.hash_u_py
    _code_uniform = _numba_cpu.code_uniform_py
    _code_levels = _numba_cpu.code_levels_py
    _group_meta1 = _numba_cpu.group_meta1_py

    def _fmul(a, b):
        return a * b
else:  # pragma: no cover - needs a GPU (tests compile these to PTX without one)
    from numba.cuda import libdevice as _libdevice

    # the CPU module's njit helpers: Numba retargets a CPU dispatcher called from a kernel to a device
    # function compiled from the same Python source (inline="always")
    _hash_u = _numba_cpu.hash_u
    _code_uniform = _numba_cpu.code_uniform
    _code_levels = _numba_cpu.code_levels
    _group_meta1 = _numba_cpu.group_meta1
    _fmul = _libdevice.fmul_rn


@cuda.jit
def group_meta(mn, mx, factor, top, out):
    g = mn.size
    for i in range(cuda.grid(1), g, cuda.gridsize(1)):
        lo, step = _group_meta1(mn[i], mx[i], factor, top)
        out[i] = lo
        out[g + i] = step


@cuda.jit
def quantize_pack(x, e0, k, block_rows, lo, inv, pre, levels, has_levels, bits, s_lo, s_hi, stochastic, out):
    n = x.size
    per_byte = 8 // bits
    top = (1 << bits) - 1
    for b in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        e = b * per_byte
        cnt = n - e if n - e < per_byte else per_byte
        acc = 0
        for i in range(cnt):
            ge = e0 + e + i
            g = (ge // k) // block_rows
            if stochastic:
                u = _hash_u(ge, s_lo, s_hi)
            else:
                u = HALF
            if has_levels:
                q = _code_levels(_fmul(x[e + i], pre[g]), lo[g], inv[g], levels, top, u)
            else:
                q = _code_uniform(_fmul(x[e + i], pre[g]), lo[g], inv[g], top, u)
            acc |= q << (i * bits)
        out[b] = acc


@cuda.jit
def unpack_dequantize(packed, e0, k, block_rows, lo, step, post, vmax, table, bits, out):
    mask = (1 << bits) - 1
    for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        ge = e0 + e
        g = (ge // k) // block_rows
        b = ge * bits
        q = (np.int64(packed[b >> 3]) >> (b & 7)) & mask
        v = _fmul(lo[g] + _fmul(table[q], step[g]), post[g])
        if v > vmax:
            v = vmax
        if v < -vmax:
            v = -vmax
        out[e] = v


@cuda.jit
def pack_mask(mask, out):
    n = mask.size
    for b in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        e = b * 8
        acc = 0
        for i in range(n - e if n - e < 8 else 8):
            if mask[e + i] != 0:
                acc |= 1 << i
        out[b] = acc


@cuda.jit
def unpack_mask(packed, out):
    for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[e] = (np.int64(packed[e >> 3]) >> (e & 7)) & 1


@cuda.jit
def dropout(x, e0, p, s_lo, s_hi, scale, out):
    for e in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        keep = ONE if _hash_u(e0 + e, s_lo, s_hi) >= p else ZERO
        out[e] = (x[e] * keep) * scale


@cuda.jit
def relu_dropout(x, e0, use_p, p, s_lo, s_hi, scale, out, packed):
    n = x.size
    for b in range(cuda.grid(1), packed.size, cuda.gridsize(1)):
        e = b * 8
        acc = 0
        for i in range(n - e if n - e < 8 else 8):
            xv = x[e + i]
            on = xv > ZERO
            if use_p and on:
                on = _hash_u(e0 + e + i, s_lo, s_hi) >= p
            if on:
                acc |= 1 << i
                out[e + i] = (xv * ONE) * scale
            else:
                out[e + i] = (xv * ZERO) * scale
        packed[b] = acc


@cuda.jit
def masked_scale(g, e0, packed, a_on, a_off, c, out):
    for e in range(cuda.grid(1), g.size, cuda.gridsize(1)):
        ge = e0 + e
        if (np.int64(packed[ge >> 3]) >> (ge & 7)) & 1:
            a = a_on
        else:
            a = a_off
        out[e] = (g[e] * a) * c


@cuda.jit
def hash_uniform(e0, s_lo, s_hi, out):
    """``out[i] = u(seed, e0 + i)`` (used by load()'s smoke test and by tests)."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = _hash_u(e0 + i, s_lo, s_hi)


@cuda.jit
def rademacher(s_lo, s_hi, v, out):
    """``out[e] = v if u(seed, e) < 0.5 else -v`` (the flat ``[d, k]`` projection matrix)."""
    for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        if _hash_u(e, s_lo, s_hi) < HALF:
            out[e] = v
        else:
            out[e] = -v
