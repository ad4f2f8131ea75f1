"""The ``numba`` backend against the torch reference (the contract in ``dgl_exact.kernels.reference``).

The same parametrized comparisons run on three kernel sets:

* ``cpu``: the Numba CPU kernels (``njit(parallel=True)``), on CPU tensors;
* ``sim``: the Numba CUDA kernels run by Numba's CUDA simulator on CPU tensors (``tests/conftest.py`` sets
  ``NUMBA_ENABLE_CUDASIM=1`` when torch sees no GPU; the simulator runs one Python thread per CUDA thread,
  so shapes stay tiny);
* ``cuda`` (``@pytest.mark.cuda``): the Numba CUDA kernels on CUDA tensors.

Codes and masks must be bit-identical; decoded values and elementwise outputs are compared exactly on
``cpu`` and ``sim`` (same fp32 operations as the reference), and with ``allclose`` on a real GPU.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import pytest
import torch

numba = pytest.importorskip("numba")

import dgl_exact  # noqa: E402
from dgl_exact import kernels  # noqa: E402
from dgl_exact.compression.levels import optimal_levels  # noqa: E402
from dgl_exact.kernels import numba_kernels as NC  # noqa: E402
from dgl_exact.kernels import reference as R  # noqa: E402

from tests.kernels._helpers import DTYPES, SEED, assert_same  # noqa: E402

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _ops(kind: str):
    if kind == "sim" and not SIMULATOR:
        pytest.skip("NUMBA_ENABLE_CUDASIM is not set (a GPU is present): the simulator tests do not apply")
    if kind == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    return NC.get_ops({"sim": "simulator"}.get(kind, kind))


def _device(kind: str) -> str:
    return "cuda" if kind == "cuda" else "cpu"


def _exact(kind: str) -> bool:
    return kind != "cuda"


# ----------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------

def _levels(bits: int, kind: str, device):
    if kind == "uniform":
        return None
    return torch.tensor(optimal_levels(bits, 128), dtype=torch.float32, device=device)


def _problem(n_rows: int, k: int, bits: int, block_rows: int, dtype, levels, device, seed: int = 0):
    """``x`` plus per-group ``lo``/``step`` (fp32) that exercise every branch of the rounding rule:
    clamping below 0 and above the top, exact level hits and ties for nearest rounding, a constant
    group (``step == 0``), a non-finite group (``lo`` NaN) and, in fp32, NaN/inf elements."""
    g = torch.Generator().manual_seed(seed)
    top = (1 << bits) - 1
    n_groups = -(-n_rows // block_rows)
    x = torch.randn(n_rows, k, generator=g) * 2.0
    rows_group = (torch.arange(n_rows) // block_rows)[:, None].expand(n_rows, k).reshape(-1)
    lo = torch.full((n_groups,), float("inf")).scatter_reduce(0, rows_group, x.reshape(-1), "amin")
    mx = torch.full((n_groups,), float("-inf")).scatter_reduce(0, rows_group, x.reshape(-1), "amax")
    step = (mx - lo) / top
    # a few groups with a range that is too narrow (values clamp at 0 and at the top)
    lo[1::5] += 0.3 * step[1::5]
    step[2::5] *= 0.7
    # exact levels and midpoints between levels in the first group's first row
    table = torch.arange(top + 1, dtype=torch.float32) if levels is None else levels.cpu()
    m = min(k, top + 1)
    x[0, :m] = lo[0] + table[:m] * step[0]
    if k > m and top >= 1:
        mids = (table[:-1] + table[1:]) / 2
        mm = min(k - m, top)
        x[0, m:m + mm] = lo[0] + mids[:mm] * step[0]
    if n_groups > 2:
        step[-1] = 0.0  # constant group: inv = 0
    if n_groups > 3:
        lo[-2] = float("nan")  # a group with NaN/inf: compress stores lo = NaN, step = 0
        step[-2] = 0.0
    if dtype == torch.float32 and x.numel() > 10:
        x.view(-1)[3] = float("inf")
        x.view(-1)[5] = float("-inf")
        x.view(-1)[7] = float("nan")
    x = x.to(dtype)
    return x.to(device), lo.to(device), step.to(device)


def _check_compression(kind, n_rows, k, bits, block_rows, level_kind, dtype_name, stochastic):
    ops = _ops(kind)
    device = _device(kind)
    dtype = DTYPES[dtype_name]
    levels = _levels(bits, level_kind, device)
    x, lo, step = _problem(n_rows, k, bits, block_rows, dtype, levels, device, seed=bits * 31 + block_rows)
    packed = ops.quantize_pack(x, lo, step, levels, bits, block_rows, SEED, stochastic)
    want = R.quantize_pack(x, lo, step, levels, bits, block_rows, SEED, stochastic)
    assert packed.dtype == torch.uint8 and packed.numel() == -(-n_rows * k * bits // 8)
    assert torch.equal(packed, want), f"codes differ at bytes {(packed != want).nonzero().flatten()[:10].tolist()}"
    out_dtype = dtype if dtype_name != "fp32" else torch.float32
    got = ops.unpack_dequantize(packed, lo, step, levels, bits, block_rows, n_rows, k, out_dtype)
    assert_same(got, R.unpack_dequantize(want, lo, step, levels, bits, block_rows, n_rows, k, out_dtype),
                 _exact(kind))


def _check_compress_rows(kind, n_rows, k, bits, block_rows, level_kind, dtype_name, stochastic):
    """The fused op (group ranges, bf16 metadata and codes from the values) against the reference's, and the
    decode from the bf16 metadata as stored (no converted copy) against the fp32 values it holds."""
    ops = _ops(kind)
    device = _device(kind)
    dtype = DTYPES[dtype_name]
    levels = _levels(bits, level_kind, device)
    x, _, _ = _problem(n_rows, k, bits, block_rows, dtype, levels, device, seed=bits * 7 + block_rows)
    x[min(2, n_rows - 1)] = 0.0  # a constant row (a constant group when block_rows == 1)
    packed, meta = ops.compress_rows(x, levels, bits, block_rows, SEED, stochastic)
    want_packed, want_meta = R.compress_rows(x, levels, bits, block_rows, SEED, stochastic)
    assert meta.dtype == torch.bfloat16 and meta.shape == (2, -(-n_rows // block_rows))
    assert_same(meta, want_meta)
    assert torch.equal(packed, want_packed)
    dec = ops.unpack_dequantize(packed, meta[0], meta[1], levels, bits, block_rows, n_rows, k, torch.float32)
    assert_same(dec, R.unpack_dequantize(packed, meta[0].float(), meta[1].float(), levels, bits, block_rows, n_rows,
                                         k, torch.float32), _exact(kind))


# Every bit width x block size x level kind; dtype, rounding and shape rotate through the cases so each
# value of each appears with every bit width. Shapes: N*k not a multiple of 8, k = 1, rows crossing bytes.
_SHAPES = [(37, 5), (23, 1), (9, 17), (70, 3)]
_CASES = []
for _i, (_bits, _block, _lv) in enumerate(itertools.product((1, 2, 4, 8), (1, 3, 64), ("uniform", "optimal"))):
    _CASES.append((*_SHAPES[_i % len(_SHAPES)], _bits, _block, _lv, ("fp32", "fp16", "bf16")[_i % 3],
                   (True, False)[(_i // 3) % 2]))
_CASE_IDS = [f"{n}x{k}-int{b}-br{br}-{lv}-{dt}-{'sr' if st else 'rn'}" for n, k, b, br, lv, dt, st in _CASES]


@pytest.mark.parametrize("kind", ["cpu", "sim"])
@pytest.mark.parametrize("case", _CASES, ids=_CASE_IDS)
def test_compression_matches_reference(kind, case):
    _check_compression(kind, *case)


@pytest.mark.parametrize("kind", ["cpu", "sim"])
@pytest.mark.parametrize("case", _CASES, ids=_CASE_IDS)
def test_compress_rows_matches_reference(kind, case):
    _check_compress_rows(kind, *case)


@pytest.mark.parametrize("kind", ["cpu", "sim"])
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_relu_dropout_compress_matches_reference(kind, bits):
    ops = _ops(kind)
    device = _device(kind)
    for (n, k), block_rows, dtype, p in [((37, 5), 1, torch.float32, 0.5), ((9, 17), 3, torch.bfloat16, 0.0),
                                         ((23, 1), 64, torch.float16, 0.3)]:
        x, _, _ = _problem(n, k, bits, block_rows, dtype, None, device, seed=bits)
        got = ops.relu_dropout_compress(x, p, SEED, None, bits, block_rows, SEED + 1, True)
        want = R.relu_dropout_compress(x, p, SEED, None, bits, block_rows, SEED + 1, True)
        for a, b in zip(got, want):
            assert_same(a, b, _exact(kind))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype_name", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("level_kind", ["uniform", "optimal"])
def test_cpu_compression_full_product(bits, dtype_name, level_kind):
    """CPU only (fast): the full product on shapes big enough for many parallel tasks, segments longer
    than the kernel's code buffer (k > 1024) and rows that start mid-byte."""
    for (n_rows, k), block_rows, stochastic in itertools.product([(301, 7), (3, 2500), (40, 1)], (1, 3, 64),
                                                                 (True, False)):
        _check_compression("cpu", n_rows, k, bits, block_rows, level_kind, dtype_name, stochastic)


