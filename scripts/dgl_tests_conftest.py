"""conftest.py of :mod:`scripts.dgl_ops_tests`: route DGL through dgl_exact, set the compression, and compare
compressed results with a tolerance derived from the quantization noise.

Copied into the scratch folder beside DGL's test files; configured by environment variables that
``dgl_ops_tests.py`` sets: ``DGL_EXACT_TESTS_COMPRESSION`` (``off`` or ``int1`` ... ``int8``),
``DGL_EXACT_TESTS_ROUTE`` (``1``: every public name of ``dgl.ops`` is dgl_exact's, and every test runs inside
``dgl_exact.message_passing()``), ``DGL_EXACT_TESTS_DRAWS`` (K, below; ``0``: DGL's fixed tolerance only).

**The statistical comparison.** A test first runs as DGL wrote it, with DGL's ``allclose`` tolerance
(1e-4). If it fails with compression on, the failure may be quantization noise: a kept tensor is decoded
with stochastic rounding, so every result computed from it is a random variable whose expectation is the
exact result, and no fixed tolerance below its noise holds for one run. The test is then run again on the
same inputs (every random generator restored to its state at the test's start; the compression noise comes
from a generator of its own, :func:`dgl_exact.compression.core.seed_stream`): once with compression off,
which must pass DGL's own tolerance and gives the exact values, and K times compressed (K = ``DRAWS``, draw 0
being the test's own run). Each ``backend.allclose(a, b)`` records its operands. For every element of every
compared difference ``d = b - a`` (``c``: the exact run's), the draws' mean must be ``c`` within the
tolerance the noise allows::

    |mean(d) - c| <= tol + t * sd / sqrt(K)

``sd`` being the element's standard deviation over the draws (the quantization noise, measured on these
inputs), ``tol = atol + rtol * |b_exact|`` DGL's own allowance, and ``t`` Student's t quantile with K - 1
degrees of freedom at ``1 - alpha / (2 m)``, ``m`` the compared elements of the test (Bonferroni, valid for
dependent elements). One element's stochastic rounding is a skewed two-point variable (it moves a whole step
with a small probability), so K draws may see no move at all (``sd`` = 0 while the mean is off by the move's
probability times its size). The draws therefore grow in looks (``LOOKS``: K, 4K, 16K; alpha split between
them) until the check passes or the last look fails: a test fails by chance with probability at most
``alpha`` = 1e-3, given the normal approximation of the mean. Elements without noise (``sd`` = 0 at the last
look) must meet ``tol`` exactly. Each draw's noise is seeded from the test's name and the draw's index; the
inputs are what DGL's generators give the test (under xdist they depend on which tests a worker ran before).

A compressed draw takes the exact run's path: its ``allclose`` answers what the exact run's did, so a
comparison the test asserts to differ (``assert not F.allclose(...)``) must differ in every draw too, and a
non-finite value must be where the exact run has the same infinity. Comparisons a test makes without
``backend.allclose`` (e.g. a relative-error rate) keep DGL's fixed thresholds. The terminal summary counts
the tests that passed DGL's fixed tolerance and those compared statistically.
"""
from __future__ import annotations

import collections
import math
import os
import random
import zlib

import dgl_exact  # first: installs the import shim DGL needs on a modern torch
import dgl_exact.compression.core
import dgl
import dgl.ops
import numpy as np
import pytest
import torch

import backend  # DGL's tests/backend, copied beside this file

COMPRESSION = os.environ.get("DGL_EXACT_TESTS_COMPRESSION", "off")
ROUTE = os.environ.get("DGL_EXACT_TESTS_ROUTE", "1") == "1"
DRAWS = int(os.environ.get("DGL_EXACT_TESTS_DRAWS", "32"))
ALPHA = 1e-3
#: the statistical comparison looks at DRAWS times these many draws, stopping at the first that passes
LOOKS = (1, 4, 16)

if COMPRESSION == "off":
    dgl_exact.set_config(dgl_exact.CompressionConfig(enabled=False))
else:
    dgl_exact.set_config(dgl_exact.CompressionConfig(bits=int(COMPRESSION[3:])))

if ROUTE:
    for _name in [n for n in dir(dgl.ops) if not n.startswith("_") and callable(getattr(dgl.ops, n))]:
        setattr(dgl.ops, _name, getattr(dgl_exact.ops, _name))
    assert dgl.ops.gspmm is dgl_exact.ops.gspmm


@pytest.fixture(autouse=True)
def _dgl_message_passing_on_dgl_exact():
    with dgl_exact.message_passing(ROUTE):
        yield


class _Recorder:
    """``backend.allclose`` that also records its operands and its answer while ``records`` is a list. With
    ``answers`` (the exact run's) it gives those instead of its own: a compressed draw takes the exact run's
    path (``assert not F.allclose(...)`` included), its comparisons being judged afterwards."""

    def __init__(self, allclose):
        self.allclose, self.records, self.answers = allclose, None, None

    def __call__(self, a, b, rtol=1e-4, atol=1e-4):
        close = self.allclose(a, b, rtol=rtol, atol=atol)
        if self.records is None:
            return close
        self.records.append((a.detach().double().cpu().clone(), b.detach().double().cpu().clone(), rtol, atol,
                             bool(close)))
        if self.answers is not None and len(self.records) <= len(self.answers):
            return self.answers[len(self.records) - 1]
        return close


