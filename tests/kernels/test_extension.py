"""The compiled extension backend (``cuda``: ``torch.ops.dgl_exact``) against the torch reference.

The contract is ``dgl_exact.kernels.reference``: codes, masks, dropout outputs and max/min arguments must
be bit-identical; decoded values are the same fp32 operations (compared exactly on CPU and to within
rounding on a GPU); sums (spmm_sum, sddmm_dot) may differ in summation order only.

Kernel sets:

* ``cpu`` (``@pytest.mark.slow``): the C++ CPU kernels. Without a prebuilt ``dgl_exact._C`` or a GPU this
  compiles the CPU part just in time (about 1 to 3 minutes on 2 cores, cached afterwards in torch's
  extension directory); skipped with the reason when that build is impossible.
* ``cuda`` (``@pytest.mark.cuda``): the CUDA kernels on CUDA tensors (prebuilt or compiled just in time).

The quick tests at the top need no build.
"""
from __future__ import annotations

import inspect
import os
import subprocess

import pytest
import torch

from dgl_exact import kernels
from dgl_exact.kernels import extension as X
from dgl_exact.kernels import reference as R

from tests.kernels._helpers import DTYPES, SEED, assert_same

KINDS = [pytest.param("cpu", marks=pytest.mark.slow), pytest.param("cuda", marks=pytest.mark.cuda)]


# ----------------------------------------------------------------------------------------------------
# Quick checks (no build).
# ----------------------------------------------------------------------------------------------------

def test_wrappers_match_reference_signatures():
    for op in X.OPS:
        ref = getattr(R, op)
        ours = getattr(X, op)
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(ref).parameters), op


def test_sources_are_found_and_complete():
    src = X.source_dir()
    assert src is not None
    names = set(os.listdir(src))
    assert {"dgl_exact.cpp", "common.h", "dgl_exact.h"} <= names
    assert any(n.endswith(".cu") for n in names) and any(n.endswith("_cpu.cpp") for n in names)
    # every op has a schema
    schema = open(os.path.join(src, "dgl_exact.cpp")).read()
    for op in X.OPS:
        assert f'm.def("{X.SCHEMAS[op].split("(")[0]}(' in schema, op


def test_every_op_of_the_spec_has_a_schema_and_fake():
    from dgl_exact.kernels.spec import OPS

    for op in X.OPS:
        assert op in X.SCHEMAS and (OPS[op].fake is not None or OPS[op].schema is None), op


def test_ops_missing_from_an_older_library_are_not_registered():
    # a prebuilt library from older sources may lack newer ops: load() registers only what it finds
    assert X._has_op("no_such_op") is False


def test_seed_is_passed_as_int64_with_the_same_bits():
    assert X._seed(5) == 5
    assert X._seed(2**63 - 1) == 2**63 - 1
    assert X._seed(2**64 - 1) == -1
    assert X._seed(-1) == -1
    assert X._seed(2**63) == -(2**63)


def test_compile_check_script_is_runnable():
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts",
                          "compile_check_cuda.sh")
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", script]).returncode == 0


def test_load_never_raises_and_explains(monkeypatch):
    monkeypatch.delenv(X.ENV_CPU_EXT, raising=False)
    reason = X.load()
    if not torch.cuda.is_available() and X.library_info()["kind"] is None:
        assert isinstance(reason, str) and reason
    else:
        assert reason is None or isinstance(reason, str)


# ----------------------------------------------------------------------------------------------------
# Fixtures and helpers.
# ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def _library():
    reason = X.load_library(allow_cpu_jit=True)
    return reason


def _setup(kind, _library):
    if _library is not None:
        pytest.skip(f"the extension is not available: {_library}")
    if kind == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("needs an NVIDIA GPU")
        if not X.library_info()["cuda_kernels"]:
            pytest.skip("the loaded extension has no CUDA kernels")
    return "cuda" if kind == "cuda" else "cpu"


