"""Quantization levels: i-EXACT's clipped-normal variance model, the variance-optimal levels it yields,
and that those levels lower the *measured* rounding variance of compress/decompress by what the model
predicts."""
import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from dgl_exact import CompressionConfig, compress, decompress
from dgl_exact.compression import expected_variance, model_sigma, optimal_levels, uniform_levels
from dgl_exact.compression.levels import levels_for


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tests run many small tensor ops; on a shared 2-core machine OpenMP's thread barrier costs far
    more than the work (about 15 ms per op under load), so run them single-threaded."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def ifit_lo(d):
    """i-EXACT's fitted optimum of the lower interior 2-bit level."""
    return 0.83162565 + 0.02993653 * math.log(116.05528511 * d) + 1.225e-5 * d - 0.00171617 * math.sqrt(d)


# ------------------------------------------------------------------------------------------------
# The model and the optimiser
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("d", [3, 16, 100, 1024, 65536])
def test_model_sigma_puts_min_and_max_at_the_1_over_d_quantiles(bits, d):
    half = (2**bits - 1) / 2
    sigma = model_sigma(bits, d)
    assert sigma > 0
    assert special.ndtr((0 - half) / sigma) == pytest.approx(1 / d, rel=1e-9)
    assert special.ndtr((2 * half - half) / sigma) == pytest.approx(1 - 1 / d, rel=1e-9)


@pytest.mark.parametrize("bits, d", [(2, 16), (2, 1024), (4, 128)])
def test_expected_variance_matches_numerical_integration(bits, d):
    """``expected_variance`` = sum over gaps of E[(t - a)(b - t); a < t < b], t ~ N(M/2, sigma^2); the clipped
    mass sits on the end levels and contributes nothing. Check against direct quadrature."""
    top = 2**bits - 1
    mu, sigma = top / 2, model_sigma(bits, d)
    for lv in (uniform_levels(bits), optimal_levels(bits, d)):
        total = 0.0
        for a, b in zip(lv[:-1], lv[1:]):
            total += integrate.quad(lambda t: (t - a) * (b - t) * stats.norm.pdf(t, mu, sigma), a, b,
                                    epsabs=1e-13, epsrel=1e-11)[0]
        assert expected_variance(lv, bits, d) == pytest.approx(total, rel=1e-8, abs=1e-12)


@pytest.mark.parametrize("d", [16, 20, 32, 50, 64, 100, 128, 200, 256, 384, 512, 777, 1000, 1024])
def test_two_bit_optimum_matches_iexact_fit(d):
    lv = optimal_levels(2, d)
    assert lv.shape == (4,) and lv[0] == 0.0 and lv[3] == 3.0
    assert lv[1] == pytest.approx(ifit_lo(d), abs=0.005)
    assert lv[2] == pytest.approx(3 - lv[1], abs=1e-9)  # {0, lo, 3 - lo, 3}


@pytest.mark.parametrize("d, anchor_lo", [(16, 1.05), (128, 1.10), (1024, 1.14)])
def test_two_bit_optimum_published_anchors(d, anchor_lo):
    assert optimal_levels(2, d)[1] == pytest.approx(anchor_lo, abs=0.005)


@pytest.mark.parametrize("d, reduction", [(16, 0.02), (128, 0.09), (1024, 0.20)])
def test_two_bit_model_variance_reduction_matches_iexact(d, reduction):
    """i-EXACT: about 2%, 9%, 20% less rounding variance than uniform levels at d = 16, 128, 1024."""
    vu = expected_variance(uniform_levels(2), 2, d)
    vo = expected_variance(optimal_levels(2, d), 2, d)
    assert 1 - vo / vu == pytest.approx(reduction, abs=0.01)


@pytest.mark.parametrize("d", [16, 128, 1024])
def test_two_bit_optimum_is_the_grid_minimum(d):
    """Scan the symmetric family {0, lo, 3 - lo, 3}: the optimiser's lo is the minimiser (to the grid step)."""
    grid = np.linspace(0.5, 1.49, 991)
    values = [expected_variance([0, lo, 3 - lo, 3], 2, d) for lo in grid]
    best = grid[int(np.argmin(values))]
    assert optimal_levels(2, d)[1] == pytest.approx(best, abs=0.002)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("d", [3, 16, 128, 1024, 8192])
