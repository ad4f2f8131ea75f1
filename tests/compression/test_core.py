"""compress / decompress: unbiasedness and variance (checked against the exact per-element theory), exact
sizes, bit layout, range coverage, constant groups, dtypes and shapes, NaN/Inf policy, determinism,
split/join, and bad inputs.

Statistics. For one element with code-space position ``t`` between adjacent levels ``a < b`` (gap
``g = (b - a) * step`` in value units, ``p = (t - a) / (b - a)``, ``q = 1 - p``) the decoded value is
``x_lo + g B`` with ``B ~ Bernoulli(p)``: mean ``x``, variance ``v = g^2 p q`` = ``(x - a)(b - x)`` in value units.
Over ``S`` independent seeds the mean ``m`` has ``Var(m) = v / S`` exactly, and with ``z = (m - x) / sqrt(v / S)``:
``E[z^2] = 1``, ``Var(z^2) = 2 + (1 - 6pq) / (S pq)`` (binomial fourth central moment ``S pq (1 + 3 (S - 2) pq)``).
The unbiased sample variance ``s2`` has ``E[s2] = v`` and ``Var(s2) = mu4 / S - v^2 (S - 3) / (S (S - 1))`` with
``mu4 = g^4 pq (1 - 3pq)``. Elements are independent (distinct hash inputs, random 63-bit seeds), so sums over
elements have the summed variances. Every check is at 5 standard deviations with fixed seeds: it is
deterministic (never flaky) and would hold for about 1 - 6e-7 of all seed choices if the code is right.
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dgl_exact
from dgl_exact import CompressedTensor, CompressionConfig, compress, decompress
from dgl_exact.compression import compressed_nbytes, draw_seed, optimal_levels, uniform_levels
from dgl_exact.compression import projection
from dgl_exact.kernels.reference import hash_uniform, pack_codes, unpack_codes

BITS = [1, 2, 4, 8]
FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Many small tensor ops: on a shared 2-core machine OpenMP's thread barrier costs far more than the
    work (about 15 ms per op under load), so these tests run single-threaded."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------

def seeds(n, salt=0):
    """``n`` random 63-bit seeds (fixed). Random high bits matter: for seeds below 2^32 the rounding noise
    of seed ``s`` is that of seed 0 with element indices XOR-permuted (``u(s, e) = u(0, e ^ s)``), so small
    consecutive seeds are not independent across elements."""
    gen = torch.Generator().manual_seed(12345 + salt)
    return [int(s) for s in torch.randint(0, 2**63 - 1, (n,), generator=gen)]


def level_table(c: CompressedTensor) -> torch.Tensor:
    group = c.block_rows * c.width if c.n_rows >= c.block_rows else c.n_rows * c.width
    lv = uniform_levels(c.bits) if c.levels == "uniform" else optimal_levels(c.bits, group)
    return torch.tensor(lv, dtype=torch.float64)


def group_meta(c: CompressedTensor):
    """Per-row stored ``lo`` and ``step`` (fp64) as ``[N, 1]`` columns."""
    lo = c.lo.double().repeat_interleave(c.block_rows)[: c.n_rows, None]
    step = c.step.double().repeat_interleave(c.block_rows)[: c.n_rows, None]
    return lo, step


def rounding_theory(x: torch.Tensor, c: CompressedTensor):
    """Per element (as ``[N, D]`` fp64): gap ``g`` in value units and probability ``p`` of rounding up,
    computed independently of the kernels from the stored metadata."""
    rows = x.double().reshape(c.n_rows, c.width)
    lo, step = group_meta(c)
    lv = level_table(c)
    top = len(lv) - 1
    safe = torch.where(step > 0, step, torch.ones_like(step))
    t = ((rows - lo) / safe).clamp(0, top)
    t = torch.where(step > 0, t, torch.zeros_like(t))
    j = (torch.searchsorted(lv, t.contiguous(), right=True) - 1).clamp(0, top - 1)
    a, b = lv[j], lv[j + 1]
    return (b - a) * step, (t - a) / (b - a)


def draw(x, cfg, ss):
    return torch.stack([decompress(compress(x, cfg, seed=s)).double() for s in ss])


def check_unbiased_and_variance(x, cfg, n_seeds, salt=0):
    """Mean and variance of ``decompress(compress(x))`` over seeds versus the exact theory (module docstring)."""
    ss = seeds(n_seeds, salt)
    c = compress(x, cfg, seed=ss[0])
    d = draw(x, cfg, ss).reshape(n_seeds, c.n_rows, c.width)
    g, p = rounding_theory(x, c)
    pq = p * (1 - p)
    v = g**2 * pq
    S = n_seeds
    m = d.mean(0)
    xr = x.double().reshape(c.n_rows, c.width)

    # elements with no rounding noise (exactly on a level) decode exactly (up to fp32 arithmetic)
    exact = v == 0
    scale = xr.abs().max() + 1
    assert torch.all((m - xr).abs()[exact] <= 1e-6 * scale)

    # aggregate bias: sum(m - x) ~ N(0, sum(v) / S)
    z_sum = float((m - xr).sum()) / math.sqrt(float(v.sum()) / S)
    assert abs(z_sum) < 5, f"aggregate bias z = {z_sum:.2f}"

    # per-element: sum of z^2 over elements with pq > 0.01 (chosen from x, not from the draws)
    sel = pq > 0.01
    assert int(sel.sum()) > 50
    z2 = ((m - xr)[sel]) ** 2 / (v[sel] / S)
    var_z2 = 2 + (1 - 6 * pq[sel]) / (S * pq[sel])
    n = int(sel.sum())
    chi = (float(z2.sum()) - n) / math.sqrt(float(var_z2.sum()))
    assert abs(chi) < 5, f"per-element chi-square deviation = {chi:.2f} sd"

    # variance: sum of sample variances ~ sum of v, exact variance of the sample variance
    s2 = d.var(0, unbiased=True)
    var_s2 = g**4 * pq * (1 - 3 * pq) / S - v**2 * (S - 3) / (S * (S - 1))
    z_var = float(s2.sum() - v.sum()) / math.sqrt(float(var_s2.sum()))
    assert abs(z_var) < 5, f"variance z = {z_var:.2f}"
    return m, v


def test_helper_catches_a_biased_compressor():
    """Power check for the statistics above: a decoder biased by 2% of a step must fail them."""
    x = torch.randn(96, 16)
    cfg = CompressionConfig(bits=2)
    real = decompress

    def biased(c):
        out = real(c)
        return out + 0.02 * c.step.float().repeat_interleave(c.block_rows)[: c.n_rows, None]

    globals()["decompress"] = biased
    try:
        with pytest.raises(AssertionError, match="bias"):
            check_unbiased_and_variance(x, cfg, 200)
    finally:
        globals()["decompress"] = real


def test_helper_catches_a_wrong_variance():
    """... and so must a decoder with the right mean but extra noise (variance grows by 20%)."""
    x = torch.randn(96, 16)
    cfg = CompressionConfig(bits=4)
    real = decompress
    gen = torch.Generator().manual_seed(7)

    def noisy(c):
        out = real(c)
        c_ = c.step.float().repeat_interleave(c.block_rows)[: c.n_rows, None]
        return out + 0.2 * c_ * torch.randn(out.shape, generator=gen)  # sd 0.2 step vs ~0.4 step of rounding

    globals()["decompress"] = noisy
    try:
        with pytest.raises(AssertionError, match="variance|chi"):
            check_unbiased_and_variance(x, cfg, 200)
    finally:
        globals()["decompress"] = real


def row_data(n, d, gen):
    """Rows with very different scales and offsets."""
    scale = torch.exp(torch.randn(n, 1, generator=gen))
    offset = 3 * torch.randn(n, 1, generator=gen)
    return (torch.randn(n, d, generator=gen) * scale + offset).float()


# ------------------------------------------------------------------------------------------------
# Unbiasedness and variance
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("block_rows", [1, 64])
@pytest.mark.parametrize("levels", ["uniform", "optimal"])
def test_unbiased_with_theoretical_variance(bits, block_rows, levels):
    """96 rows (with block_rows 64: one full block and a 32-row tail group) x 16 columns, 160 seeds."""
    gen = torch.Generator().manual_seed(bits * 100 + block_rows)
    x = row_data(96, 16, gen)
    check_unbiased_and_variance(x, CompressionConfig(bits=bits, block_rows=block_rows, levels=levels), 160,
                                salt=bits + block_rows)


def test_unbiased_when_metadata_not_bf16_representable():
    """Rows whose min (about 100.3) is far from a bf16 value (spacing 0.5 there) and whose range (0.05) is
    tiny: lo is rounded down before quantising, so the decode stays unbiased. Power: EXACT's order
    (quantise with fp32 metadata, store it rounded to nearest bf16) would be biased by tens of steps."""
    gen = torch.Generator().manual_seed(3)
    x = (100.3 + 0.05 * torch.rand(32, 16, generator=gen) + 0.01 * torch.arange(32)[:, None]).float()
    assert torch.all(x.amin(1).bfloat16().float() != x.amin(1))
    cfg = CompressionConfig(bits=2)
    m, v = check_unbiased_and_variance(x, cfg, 200, salt=77)

    # what EXACT's ordering would give on average: lo_n + t * step_n with t from the fp32 values
    mn, mx = x.amin(1, keepdim=True).double(), x.amax(1, keepdim=True).double()
    step32 = (mx - mn) / 3
    t = (x.double() - mn) / step32
    exact_style = mn.float().bfloat16().double() + t * step32.float().bfloat16().double()
    bias = float((exact_style - x.double()).sum())
    assert abs(bias) > 10 * 5 * math.sqrt(float(v.sum()) / 200)  # EXACT-style bias: > 10x our tolerance


@pytest.mark.parametrize("kept_frac", [0.25, 0.125])
@pytest.mark.parametrize("bits, block_rows, levels", [(2, 1, "uniform"), (8, 64, "optimal"), (4, 8, "uniform")])
def test_projection_unbiased(kept_frac, bits, block_rows, levels):
    """With projection the estimator's variance is normalised by its empirical variance (S = 240 seeds):
    * per element, t = (m - x) / (s / sqrt(S)); the projection error is a Rademacher sum of ~D*k terms, so
      t is close to N(0, 1); over 24*64 = 1536 elements a Bonferroni bound |t| < 5.6 (two-sided normal tail
      2e-8 each, student-t with 239 dof about 5e-8, family-wise < 1e-4);
    * two aggregate functionals f_s = sum_e w_e (x_hat_s - x)_e (w = 1 and random signs), iid over seeds:
      |mean| / (sd / sqrt(S)) < 5;
    * the variance: for element (i, j) the projection alone gives sum_{l != j} x_il^2 / k exactly
      ((R R^T)_lj has mean [l = j] and variance 1/k off the diagonal); quantisation adds at most step^2 / 4
      per projected value, i.e. at most max step_i^2 / 4 per output element. The mean over elements of
      s2 / v_proj deviates from 1 (+ the quantisation excess) by at most 5 * sqrt(2 / (S - 1)) even if all
      elements were fully correlated (sample variance of a near-normal variable)."""
    gen = torch.Generator().manual_seed(int(kept_frac * 1000) + bits)
    n, dim, S = 24, 64, 240
    x = row_data(n, dim, gen)
    cfg = CompressionConfig(bits=bits, block_rows=block_rows, levels=levels, kept_frac=kept_frac)
    ss = seeds(S, salt=bits * 7 + block_rows)
    d = draw(x, cfg, ss)
    err = d - x.double()
    m, sd = err.mean(0), err.std(0, unbiased=True)
    t = m / (sd / math.sqrt(S))
    assert float(t.abs().max()) < 5.6

    signs = torch.where(torch.rand(n, dim, generator=gen) < 0.5, -1.0, 1.0).double()
    for w in (torch.ones(n, dim, dtype=torch.float64), signs):
        f = (err * w).sum(dim=(1, 2))
        assert abs(float(f.mean())) / (float(f.std()) / math.sqrt(S)) < 5

    k = cfg.projected_width(dim)
    xd = x.double()
    v_proj = ((xd**2).sum(1, keepdim=True) - xd**2) / k
    steps = torch.stack([compress(x, cfg, seed=s).step.double().max() for s in ss[:20]])
    quant_excess = float((steps.max() ** 2 / 4 / v_proj).max())
    ratio = float((sd**2 / v_proj).mean())
    tol = 5 * math.sqrt(2 / (S - 1))
    assert 1 - tol < ratio < 1 + quant_excess + tol


def test_rademacher_matrix():
    r = projection.rademacher(64, 16, seed=99, device="cpu")
    assert r.shape == (64, 16) and r.dtype == torch.float32
    assert set(r.unique().tolist()) == {-0.25, 0.25}
    assert torch.equal(r, projection.rademacher(64, 16, seed=99, device="cpu"))  # regenerated, not stored
    assert not torch.equal(r, projection.rademacher(64, 16, seed=100, device="cpu"))
    # E[R R^T] = I: average over 400 seeds; off-diagonals have sd 1/sqrt(k * 400) = 1/80, diagonal is exactly 1
    acc = sum(projection.rademacher(32, 16, s, "cpu") @ projection.rademacher(32, 16, s, "cpu").t()
              for s in seeds(400, salt=5)) / 400
    assert torch.allclose(acc.diagonal(), torch.ones(32))
    off = acc - torch.diag(acc.diagonal())
    assert float(off.abs().max()) < 5.5 / 80  # 992 off-diagonal entries (496 distinct), Bonferroni


# ------------------------------------------------------------------------------------------------
# Exact sizes and bit layout
# ------------------------------------------------------------------------------------------------

def formula(shape, cfg):
    n = 1 if len(shape) == 1 else shape[0]
    width = math.prod(shape) // n if n else math.prod(shape[1:])
    k = cfg.projected_width(width) if n > 0 and cfg.projected_width(width) < width else width
    return math.ceil(n * k * cfg.bits / 8) + 2 * 2 * math.ceil(n / cfg.block_rows)


SHAPES = [(1, 1), (7, 5), (13, 3), (65, 33), (1, 1025), (3, 5000), (31,), (1,), (2, 3, 5), (4, 1), (129, 7)]


def _check_nbytes(x, cfg):
    c = compress(x, cfg, seed=5)
    shape = tuple(x.shape)
    expected = formula(shape, cfg)
    assert c.nbytes == compressed_nbytes(shape, cfg) == expected, (shape, cfg)
    assert c.nbytes == sum(t.numel() * t.element_size() for t in c.tensors())
    assert c.packed.dtype == torch.uint8 and c.lo.dtype == c.step.dtype == torch.bfloat16
    assert c.packed.numel() == math.ceil(c.n_rows * c.width * cfg.bits / 8)
    assert decompress(c).shape == x.shape


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("kept_frac", [1.0, 0.3, 0.125])
@pytest.mark.parametrize("block_rows", [1, 3, 64])
def test_nbytes_exact(bits, kept_frac, block_rows):
    """nbytes = ceil(N k bits / 8) + 2 bytes * 2 * ceil(N / block_rows) for odd N and widths, 1-D, 3-D,
    widths past 1024, with and without projection."""
    gen = torch.Generator().manual_seed(1)
    cfg = CompressionConfig(bits=bits, kept_frac=kept_frac, block_rows=block_rows)
    for shape in SHAPES:
        if kept_frac < 1 and shape == (3, 5000):
            continue  # regenerating a 5000 x 1500 projection twice per call is slow; width 1025 covers it
        _check_nbytes(torch.randn(shape, generator=gen), cfg)


@pytest.mark.parametrize("bits", BITS)
def test_nbytes_exact_optimal_levels(bits):
    """Levels do not change the size (one optimiser run per new group size, so fewer shapes here)."""
    gen = torch.Generator().manual_seed(2)
    for shape, block_rows, kept_frac in [((65, 33), 64, 1.0), ((13, 3), 1, 1.0), ((7, 5), 3, 0.3)]:
        cfg = CompressionConfig(bits=bits, block_rows=block_rows, kept_frac=kept_frac, levels="optimal")
        _check_nbytes(torch.randn(shape, generator=gen), cfg)


@pytest.mark.parametrize("shape", [(0, 5), (0, 3, 4), (5, 0), (0,), (3, 0, 2), (0, 0)])
@pytest.mark.parametrize("kept_frac", [1.0, 0.5])
def test_nbytes_empty(shape, kept_frac):
    for bits in BITS:
        cfg = CompressionConfig(bits=bits, kept_frac=kept_frac, block_rows=2)
        c = compress(torch.empty(shape), cfg, seed=1)
        assert c.nbytes == compressed_nbytes(shape, cfg) == formula(shape, cfg)
        assert c.packed.numel() == 0


def test_blockwise_metadata_smaller_than_per_row():
    x = torch.randn(1000, 128)
    per_row = compress(x, CompressionConfig(bits=2), seed=1)
    blocked = compress(x, CompressionConfig(bits=2, block_rows=64), seed=1)
    assert per_row.lo.numel() == 1000 and blocked.lo.numel() == 16
    assert blocked.nbytes == 1000 * 128 * 2 // 8 + 16 * 4
    assert per_row.nbytes - blocked.nbytes == (1000 - 16) * 4
    # the metadata share: with projection it is a large part of the per-row format
    proj = compress(x, CompressionConfig(bits=2, kept_frac=0.125), seed=1)
    assert (proj.lo.numel() * 4) / proj.nbytes == pytest.approx(4000 / (1000 * 16 / 4 + 4000))


def test_projection_matrix_not_stored():
    """R (D x k) is regenerated from the seed: nothing of size D * k is kept."""
    x = torch.randn(4, 1024)
    cfg = CompressionConfig(bits=8, kept_frac=0.5)
    c = compress(x, cfg, seed=3)
    assert c.nbytes == 4 * 512 + 4 * 4 == compressed_nbytes(x.shape, cfg)  # R alone would be 2 MiB
    assert max(t.numel() for t in c.tensors()) == 4 * 512
    assert torch.equal(decompress(c), decompress(c))


def _pack_reference(codes: np.ndarray, bits: int) -> np.ndarray:
    """Documented layout: code e at bits [(e * bits) % 8, +bits) of byte (e * bits) // 8, little-endian."""
    out = np.zeros(-(-codes.size * bits // 8), dtype=np.uint8)
    for e, q in enumerate(codes.tolist()):
        out[(e * bits) // 8] |= np.uint8(q << ((e * bits) % 8))
    return out


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("stochastic", [False, True])
@pytest.mark.parametrize("shape", [(3, 1), (5, 3), (2, 1025), (1, 5000), (7, 13)])
def test_bit_layout_matches_the_contract(bits, stochastic, shape):
    """Recompute the codes from the stored metadata (kernel contract in kernels/reference.py) and pack
    them independently: the bytes must be identical, for any row count and width (no 1024-column limit)."""
    gen = torch.Generator().manual_seed(bits)
    x = torch.randn(shape, generator=gen)
    cfg = CompressionConfig(bits=bits, stochastic=stochastic, block_rows=2)
    c = compress(x, cfg, seed=4242)
    top = 2**bits - 1
    lo = c.lo.float().repeat_interleave(2)[: shape[0], None]
    step = c.step.float().repeat_interleave(2)[: shape[0], None]
    inv = torch.where(step > 0, 1.0 / step, torch.zeros_like(step))
    t = ((x - lo) * inv).clamp(0, top)
    j = t.floor().clamp(max=top - 1)
    u = hash_uniform(4242, 0, x.numel(), "cpu").view(shape) if stochastic else torch.full(shape, 0.5)
    codes = (j + (u < t - j).float()).to(torch.uint8).numpy().reshape(-1)
    assert codes.max() <= top
    assert np.array_equal(c.packed.numpy(), _pack_reference(codes, bits))
    # every column decodes: nearest rounding is within half a step everywhere, stochastic within one
    err = (decompress(c) - x).abs()
    assert torch.all(err <= step * (0.5 if not stochastic else 1.0) * (1 + 1e-5) + 1e-6)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 1025, 5001])
def test_pack_unpack_round_trip(bits, n):
    gen = torch.Generator().manual_seed(n)
    codes = torch.randint(0, 2**bits, (n,), generator=gen, dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.numel() == -(-n * bits // 8)
    assert torch.equal(unpack_codes(packed, bits, n), codes.long())
    assert np.array_equal(packed.numpy(), _pack_reference(codes.numpy(), bits))


# ------------------------------------------------------------------------------------------------
# Range coverage, clamping, constant groups
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("block_rows", [1, 5])
@pytest.mark.parametrize("levels", ["uniform", "optimal"])
def test_decoded_within_group_range(bits, block_rows, levels):
    """No decoded value leaves [group min, group max] by more than the bf16 metadata rounding:
    lo >= min - 2^-7 |min| (bf16 keeps 8 significant bits) and lo + M step <= max + (max - lo)(2^-7 + 2^-19)
    (step rounded up by < 1 bf16 ulp after a 2^-20 safety factor); plus fp32 arithmetic (4 ulps)."""
    gen = torch.Generator().manual_seed(bits)
    x = torch.cat([row_data(40, 9, gen), 1000 + row_data(10, 9, gen), 1e-3 * row_data(10, 9, gen),
                   -7.3 + 1e-4 * torch.rand(10, 9, generator=gen)])
    cfg = CompressionConfig(bits=bits, block_rows=block_rows, levels=levels)
    top = 2**bits - 1
    n = x.shape[0]
    grp = torch.arange(n) // block_rows
    G = int(grp.max()) + 1
    mn = torch.full((G,), float("inf")).scatter_reduce(0, grp, x.amin(1), "amin").double()[grp, None]
    mx = torch.full((G,), -float("inf")).scatter_reduce(0, grp, x.amax(1), "amax").double()[grp, None]
    for s in seeds(30, salt=bits):
        c = compress(x, cfg, seed=s)
        y = decompress(c).double()
        lo, step = group_meta(c)
        ulp = 4 * 2.0**-23 * torch.maximum(mn.abs(), mx.abs())
        assert torch.all(y >= lo - ulp) and torch.all(y <= lo + top * step + ulp)
        assert torch.all(lo >= mn - 2.0**-7 * mn.abs())
        assert torch.all(lo <= mn)
        assert torch.all(y >= mn - 2.0**-7 * mn.abs() - ulp)
        assert torch.all(y <= mx + (mx - lo) * (2.0**-7 + 2.0**-19) + ulp)


@pytest.mark.parametrize("bits", BITS)
def test_extremes_decode_and_no_overflow_into_neighbour(bits):
    """Alternating max/min columns. The min sits exactly on ``lo`` (bf16-representable -1) and must decode to
    exactly ``lo`` every time; the max sits just below the top level (step is rounded up) and must decode to
    one of the two top levels. A code spilling into the neighbouring packed code would corrupt the mins."""
    x = torch.zeros(16, 33)
    x[:, ::2] = 1.0
    x[:, 1::2] = -1.0
    top = 2**bits - 1
    for s in seeds(50, salt=bits):
        c = compress(x, CompressionConfig(bits=bits), seed=s)
        y = decompress(c).double()
        lo, step = group_meta(c)
        assert torch.all(lo == -1)
        assert torch.equal(y[:, 1::2], lo.expand(16, 16))
        hi = y[:, ::2]
        assert torch.all((hi == (lo + top * step).float().double()) | (hi == (lo + (top - 1) * step).float().double()))


@pytest.mark.parametrize("bits", BITS)
def test_group_meta_reference_rounds_safely(bits, meta_cases):
    """lo is the largest bf16 <= min, step the smallest bf16 keeping max inside ``lo + M step`` (up to the
    2^-20 margin; below 2^-126 the smallest multiple of bf16's denormal spacing 2^-133), both bf16 values;
    non-finite groups get NaN lo and zero step; groups whose top code would not decode finite are wide
    (the same metadata of min / 16, max / 16, step negated)."""
    from dgl_exact.kernels.reference import FLOAT_MAX, group_meta

    top = (1 << bits) - 1
    mn, mx = meta_cases
    meta = group_meta(mn, mx, bits)
    assert meta.shape == (2, mn.numel()) and meta.dtype == torch.float32
    finite_in = torch.isfinite(mn) & torch.isfinite(mx)
    assert torch.all(meta[0, ~finite_in].isnan()) and torch.all(meta[1, ~finite_in] == 0)
    assert torch.equal(meta[:, finite_in].bfloat16().float(), meta[:, finite_in])  # bf16 values, stored exactly
    wide = finite_in & (meta[1] < 0)
    scaled = group_meta(mn / 16, mx / 16, bits)
    assert torch.equal(meta[0, wide], scaled[0, wide]) and torch.equal(meta[1, wide], -scaled[1, wide])
    assert torch.all(torch.maximum(mn.abs(), mx.abs())[wide] > 2.0**125)  # only groups near fp32's range
    assert wide[4010] and not wide[4009]  # (-3.4e38, 3.4e38) is wide, (3e38, 3.4e38) is not
    lo, step = meta.double()
    narrow = finite_in & ~wide
    assert torch.all((lo + top * step)[narrow].abs() <= FLOAT_MAX)  # every narrow code decodes finite
    assert torch.all(step[narrow] <= 2.0**126)  # and its reciprocal is a normal fp32
    lo, step, m, span = lo[narrow], step[narrow], mn.double()[narrow], mx.double()[narrow] - lo[narrow]
    up = torch.nextafter(meta[0, narrow].bfloat16(), torch.tensor(float("inf"), dtype=torch.bfloat16)).double()
    assert torch.all(lo <= m) and torch.all(up > m)  # the largest bf16 <= min
    assert torch.all(step * top >= span)  # every value inside [lo, lo + M step]
    pos = span > 0
    assert torch.all(step[~pos] == 0) and torch.all(step[pos] > 0)
    tiny = pos & (step < 2.0**-126)  # denormal steps: multiples of 2^-133, the smallest one that covers
    assert torch.all(torch.remainder(step[tiny], 2.0**-133) == 0)
    assert torch.all((step[tiny] - 2.0**-133) * top < span[tiny] * (1 + 2.0**-19))
    big = pos & ~tiny
    below = torch.nextafter(meta[1, narrow][big].bfloat16(), torch.tensor(0.0, dtype=torch.bfloat16)).double()
    assert torch.all(below * top < span[big] * (1 + 2.0**-19))  # and the smallest bf16 that does (margin aside)


@pytest.mark.parametrize("value", [1e-40, -1e-40, 1e-45, 2e-38])
def test_denormal_constant_groups_stay_unbiased(value):
    """Denormal values: the step may be denormal (a multiple of 2^-133); quantisation then scales by 2^24, so
    the step's inverse never overflows to inf, which would send every value to the top code."""
    x = torch.full((50, 40), value)
    c = compress(x, CompressionConfig(bits=2), seed=4)
    y = decompress(c).double()
    width = 3 * float(c.step.float().max())  # every draw lies in [lo, lo + 3 step]
    assert (y - value).abs().max() <= width
    assert abs(float(y.mean()) - value) <= 5 * (width / 2) / math.sqrt(x.numel())


@pytest.mark.parametrize("bits", BITS)
def test_kernel_clamps_codes_above_the_top_level(bits):
    """Feed the reference kernel values beyond ``lo + M step`` (t > M): codes are clamped to M and the
    neighbouring codes (zeros) are untouched, for every rounding draw."""
    from dgl_exact.kernels import reference

    top = 2**bits - 1
    x = torch.zeros(4, 17)
    x[:, ::2] = top + 0.999  # t = M + 0.999 would round up to M + 1 in EXACT's unclamped kernel
    lo, step = torch.zeros(4), torch.ones(4)
    for s in seeds(20, salt=bits):
        packed = reference.quantize_pack(x, lo, step, None, bits, 1, s, True)
        codes = unpack_codes(packed, bits, x.numel()).view(4, 17)
        assert torch.all(codes[:, ::2] == top) and torch.all(codes[:, 1::2] == 0)


def _bf16_ulp(v: float) -> float:
    """The spacing of bf16 values around ``v`` (its floor and the next bf16 up)."""
    bits = torch.tensor([abs(v)], dtype=torch.float32).view(torch.int32) & -65536
    lo = bits.view(torch.float32)
    return float((bits + 65536).view(torch.float32) - lo)


def _check_constant(y: torch.Tensor, value: float, n_draws: int):
    """A constant group whose value bf16 cannot hold: every decoded value within one bf16 ulp, and the
    mean unbiased (each draw lies in an interval of width <= ulp, so its sd is <= ulp / 2; 5 sigma)."""
    ulp = _bf16_ulp(value)
    err = y.double() - torch.tensor(value, dtype=torch.float32).double()
    assert err.abs().max() <= ulp, (value, float(err.abs().max()), ulp)
    assert abs(float(err.mean())) <= 5 * (ulp / 2) / math.sqrt(n_draws), (value, float(err.mean()), ulp)


@pytest.mark.parametrize("value", [0.0, 1.0, -2.5, 3.14159, -3.14159, 1e-30, -7e20, 65504.0])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("block_rows", [1, 64])
def test_constant_groups(value, bits, block_rows):
    """Constant groups: exact (step 0) when bf16 holds the value, else unbiased within one bf16 ulp;
    never an extra byte (no exception list, hence no device sync in compress)."""
    x = torch.full((70, 6), value)
    cfg = CompressionConfig(bits=bits, block_rows=block_rows, levels="optimal")
    c = compress(x, cfg, seed=1)
    y = decompress(c)
    exact = torch.tensor(value).bfloat16().float() == torch.tensor(value)
    if exact:
        assert torch.equal(y, x) and torch.all(c.step == 0)
    else:
        _check_constant(y, value, x.numel())
    assert c.nbytes == compressed_nbytes(x.shape, cfg) == formula(x.shape, cfg)


def test_constant_rows_mixed_with_varying_rows():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 400, generator=gen)
    x[2], x[5], x[11] = 3.14159, 0.0, -1.2345678
    for block_rows in (1, 4):
        c = compress(x, CompressionConfig(bits=2, block_rows=block_rows), seed=9)
        y = decompress(c)
        if block_rows == 1:
            assert torch.equal(y[5], x[5])
            _check_constant(y[2], 3.14159, 400)
            _check_constant(y[11], -1.2345678, 400)
        assert torch.all(torch.isfinite(y))
        sh, tensors = c.split()
        assert torch.equal(decompress(sh.join(tensors)), y)
    # a constant block within a blocked tensor
    x2 = torch.randn(12, 400, generator=gen)
    x2[4:8] = 3.14159
    y2 = decompress(compress(x2, CompressionConfig(bits=1, block_rows=4), seed=2))
    _check_constant(y2[4:8], 3.14159, 1600)


def test_constant_fp16_bf16_fp64():
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        x = torch.full((4, 300), 3.14159, dtype=dtype)
        y = decompress(compress(x, CompressionConfig(bits=2), seed=1))
        assert y.dtype == dtype
        # fp16's and bf16's 3.14 fit in bf16: exact; fp64's is quantised in fp32 (within an ulp, unbiased)
        if dtype == torch.float64:
            _check_constant(y.float(), float(x[0, 0].float()), x.numel())
        else:
            assert torch.equal(y, x)


# ------------------------------------------------------------------------------------------------
# dtypes and shapes
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(10,), (4, 6), (3, 4, 5), (2, 1, 3, 2), (0, 8), (0, 3, 4), (5, 0)])
@pytest.mark.parametrize("kept_frac", [1.0, 0.5])
def test_dtype_shape_device_preserved(dtype, shape, kept_frac):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen).to(dtype)
    cfg = CompressionConfig(bits=8, kept_frac=kept_frac)
    c = compress(x, cfg, seed=3)
    y = decompress(c)
    assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
    assert (c.shape, c.dtype, c.device) == (x.shape, dtype, x.device)
    assert torch.all(torch.isfinite(y))
    assert c.nbytes == compressed_nbytes(shape, cfg)
    if x.numel() and kept_frac == 1.0:
        # 8 bits: within one step of the row range, plus the output dtype's rounding
        rows = x.double().reshape(x.shape[0], -1) if x.dim() > 1 else x.double().reshape(1, -1)
        step = (rows.amax(1) - rows.amin(1)).clamp_min(1e-30)[:, None] * 1.01 / 255
        eps = torch.finfo(dtype).eps
        err = (y.double().reshape(rows.shape) - rows).abs()
        assert torch.all(err <= step + eps * rows.abs().amax(1, keepdim=True) * 2)