def _groups(x32, bits, block_rows, n_groups):
    """Group lo/step roughly like the compressor: bf16 min and a step a little above (max - min) / M."""
    n, k = x32.shape
    top = (1 << bits) - 1
    idx = torch.arange(n) // block_rows
    lo = torch.full((n_groups,), float("inf")).scatter_reduce(0, idx, x32.amin(1), "amin")
    hi = torch.full((n_groups,), float("-inf")).scatter_reduce(0, idx, x32.amax(1), "amax")
    lo = lo.to(torch.bfloat16).float()  # may round above the minimum: codes clamp at 0 (tested too)
    step = ((hi - lo) * (1 + 2**-20) / top).to(torch.bfloat16).float() * (1 + 2**-7)
    step = torch.where(hi > lo, step, torch.zeros_like(step))
    return lo, step


def _levels(bits, kind):
    top = (1 << bits) - 1
    if kind == "uniform":
        return None
    g = torch.Generator().manual_seed(bits)
    inner = torch.sort(torch.rand(top - 1, generator=g) * top).values
    return torch.cat([torch.zeros(1), inner, torch.full((1,), float(top))]).float()


def _input(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3 + 1).to(dtype)


# ----------------------------------------------------------------------------------------------------
# Compression.
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_rademacher(kind, _library):
    """The projection matrix, bit for bit in every dtype (many parallel chunks / blocks in the largest)."""
    dev = _setup(kind, _library)
    for (d, k), seed in [((1, 1), 0), ((7, 3), SEED), ((301, 77), 2**64 - 1), ((2000, 513), SEED)]:
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            assert_same(X.rademacher(d, k, seed, dev, dtype), R.rademacher(d, k, seed, dev, dtype))
    assert X.rademacher(0, 5, 1, dev).shape == (0, 5)
    with pytest.raises(RuntimeError, match="floating"):
        torch.ops.dgl_exact.rademacher_(torch.empty(2, 2, dtype=torch.int32, device=dev), 1)


