"""Choose a compression per slot within a byte limit with the least added variance (multiple-choice
knapsack: greedy, then a dynamic programme over slots).

Per slot, the options not dominated in (bytes, variance); start from the fewest bytes and
repeatedly take the upgrade with the largest variance reduction per byte that still fits (greedy
multiple-choice knapsack), then a dynamic programme over slots (Pareto states of bytes and variance)
where it finds less variance: it finds e.g. one slot up to INT4 paid by two down to INT1, which the
greedy misses.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Dict, List, Optional, Sequence


from ..compression import compressed_nbytes
from .settings import OPTIONS, select
from .slots import BudgetError, Slot
from ..units import format_bytes


def _frontier(slot: Slot, cost: Callable[[Slot, str], int]) -> List[str]:
    """The slot's options not dominated in (cost, variance), cheapest first."""
    names = sorted(slot.allowed(), key=lambda n: (cost(slot, n), slot.variance.get(n, 0.0)))
    out, best = [], math.inf
    for n in names:
        v = slot.variance.get(n, 0.0)
        if v < best:
            out.append(n)
            best = v
    return out


def _caps(n: int, limit: float, prefix: Optional[Dict[int, int]]) -> List[float]:
    """Per position ``k``: the limit on the cumulative cost of slots ``0..k`` (``limit`` on all of them)."""
    caps = [math.inf] * n
    for k, v in (prefix or {}).items():
        caps[k] = min(caps[k], v)
    if n:
        caps[n - 1] = min(caps[n - 1], limit)
    return caps


def _room_after(caps: Sequence[float], costs: Sequence[int]) -> List[float]:
    """Per position ``i``: the most the cumulative cost of slots ``0..i`` may be so that every limit from ``i``
    on holds with ``costs[j]`` for the slots after ``i``."""
    out, nxt = [math.inf] * len(caps), math.inf
    for i in range(len(caps) - 1, -1, -1):
        out[i] = min(caps[i], nxt)
        nxt = out[i] - costs[i]
    return out


def allocate(slots: Sequence[Slot], limit: float, cost: Optional[Callable[[Slot, str], int]] = None,
             prefix: Optional[Dict[int, int]] = None) -> int:
    """Choose ``slot.choice`` for every slot with summed ``cost`` (default: the option's bytes) at most
    ``limit``, minimising the summed variance: greedily (largest variance reduction per byte first), or by
    dynamic programming over the slots where that finds less (:func:`_pareto`); returns the cost used.
    ``prefix``: limits on cumulative costs, ``{k: limit}`` for slots ``0..k`` in order (the kept activations
    alive at a point of the step: :class:`PeakModel`). :class:`BudgetError` (cost needed in its ``needed``,
    excess over the tightest limit in ``excess``) when even the cheapest options exceed a limit."""
    cost = cost or (lambda s, n: s.bytes[n])
    fronts = {s.index: _frontier(s, cost) for s in slots}
    pos = {s.index: 0 for s in slots}
    mins = [cost(s, fronts[s.index][0]) for s in slots]
    caps = _caps(len(slots), limit, prefix)
    bounds = _room_after(caps, mins)
    used = sum(mins)
    excess = max([0] + [c - cap for c, cap in zip(itertools.accumulate(mins), caps)])
    if excess > 0:
        err = BudgetError(f"kept activations need at least {format_bytes(used)}")
        err.needed, err.excess = used, excess
        raise err
    while True:
        # slack[i]: how many more bytes slot i may take without breaking a limit on a prefix that holds it
        cum = list(itertools.accumulate(cost(s, fronts[s.index][pos[s.index]]) for s in slots))
        slack, low = [0.0] * len(slots), math.inf
        for i in range(len(slots) - 1, -1, -1):
            low = min(low, caps[i] - cum[i])
            slack[i] = low
        best = None
        for i, s in enumerate(slots):
            f, j = fronts[s.index], pos[s.index]
            for k in range(j + 1, len(f)):
                db = cost(s, f[k]) - cost(s, f[j])
                dv = s.variance.get(f[j], 0.0) - s.variance.get(f[k], 0.0)
                if db > slack[i] or dv <= 0:
                    continue
                ratio = dv / max(db, 1)
                if best is None or ratio > best[0]:
                    best = (ratio, s, k, db)
        if best is None:
            break
        _, s, k, db = best
        pos[s.index] = k
        used += db
    exact = _pareto(slots, fronts, bounds, cost)
    if exact is not None:
        var = sum(s.variance.get(fronts[s.index][pos[s.index]], 0.0) for s in slots)
        if sum(s.variance.get(fronts[s.index][k], 0.0) for s, k in zip(slots, exact[0])) < var:
            pos = {s.index: k for s, k in zip(slots, exact[0])}
            used = exact[1]
    for s in slots:
        s.choice = fronts[s.index][pos[s.index]]
    return used


def _pareto(slots: Sequence[Slot], fronts, bounds: Sequence[float], cost, work: int = 300_000):
    """The multiple-choice knapsack by dynamic programming over slots, keeping the (cost, variance) states
    not dominated (thinned evenly in cost beyond ``work / (slots x options)`` states, at least 64: then
    approximate; the work is bounded for models with hundreds of kept activations); returns the frontier
    position per slot of the least-variance state within the limits and its cost, or None. ``bounds[i]``:
    the most the cumulative cost after slot ``i`` may be (:func:`_prefix_bounds`). It finds the exchanges the
    greedy misses: e.g. one INT2 slot up to INT4, paid by two others down to INT1."""
    states, layers = [(0, 0.0)], []
    max_states = max(64, work // max(1, len(slots) * max(len(f) for f in fronts.values())))
    for i, s in enumerate(slots):
        f = fronts[s.index]
        opts = [(cost(s, n), s.variance.get(n, 0.0)) for n in f]
        cand = [(c + oc, v + ov, j, k) for j, (c, v) in enumerate(states) for k, (oc, ov) in enumerate(opts)
                if c + oc <= bounds[i]]
        cand.sort(key=lambda t: (t[0], t[1]))
        kept, best = [], math.inf
        for t in cand:
            if t[1] < best:
                kept.append(t)
                best = t[1]
        if len(kept) > max_states:
            step = len(kept) / max_states
            kept = [kept[int(j * step)] for j in range(max_states - 1)] + [kept[-1]]
        if not kept:
            return None
        layers.append([(t[2], t[3]) for t in kept])
        states = [(t[0], t[1]) for t in kept]
    j, picks = len(states) - 1, []
    for i in range(len(slots) - 1, -1, -1):
        j, k = layers[i][j]
        picks.append(k)
    return picks[::-1], states[-1][0]


def uniform_option(name: str) -> Optional[str]:
    """The :data:`OPTIONS` name a uniform setting keeps every slot with (None: not one of them)."""
    setting = select(name)[0]
    if not setting.compression.enabled:
        return "fp32"
    return next((n for n, c in OPTIONS.items() if c == setting.compression), None)


def bytes_under(s: Slot, ref: str) -> int:
    """The slot's bytes under the uniform option ``ref`` (an op that does not allow projection keeps it
    unprojected)."""
    if ref in s.bytes:
        return s.bytes[ref]
    return compressed_nbytes((s.rows, s.width), OPTIONS[ref].replace(kept_frac=1.0))


def total_variance(slots: Sequence[Slot]) -> float:
    """The summed added variance of the slots' current choices."""
    return sum(s.variance.get(s.choice, 0.0) for s in slots)