@pytest.mark.parametrize("kind", ["cpu", "sim"])
def test_empty_and_single_element(kind):
    ops = _ops(kind)
    lo, step = torch.zeros(1), torch.ones(1)
    assert ops.quantize_pack(torch.empty(0, 4), lo, step, None, 2, 1, 1, True).numel() == 0
    assert ops.unpack_dequantize(torch.empty(0, dtype=torch.uint8), lo, step, None, 2, 1, 0, 4,
                                 torch.float32).shape == (0, 4)
    x = torch.tensor([[0.7]])
    for bits in (1, 2, 4, 8):
        assert torch.equal(ops.quantize_pack(x, lo, step, None, bits, 1, 5, True),
                           R.quantize_pack(x, lo, step, None, bits, 1, 5, True))


@pytest.mark.filterwarnings("ignore:.*(overflow|invalid value):RuntimeWarning")  # the simulator's NumPy scalars
@pytest.mark.parametrize("kind", ["cpu", "sim"])
def test_group_meta_matches_reference(kind, meta_cases):
    ops = _ops(kind)
    mn, mx = meta_cases
    if kind == "sim":  # one Python thread per CUDA thread: a sample, with every special case (at the end)
        mn, mx = torch.cat([mn[:200], mn[4000:4100]]), torch.cat([mx[:200], mx[4000:4100]])
    for bits in (1, 2, 4, 8):
        got, want = ops.group_meta(mn, mx, bits), R.group_meta(mn, mx, bits)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)) or (
            torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())), bits
    assert ops.group_meta(mn[:0], mx[:0], 2).shape == (2, 0)
    with pytest.raises(ValueError, match="bits"):
        ops.group_meta(mn[:3], mx[:3], 3)
    with pytest.raises(ValueError, match="differ in length"):
        ops.group_meta(mn[:3], mx[:4], 2)


