"""The ``numba`` backend: Numba kernels for the compression and mask ops, on CUDA and on the CPU.

Ops (from :data:`.spec.OPS`; signatures and results exactly those of :mod:`.reference`, codes and masks bit for bit):
``compress_rows``, ``relu_dropout_compress``, ``quantize_pack``, ``unpack_dequantize``, ``pack_mask``,
``unpack_mask``, ``dropout``, ``dropout_at`` (its elements from ``start`` on), ``relu_dropout``,
``relu_dropout_inplace`` (the ``relu_dropout`` kernel with its output array the input's), ``masked_scale``,
``rademacher``. No fallback of its own: the
registry chooses. ``compress_rows`` reads its input once on the CPU (``_numba_cpu.compress_groups``, for fp32
rows whose groups begin on whole bytes of the codes); elsewhere it, and ``relu_dropout_compress`` everywhere, are
compositions of this backend's kernels (the extension's are fused on both devices).

Two kernel sets share one scalar source (the hash and the rounding rule live in :mod:`._numba_cpu`):

* CPU: ``njit(cache=True, nogil=True)`` kernels (:mod:`._numba_cpu`), for CPU tensors, each call split
  across ``torch.get_num_threads()`` threads of a small thread pool (no Numba threading layer: safe
  with fork, no second OpenMP runtime). Compiled on first use and cached on disk next to the module
  (or in ``NUMBA_CACHE_DIR``).
* CUDA: ``numba.cuda.jit`` kernels (:mod:`._numba_gpu`), for CUDA tensors, which reach Numba zero-copy
  through ``__cuda_array_interface__`` and run on torch's current stream. Registered only when a real
  GPU works: never when ``NUMBA_ENABLE_CUDASIM=1`` makes ``numba.cuda`` the simulator.

How arrays reach each set's kernels and how a call is launched (threads, grid): :mod:`._numba_engines`.

Tensors are handed to the kernels as flat 1-D arrays. fp32 goes straight through; fp16/bf16/fp64 are
converted to fp32 by torch in chunks of :data:`CHUNK` elements (the reference computes in fp32 too), and
results are converted back per chunk, so the extra memory stays bounded. The elementwise ops
(``dropout``, ``relu_dropout``, ``masked_scale``) compute in fp32 and round once to the tensor's dtype,
as torch does for fp16/bf16; fp64 tensors there are left to the reference (it computes in fp64).

For tests and tools, :func:`get_ops` returns the torch-level ops of one kernel set directly:
``get_ops("cpu")``, ``get_ops("cuda")``, or ``get_ops("simulator")`` (the CUDA kernels run by
Numba's simulator on CPU tensors; ``NUMBA_ENABLE_CUDASIM=1`` must be set before ``numba.cuda`` is first
imported).
"""
from __future__ import annotations

import os
import threading
from typing import Optional

import torch

from . import register
from ._numba_engines import CpuEngine as _CpuEngine, CudaEngine as _CudaEngine
from .spec import OPS as _SPEC, implemented

__all__ = ["load", "get_ops", "OPS", "CHUNK", "cpu_status", "cuda_status"]

OPS = implemented("numba")  # from the one list of ops (spec.py)
CHUNK = 1 << 22  # elements per dtype-conversion chunk (a multiple of 8: chunks start on byte boundaries)

_status = {"cpu": "not loaded", "cuda": "not loaded"}
_ops = {}  # "cpu" / "cuda" / "simulator" -> _TorchOps
_lock = threading.Lock()
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def cpu_status() -> str:
    """``"available"`` or why the Numba CPU kernels are not used."""
    return _status["cpu"]


def cuda_status() -> str:
    """``"available"`` or why the Numba CUDA kernels are not registered for CUDA tensors."""
    return _status["cuda"]


# ----------------------------------------------------------------------------------------------------
# Torch-level ops over an engine (the reference's signatures).
# ----------------------------------------------------------------------------------------------------

def _seed_words(seed: int):
    import numpy as np

    from .reference import split_seed

    s_lo, s_hi = split_seed(seed)
    return np.uint64(s_lo), np.uint64(s_hi)


def _f32(v: float):
    import numpy as np

    return np.float32(v)


def _f32_chunks(flat: torch.Tensor):
    """``(start, end, fp32 view or copy)`` over a flat tensor, in chunks unless it is fp32 already."""
    n = flat.numel()
    if flat.dtype == torch.float32:
        yield 0, n, flat
        return
    for a in range(0, n, CHUNK):
        b = min(n, a + CHUNK)
        yield a, b, flat[a:b].float()