def test_empty_decompress_is_zeros_of_shape():
    for shape in [(0, 3), (0,), (4, 0), (0, 2, 5)]:
        y = decompress(compress(torch.empty(shape, dtype=torch.float16), CompressionConfig(bits=2), seed=0))
        assert y.shape == torch.Size(shape) and y.dtype == torch.float16


def test_one_dimensional_is_one_row():
    x = torch.randn(50)
    c = compress(x, CompressionConfig(bits=4, block_rows=8), seed=0)
    assert c.n_rows == 1 and c.width == 50 and c.lo.numel() == 1


def test_noncontiguous_and_grad_inputs():
    base = torch.randn(20, 30)
    x = base.t()[:, ::2]  # non-contiguous view
    y = decompress(compress(x, CompressionConfig(bits=8), seed=1))
    assert y.shape == x.shape and float((y - x).abs().max()) < 0.05
    w = torch.randn(6, 7, requires_grad=True)
    c = compress(w * 2, CompressionConfig(bits=4), seed=1)
    out = decompress(c)
    assert not out.requires_grad and out.grad_fn is None  # compression treats its input as data


@pytest.mark.parametrize("dtype", FLOATS)
def test_low_precision_unbiased_enough(dtype):
    """For fp16/bf16/fp64 inputs the decode is unbiased up to the output dtype's own rounding: the mean over
    seeds is within 5 sd of the theory plus half an ulp of the output dtype."""
    gen = torch.Generator().manual_seed(0)
    x = row_data(16, 16, gen).to(dtype)
    cfg = CompressionConfig(bits=2)
    ss = seeds(160, salt=3)
    d = draw(x, cfg, ss)
    c = compress(x, cfg, seed=ss[0])
    g, p = rounding_theory(x, c)
    v = g**2 * p * (1 - p)
    m = d.mean(0)
    half_ulp = torch.finfo(dtype).eps * x.double().abs() * 0.5 if dtype != torch.float64 else 0
    slack = (m - x.double()).abs() - half_ulp
    assert float(slack.sum()) < 5 * math.sqrt(float(v.sum()) / 160) + 2 * float((v / 160).sqrt().sum())