def test_wide_levels_symmetric_ascending_with_fixed_endpoints(bits, d):
    top = 2**bits - 1
    lv = optimal_levels(bits, d)
    assert lv.shape == (top + 1,)
    assert lv[0] == 0.0 and lv[-1] == float(top)
    assert np.all(np.diff(lv) > 0)
    np.testing.assert_allclose(lv + lv[::-1], top, atol=1e-9)
    vu, vo = expected_variance(uniform_levels(bits), bits, d), expected_variance(lv, bits, d)
    assert vo <= vu * (1 + 1e-12)
    if d >= 128:
        assert vo < 0.95 * vu  # a clear gain once the groups are wide


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_optimal_gain_grows_with_group_size(bits):
    gains = [1 - expected_variance(optimal_levels(bits, d), bits, d) / expected_variance(uniform_levels(bits), bits, d)
             for d in (16, 64, 256, 1024)]
    assert all(g2 > g1 for g1, g2 in zip(gains, gains[1:]))


def test_degenerate_cases_are_uniform():
    np.testing.assert_array_equal(optimal_levels(1, 1024), [0.0, 1.0])
    for d in (1, 2):
        np.testing.assert_array_equal(optimal_levels(2, d), uniform_levels(2))
    np.testing.assert_array_equal(uniform_levels(4), np.arange(16.0))


def test_levels_for():
    assert levels_for(2, "uniform", 1024) is None
    assert levels_for(1, "optimal", 1024) is None  # one gap: nothing to optimise, integer fast path
    assert levels_for(2, "optimal", 2) is None
    np.testing.assert_array_equal(levels_for(2, "optimal", 128), optimal_levels(2, 128))
    with pytest.raises(ValueError, match="levels must be"):
        levels_for(2, "fancy", 16)


def test_optimal_levels_returns_a_fresh_array():
    lv = optimal_levels(2, 64)
    lv[1] = 99.0  # mutating the result must not poison the cache
    assert optimal_levels(2, 64)[1] != 99.0


@pytest.mark.parametrize("bits", [0, 3, 16, -1, True, 2.0, "2", None])
def test_bad_bits(bits):
    with pytest.raises(ValueError, match=r"bits must be one of \(1, 2, 4, 8\)"):
        optimal_levels(bits, 16)
    with pytest.raises(ValueError, match=r"bits must be one of \(1, 2, 4, 8\)"):
        uniform_levels(bits)


@pytest.mark.parametrize("d", [0, -5, 1.5, "16", None, True])
def test_bad_group_size(d):
    with pytest.raises(ValueError, match="group size d must be >= 1"):
        optimal_levels(2, d)


def test_numpy_integers_accepted():
    np.testing.assert_array_equal(optimal_levels(np.int64(2), np.int32(128)), optimal_levels(2, 128))


# ------------------------------------------------------------------------------------------------
# Measured variance on data drawn from the model
# ------------------------------------------------------------------------------------------------

def _model_tensor(bits, d, width, n_groups, gen):
    """Rows whose groups (``d / width`` consecutive rows each) follow i-EXACT's model in code units:
    ``t ~ N(M/2, sigma(d)^2)`` clipped to ``[0, M]``. Element 0 of each group is forced to 0 and element 1 to
    ``M`` so every group spans exactly ``[0, M]``. The tensor is ``t * s`` with ``s = 1 - 2^-12``: then the stored
    bf16 ``lo`` is exactly 0 and ``step = roundup_bf16(M s (1 + 2^-20) / M)`` is exactly 1.0, so code units equal
    the model's units (scaling by ``s`` moves values by < 0.03% of a step: negligible). Without ``s`` the
    step would be rounded up by one bf16 ulp (1 + 2^-7) and the grid would not span [0, M] exactly.
    Returns the tensor and a mask of the iid (not forced) elements."""
    top = 2**bits - 1
    rows_per_group = d // width
    sigma = model_sigma(bits, d)
    t = (top / 2 + sigma * torch.randn(n_groups, d, generator=gen, dtype=torch.float64)).clamp(0, top)
    t[:, 0], t[:, 1] = 0.0, top
    iid = torch.ones(n_groups, d, dtype=torch.bool)
    iid[:, :2] = False
    s = 1 - 2.0**-12
    x = (t * s).float().reshape(n_groups * rows_per_group, width)
    return x, iid.reshape(n_groups * rows_per_group, width)


def _exact_rounding_variance(x, c, lv):
    """Per-element variance of the decoded value, given the stored metadata (code units: step = 1, lo = 0)."""
    lo = c.lo.float().repeat_interleave(c.block_rows)[:, None].double()
    step = c.step.float().repeat_interleave(c.block_rows)[:, None].double()
    assert torch.all(lo == 0) and torch.all(step == 1)
    t = (x.double() - lo) / step
    lv = torch.as_tensor(lv, dtype=torch.float64)
    j = (torch.searchsorted(lv, t.contiguous(), right=True) - 1).clamp(0, len(lv) - 2)
    a, b = lv[j], lv[j + 1]
    g = b - a
    p = (t - a) / g
    return g, p