@pytest.mark.parametrize("kind", ["cpu", "sim"])
def test_hash_uniform_matches_reference(kind):
    ops = _ops(kind)
    for seed, start in [(0, 0), (SEED, 0), ((1 << 63) - 1, (1 << 32) - 40), (12345, (5 << 32) + 3)]:
        want = R.hash_uniform(seed, start, 80, "cpu")
        assert torch.equal(ops.hash_uniform(seed, start, 80, "cpu"), want), (seed, start)


@pytest.mark.parametrize("kind", ["cpu", "sim"])
def test_rademacher_matches_reference(kind):
    """The projection matrix, bit for bit in every dtype (both seed words, k not a power of two)."""
    ops = _ops(kind)
    shapes = [(1, 1), (7, 3), (33, 16)] if kind == "sim" else [(1, 1), (7, 3), (128, 16), (301, 77), (2000, 64)]
    for (d, k), seed in itertools.product(shapes, (0, SEED)):
        for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            got, want = ops.rademacher(d, k, seed, "cpu", dtype), R.rademacher(d, k, seed, "cpu", dtype)
            assert got.dtype == want.dtype and torch.equal(got, want), (d, k, seed, dtype)
    assert ops.rademacher(0, 4, 1, "cpu").shape == (0, 4)


# ----------------------------------------------------------------------------------------------------
# Masks and dropout
# ----------------------------------------------------------------------------------------------------

_MASK_SHAPES = [(1,), (13,), (6, 9), (4, 2, 8)]