# ------------------------------------------------------------------------------------------------
# Non-finite values
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kept_frac", [1.0, 0.5])
@pytest.mark.parametrize("bits", [1, 8])
def test_nonfinite_propagates_as_nan(kept_frac, bits):
    x = torch.randn(12, 10)
    x[3, 4] = float("nan")
    x[5, 0] = float("inf")
    x[7, 9] = -float("inf")
    bad = [3, 5, 7]
    good = [i for i in range(12) if i not in bad]
    y = decompress(compress(x, CompressionConfig(bits=bits, kept_frac=kept_frac), seed=1))
    assert torch.all(torch.isnan(y[bad]))  # the whole group, never a finite wrong value
    assert torch.all(torch.isfinite(y[good]))
    if kept_frac == 1.0:
        assert float((y[good] - x[good]).abs().max()) < 6  # sanity; ranges are a few units


def test_nonfinite_propagates_per_block():
    x = torch.randn(12, 4)
    x[5, 1] = float("nan")
    y = decompress(compress(x, CompressionConfig(bits=2, block_rows=4), seed=1))
    assert torch.all(torch.isnan(y[4:8])) and torch.all(torch.isfinite(y[:4])) and torch.all(torch.isfinite(y[8:]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_nonfinite_low_precision(dtype):
    x = torch.randn(4, 4).to(dtype)
    x[1, 1] = float("inf")
    y = decompress(compress(x, CompressionConfig(bits=4), seed=1))
    assert torch.all(torch.isnan(y[1])) and torch.all(torch.isfinite(y[[0, 2, 3]]))


def test_nonfinite_raise():
    x = torch.randn(8, 8)
    x[2, 2] = float("nan")
    with pytest.raises(FloatingPointError, match="NaN or Inf"):
        compress(x, CompressionConfig(nonfinite="raise"), seed=1)
    x[2, 2] = float("inf")
    with pytest.raises(FloatingPointError):
        compress(x, CompressionConfig(nonfinite="raise", block_rows=4, kept_frac=0.5), seed=1)
    x[2, 2] = 0.0
    compress(x, CompressionConfig(nonfinite="raise"), seed=1)  # finite input: no error


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("bits", BITS)
def test_range_beyond_fp32_decodes_finite_and_close(bits, dtype):
    """A finite group whose range overflows fp32 (``[3e38, -3e38]``) or whose minimum is below bf16's lowest
    (``-3.4e38``) is wide: its metadata are those of the values / 16 (step negated), so every value decodes
    finite and within one step (16 |step|) of itself. It used to saturate at +-1.28e38: a finite wrong value
    that a downstream overflow (the exact backward's NaN) never saw. Other groups are untouched."""
    x = torch.tensor([[3e38, -3e38], [1.0, -2.0], [3.0e38, 3.3e38], [-3.4e38, 1.0]], dtype=dtype)
    cfg = CompressionConfig(bits=bits, block_rows=1)
    for nonfinite in ("propagate", "raise"):
        c = compress(x, cfg.replace(nonfinite=nonfinite), seed=3)  # no FloatingPointError: nothing is NaN
        y = decompress(c)
        assert torch.isfinite(y).all(), (nonfinite, y)
        assert torch.isfinite(c.lo.float()).all() and torch.isfinite(c.step.float()).all()
    step = c.step.double()
    assert step[0] < 0 and step[3] < 0 and step[1] > 0 and step[2] > 0  # rows 0 and 3 are wide
    true_step = torch.where(step < 0, -16 * step, step)[:, None]
    assert torch.all((y.double() - x.double()).abs() <= true_step * (1 + 1e-6)), (x, y)
    assert y[0, 0] > 0 > y[0, 1]
    # the same rows alone give the same metadata: a wide group does not touch another
    alone = compress(x[1:3], cfg, seed=3)
    assert torch.equal(alone.lo, c.lo[1:3]) and torch.equal(alone.step, c.step[1:3])


@pytest.mark.parametrize("bits", [1, 2, 8])
def test_wide_group_is_unbiased(bits):
    """Every value of a wide group (span beyond fp32) is quantised unbiased, the extremes included, as long as
    its neighbouring levels are finite (here they are: the top level stays below fp32's largest value)."""
    row = torch.tensor([3e38, -3e38, 1e38, -5e37, 0.0, 7e36])
    x = row.repeat(4000, 1)  # block_rows=1: 4000 independent roundings of the same group
    c = compress(x, CompressionConfig(bits=bits, block_rows=1), seed=11)
    step = -16 * float(c.step[0])
    assert step > 0 and 16 * (float(c.lo[0]) + ((1 << bits) - 1) * step / 16) < 3.4e38
    y = decompress(c).double()
    tol = 5 * step / 2 / math.sqrt(4000) + 1e-5 * step  # 5 sigma of the mean, plus fp32 rounding of t
    assert torch.all((y.mean(0) - row.double()).abs() <= tol), (y.mean(0), row)


def test_nonfinite_raise_says_what_happened():
    """'raise' names NaN/Inf only when the input holds them; fp64 values beyond fp32 are said as such."""
    x = torch.tensor([[1e300, -1.0], [1.0, 2.0]], dtype=torch.float64)
    with pytest.raises(FloatingPointError, match="finite but 1 group.*beyond float32's largest finite value") as e:
        compress(x, CompressionConfig(nonfinite="raise", block_rows=1), seed=1)
    assert "NaN or Inf" not in str(e.value)
    x[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"NaN or Inf \(1 NaN, 0 inf values\)"):
        compress(x, CompressionConfig(nonfinite="raise", block_rows=1), seed=1)


# ------------------------------------------------------------------------------------------------
# Determinism, rounding modes, disabled compression
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kept_frac", [1.0, 0.25])
def test_same_seed_same_bytes(kept_frac):
    x = torch.randn(33, 40)
    cfg = CompressionConfig(bits=2, kept_frac=kept_frac, block_rows=4, levels="optimal")
    a, b = compress(x, cfg, seed=123), compress(x, cfg, seed=123)
    assert all(torch.equal(s, t) for s, t in zip(a.tensors(), b.tensors())) and a.proj_seed == b.proj_seed
    assert torch.equal(decompress(a), decompress(b))
    c = compress(x, cfg, seed=124)
    assert not torch.equal(a.packed, c.packed)


def test_torch_manual_seed_controls_drawn_seed():
    x = torch.randn(16, 16)
    cfg = CompressionConfig(bits=2, kept_frac=0.5)
    torch.manual_seed(2024)
    a = compress(x, cfg)
    torch.manual_seed(2024)
    b = compress(x, cfg)
    c = compress(x, cfg)  # the generator advanced: a fresh draw
    assert torch.equal(a.packed, b.packed) and a.proj_seed == b.proj_seed
    assert not torch.equal(a.packed, c.packed) and a.proj_seed != c.proj_seed
    torch.manual_seed(7)
    s1 = draw_seed()
    torch.manual_seed(7)
    assert draw_seed() == s1 and 0 <= s1 < 2**63


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("levels", ["uniform", "optimal"])
def test_nearest_rounding_deterministic(bits, levels):
    gen = torch.Generator().manual_seed(bits)
    x = row_data(20, 30, gen)
    cfg = CompressionConfig(bits=bits, stochastic=False, levels=levels, block_rows=4)
    a, b = compress(x, cfg, seed=1), compress(x, cfg, seed=999)
    assert torch.equal(a.packed, b.packed)
    y = decompress(a).double()
    lo, step = group_meta(a)
    cand = lo[:, :, None] + level_table(a)[None, None, :] * step[:, :, None]  # [N, 1, L] every level's value
    nearest = (x.double()[:, :, None] - cand).abs().min(-1).values
    assert torch.all((y - x.double()).abs() <= nearest + 1e-6 * (x.double().abs() + 1))


def test_disabled_keeps_raw_tensor():
    x = torch.randn(9, 7, dtype=torch.float16)
    cfg = CompressionConfig(enabled=False, bits=1)
    c = compress(x, cfg)
    assert c.raw is not None and c.packed is None and c.raw.data_ptr() == x.data_ptr()
    assert c.nbytes == x.numel() * 2
    assert torch.equal(decompress(c), x)
    with pytest.raises(ValueError, match="disabled"):
        compressed_nbytes(x.shape, cfg)
    assert "raw" in repr(c)


# ------------------------------------------------------------------------------------------------
# split / join
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg", [CompressionConfig(bits=2), CompressionConfig(bits=4, kept_frac=0.25, block_rows=8),
                                 CompressionConfig(enabled=False), CompressionConfig(bits=1, levels="optimal")])
