"""Compression of extreme values, on every backend the kernel tests cover: the torch reference (``torch``), the
Numba CPU kernels (``cpu``), the Numba CUDA kernels in the simulator (``sim``) and on a GPU (``cuda``), the
compiled extension's C++ CPU kernels (``ext``, ``slow``: it may build them) and its CUDA kernels (``ext-cuda``).

The contract (``dgl_exact.kernels.reference``): denormal fp32 values are quantised unbiased (a denormal step is
a multiple of 2^-133, quantised with values scaled by 2^24); fp16/bf16 values near their largest finite value
decode finite (a level past it decodes to it); a group whose range overflows fp32 is *wide* (metadata of the
values / 16, step negated) and decodes finite and within one step; a group holding a NaN or an inf decodes NaN.

Statistical checks: a row repeated ``n`` times (``block_rows=1``) gives ``n`` independent stochastic roundings of
each value (the hash is per element). Stochastic rounding between levels ``a <= x <= b`` is unbiased with
variance ``(x - a)(b - x) <= (b - a)^2 / 4``, so the mean of ``n`` draws has standard deviation at most
``step / (2 sqrt(n))``; the tests allow 5 of those, plus the rounding of the code position ``t`` in fp32 and
the 24-bit resolution of the uniforms (``2^-16`` of a step covers both at 8 bits).
"""
from __future__ import annotations

import math
import os

import pytest
import torch

numba = pytest.importorskip("numba")

from dgl_exact.kernels import numba_kernels as NC  # noqa: E402
from dgl_exact.kernels import reference as R  # noqa: E402

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
KINDS = ["torch", "cpu", "sim", pytest.param("cuda", marks=pytest.mark.cuda),
         pytest.param("ext", marks=pytest.mark.slow), pytest.param("ext-cuda", marks=pytest.mark.cuda)]
N_REPEAT = 600  # rows: draws per value (the simulator runs one Python thread per element: keep it small)
Z = 5.0
FP32_MAX = torch.finfo(torch.float32).max


class _Reference:
    compress_rows = staticmethod(R.compress_rows)
    unpack_dequantize = staticmethod(R.unpack_dequantize)


def _ops(kind: str):
    if kind == "torch":
        return _Reference
    if kind.startswith("ext"):
        from dgl_exact.kernels import extension as X

        reason = X.load_library(allow_cpu_jit=True)
        if reason is not None:
            pytest.skip(f"the extension is not available: {reason}")
        if kind == "ext-cuda" and not (torch.cuda.is_available() and X.library_info()["cuda_kernels"]):
            pytest.skip("needs an NVIDIA GPU and the extension's CUDA kernels")
        return X
    if kind == "sim" and not SIMULATOR:
        pytest.skip("NUMBA_ENABLE_CUDASIM is not set (a GPU is present): the simulator tests do not apply")
    if kind == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    return NC.get_ops({"sim": "simulator"}.get(kind, kind))


def _roundtrip(kind, row, bits, seed, dtype=torch.float32, repeat=N_REPEAT):
    """``(x, decoded, lo, step)`` for ``row`` repeated ``repeat`` times, one group per row; also checks that
    the backend's metadata, codes and decode are the reference's, bit for bit."""
    ops = _ops(kind)
    device = "cuda" if kind.endswith("cuda") else "cpu"
    x = torch.tensor(row, dtype=torch.float64).to(dtype).repeat(repeat, 1).to(device)
    packed, meta = ops.compress_rows(x, None, bits, 1, seed, True)
    y = ops.unpack_dequantize(packed, meta[0], meta[1], None, bits, 1, x.shape[0], x.shape[1], dtype)
    want_packed, want_meta = R.compress_rows(x.cpu(), None, bits, 1, seed, True)
    assert torch.equal(meta.cpu().view(torch.int16), want_meta.view(torch.int16))
    assert torch.equal(packed.cpu(), want_packed)
    want = R.unpack_dequantize(want_packed, want_meta[0], want_meta[1], None, bits, 1, x.shape[0], x.shape[1], dtype)
    if not kind.endswith("cuda"):
        torch.testing.assert_close(y, want, rtol=0, atol=0, equal_nan=True)
    return x.cpu().double(), y.cpu().double(), float(want_meta[0, 0]), float(want_meta[1, 0])