def _check_masks(kind, shape, dtype_name, p, on_off):
    ops = _ops(kind)
    device = _device(kind)
    dtype = DTYPES[dtype_name]
    exact = _exact(kind)
    g = torch.Generator().manual_seed(len(shape) * 7 + int(p * 10))
    x = torch.randn(shape, generator=g).to(dtype).to(device)
    if x.numel() > 4:
        x.view(-1)[2] = 0.0
        x.view(-1)[3] = -0.0
    n = x.numel()

    mask = x > 0.3
    packed = ops.pack_mask(mask)
    assert torch.equal(packed, R.pack_mask(mask))
    assert torch.equal(ops.unpack_mask(packed, n), R.unpack_mask(packed, n))

    if p > 0:
        assert_same(ops.dropout(x, p, SEED), R.dropout(x, p, SEED), exact)
        start = 13  # a part of a larger tensor: its masks from element ``start`` on (a kept dropout's rows)
        assert_same(ops.dropout_at(x, p, SEED, start), R.dropout_at(x, p, SEED, start), exact)
    y, bits = ops.relu_dropout(x, p, SEED)
    y_ref, bits_ref = R.relu_dropout(x, p, SEED)
    assert torch.equal(bits, bits_ref)
    assert_same(y, y_ref, exact)

    on, off = on_off
    assert_same(ops.masked_scale(x, bits, on, off), R.masked_scale(x, bits_ref, on, off), exact)