def test_split_join_round_trip(cfg):
    x = torch.randn(10, 12)
    x[3] = 3.14159  # a constant row bf16 cannot hold
    c = compress(x, cfg, seed=5)
    shell, tensors = c.split()
    assert shell.tensors() == () and shell.nbytes == 0
    assert len(tensors) == len(c.tensors()) and all(a is b for a, b in zip(tensors, c.tensors()))
    with pytest.raises(ValueError, match="join"):
        decompress(shell)
    back = shell.join(tensors)
    assert back.nbytes == c.nbytes and torch.equal(decompress(back), decompress(c))
    with pytest.raises(ValueError, match=f"join expects {len(tensors)} tensors"):
        shell.join(tensors[:-1])
    with pytest.raises(ValueError):
        shell.join(tensors + (torch.zeros(1),))
    # tensors pass through autograd's saved-tensor mechanism
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            sh, ts = compress(inp, cfg, seed=5).split()
            ctx.shell = sh
            ctx.save_for_backward(*ts)
            return inp.clone()

        @staticmethod
        def backward(ctx, g):
            return g * decompress(ctx.shell.join(ctx.saved_tensors))

    inp = x.clone().requires_grad_()
    F.apply(inp).sum().backward()
    assert torch.equal(inp.grad, decompress(c))