SHAPES = [(37, 5), (10, 1), (7, 1500), (64, 3)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_group_meta(kind, bits, meta_cases, _library):
    dev = _setup(kind, _library)
    mn, mx = meta_cases
    g = torch.Generator().manual_seed(bits)
    big = torch.randn(300_000, generator=g)  # several parallel chunks / blocks
    mn, mx = torch.cat([mn, big]), torch.cat([mx, big + torch.rand(300_000, generator=g)])
    for a, b in ((mn, mx), (mn[:0], mx[:0]), (mn[:1], mx[:1])):
        a, b = a.to(dev), b.to(dev)
        assert_same(X.group_meta(a, b, bits), R.group_meta(a, b, bits))
    # low-precision inputs are widened exactly, as the reference does
    assert_same(X.group_meta(mn[:500].half().to(dev), mx[:500].half().to(dev), bits),
          R.group_meta(mn[:500].half().to(dev), mx[:500].half().to(dev), bits))
    with pytest.raises(RuntimeError, match="differ in length"):
        X.group_meta(mn[:3].to(dev), mx[:4].to(dev), bits)
    with pytest.raises(RuntimeError, match="bits"):
        X.group_meta(mn[:3].to(dev), mx[:3].to(dev), 3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("levels", ["uniform", "table"])
@pytest.mark.parametrize("block_rows", [1, 3, 64])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_quantize_pack_and_decode(kind, bits, block_rows, levels, _library):
    dev = _setup(kind, _library)
    for shape in SHAPES:
        for stochastic in (True, False):
            x = _input(shape, torch.float32, seed=bits * 100 + block_rows)
            n_groups = -(-shape[0] // block_rows)
            lo, step = _groups(x, bits, block_rows, n_groups)
            if n_groups > 1:
                step[1] = 0.0  # a constant-looking group
            lv = _levels(bits, levels)
            args = [t.to(dev) if t is not None else None for t in (x, lo, step, lv)]
            want = R.quantize_pack(*args, bits, block_rows, SEED, stochastic)
            got = X.quantize_pack(*args, bits, block_rows, SEED, stochastic)
            assert_same(got, want)
            assert got.numel() == -(-x.numel() * bits // 8)
            dec_ref = R.unpack_dequantize(want, args[1], args[2], args[3], bits, block_rows, shape[0], shape[1],
                                          torch.float32)
            dec = X.unpack_dequantize(got, args[1], args[2], args[3], bits, block_rows, shape[0], shape[1],
                                      torch.float32)
            assert_same(dec, dec_ref, exact=(dev == "cpu"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp64"])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_quantize_dtypes(kind, bits, dtype, _library):
    dev = _setup(kind, _library)
    dt = {**DTYPES, "fp64": torch.float64}[dtype]
    x = _input((29, 33), dt, seed=bits).to(dev)
    lo, step = _groups(x.float().cpu(), bits, 4, 8)
    lo, step = lo.to(dev), step.to(dev)
    lv = _levels(bits, "table").to(dev)
    for levels in (None, lv):
        for stochastic in (True, False):
            want = R.quantize_pack(x, lo, step, levels, bits, 4, SEED, stochastic)
            got = X.quantize_pack(x, lo, step, levels, bits, 4, SEED, stochastic)
            assert_same(got, want)
            dec_ref = R.unpack_dequantize(want, lo, step, levels, bits, 4, 29, 33, dt)
            dec = X.unpack_dequantize(got, lo, step, levels, bits, 4, 29, 33, dt)
            assert_same(dec, dec_ref, exact=(dev == "cpu"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_quantize_nonfinite_and_seeds(kind, _library):
    dev = _setup(kind, _library)
    x = _input((12, 20), torch.float32, seed=3)
    x[0, 3], x[1, 4], x[2, 5] = float("nan"), float("inf"), float("-inf")
    lo, step = _groups(x.nan_to_num(0.0, 0.0, 0.0), 2, 2, 6)
    lo[0] = float("nan")  # compress(nonfinite="propagate") stores NaN lo, zero step for such groups
    step[0] = 0.0
    step[2] = 1e-40  # a denormal step
    x, lo, step = x.to(dev), lo.to(dev), step.to(dev)
    for seed in (0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1, -5):
        want = R.quantize_pack(x, lo, step, None, 2, 2, seed, True)
        got = X.quantize_pack(x, lo, step, None, 2, 2, seed, True)
        assert_same(got, want)
    # non-contiguous input
    xt = _input((20, 12), torch.float32, seed=4).to(dev).t()
    lo2, step2 = _groups(xt.cpu().contiguous(), 4, 1, 12)
    assert_same(X.quantize_pack(xt, lo2.to(dev), step2.to(dev), None, 4, 1, SEED, True),
          R.quantize_pack(xt, lo2.to(dev), step2.to(dev), None, 4, 1, SEED, True))


# Shapes for the fused compress_rows: rows narrower than a code word, odd widths (groups ending mid-word:
# chunks of several groups), more elements than one CPU chunk (2^14) or one CUDA shared-memory chunk (8192,
# also with groups too large for any chunk: the two-launch path), a single row.
COMPRESS_SHAPES = [(37, 5), (10, 1), (7, 1500), (300, 257), (1, 3), (129, 64)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("levels", ["uniform", "table"])
@pytest.mark.parametrize("block_rows", [1, 3, 64])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_compress_rows(kind, bits, block_rows, levels, _library):
    dev = _setup(kind, _library)
    lv = _levels(bits, levels)
    lv = lv.to(dev) if lv is not None else None
    for shape in COMPRESS_SHAPES:
        x = _input(shape, torch.float32, seed=bits * 100 + block_rows).to(dev)
        if shape[0] > 3:
            x[2] = 0.0  # a constant row
            x[3] = x[3].clamp(0, 0) + 1.5  # a constant non-zero row
        for stochastic in (True, False):
            got_p, got_m = X.compress_rows(x, lv, bits, block_rows, SEED, stochastic)
            want_p, want_m = R.compress_rows(x, lv, bits, block_rows, SEED, stochastic)
            assert_same(got_m, want_m)
            assert_same(got_p, want_p)
            dec = X.unpack_dequantize(got_p, got_m[0], got_m[1], lv, bits, block_rows, shape[0], shape[1],
                                      torch.float32)
            dec_ref = R.unpack_dequantize(want_p, want_m[0].float(), want_m[1].float(), lv, bits, block_rows,
                                          shape[0], shape[1], torch.float32)
            assert_same(dec, dec_ref, exact=(dev == "cpu"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp64"])
def test_compress_rows_dtypes_and_nonfinite(kind, dtype, _library):
    dev = _setup(kind, _library)
    dt = {**DTYPES, "fp64": torch.float64}[dtype]
    x = _input((29, 33), torch.float32, seed=5)
    x[0, 3], x[4, 4], x[9, 5] = float("nan"), float("inf"), float("-inf")  # three non-finite groups (lo NaN)
    x[12] = 3e38  # saturating groups (fp16 / bf16: inf)
    x[12, 0] = -3e38
    x = x.to(dt).to(dev)
    if dt == torch.float64:
        x[20, 1] = 1e300  # beyond fp32: inf in fp32, a non-finite group
    for block_rows in (1, 4):
        for seed in (0, 2**63 - 1, -5):
            got = X.compress_rows(x, None, 2, block_rows, seed, True)
            want = R.compress_rows(x, None, 2, block_rows, seed, True)
            assert_same(got[1], want[1])
            assert_same(got[0], want[0])
    # non-contiguous input, empty input
    xt = _input((20, 12), torch.float32, seed=4).to(dev).t()
    for a, b in zip(X.compress_rows(xt, None, 4, 1, SEED, True), R.compress_rows(xt, None, 4, 1, SEED, True)):
        assert_same(a, b)
    p, m = X.compress_rows(torch.empty(0, 7, device=dev), None, 2, 1, 1, True)
    assert p.numel() == 0 and m.shape == (2, 0) and m.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="bits"):
        X.compress_rows(xt, None, 3, 1, 1, True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16", "fp64"])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_relu_dropout_compress(kind, bits, dtype, _library):
    """The fused activation + compression: relu_dropout's output and mask and compress_rows of the output,
    bit for bit (element counts not a multiple of 8; groups too large for a CUDA chunk: the unfused path)."""
    dev = _setup(kind, _library)
    dt = {**DTYPES, "fp64": torch.float64}[dtype]
    lv = _levels(bits, "table")
    for shape, block_rows, levels in [((37, 5), 1, None), ((300, 257), 1, lv), ((29, 33), 4, None),
                                      ((129, 64), 64, lv), ((1, 3), 1, None)]:
        x = _input(shape, dt, seed=bits).to(dev)
        lvd = levels.to(dev) if levels is not None else None
        for p, seed in [(0.0, 0), (0.5, SEED), (0.9, 2**63 - 1)]:
            got = X.relu_dropout_compress(x, p, seed, lvd, bits, block_rows, SEED ^ 1, True)
            want = R.relu_dropout_compress(x, p, seed, lvd, bits, block_rows, SEED ^ 1, True)
            for a, b in zip(got, want):
                assert_same(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_empty_tensors(kind, _library):
    dev = _setup(kind, _library)
    x = torch.empty(0, 7, device=dev)
    lo = torch.empty(0, device=dev)
    assert X.quantize_pack(x, lo, lo, None, 2, 1, 1, True).numel() == 0
    assert X.unpack_dequantize(torch.empty(0, dtype=torch.uint8, device=dev), lo, lo, None, 2, 1, 0, 7,
                               torch.float16).shape == (0, 7)
    assert X.pack_mask(torch.empty(0, dtype=torch.bool, device=dev)).numel() == 0
    assert X.unpack_mask(torch.empty(0, dtype=torch.uint8, device=dev), 0).numel() == 0


# ----------------------------------------------------------------------------------------------------
# Masks and dropout.
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 7, 8, 33, 1000, 4099])
def test_masks(kind, n, _library):
    dev = _setup(kind, _library)
    g = torch.Generator().manual_seed(n)
    mask = (torch.rand(n, generator=g) < 0.4).to(dev)
    packed = X.pack_mask(mask)
    assert_same(packed, R.pack_mask(mask))
    assert_same(X.unpack_mask(packed, n), R.unpack_mask(packed, n))
    # any shape, through the same flat bit order
    m2 = mask[: (n // 3) * 3].view(-1, 3) if n >= 3 else mask
    assert_same(X.pack_mask(m2), R.pack_mask(m2))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.5 + 2**-26])
def test_dropout_family(kind, dtype, p, _library):
    dev = _setup(kind, _library)
    dt = DTYPES[dtype]
    x = _input((37, 29), dt, seed=7).to(dev)
    x[0, 0], x[0, 1], x[0, 2] = float("inf"), float("-inf"), float("nan")
    assert_same(X.dropout(x, p, SEED), R.dropout(x, p, SEED))
    y, packed = X.relu_dropout(x, p, SEED)
    y_ref, packed_ref = R.relu_dropout(x, p, SEED)
    assert_same(y, y_ref)
    assert_same(packed, packed_ref)
    g = _input((37, 29), dt, seed=8).to(dev)
    for on, off in ((1.0 / (1.0 - p), 0.0), (1.0, 0.0), (1 + 2**-11 + 2**-30, 0.25), (2.0, -0.1)):
        assert_same(X.masked_scale(g, packed, on, off), R.masked_scale(g, packed, on, off))


# ----------------------------------------------------------------------------------------------------
# Graph kernels.
# ----------------------------------------------------------------------------------------------------

def _graph(n_dst, n_src, max_deg, idx_dtype, seed=0, permute=False):
    g = torch.Generator().manual_seed(seed)
    deg = torch.randint(0, max_deg + 1, (n_dst,), generator=g)
    deg[::5] = 0  # empty rows
    indptr = torch.zeros(n_dst + 1, dtype=torch.int64)
    indptr[1:] = deg.cumsum(0)
    nnz = int(indptr[-1])
    indices = torch.randint(0, n_src, (nnz,), generator=g)
    eids = torch.randperm(nnz, generator=g).to(idx_dtype) if permute else None
    return indptr.to(idx_dtype), indices.to(idx_dtype), eids, nnz


def _tol(dt):
    # ours accumulates in fp32 and rounds once; the comparison is against the fp64 reference rounded to dt
    return {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3),
            torch.bfloat16: dict(rtol=1e-2, atol=1e-2)}[dt]


def _reference_sum(fn, args, dt):
    """The reference in fp64 (the low-precision reference accumulates in fp16/bf16 on some paths), cast to dt."""
    if dt == torch.float32:
        return fn(*args)
    up = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in args]
    return fn(*up).to(dt)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("idx", ["int32", "int64"])
@pytest.mark.parametrize("heads,dim", [(1, 1), (1, 7), (3, 5), (2, 1500)])
def test_spmm_sum(kind, dtype, idx, heads, dim, _library):
    dev = _setup(kind, _library)
    dt = DTYPES[dtype]
    idx_dtype = getattr(torch, idx)
    n_dst, n_src = 23, 17
    for weighted, permute in ((False, False), (True, False), (True, True)):
        indptr, indices, eids, nnz = _graph(n_dst, n_src, 6, idx_dtype, seed=heads * dim, permute=permute)
        x = _input((n_src, heads, dim), dt, seed=1)
        w = _input((nnz, heads), dt, seed=2) if weighted else None
        args = [t.to(dev) if t is not None else None for t in (indptr, indices, eids, x, w)]
        got = X.spmm_sum(*args, n_dst)
        want = _reference_sum(R.spmm_sum, args + [n_dst], dt)
        assert_same(got, want, exact=False, **_tol(dt))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("idx", ["int32", "int64"])
@pytest.mark.parametrize("reduce", ["max", "min"])
@pytest.mark.parametrize("heads,dim", [(1, 1), (3, 5), (1, 1500)])
def test_spmm_minmax(kind, dtype, idx, reduce, heads, dim, _library):
    dev = _setup(kind, _library)
    dt = DTYPES[dtype]
    n_dst, n_src = 19, 13
    indptr, indices, eids, _ = _graph(n_dst, n_src, 8, getattr(torch, idx), seed=dim)
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-2, 3, (n_src, heads, dim), generator=g).to(dt)  # many ties
    x[0, 0, 0] = float("inf")
    x[1, 0, 0] = float("-inf")
    args = [t.to(dev) if t is not None else None for t in (indptr, indices, eids, x)]
    out, arg = X.spmm_minmax(*args, reduce, n_dst)
    out_ref, arg_ref = R.spmm_minmax(*args, reduce, n_dst)
    assert_same(out, out_ref)
    assert_same(arg, arg_ref)


@pytest.mark.parametrize("kind", KINDS)
def test_spmm_minmax_nan(kind, _library):
    dev = _setup(kind, _library)
    indptr, indices, eids, _ = _graph(11, 7, 5, torch.int64, seed=3)
    x = torch.randn(7, 1, 4)
    x[2, 0, 1] = float("nan")
    args = [t.to(dev) if t is not None else None for t in (indptr, indices, eids, x)]
    for reduce in ("max", "min"):
        out, arg = X.spmm_minmax(*args, reduce, 11)
        out_ref, arg_ref = R.spmm_minmax(*args, reduce, 11)
        assert_same(out, out_ref)
        assert_same(arg, arg_ref)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("idx", ["int32", "int64"])
@pytest.mark.parametrize("heads,dim", [(1, 1), (3, 5), (2, 40), (1, 1500)])
def test_sddmm_dot(kind, dtype, idx, heads, dim, _library):
    dev = _setup(kind, _library)
    dt = DTYPES[dtype]
    n_dst, n_src = 21, 15
    for permute in (False, True):
        indptr, indices, eids, _ = _graph(n_dst, n_src, 6, getattr(torch, idx), seed=dim, permute=permute)
        a = _input((n_src, heads, dim), dt, seed=3)
        b = _input((n_dst, heads, dim), dt, seed=4)
        args = [t.to(dev) if t is not None else None for t in (indptr, indices, eids, a, b)]
        got = X.sddmm_dot(*args)
        want = _reference_sum(R.sddmm_dot, args, dt)
        tol = _tol(dt) if dim < 100 else dict(rtol=_tol(dt)["rtol"], atol=_tol(dt)["atol"] * 10)
        assert_same(got, want, exact=False, **tol)


# ----------------------------------------------------------------------------------------------------
# Integration: registry and torch.compile.
# ----------------------------------------------------------------------------------------------------

@pytest.mark.cuda
def test_registry_serves_cuda_tensors_with_the_extension(_library):
    _setup("cuda", _library)
    assert X.load() is None
    assert kernels.available_backends()["ext"] == "available"
    assert kernels.get("quantize_pack", "cuda") is X.quantize_pack
    with kernels.use_backend("ext"):
        assert kernels.get("spmm_sum", "cuda") is X.spmm_sum
        assert kernels.get("rademacher", "cuda") is X.rademacher


@pytest.mark.parametrize("kind", KINDS)
def test_schemas_of_the_library_are_the_spec(kind, _library):
    """The schemas cuda/dgl_exact.cpp declares are the ones the wrappers were derived from."""
    _setup(kind, _library)
    for op, schema in X.SCHEMAS.items():
        name = schema.split("(")[0]
        got = str(getattr(torch.ops.dgl_exact, name).default._schema)
        assert got == f"dgl_exact::{schema}", (got, schema)


@pytest.mark.parametrize("kind", KINDS)
def test_torch_compile_traces_the_ops(kind, _library):
    dev = _setup(kind, _library)
    if not (hasattr(torch.library, "register_fake") or hasattr(torch.library, "impl_abstract")):
        pytest.skip(f"torch {torch.__version__} has no torch.library.register_fake / impl_abstract")
    X._register_fakes()
    x = _input((33, 9), torch.float32).to(dev)
    lo, step = _groups(x.cpu(), 2, 4, 9)
    lo, step = lo.to(dev), step.to(dev)

    def roundtrip(x, lo, step):
        packed = torch.ops.dgl_exact.quantize_pack(x, lo, step, None, 2, 4, 123, True)
        y, mask = torch.ops.dgl_exact.relu_dropout(x, 0.25, 7)
        return torch.ops.dgl_exact.unpack_dequantize(packed, lo, step, None, 2, 4, 33, 9, torch.float32), y, mask

    compiled = torch.compile(roundtrip, backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(x, lo, step), roundtrip(x, lo, step)):
        assert_same(got, want)