def _levels(x_row, lo, step, bits):
    """Per value: the true step and its neighbouring levels ``a <= x <= b`` (as decoding computes them in
    exact arithmetic, before any clamp)."""
    scale = 16.0 if step < 0 else 1.0
    lo, s = lo * scale, abs(step) * scale
    t = ((x_row - lo) / s).clamp(0, (1 << bits) - 1)
    j = t.floor().clamp(max=(1 << bits) - 2)
    return s, lo + j * s, lo + (j + 1) * s


def _assert_unbiased(x, y, lo, step, bits, finite_max):
    """The mean of the draws of each value is within 5 sigma of it where both its neighbouring levels are
    inside ``[-finite_max, finite_max]``; elsewhere (a level clamped) within one step. Returns the mask of
    values checked for bias."""
    s, a, b = _levels(x[0], lo, step, bits)
    mean = y.mean(0)
    inside = (a >= -finite_max) & (b <= finite_max)
    tol = Z * s / (2 * math.sqrt(x.shape[0])) + 2.0**-16 * s
    assert torch.all((mean - x[0]).abs()[inside] <= tol), (x[0], mean, s)
    assert torch.all((mean - x[0]).abs()[~inside] <= s * (1 + 1e-6)), (x[0], mean, s)
    return inside


@pytest.mark.filterwarnings("ignore:.*(overflow|invalid value|underflow):RuntimeWarning")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", [1, 2, 8])
@pytest.mark.parametrize("row", [[0.0, 1e-42, 1e-40, -3e-41, 1e-45, 5e-39],  # denormals next to zero
                                 [1e-42, 1e-42, 1e-42],                          # a constant denormal group
                                 [1e-40, 1.1e-40, 2e-38]],                       # denormals and a normal
                         ids=["with-zero", "constant", "mixed"])
def test_denormals_are_unbiased(kind, bits, row):
    """fp32 denormals are quantised unbiased (they used to get a step of at least 2^-126: ``1e-42`` nearly
    always decoded to 0, ``1e-40`` was biased). A denormal step is a multiple of 2^-133, bf16's spacing."""
    x, y, lo, step = _roundtrip(kind, row, bits, seed=1000 + bits)
    assert step >= 0 and (step >= 2.0**-126 or step % 2.0**-133 == 0)
    span = float(x[0].max()) - lo
    if step < 2.0**-126:  # the smallest multiple of 2^-133 that covers the range (not a floor of 2^-126)
        assert (step - 2.0**-133) * ((1 << bits) - 1) < span * (1 + 2.0**-19) <= step * ((1 << bits) - 1)
    assert torch.isfinite(y).all()
    inside = _assert_unbiased(x, y, lo, step, bits, FP32_MAX)
    assert inside.all()
    assert torch.all((y >= lo) & (y <= lo + ((1 << bits) - 1) * step))


@pytest.mark.filterwarnings("ignore:.*(overflow|invalid value):RuntimeWarning")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_low_precision_near_its_maximum_decodes_finite(kind, bits, dtype):
    """fp16/bf16 values near the dtype's largest value decode finite at every bit width (they used to decode
    to +-inf: a level past the maximum overflowed the cast; under AMP the GradScaler then skipped every
    step). A level past the maximum decodes to the maximum: unbiased wherever both neighbouring levels are
    finite in the dtype, otherwise within one step."""
    big = torch.finfo(dtype).max
    row = [65000.0, -65000.0, 0.0, 1.0, 65504.0, -65504.0] if dtype == torch.float16 else \
        [3.3e38, -3.3e38, 0.0, 1.0, big, -big]
    x, y, lo, step = _roundtrip(kind, row, bits, seed=2000 + bits, dtype=dtype)
    assert torch.isfinite(y).all()
    _assert_unbiased(x, y, lo, step, bits, big)


@pytest.mark.filterwarnings("ignore:.*(overflow|invalid value):RuntimeWarning")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("row", [[1e38, -1e38, 0.0, 1.0],
                                 [3e38, -3e38, 1e38, -5e37, 7e36],
                                 [3.4e38, -3.4e38, 0.0],
                                 [FP32_MAX, -FP32_MAX, 1.0],
                                 [-3.4e38, 1.0]],
                         ids=["1e38", "3e38", "3.4e38", "fp32-max", "below-bf16-lowest"])