def test_repr():
    c = compress(torch.randn(4, 64), CompressionConfig(bits=2, kept_frac=0.25), seed=1)
    r = repr(c)
    assert "INT2" in r and "k=16/64" in r and f"nbytes={c.nbytes}" in r


# ------------------------------------------------------------------------------------------------
# Bad inputs
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [[1.0, 2.0], np.ones((2, 2)), 3.0, None, "x"])
def test_compress_rejects_non_tensor(bad):
    with pytest.raises(TypeError, match="compress expects a torch.Tensor"):
        compress(bad)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64])
def test_compress_rejects_non_float(dtype):
    with pytest.raises(TypeError, match="floating"):
        compress(torch.ones(3, 3, dtype=dtype))


def test_compress_rejects_scalar_and_bad_config():
    with pytest.raises(ValueError, match="at least one dimension"):
        compress(torch.tensor(1.0))
    with pytest.raises(TypeError, match="CompressionConfig"):
        compress(torch.ones(3, 3), config={"bits": 2})
    with pytest.raises(TypeError, match="CompressionConfig"):
        compress(torch.ones(3, 3), config=2)


@pytest.mark.parametrize("bad", [torch.ones(3), None, "c", {"packed": None}])
def test_decompress_rejects_non_compressed(bad):
    with pytest.raises(TypeError, match="decompress expects a CompressedTensor"):
        decompress(bad)


