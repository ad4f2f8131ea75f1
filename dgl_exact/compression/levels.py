"""Quantization levels in code space, and the variance model that picks them.

A group of ``d`` values is mapped to code space ``[0, M]`` (``M = 2**bits - 1``) by its min and range;
stochastic rounding then picks one of ``2**bits`` levels ``0 = L_0 < L_1 < ... < L_M' = M``. Uniform
levels are the integers. i-EXACT models the normalised values of a group as a normal distribution
centred at ``M / 2`` and clipped to ``[0, M]``, whose spread puts the group's min and max at the ``1/d``
and ``1 - 1/d`` quantiles: ``sigma(d) = -(M / 2) / Phi^-1(1 / d)``. Under that model the expected
per-element variance of stochastic rounding between adjacent levels ``a < b`` is
``V(a, b) = E[(t - a)(b - t); a < t < b]`` (the clipped mass sits exactly on ``0`` and ``M`` and adds no
variance). :func:`optimal_levels` minimises ``sum_j V(L_j, L_{j+1})`` over the interior levels, for
any bit width (i-EXACT only fitted the 2-bit case).
"""
from __future__ import annotations

import functools
import math
import numbers

import numpy as np
from scipy import optimize, special

__all__ = ["uniform_levels", "optimal_levels", "model_sigma", "expected_variance", "levels_for"]


def _check_bits(bits) -> int:
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or bits not in (1, 2, 4, 8):
        raise ValueError(f"bits must be one of (1, 2, 4, 8), got {bits!r}")
    return int(bits)


def uniform_levels(bits: int) -> np.ndarray:
    return np.arange(2**_check_bits(bits), dtype=np.float64)


def model_sigma(bits: int, d: int) -> float:
    """Std of the clipped-normal model for a group of ``d`` values, in code units."""
    half = (2**bits - 1) / 2.0
    d = max(int(d), 3)  # d <= 2: min and max are the values themselves; any spread is degenerate
    return -half / special.ndtri(1.0 / d)


def _partial_moments(a, b, mu, sigma):
    """P(a<t<b), E[t; a<t<b], E[t^2; a<t<b] for t ~ N(mu, sigma^2) (vectorised over a, b)."""
    za, zb = (a - mu) / sigma, (b - mu) / sigma
    pa, pb = np.exp(-0.5 * za * za) / math.sqrt(2 * math.pi), np.exp(-0.5 * zb * zb) / math.sqrt(2 * math.pi)
    m0 = special.ndtr(zb) - special.ndtr(za)
    ez = pa - pb
    ez2 = m0 + za * pa - zb * pb
    m1 = mu * m0 + sigma * ez
    m2 = mu * mu * m0 + 2 * mu * sigma * ez + sigma * sigma * ez2
    return m0, m1, m2


def expected_variance(levels, bits: int, d: int) -> float:
    """Expected per-element stochastic-rounding variance (code units^2) under the model."""
    lv = np.asarray(levels, dtype=np.float64)
    a, b = lv[:-1], lv[1:]
    m0, m1, m2 = _partial_moments(a, b, (2**bits - 1) / 2.0, model_sigma(bits, d))
    return float(np.sum(-m2 + (a + b) * m1 - a * b * m0))


@functools.lru_cache(maxsize=256)
def _optimal_levels_cached(bits: int, d: int) -> tuple:
    top = 2**bits - 1
    if bits == 1 or d <= 2:
        return tuple(uniform_levels(bits))
    mu, sigma = top / 2.0, model_sigma(bits, d)
    n_gaps = top

    def levels_from(theta):
        w = np.exp(theta - theta.max())
        cum = np.concatenate([[0.0], np.cumsum(w)])
        return top * cum / cum[-1], w

    def objective(theta):
        lv, w = levels_from(theta)
        a, b = lv[:-1], lv[1:]
        m0, m1, m2 = _partial_moments(a, b, mu, sigma)
        value = np.sum(-m2 + (a + b) * m1 - a * b * m0)
        # dV/dL_j for each level (interior ones matter; ends are fixed at 0 and top).
        d_upper = m1 - a * m0      # d V(a, b) / d b
        d_lower = -(b * m0 - m1)   # d V(a, b) / d a
        g_level = np.zeros(top + 1)
        g_level[1:] += d_upper
        g_level[:-1] += d_lower
        # L_k = top * S_k / S_n with S_k = sum_{i<k} w_i; dL_k/dw_i = top*([i<k] - S_k/S_n)/S_n.
        s_n = w.sum()
        frac = lv / top
        # dF/dw_i = top/S_n * (sum_{k>i} g_k - sum_k g_k * frac_k)
        tail = np.cumsum(g_level[::-1])[::-1]  # tail[k] = sum_{j>=k} g_j
        g_w = top / s_n * (tail[1:] - np.dot(g_level, frac))
        return value, g_w * w  # chain rule through w = exp(theta) (scaled)

    res = optimize.minimize(objective, np.zeros(n_gaps), jac=True, method="L-BFGS-B",
                            options={"maxiter": 2000, "gtol": 1e-12, "ftol": 1e-15})
    lv, _ = levels_from(res.x)
    lv = 0.5 * (lv + (top - lv[::-1]))  # the model is symmetric: remove optimiser asymmetry
    lv[0], lv[-1] = 0.0, float(top)
    if expected_variance(lv, bits, d) > expected_variance(uniform_levels(bits), bits, d):
        lv = uniform_levels(bits)  # never worse than uniform
    return tuple(float(v) for v in lv)


def optimal_levels(bits: int, d: int) -> np.ndarray:
    """Variance-optimal levels (ascending, from 0 to ``2**bits - 1``) for groups of ``d`` values."""
    bits = _check_bits(bits)
    if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1:
        raise ValueError(f"group size d must be >= 1, got {d!r}")
    return np.array(_optimal_levels_cached(int(bits), int(d)))


def levels_for(bits: int, mode: str, d: int):
    """Levels for a config: ``None`` for uniform (kernels use the integer fast path), else an array."""
    if mode == "uniform":
        return None
    if mode == "optimal":
        lv = optimal_levels(bits, d)
        return None if np.array_equal(lv, uniform_levels(bits)) else lv
    raise ValueError(f"levels must be 'uniform' or 'optimal', got {mode!r}")