_MASK_CASES = []
for _i, (_shape, _dt) in enumerate(itertools.product(_MASK_SHAPES, ("fp32", "fp16", "bf16"))):
    _MASK_CASES.append((_shape, _dt, (0.0, 0.1, 0.5, 0.3)[_i % 4],
                        ((1.0, 0.0), (1.0 / 0.7, 0.0), (1.0, 0.01), (0.5, -0.3))[(_i // 2) % 4]))
_MASK_IDS = [f"{'x'.join(map(str, s))}-{dt}-p{p}-on{on:.3g}-off{off}" for s, dt, p, (on, off) in _MASK_CASES]


@pytest.mark.parametrize("kind", ["cpu", "sim"])
@pytest.mark.parametrize("case", _MASK_CASES, ids=_MASK_IDS)
def test_masks_and_dropout_match_reference(kind, case):
    _check_masks(kind, *case)


@pytest.mark.parametrize("dtype_name", ["fp32", "fp16", "bf16"])
def test_cpu_masks_larger(dtype_name):
    for shape, p, on_off in [((1001, 37), 0.5, (2.0, 0.0)), ((64, 129), 0.1, (1.0, 0.2)), ((5003,), 0.0, (1.0, 0.0))]:
        _check_masks("cpu", shape, dtype_name, p, on_off)


def test_cpu_dropout_p_values():
    """``keep = u >= p`` compares in fp32 (torch rounds the Python float to the tensor's dtype)."""
    ops = _ops("cpu")
    x = torch.randn(20000)
    for p in (1e-9, 2.0**-24, 0.1, 1.0 / 3.0, 0.7, 0.999999):
        assert torch.equal(ops.dropout(x, p, 3), R.dropout(x, p, 3)), p
        assert torch.equal(ops.relu_dropout(x, p, 3)[1], R.relu_dropout(x, p, 3)[1]), p


def test_cpu_dropout_at_is_the_wholes_rows():
    """Rows ``r0:r1`` of a dropout, regenerated from element ``r0 * cols`` on, equal the same rows of the whole
    (also past element 2**31, where the counter's high word is used)."""
    ops = _ops("cpu")
    x = torch.randn(300, 7)
    whole = ops.dropout(x, 0.4, 9)
    for r0, r1 in ((0, 300), (5, 17), (299, 300)):
        assert torch.equal(ops.dropout_at(x[r0:r1], 0.4, 9, r0 * 7), whole[r0:r1])
    far = (1 << 31) - 5
    assert torch.equal(ops.dropout_at(x, 0.4, 9, far), R.dropout_at(x, 0.4, 9, far))


def test_chunked_low_precision(monkeypatch):
    """fp16/bf16 go through fp32 chunks: results must not depend on where chunks split."""
    ops = _ops("cpu")
    monkeypatch.setattr(NC, "CHUNK", 64)
    for dtype in (torch.float16, torch.bfloat16):
        x, lo, step = _problem(50, 7, 2, 3, dtype, None, "cpu", seed=3)
        for bits in (1, 2, 4, 8):
            packed = ops.quantize_pack(x, lo, step, None, bits, 3, SEED, True)
            assert torch.equal(packed, R.quantize_pack(x, lo, step, None, bits, 3, SEED, True))
            assert_same(ops.unpack_dequantize(packed, lo, step, None, bits, 3, 50, 7, dtype),
                         R.unpack_dequantize(packed, lo, step, None, bits, 3, 50, 7, dtype), True)
        y, m = ops.relu_dropout(x, 0.4, SEED)
        y_ref, m_ref = R.relu_dropout(x, 0.4, SEED)
        assert torch.equal(m, m_ref) and torch.equal(y, y_ref)
        assert torch.equal(ops.dropout(x, 0.4, SEED), R.dropout(x, 0.4, SEED))
        assert torch.equal(ops.masked_scale(x, m, 2.5, 0.0), R.masked_scale(x, m, 2.5, 0.0))


def test_cpu_work_split_across_threads(monkeypatch):
    """Each call is split into unit ranges run on several threads: ranges start mid-row and mid-chunk."""
    ops = _ops("cpu")
    monkeypatch.setattr(ops.engine, "min_units_per_thread", 5)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        for bits, block_rows, level_kind, dtype_name in [(1, 1, "uniform", "fp32"), (2, 3, "optimal", "bf16"),
                                                          (4, 64, "optimal", "fp16"), (8, 3, "uniform", "fp32")]:
            _check_compression("cpu", 97, 13, bits, block_rows, level_kind, dtype_name, True)
        for shape, dtype_name in [((97, 13), "fp32"), ((1003,), "bf16")]:
            _check_masks("cpu", shape, dtype_name, 0.3, (1.5, 0.0))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", ["cpu", "sim"])
def test_bad_arguments_raise(kind):
    """The kernels do not bounds-check, so the wrappers refuse what would make them read out of bounds."""
    ops = _ops(kind)
    x = torch.randn(10, 4)
    lo, step = torch.zeros(10), torch.ones(10)
    with pytest.raises(ValueError):
        ops.quantize_pack(x, lo[:3], step[:3], None, 2, 1, 1, True)
    with pytest.raises(ValueError):
        ops.quantize_pack(x, lo, step, torch.arange(3.0), 2, 1, 1, True)
    with pytest.raises(ValueError):
        ops.quantize_pack(x, lo, step, None, 3, 1, 1, True)
    with pytest.raises(ValueError):
        ops.unpack_dequantize(torch.zeros(2, dtype=torch.uint8), lo, step, None, 2, 1, 10, 4, torch.float32)
    with pytest.raises(ValueError):
        ops.unpack_mask(torch.zeros(1, dtype=torch.uint8), 9)
    with pytest.raises(ValueError):
        ops.masked_scale(x, torch.zeros(4, dtype=torch.uint8), 2.0, 0.0)


def test_float64_falls_back_to_reference_math():
    ops = _ops("cpu")
    x = torch.randn(40, 3, dtype=torch.float64)
    assert torch.equal(ops.dropout(x, 0.3, 1), R.dropout(x, 0.3, 1))
    y, m = ops.relu_dropout(x, 0.3, 1)
    assert torch.equal(y, R.relu_dropout(x, 0.3, 1)[0])
    assert torch.equal(ops.masked_scale(x, m, 2.0, 0.5), R.masked_scale(x, m, 2.0, 0.5))
    lo, step = x.float().amin(1), (x.float().amax(1) - x.float().amin(1)) / 3
    assert torch.equal(ops.quantize_pack(x, lo, step, None, 2, 1, 9, True),
                       R.quantize_pack(x, lo, step, None, 2, 1, 9, True))


# ----------------------------------------------------------------------------------------------------
# Registry integration
# ----------------------------------------------------------------------------------------------------

def test_backend_loads_and_serves_cpu():
    status = kernels.available_backends()
    assert status["numba"] == "available", status["numba"]
    assert NC.cpu_status() == "available"
    assert NC.cuda_status() != "available" or torch.cuda.is_available()
    with kernels.use_backend("numba"):
        for op in NC.OPS:
            assert kernels.get(op, "cpu").__name__ == f"numba_{op}"
    if os.environ.get(kernels.ENV_VAR, "") in ("", "numba"):
        report = kernels.backend("cpu")  # the numba CPU kernels serve CPU tensors by default
        assert all(report.ops[op] == "numba" for op in NC.OPS), report.ops


def test_simulator_is_never_registered_for_cuda():
    if not SIMULATOR:
        pytest.skip("only meaningful under NUMBA_ENABLE_CUDASIM=1")
    kernels.available_backends()
    assert "simulator" in NC.cuda_status().lower()
    fn, devices = kernels._REGISTRY["quantize_pack"]["numba"]
    assert "cuda" not in devices


@pytest.mark.parametrize("bits", [2, 8])
@pytest.mark.parametrize("block_rows", [1, 4])
@pytest.mark.parametrize("levels", ["uniform", "optimal"])
def test_compress_end_to_end_matches_torch_backend(bits, block_rows, levels):
    x = torch.randn(203, 33)
    cfg = dgl_exact.CompressionConfig(bits=bits, block_rows=block_rows, levels=levels)
    with kernels.use_backend("torch"):
        c_ref = dgl_exact.compress(x, cfg, seed=77)
        d_ref = dgl_exact.decompress(c_ref)
    with kernels.use_backend("numba"):
        c = dgl_exact.compress(x, cfg, seed=77)
        d = dgl_exact.decompress(c)
        d_cross = dgl_exact.decompress(c_ref)
    assert torch.equal(c.packed, c_ref.packed)
    assert torch.equal(d, d_ref) and torch.equal(d_cross, d_ref)


def test_registered_ops_do_not_differentiate():
    """Like every backend, the registered functions compute values only: callers (autograd Functions) call
    them with gradients off; there is no private fallback to the reference for inputs requiring grad."""
    ops = _ops("cpu")
    x = torch.randn(30, 5, requires_grad=True)
    y, m = ops.relu_dropout(x, 0.3, 2)
    assert torch.equal(y, R.relu_dropout(x, 0.3, 2)[0].detach()) and not y.requires_grad
    with kernels.use_backend("numba"):
        y2 = kernels.get("dropout", "cpu")(x, 0.3, 2)
    assert not y2.requires_grad and torch.equal(y2, R.dropout(x, 0.3, 2).detach())


def test_load_never_raises_without_numba(monkeypatch):
    saved = dict(NC._status)
    monkeypatch.setitem(sys.modules, "numba", None)  # "import numba" now raises ImportError
    try:
        reason = NC.load()
    finally:
        NC._status.update(saved)
    assert isinstance(reason, str) and "numba" in reason


def test_kernel_failure_raises(monkeypatch):
    """No private fallback: a failing Numba kernel raises (the registry is the one selector; force another
    backend with DGL_EXACT_BACKEND to avoid it)."""
    kernels.available_backends()
    ops = NC.get_ops("cpu")

    def broken(mask):
        raise numba.core.errors.TypingError("simulated compile failure")

    monkeypatch.setattr(ops, "pack_mask", broken)
    fn = NC._registered("pack_mask", ops, None)
    with pytest.raises(numba.core.errors.TypingError):
        fn(torch.rand(30) > 0.5)
    assert NC.cpu_status() == "available"


@pytest.mark.nightly
def test_cuda_kernels_compile_to_ptx_without_fma_in_decode():
    """Compiles every CUDA kernel to PTX (no GPU needed, only NVVM) in a process without the simulator,
    and checks that decoding keeps the reference's two roundings (no fused multiply-add)."""
    script = textwrap.dedent("""
        import sys
        from numba import cuda, types as T
        from numba.cuda.cudadrv.error import CudaSupportError, NvvmSupportError
        from dgl_exact.kernels import _numba_gpu as G
        f32, u8, i64, u64, b, f = T.float32[::1], T.uint8[::1], T.int64, T.uint64, T.boolean, T.float32
        sigs = {
            "group_meta": (f32, f32, f, f, f32),
            "quantize_pack": (f32, i64, i64, i64, f32, f32, f32, f32, b, i64, u64, u64, b, u8),
            "unpack_dequantize": (u8, i64, i64, i64, f32, f32, f32, f, f32, i64, f32),
            "pack_mask": (u8, u8), "unpack_mask": (u8, u8),
            "dropout": (f32, i64, f, u64, u64, f, f32),
            "relu_dropout": (f32, i64, b, f, u64, u64, f, f32, u8),
            "masked_scale": (f32, i64, u8, f, f, f, f32),
            "hash_uniform": (i64, u64, u64, f32),
            "rademacher": (u64, u64, f, f32),
        }
        for name, sig in sigs.items():
            try:
                ptx, _ = cuda.compile_ptx(getattr(G, name).py_func, sig, cc=(8, 0))
            except (CudaSupportError, NvvmSupportError, OSError) as exc:
                print("SKIP", type(exc).__name__, exc)
                sys.exit(0)
            if name != "group_meta":  # one thread per group rounds to bf16 exactly in f64 (frexp / ldexp)
                assert ".f64" not in ptx, name
            if name == "unpack_dequantize":
                assert "fma." not in ptx, "decode must not fuse the multiply-add"
            print("OK", name)
    """)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    if res.returncode == 0 and res.stdout.startswith("SKIP"):
        pytest.skip(f"NVVM unavailable: {res.stdout.strip()}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("OK") == 10, res.stdout


# ----------------------------------------------------------------------------------------------------
# Real GPU
# ----------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("case", _CASES, ids=_CASE_IDS)
def test_cuda_compression_matches_reference(case):
    _check_compression("cuda", *case)


@pytest.mark.cuda
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype_name", ["fp32", "fp16", "bf16"])
def test_cuda_compression_large(bits, dtype_name):
    for level_kind in ("uniform", "optimal"):
        _check_compression("cuda", 4099, 257, bits, 3, level_kind, dtype_name, True)
        _check_compression("cuda", 1000, 128, bits, 1, level_kind, dtype_name, False)


@pytest.mark.cuda
@pytest.mark.parametrize("case", _MASK_CASES, ids=_MASK_IDS)
def test_cuda_masks_match_reference(case):
    _check_masks("cuda", *case)


@pytest.mark.cuda
def test_cuda_masks_large():
    for dtype_name in DTYPES:
        _check_masks("cuda", (4099, 257), dtype_name, 0.5, (2.0, 0.0))


@pytest.mark.cuda
def test_cuda_backend_registered():
    kernels.available_backends()
    if NC.cuda_status() != "available":
        pytest.fail(f"numba CUDA kernels not registered: {NC.cuda_status()}")
    x = torch.randn(300, 64, device="cuda")
    cfg = dgl_exact.CompressionConfig(bits=2)
    with kernels.use_backend("torch"):
        c_ref = dgl_exact.compress(x, cfg, seed=5)
    with kernels.use_backend("numba"):
        assert kernels.get("quantize_pack", "cuda").__name__ == "numba_quantize_pack"
        c = dgl_exact.compress(x, cfg, seed=5)
        torch.testing.assert_close(dgl_exact.decompress(c), dgl_exact.decompress(c_ref))
    assert torch.equal(c.packed, c_ref.packed)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("block_rows,k,level_kind", [(1, 64, "uniform"), (64, 48, "optimal"), (3, 8, "uniform")])
def test_one_read_compression_matches_reference(bits, block_rows, k, level_kind):
    """The CPU's one-read kernel (``_numba_cpu.compress_groups``: groups on whole bytes, fp32), on enough rows
    for several cached batches per thread and two threads, with the groups that take its special branches: a
    NaN, an inf, a constant row, mixed signed zeros, denormals (a tiny step) and values near fp32's largest (a
    wide group). Metadata bit for bit (signed zeros included), codes exactly."""
    assert block_rows * k * bits % 8 == 0  # the one-read path
    g = torch.Generator().manual_seed(bits + k)
    x = torch.randn(6001, k, generator=g)
    x[5, 3], x[70, 0], x[71] = float("nan"), float("inf"), 2.5
    x[300, :] = 0.0
    x[300, ::2] = -0.0
    x[2000] = torch.rand(k, generator=g) * 1e-40
    x[4000] = torch.rand(k, generator=g) * 3e38 - 1.5e38
    levels = _levels(bits, level_kind, "cpu")
    ops = _ops("cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        packed, meta = ops.compress_rows(x, levels, bits, block_rows, SEED, True)
    finally:
        torch.set_num_threads(threads)
    want_packed, want_meta = R.compress_rows(x, levels, bits, block_rows, SEED, True)
    assert torch.equal(meta.view(torch.int16), want_meta.view(torch.int16))
    assert torch.equal(packed, want_packed)