def test_compressed_nbytes_bad_inputs():
    cfg = CompressionConfig(bits=2)
    with pytest.raises(TypeError, match="CompressionConfig"):
        compressed_nbytes((3, 4), "bits=2")
    with pytest.raises(TypeError, match="CompressionConfig"):
        compressed_nbytes((3, 4), None)
    with pytest.raises(ValueError, match="at least one dimension"):
        compressed_nbytes((), cfg)
    with pytest.raises(ValueError, match=">= 0"):
        compressed_nbytes((-1, 4), cfg)


def test_public_api_exports():
    assert dgl_exact.compress is compress and dgl_exact.decompress is decompress
    assert dgl_exact.CompressedTensor is CompressedTensor


# ------------------------------------------------------------------------------------------------
# Property test (small)
# ------------------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(0, 40), dims=st.lists(st.integers(0, 9), min_size=0, max_size=2),
       bits=st.sampled_from(BITS), block_rows=st.sampled_from([1, 2, 3, 64]),
       kept_frac=st.sampled_from([1.0, 0.5, 0.2]), levels=st.sampled_from(["uniform", "optimal"]),
       dtype=st.sampled_from(FLOATS), seed=st.integers(0, 2**63 - 1), scale=st.floats(1e-3, 1e3))
def test_property_sizes_shapes_ranges(n, dims, bits, block_rows, kept_frac, levels, dtype, seed, scale):
    shape = (n, *dims)
    gen = torch.Generator().manual_seed(seed % 1000)
    x = (scale * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)
    cfg = CompressionConfig(bits=bits, block_rows=block_rows, kept_frac=kept_frac, levels=levels)
    c = compress(x, cfg, seed=seed)
    assert c.nbytes == compressed_nbytes(shape, cfg) == formula(shape, cfg)
    y = decompress(c)
    assert y.shape == x.shape and y.dtype == dtype
    assert torch.all(torch.isfinite(y))
    if kept_frac == 1.0 and x.numel():
        lo, step = group_meta(c)
        rows = y.double().reshape(c.n_rows, c.width)
        out_eps = torch.finfo(dtype).eps * (lo.abs() + (2**bits - 1) * step)
        assert torch.all(rows >= lo - out_eps - 1e-30)
        assert torch.all(rows <= lo + (2**bits - 1) * step + out_eps + 1e-30)