def _check_codes(bits, block_rows, levels, lo, step, n_rows):
    """The kernels do not bounds-check: refuse arguments that would make them read out of bounds."""
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be 1, 2, 4 or 8, got {bits}")
    if block_rows < 1:
        raise ValueError(f"block_rows must be >= 1, got {block_rows}")
    if levels is not None and levels.numel() != 1 << bits:
        raise ValueError(f"a level table for {bits}-bit codes has {1 << bits} entries, got {levels.numel()}")
    groups = -(-n_rows // block_rows)
    if lo.numel() < groups or step.numel() < groups:
        raise ValueError(f"{n_rows} rows in blocks of {block_rows} need {groups} lo/step values, got "
                         f"{lo.numel()}/{step.numel()}")


def _check_packed(packed, n_bits):
    if packed.dtype != torch.uint8 or packed.numel() * 8 < n_bits:
        raise ValueError(f"packed must be uint8 with at least {-(-n_bits // 8)} bytes, got {packed.dtype} "
                         f"with {packed.numel()}")


class _TorchOps:
    """The registered ops, implemented with one engine's kernels."""

    def __init__(self, engine):
        self.engine = engine
        self._dummy_levels = {}
        self._uniform_tables = {}

    def __repr__(self):
        return f"<dgl_exact {self.engine.name} ops>"

    # helpers ------------------------------------------------------------------------------------
    def _a(self, t: torch.Tensor):
        return self.engine.array(t)

    def _levels(self, levels: Optional[torch.Tensor], device):
        if levels is not None:
            return levels.float().contiguous(), True
        key = str(device)
        if key not in self._dummy_levels:
            self._dummy_levels[key] = torch.zeros(1, dtype=torch.float32, device=device)
        return self._dummy_levels[key], False

    def _table(self, levels: Optional[torch.Tensor], bits: int, device):
        """The decode table: ``levels``, or ``0, 1, ..., 2**bits - 1`` (exactly ``float(q)``)."""
        if levels is not None:
            return levels.float().contiguous()
        key = (str(device), bits)
        if key not in self._uniform_tables:
            self._uniform_tables[key] = torch.arange(1 << bits, dtype=torch.float32, device=device)
        return self._uniform_tables[key]

    def _map_chunks(self, x: torch.Tensor, launch, in_place: bool = False) -> torch.Tensor:
        """The output of an elementwise op, shaped as ``x`` (a tensor of its own, not a view, so that it can be
        released alone): ``launch(a, b, xc, oc)`` runs the kernel on elements ``[a, b)``, from the fp32
        array ``xc`` into the fp32 array ``oc``. fp32 tensors go in one chunk; others through fp32 chunks
        of :data:`CHUNK` elements (``oc`` then a scratch buffer copied back). ``in_place``: the output is
        ``x`` itself (contiguous; the kernels read each element before they write it)."""
        shaped = x if in_place else torch.empty(x.shape, dtype=x.dtype, device=x.device)
        out = shaped.view(-1)
        scratch = None if x.dtype == torch.float32 else torch.empty(min(CHUNK, x.numel()), dtype=torch.float32,
                                                                    device=x.device)
        with self.engine.scope(x.device):
            for a, b, xc in _f32_chunks(x.contiguous().view(-1)):
                oc = out if scratch is None else scratch[: b - a]
                launch(a, b, self._a(xc), self._a(oc))
                if scratch is not None:
                    out[a:b].copy_(oc)
        return shaped

    # compression --------------------------------------------------------------------------------
    def group_meta(self, mn, mx, bits):
        from .reference import meta_factor

        bits = int(bits)
        if bits not in (1, 2, 4, 8):
            raise ValueError(f"bits must be 1, 2, 4 or 8, got {bits}")
        if mn.numel() != mx.numel():
            raise ValueError(f"group_meta: mn and mx differ in length ({mn.numel()} vs {mx.numel()})")
        mn32 = mn.float().contiguous().view(-1)
        mx32 = mx.float().contiguous().view(-1)
        g = mn32.numel()
        out = torch.empty((2, g), dtype=torch.float32, device=mn.device)
        if g:
            with self.engine.scope(mn.device):
                self.engine.launch("group_meta", g, mn.device, self._a(mn32), self._a(mx32), _f32(meta_factor(bits)),
                                   _f32((1 << bits) - 1),
                                   self._a(out.view(-1)))
        return out

    def quantize_pack(self, x, lo, step, levels, bits, block_rows, seed, stochastic):
        n_rows, k = x.shape
        n = n_rows * k
        bits, block_rows = int(bits), int(block_rows)
        _check_codes(bits, block_rows, levels, lo, step, n_rows)
        out = torch.empty(-(-n * bits // 8), dtype=torch.uint8, device=x.device)
        if n == 0:
            return out
        from .reference import quant_params

        pre, lo32, inv = (t.contiguous() for t in quant_params(lo, step))  # bf16 metadata read as fp32
        lv, has_levels = self._levels(levels, x.device)
        s_lo, s_hi = _seed_words(seed)
        flat = x.contiguous().view(-1)
        eng = self.engine
        with eng.scope(x.device):
            a_lo, a_inv, a_pre, a_lv = self._a(lo32), self._a(inv), self._a(pre), self._a(lv)
            for a, b, xc in _f32_chunks(flat):
                oc = out[a * bits // 8: -(-b * bits // 8)]
                eng.launch("quantize_pack", oc.numel(), x.device, self._a(xc), a, k, block_rows, a_lo, a_inv,
                           a_pre, a_lv, has_levels, bits, s_lo, s_hi, bool(stochastic), self._a(oc))
        return out

    def compress_rows(self, x, levels, bits, block_rows, seed, stochastic):
        """On the CPU, for fp32 rows whose groups begin on whole bytes of the codes, one read of ``x``
        (``_numba_cpu.compress_groups``); otherwise three launches (torch's ``aminmax``, then this engine's
        ``group_meta`` and ``quantize_pack``). The results are the reference's bit for bit."""
        from .reference import group_minmax

        n_rows, k = x.shape
        bits, block_rows = int(bits), int(block_rows)
        n_groups = -(-n_rows // block_rows)
        if n_rows * k == 0:
            _check_codes(bits, block_rows, levels, x.new_zeros(n_groups), x.new_zeros(n_groups), n_rows)
            return (torch.empty(0, dtype=torch.uint8, device=x.device),
                    torch.zeros((2, n_groups), dtype=torch.bfloat16, device=x.device))
        one_read = hasattr(self.engine.module, "compress_groups") and x.dtype == torch.float32
        if one_read and block_rows * k * bits % 8 == 0:  # groups begin on whole bytes: threads share none
            _check_codes(bits, block_rows, levels, x.new_zeros(n_groups), x.new_zeros(n_groups), n_rows)
            return self._compress_groups(x, levels, bits, block_rows, seed, stochastic, n_groups)
        mn, mx = group_minmax(x, block_rows)
        meta = self.group_meta(mn, mx, bits)
        packed = self.quantize_pack(x, meta[0], meta[1], levels, bits, block_rows, seed, stochastic)
        return packed, meta.to(torch.bfloat16)

    def _compress_groups(self, x, levels, bits, block_rows, seed, stochastic, n_groups):
        from .reference import meta_factor

        n_rows, k = x.shape
        out = torch.empty(-(-n_rows * k * bits // 8), dtype=torch.uint8, device=x.device)
        meta = torch.empty((2, n_groups), dtype=torch.float32, device=x.device)
        lo, inv, pre = (torch.empty(n_groups, dtype=torch.float32, device=x.device) for _ in range(3))
        lv, has_levels = self._levels(levels, x.device)
        s_lo, s_hi = _seed_words(seed)
        a = self._a
        self.engine.launch("compress_groups", n_groups, x.device, a(x.contiguous().view(-1)), n_rows, k, block_rows,
                           a(lv), has_levels, bits, _f32(meta_factor(bits)), _f32((1 << bits) - 1), s_lo, s_hi,
                           bool(stochastic), a(meta), a(lo), a(inv), a(pre), a(out),
                           unit_bytes=max(1, block_rows * k * bits // 8))
        return out, meta.to(torch.bfloat16)

    def unpack_dequantize(self, packed, lo, step, levels, bits, block_rows, n_rows, k, dtype):
        n = n_rows * k
        bits, block_rows, k = int(bits), int(block_rows), int(k)
        _check_codes(bits, block_rows, levels, lo, step, n_rows)
        _check_packed(packed, n * bits)
        out = torch.empty((n_rows, k), dtype=dtype, device=packed.device)
        if n == 0:
            return out
        from .reference import decode_params, finite_max

        lo32, step32, post = (t.contiguous() for t in decode_params(lo, step))
        vmax = _f32(finite_max(dtype))
        table = self._table(levels, bits, packed.device)
        flat = out.view(-1)
        eng = self.engine
        with eng.scope(packed.device):
            a_packed, a_table = self._a(packed.contiguous()), self._a(table)
            a_lo, a_step, a_post = self._a(lo32), self._a(step32), self._a(post)

            def decode(e0, dst):
                eng.launch("unpack_dequantize", dst.numel(), packed.device, a_packed, e0, k, block_rows, a_lo, a_step,
                           a_post, vmax, a_table, bits, self._a(dst))

            if dtype == torch.float32:
                decode(0, flat)
                return out
            scratch = torch.empty(min(CHUNK, n), dtype=torch.float32, device=packed.device)
            for a in range(0, n, CHUNK):
                b = min(n, a + CHUNK)
                decode(a, scratch[: b - a])
                flat[a:b].copy_(scratch[: b - a])
        return out

    # masks --------------------------------------------------------------------------------------
    def pack_mask(self, mask):
        from . import reference

        flat = mask.reshape(-1)
        if flat.dtype != torch.bool:
            return reference.pack_mask(mask)
        n = flat.numel()
        out = torch.empty(-(-n // 8), dtype=torch.uint8, device=mask.device)
        if n:
            with self.engine.scope(mask.device):
                self.engine.launch("pack_mask", out.numel(), mask.device,
                                   self._a(flat.contiguous().view(torch.uint8)), self._a(out))
        return out

    def unpack_mask(self, packed, numel):
        numel = int(numel)
        _check_packed(packed, numel)
        out = torch.empty(numel, dtype=torch.bool, device=packed.device)
        if numel:
            with self.engine.scope(packed.device):
                self.engine.launch("unpack_mask", numel, packed.device, self._a(packed.contiguous()),
                                   self._a(out.view(torch.uint8)))
        return out

    def dropout(self, x, p, seed):
        return self.dropout_at(x, p, seed, 0)

    def dropout_at(self, x, p, seed, start):
        from . import reference

        if x.dtype != torch.float32 and x.dtype not in _LOW_PRECISION:
            return reference.dropout_at(x, p, seed, start)
        scale = 1.0 / (1.0 - p)  # p == 1 raises ZeroDivisionError, as in the reference
        p32, sc = _f32(p), _f32(scale)
        s_lo, s_hi = _seed_words(seed)
        start = int(start)
        out = self._map_chunks(x, lambda a, b, xc, oc: self.engine.launch(
            "dropout", b - a, x.device, xc, start + a, p32, s_lo, s_hi, sc, oc))
        return out

    def relu_dropout(self, x, p, seed):
        from . import reference

        if x.dtype != torch.float32 and x.dtype not in _LOW_PRECISION:
            return reference.relu_dropout(x, p, seed)
        return self._relu_dropout(x, p, seed)

    def _relu_dropout(self, x, p, seed, in_place: bool = False):
        use_p = p > 0
        scale = 1.0 / (1.0 - p) if use_p else 1.0
        p32, sc = _f32(p), _f32(scale)
        s_lo, s_hi = _seed_words(seed)
        packed = torch.empty(-(-x.numel() // 8), dtype=torch.uint8, device=x.device)

        def launch(a, b, xc, oc):
            pc = packed[a // 8: -(-b // 8)]  # chunks start on multiples of 8 elements: whole bytes
            self.engine.launch("relu_dropout", pc.numel(), x.device, xc, a, bool(use_p), p32, s_lo, s_hi, sc, oc,
                               self._a(pc))

        return self._map_chunks(x, launch, in_place), packed

    def relu_dropout_inplace(self, x, p, seed):
        from . import reference

        if not x.is_contiguous():
            raise ValueError("relu_dropout_inplace: x must be contiguous")
        if x.dtype != torch.float32 and x.dtype not in _LOW_PRECISION:
            return reference.relu_dropout_inplace(x, p, seed)
        return self._relu_dropout(x, p, seed, in_place=True)[1]

    def relu_dropout_compress(self, x, p, seed, levels, bits, block_rows, code_seed, stochastic):
        """This engine's ``relu_dropout`` then its ``compress_rows`` (the one-read fused kernel is the
        extension's); the same results bit for bit."""
        y, mask = self.relu_dropout(x, p, seed)
        packed, meta = self.compress_rows(y, levels, bits, block_rows, code_seed, stochastic)
        return y, mask, packed, meta

    def masked_scale(self, g, packed, on, off):
        from . import reference

        if g.dtype != torch.float32 and g.dtype not in _LOW_PRECISION:
            return reference.masked_scale(g, packed, on, off)
        if off == 0.0:  # reference: (g * mask) * on
            a_on, a_off, c = _f32(1.0), _f32(0.0), _f32(on)
        else:  # reference: g * where(mask, on, off), the factors in g's dtype
            a_on = _f32(torch.tensor(on, dtype=g.dtype).item())
            a_off = _f32(torch.tensor(off, dtype=g.dtype).item())
            c = _f32(1.0)
        _check_packed(packed, g.numel())
        with self.engine.scope(g.device):
            a_packed = self._a(packed.contiguous())
        out = self._map_chunks(g, lambda a, b, gc, oc: self.engine.launch(
            "masked_scale", b - a, g.device, gc, a, a_packed, a_on, a_off, c, oc))
        return out

    # graph ----------------------------------------------------------------------------------------
    def spmm_weighted_sum(self, indptr, indices, eids, x, w, n_dst):
        """The CPU kernel (the spec registers no Numba CUDA graph kernel) over parts of about equal edge counts;
        fp16/bf16 go to the reference."""
        from . import reference

        if x.dtype not in (torch.float32, torch.float64):
            return reference.spmm_weighted_sum(indptr, indices, eids, x, w, n_dst)
        edges = indices.numel()
        if x.dim() != 3 or w.dim() != 2 or w.shape[1] not in (1, x.shape[1]) or indptr.numel() != n_dst + 1 \
                or (eids is None and w.shape[0] < edges) or (eids is not None and eids.numel() != edges):
            raise ValueError(f"spmm_weighted_sum: x [n, H, D] and w [E, H or 1] over {edges} edges and {n_dst} rows, "
                             f"got x {tuple(x.shape)}, w {tuple(w.shape)}, indptr of {indptr.numel()}")
        out = torch.zeros((n_dst,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
        if edges == 0 or out.numel() == 0:
            return out
        parts = 4 * torch.get_num_threads()
        ptr = indptr.long()
        bounds = torch.searchsorted(ptr, torch.linspace(0, edges, parts + 1, dtype=torch.float64).long())
        bounds[0], bounds[-1] = 0, n_dst
        a = self._a
        none = eids is None
        part_bytes = edges * (x.numel() // x.shape[0]) * x.element_size() // parts
        self.engine.launch("spmm_weighted_rows", parts, x.device, a(ptr), a(indices.contiguous()),
                           a(indices[:0] if none else eids.contiguous()), not none, a(x.contiguous()),
                           a(w.to(x.dtype).contiguous()), a(out), a(bounds), unit_bytes=part_bytes)
        return out

    # random numbers -------------------------------------------------------------------------------
    def rademacher(self, d, k, seed, device, dtype=torch.float32):
        import math

        device = torch.device(device)
        d, k = int(d), int(k)
        out = torch.empty(d * k, dtype=torch.float32, device=device)
        if out.numel():
            s_lo, s_hi = _seed_words(seed)
            with self.engine.scope(device):
                self.engine.launch("rademacher", out.numel(), device, s_lo, s_hi, _f32(1.0 / math.sqrt(k)),
                                   self._a(out))
        out = out.view(d, k)
        return out if dtype == torch.float32 else out.to(dtype)

    # hash_uniform is not a registered op: for the smoke test and tests
    def hash_uniform(self, seed: int, start: int, count: int, device) -> torch.Tensor:
        device = torch.device(device)
        out = torch.empty(int(count), dtype=torch.float32, device=device)
        if count:
            s_lo, s_hi = _seed_words(seed)
            with self.engine.scope(device):
                self.engine.launch("hash_uniform", int(count), device, int(start), s_lo, s_hi, self._a(out))
        return out


# ----------------------------------------------------------------------------------------------------
# Loading and registration.
# ----------------------------------------------------------------------------------------------------

def _import_numba_cuda():
    from .._compat import patch_numpy_for_numba

    patch_numpy_for_numba()
    from numba import cuda

    return cuda


def get_ops(kind: str) -> _TorchOps:
    """The torch-level ops of one kernel set: ``"cpu"``, ``"cuda"`` or ``"simulator"``.

    Raises ``RuntimeError`` when that kernel set cannot run here. ``"simulator"`` needs
    ``NUMBA_ENABLE_CUDASIM=1`` in the environment before ``numba.cuda`` is first imported; its ops take
    CPU tensors.
    """
    if kind not in ("cpu", "cuda", "simulator"):
        raise ValueError(f"kind must be 'cpu', 'cuda' or 'simulator', got {kind!r}")
    with _lock:
        if kind in _ops:
            return _ops[kind]
        if kind == "cpu":
            from . import _numba_cpu

            ops = _TorchOps(_CpuEngine(_numba_cpu))
        else:
            from numba import config as numba_config

            simulator = bool(numba_config.ENABLE_CUDASIM)
            if simulator != (kind == "simulator"):
                raise RuntimeError(f"numba.cuda kernels of kind {kind!r} need NUMBA_ENABLE_CUDASIM="
                                   f"{'1' if kind == 'simulator' else '0'} (it is {int(simulator)})")
            cuda = _import_numba_cuda()
            if kind == "cuda" and not cuda.is_available():
                raise RuntimeError("numba.cuda sees no usable GPU (no device or no driver)")
            from . import _numba_gpu

            ops = _TorchOps(_CudaEngine(_numba_gpu, cuda, simulator=simulator))
        _ops[kind] = ops
        return ops


def _load_cuda() -> Optional[str]:
    """None when the Numba CUDA kernels run on this machine's GPU, else why not."""
    from numba import config as numba_config

    if numba_config.ENABLE_CUDASIM or os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "NUMBA_ENABLE_CUDASIM is set: numba.cuda is the simulator (not used for real work)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        ops = get_ops("cuda")
        # smoke test: compile and run one kernel, and check the contract's random numbers
        from . import reference

        device = torch.device("cuda", torch.cuda.current_device())
        seed, start = 0x1234_5678_9ABC_DEF0 & ((1 << 63) - 1), (1 << 32) - 5
        got = ops.hash_uniform(seed, start, 64, device)
        want = reference.hash_uniform(seed, start, 64, device)
        if not torch.equal(got, want):
            return "numba CUDA smoke test failed: hash_uniform differs from the reference"
    except Exception as exc:
        return f"numba CUDA unavailable ({type(exc).__name__}: {exc})"
    return None


def _registered(op: str, cpu_ops: "_TorchOps", cuda_ops: Optional["_TorchOps"]):
    """The registered function of ``op``: the CPU or the CUDA kernel set by the tensors' device. No fallback
    of its own (the registry is the one selector); like every backend it does not differentiate its inputs."""
    cpu_fn = getattr(cpu_ops, op)
    cuda_fn = getattr(cuda_ops, op) if cuda_ops is not None else cpu_fn

    def run(*args, **kwargs):
        return (cuda_fn if _device_of(args, kwargs).type == "cuda" else cpu_fn)(*args, **kwargs)

    run.__name__ = f"numba_{op}"
    run.__doc__ = cpu_fn.__doc__
    return run


def _device_of(args, kwargs) -> torch.device:
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (torch.device, str)) and not isinstance(a, bool):
            return torch.device(a)
    raise TypeError("a numba op needs a tensor or device argument")


def load() -> Optional[str]:
    """Register the ops; return None when at least the CPU kernels are usable, else the reason.

    Never raises. The CUDA kernels are registered for CUDA tensors only when a real GPU works (see
    :func:`cuda_status`).
    """
    try:
        import numba
    except Exception as exc:
        _status["cpu"] = _status["cuda"] = f"numba is not importable ({type(exc).__name__}: {exc})"
        return _status["cpu"]
    try:
        version = tuple(int(p) for p in numba.__version__.split(".")[:2])
    except ValueError:
        version = (0, 0)
    if version < (0, 58):
        _status["cpu"] = _status["cuda"] = f"numba {numba.__version__} is too old (need >= 0.58)"
        return _status["cpu"]
    try:
        get_ops("cpu")
    except Exception as exc:
        _status["cpu"] = _status["cuda"] = f"numba CPU kernels failed to import ({type(exc).__name__}: {exc})"
        return _status["cpu"]
    _status["cpu"] = "available"
    reason = _load_cuda()
    _status["cuda"] = "available" if reason is None else reason
    cpu_ops = get_ops("cpu")
    cuda_ops = get_ops("cuda") if reason is None else None
    devices = ("cpu", "cuda") if cuda_ops is not None else ("cpu",)
    for op in OPS:
        served = tuple(d for d in devices if d in _SPEC[op].devices("numba"))  # graph kernels: CPU only
        register(op, "numba", devices=served)(_registered(op, cpu_ops, cuda_ops))
    return None