def _sample_variance_stats(x, cfg, lv, seeds):
    """Per-element sample variance of ``decompress(compress(x))`` over ``seeds``, the exact conditional
    variance ``v = g^2 p q`` and the variance of the sample variance (Bernoulli moments, see below)."""
    draws = torch.stack([decompress(compress(x, cfg, seed=s)).double() for s in seeds])
    s2 = draws.var(dim=0, unbiased=True)
    g, p = _exact_rounding_variance(x, compress(x, cfg, seed=seeds[0]), lv)
    pq = p * (1 - p)
    v = g**2 * pq
    n = len(seeds)
    # x_hat = a + g B with B ~ Bernoulli(p): central moments mu2 = g^2 pq, mu4 = g^4 pq (1 - 3pq);
    # Var(unbiased sample variance of n draws) = mu4 / n - mu2^2 (n - 3) / (n (n - 1)).
    var_s2 = g**4 * pq * (1 - 3 * pq) / n - v**2 * (n - 3) / (n * (n - 1))
    return s2, v, var_s2


def _seeds(n, salt):
    gen = torch.Generator().manual_seed(1000 + salt)
    return [int(s) for s in torch.randint(0, 2**63 - 1, (n,), generator=gen)]


@pytest.mark.parametrize("d, block_rows, width", [(16, 1, 16), (128, 8, 16), (1024, 64, 16)])
def test_optimal_levels_reduce_measured_variance_as_predicted(d, block_rows, width):
    """Measured (sampled) rounding variance, uniform vs optimal 2-bit levels, on data following the model.

    Prediction: r_model = 1 - EV(optimal) / EV(uniform) (about 2%, 9%, 20%). Measurement: r = 1 - V_o / V_u with
    V = mean over the model's iid elements of the per-element sample variance over S seeds.
    Two independent error sources, each with a standard deviation derived here:
      * data: the mean of v over n iid elements estimates EV with variance Var(v) / n; for the ratio, the
        delta method gives Var(A/B) = Var(v_o - (A/B) v_u) / (n B^2) with A, B the means of v_o, v_u;
      * rounding noise: V_o and V_u come from independent seeds, each with the exact variance of a sum of
        independent sample variances (Bernoulli moments); Var = Var(V_o) / B^2 + A^2 Var(V_u) / B^4.
    |r - r_model| must be below 5 combined standard deviations (fixed seeds: deterministic)."""
    bits, n_groups, n_seeds = 2, max(8, 8192 // d), 96
    gen = torch.Generator().manual_seed(d)
    x, iid = _model_tensor(bits, d, width, n_groups, gen)
    stats_by_mode = {}
    for salt, mode in enumerate(("uniform", "optimal")):
        cfg = CompressionConfig(bits=bits, block_rows=block_rows, levels=mode)
        lv = uniform_levels(bits) if mode == "uniform" else optimal_levels(bits, d)
        s2, v, var_s2 = _sample_variance_stats(x, cfg, lv, _seeds(n_seeds, salt + 10 * d))
        stats_by_mode[mode] = (s2[iid], v[iid], var_s2[iid])
    (s2_u, v_u, var_u), (s2_o, v_o, var_o) = stats_by_mode["uniform"], stats_by_mode["optimal"]
    n = v_u.numel()

    # the sampled variance agrees with the exact conditional variance (5 sigma)
    for s2, v, var_s2 in stats_by_mode.values():
        assert abs(float(s2.sum() - v.sum())) < 5 * math.sqrt(float(var_s2.sum()))

    r_model = 1 - expected_variance(optimal_levels(bits, d), bits, d) / expected_variance(uniform_levels(bits), bits, d)
    A, B = float(v_o.mean()), float(v_u.mean())
    var_data = float((v_o - (A / B) * v_u).var()) / (n * B**2)
    var_sampling = (float(var_o.sum()) / n**2) / B**2 + A**2 * (float(var_u.sum()) / n**2) / B**4
    sd = math.sqrt(var_data + var_sampling)
    r = 1 - float(s2_o.mean()) / float(s2_u.mean())
    assert abs(r - r_model) < 5 * sd, (r, r_model, sd)
    # the uniform-level variance itself matches the model's absolute prediction (data sd only: Var(v_u) / n)
    ev_u = expected_variance(uniform_levels(bits), bits, d)
    sd_u = math.sqrt(float(v_u.var()) / n + float(var_u.sum()) / n**2)
    assert abs(float(s2_u.mean()) - ev_u) < 5 * sd_u
    # and the test has power: the tolerance is well below the effect where the effect is not tiny
    if d >= 128:
        assert 5 * sd < 0.5 * r_model and r > 0