_recorder = _Recorder(backend.allclose)
backend.allclose = _recorder


def _rng_states():
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _restore(states):
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def _run(test, kwargs, states, seed, *, compressed, answers=None):
    """One run of ``test`` on the inputs of ``states``; its ``allclose`` records (``answers``: the comparisons'
    answers to give, :class:`_Recorder`)."""
    _restore(states)
    _recorder.records, _recorder.answers = [], answers
    try:
        with dgl_exact.compression.core.seed_stream(seed), dgl_exact.config(enabled=compressed):
            test(**kwargs)
        return _recorder.records
    finally:
        _recorder.records, _recorder.answers = None, None


def _t_bound(n: int, m: int, alpha: float) -> float:
    """Student t's two-sided quantile for the mean of ``n`` draws, Bonferroni over ``m`` elements."""
    from scipy import stats

    return float(stats.t.ppf(1 - alpha / (2 * max(m, 1)), n - 1))


def _judge(exact, draws, alpha):
    """Why the compared differences of ``draws`` (draw 0: the test's own) are not the exact ones up to the
    quantization noise (module doc), or None if they are."""
    if any(len(d) != len(exact) for d in draws):
        return (f"the compressed runs made {sorted({len(d) for d in draws})} comparisons, the exact run "
                f"{len(exact)}: the test's path depends on the noise")
    n = len(draws)
    bound = _t_bound(n, sum((b - a).numel() for a, b, *_ in exact), alpha)
    for i, (a_x, b_x, rtol, atol, close) in enumerate(exact):
        if not close:  # the test asserts they differ (it passed the exact run): so must every draw
            if any(d[i][4] for d in draws):
                return f"comparison {i}: a compressed draw is close where the exact run is not"
            continue
        center = b_x - a_x
        infinite = ~torch.isfinite(center)  # infinities the exact run matched (DGL's allclose passed it)
        for d in draws:
            a, b = d[i][0].expand_as(center), d[i][1].expand_as(center)
            same = (a == a_x.expand_as(center)) & (b == b_x.expand_as(center))
            if not bool(torch.where(infinite, same, torch.isfinite(b - a)).all()):
                return (f"comparison {i}: a compressed draw is non-finite where the exact run is finite, or "
                        f"differs where the exact run is infinite")
        diffs = torch.stack([torch.where(infinite, 0.0, d[i][1] - d[i][0]) for d in draws])
        center = torch.where(infinite, 0.0, center)
        mean, sd = diffs.mean(0), diffs.std(0)
        tol = atol + rtol * b_x.abs()
        excess = ((mean - center).abs() - tol).clamp(min=0)
        t = torch.where(excess > 0, excess / (sd / math.sqrt(n)), torch.zeros_like(excess))  # sd 0, excess: inf
        if float(t.max()) > bound:
            j = int(t.argmax())
            return (f"comparison {i}, mean of {n} draws: t = {float(t.flatten()[j]):.3g} > {bound:.3g} (Student "
                    f"t, {n - 1} dof) at element {j}: |mean - exact| {float((mean - center).abs().flatten()[j]):.3g},"
                    f" DGL's tolerance {float(tol.flatten()[j]):.3g}, noise sd {float(sd.flatten()[j]):.3g}")
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if COMPRESSION == "off" or DRAWS < 2:
        return None
    test = pyfuncitem.obj
    kwargs = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    states = _rng_states()
    base = zlib.crc32(pyfuncitem.nodeid.encode())
    try:
        _run(test, kwargs, states, base, compressed=True)
        return True
    except AssertionError:
        after = _rng_states()
    exact = _run(test, kwargs, states, base, compressed=False)  # DGL's own tolerance, no noise
    answers = [close for *_, close in exact]
    draws, why = [], None
    for look in LOOKS:
        draws += [_run(test, kwargs, states, base + j, compressed=True, answers=answers)
                  for j in range(len(draws), look * DRAWS)]
        why = _judge(exact, draws, ALPHA / len(LOOKS))
        if why is None:
            pyfuncitem.user_properties.append(("statistical", look * DRAWS))
            _restore(after)
            return True
    pyfuncitem.user_properties.append(("statistical", "failed statistically"))
    raise AssertionError(why)


_outcomes = collections.Counter()


def pytest_runtest_logreport(report):
    if report.when == "call" and not report.skipped:
        judged = dict(report.user_properties).get("statistical")
        _outcomes[judged if judged is not None else ("within DGL's tolerance" if report.passed else "failed")] += 1


def pytest_terminal_summary(terminalreporter):
    counts = dict(_outcomes)
    fixed, other, failed = (counts.pop(key, 0) for key in ("within DGL's tolerance", "failed", "failed statistically"))
    line = f"dgl_exact {COMPRESSION}: {fixed} tests passed with DGL's fixed tolerance, {other} failed"
    if COMPRESSION != "off" and DRAWS >= 2:
        looks = ", ".join(f"{n} at {k} draws" for k, n in sorted(counts.items(), key=lambda kv: str(kv[0]).zfill(9)))
        line += (f" before any statistical comparison; compared statistically (alpha {ALPHA}): "
                 f"{sum(counts.values())} passed ({looks or 'none'}), {failed} failed")
    terminalreporter.write_line(line)