def test_huge_range_decodes_finite_and_close(kind, bits, row):
    """Finite values whose group range overflows fp32 decode finite and within one step of themselves,
    unbiased where both neighbouring levels are finite in fp32 (they used to saturate at +-1.28e38)."""
    x, y, lo, step = _roundtrip(kind, row, bits, seed=3000 + bits)
    assert torch.isfinite(y).all()
    s, _, _ = _levels(x[0], lo, step, bits)
    assert torch.all((y - x).abs() <= s * (1 + 1e-6))
    _assert_unbiased(x, y, lo, step, bits, FP32_MAX)


@pytest.mark.filterwarnings("ignore:.*(overflow|invalid value):RuntimeWarning")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", [1, 8])
def test_nonfinite_values_decode_nonfinite(kind, bits):
    """A NaN or an inf decodes non-finite in its position; the rest of its group decodes NaN too (a group's
    codes have no spare value to mark one element: the documented limitation), other groups are untouched."""
    inf, nan = float("inf"), float("nan")
    ops = _ops(kind)
    device = "cuda" if kind.endswith("cuda") else "cpu"
    x = torch.tensor([[inf, 1.0, 2.0], [-inf, 0.5, 3e38], [nan, -1.0, 0.0], [1.0, 2.0, 3.0]], device=device)
    packed, meta = ops.compress_rows(x, None, bits, 1, 7, True)
    y = ops.unpack_dequantize(packed, meta[0], meta[1], None, bits, 1, 4, 3, torch.float32).cpu()
    assert torch.isnan(y[:3]).all()
    assert torch.isnan(meta[0, :3].float()).all() and torch.all(meta[1, :3] == 0)
    one_step = 2.0 * (1 + 2.0**-7) / ((1 << bits) - 1)  # the range [1, 3] over M levels, bf16-rounded up
    assert torch.isfinite(y[3]).all() and torch.all((y[3] - x[3].cpu()).abs() <= one_step)


@pytest.mark.filterwarnings("ignore:.*(overflow|invalid value|underflow):RuntimeWarning")
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "torch"])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block_rows", [1, 3])
def test_extreme_rows_match_reference_with_levels_and_blocks(kind, bits, block_rows):
    """Denormal, wide and fp32-maximum groups with i-EXACT's non-uniform levels and multi-row blocks: the
    backend's metadata, codes and decode are the reference's, bit for bit (on a GPU: decode to rounding)."""
    from dgl_exact.compression.levels import optimal_levels

    ops = _ops(kind)
    device = "cuda" if kind.endswith("cuda") else "cpu"
    rows = torch.tensor([[0.0, 1e-42, 1e-40, -3e-41, 1e-45, 5e-39],
                         [3e38, -3e38, 1e38, 0.0, 1.0, -3.4e38],
                         [1e-40, 1.1e-40, 2e-38, 0.0, 0.0, 0.0],
                         [FP32_MAX, -FP32_MAX, 0.0, 1.0, 2.0, 3.0]]).repeat(5, 1)
    levels = torch.tensor(optimal_levels(bits, 6 * block_rows), dtype=torch.float32)
    want_p, want_m = R.compress_rows(rows, levels, bits, block_rows, 99, True)
    want = R.unpack_dequantize(want_p, want_m[0], want_m[1], levels, bits, block_rows, rows.shape[0], 6,
                               torch.float32)
    assert torch.isfinite(want).all()
    p, m = ops.compress_rows(rows.to(device), levels.to(device), bits, block_rows, 99, True)
    assert torch.equal(p.cpu(), want_p) and torch.equal(m.cpu().view(torch.int16), want_m.view(torch.int16))
    got = ops.unpack_dequantize(p, m[0], m[1], levels.to(device), bits, block_rows, rows.shape[0], 6, torch.float32)
    exact = not kind.endswith("cuda")
    torch.testing.assert_close(got.cpu(), want, rtol=0 if exact else 1e-6, atol=0, equal_nan=True)