# ------------------------------------------------------------------------------------------------
# No host-device synchronisation (GPU)
# ------------------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("cfg", [CompressionConfig(bits=2), CompressionConfig(bits=1),
                                 CompressionConfig(bits=2, block_rows=64, levels="optimal"),
                                 CompressionConfig(bits=2, kept_frac=0.125), CompressionConfig(bits=8)],
                         ids=["int2", "int1", "int2-blocks-optimal", "int2-rp", "int8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compress_and_decompress_never_synchronise(cfg, dtype):
    """A sync stalls the host until the GPU drains, then the GPU idles while the host launches again:
    per layer that is the difference between overlapping launches and paying for them."""
    x = torch.randn(1000, 96, device="cuda", dtype=dtype)
    x[3] = 3.14159  # a constant row bf16 cannot hold
    x[4] = float("nan")
    decompress(compress(x, cfg, seed=1))  # warm-up: level tables, kernel loads, a JIT build
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = decompress(compress(x, cfg, seed=2))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert y.shape == x.shape and torch.isnan(y[4]).all() and torch.isfinite(y[64:]).all()


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("kept_frac", [1.0, 0.5])
def test_fp16_near_its_maximum_decodes_finite_with_and_without_projection(kept_frac, enabled):
    """fp16 values near 65504 decode finite at every bit width, also through the random projection, whose
    estimate may exceed fp16's range where the input did not (clamped there, not cast to inf); an inf in the
    input still comes back non-finite in its row."""
    x = torch.tensor([[65000.0, -65000.0, 0.0, 1.0] * 8], dtype=torch.float16).repeat(20, 1)
    for bits in BITS:
        cfg = CompressionConfig(bits=bits, kept_frac=kept_frac, enabled=enabled)
        assert torch.isfinite(decompress(compress(x, cfg, seed=bits))).all(), bits
    x[3, 5] = float("inf")
    y = decompress(compress(x, CompressionConfig(bits=8, kept_frac=kept_frac, enabled=enabled), seed=1))
    assert (~torch.isfinite(y)).any(1).nonzero().flatten().tolist() == [3]
