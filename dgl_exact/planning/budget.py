"""Spend the bits where they matter: a compression per kept activation that fits a memory budget and adds
the least gradient variance (GACT's idea, Liu et al., ICML 2022, for full-graph GNNs).

1. **Slots.** Every activation a training forward keeps goes through :func:`dgl_exact.ops.keep.stash`, in
   the same order every step; slot ``i`` is the ``i``-th call. Its full-size shape comes from the planner's
   sample runs (:mod:`.predict`), so its bytes under every option are exact
   (:func:`~dgl_exact.compression.compressed_nbytes`).
2. **Sensitivity** (from the model's own first steps). With dropout masks fixed by a seed, one exact forward
   and backward gives the reference gradient ``g0``; then, per slot, ``replicas`` steps compress only that
   slot with the probe option (INT2) and ``V_i = mean sum_p ||g_p - g0_p||^2 / ||g0_p||^2`` is the gradient
   variance it adds, relative to each parameter tensor ``p``'s own gradient (:func:`relative_weights`: an
   optimizer that scales each parameter's step, as Adam does, feels noise relative to its gradient, so
   noise on batch norm's small scale gradient counts as much as on a large weight's). The
   compression noise of every option on the slot's own tensor, ``e_i(c) = ||decompress(compress(x)) - x||^2``,
   scales it: ``V_i(c) = V_i(INT2) e_i(c) / e_i(INT2)`` (the weight gradients are linear in the kept
   activation, and quantisation noise is independent per element). Random projection is not: one
   projection matrix for all rows makes its error add up coherently across rows in a weight gradient
   (10-1000x the variance the INT2 scaling predicts, measured on a 20k-node GCN), so the projected options
   are probed with their own option (INT2 + RP(0.125)) and scaled from it. Compression draws its random
   numbers inside ``torch.random.fork_rng``, so every probe step sees the same dropout masks.
3. **Allocation.** Per slot, the options not dominated in (bytes, variance); start from the fewest bytes and
   repeatedly take the upgrade with the largest variance reduction per byte that still fits (greedy
   multiple-choice knapsack), then a dynamic programme over slots (Pareto states of bytes and variance)
   where it finds less variance: it finds e.g. one slot up to INT4 paid by two down to INT1, which the
   greedy misses. The step peak of a plan is predicted from the uniform settings ``u`` whose
   peaks were predicted, in two ways:

   * **trades** (tried first), from ``u``'s recorded **timeline** (:class:`PeakModel`): every point ``j`` of
     ``u``'s step (extrapolated to full size) less ``u``'s bytes of the activations alive at ``j``, plus the
     plan's bytes of those same activations; the plan's peak is the largest point. So a slot kept in fewer
     bytes than under ``u`` pays for another kept in more where both are alive at the peak, and a slot
     freed before the peak (the last layers' inputs when the peak is in an earlier layer's backward: on a
     20,000-node GAT 3x128 the peak is in the second layer's attention backward, and the last four kept
     activations are gone by then) costs nothing there and is kept in more bytes, up to the point where
     another point of the timeline would become the peak. Allocated with one limit per point on the bytes
     of the slots created up to its last live one (exact when activations die in the reverse order of their
     creation, as a backward pass frees them). Where ``u``'s stashes were not all tracked, the signed sum
     ``peak(u) + sum_i (bytes_i(plan) - bytes_i(u))`` over all slots. Both are exact only when the plan's
     own transients are ``u``'s (compression buffers differ between options), so every trade plan is
     **verified**: its own step is recorded on the planner's two samples and extrapolated, and it is kept
     only when that total is within the budget. The recorded step is compared with this call's own
     recording of ``u`` (two recordings of one step can differ by a few hundred bytes): total =
     ``u``'s predicted total + (recorded plan - recorded ``u``). Candidates are tried least variance first
     (one per ``u``; one over the budget by ``d`` is allocated again ``d`` tighter, once), at most eight
     recordings.
   * **sound bound** (the fallback when no trade plan lowers the variance or none passes the check):
     ``peak(plan) <= peak(u) + sum_i max(0, bytes_i(plan) - bytes_i(u))``, true wherever the peak sits, but
     no slot can give bytes to another; the plan's recorded step (on the same scale) is then reported, not
     required.
4. **No worse than uniform.** A plan is kept only when its added variance is no more than the best uniform
   setting's within the budget on both measures (relative and plain, :func:`_no_worse_than_uniform`); else
   that setting is applied, with the free upgrades its timeline allows (each slot only to an option no
   worse on both measures, verified the same way).

   ``BudgetPlan.allocation`` and the record's ``note`` say which was used.

:class:`BudgetPlan.active` installs the plan (a stash hook) for a training run; when a training forward does
not match the recorded slots (another model, a kept activation of another shape, another compression scope)
the hook raises :class:`PlanMismatchError` rather than apply a choice to the wrong tensor.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .. import memory, ops
from ..compression import compress, compressed_nbytes, decompress
from ..compression_config import CompressionConfig
from ..ops import keep as keeping
from .settings import OPTIONS, Setting, select
from .predict import (SAMPLE_NODES, PlanRecord, PlanSpec, _extrapolate, build_for, combine, device_bytes,
                      extrapolated_points, samples_for, single_thread)

__all__ = ["OPTIONS", "Slot", "BudgetPlan", "BudgetError", "budget_plan", "plan_row", "estimate_sensitivity",
           "allocate", "allocate_for_peak", "trade_plans", "allocate_with_trades", "PeakModel", "keep",
           "relative_weights", "per_parameter_steps"]

#: what a slot may get, by name (the presets of :mod:`.settings`)
FP = OPTIONS["fp32"]
PROBE = "INT2"
#: the probe of the options with random projection: their error is shared by all rows (one projection
#: matrix), so it adds up across rows in a weight gradient and does not scale like quantisation noise
PROBE_RP = "INT2 + RP(0.125)"


def _family(name: str) -> str:
    return PROBE_RP if OPTIONS[name].kept_frac < 1.0 else PROBE


class BudgetError(ValueError):
    """The budget cannot be met by any plan; the message says what would fit."""


class PlanMismatchError(RuntimeError):
    """A forward under a :class:`BudgetPlan` keeps other activations than the ones planned."""


@dataclasses.dataclass
class Slot:
    """One kept activation of a training forward (the ``index``-th stash call)."""

    index: int
    rows: int                 # at full size
    width: int
    element_size: int
    projectable: bool
    shape: tuple              # as recorded on the larger sample
    bytes: Dict[str, int] = dataclasses.field(default_factory=dict)
    variance: Dict[str, float] = dataclasses.field(default_factory=dict)
    #: the other measure of the same probes (plain where ``variance`` is relative, and the reverse)
    other_variance: Dict[str, float] = dataclasses.field(default_factory=dict)
    choice: Optional[str] = None
    #: whether the kept copy is alive at the plan's predicted step peak (None: not known)
    at_peak: Optional[bool] = None

    def allowed(self) -> List[str]:
        return [n for n, c in OPTIONS.items() if self.projectable or c.kept_frac >= 1.0]

    def nbytes(self, option: str) -> int:
        cfg = OPTIONS[option]
        if not cfg.enabled:
            return self.rows * self.width * self.element_size
        return compressed_nbytes((self.rows, self.width), cfg)


def _slots_from_runs(r1, r2, s1: float, s2: float) -> List[Slot]:
    if len(r1.stashes) != len(r2.stashes):
        raise RuntimeError("the two sample runs kept a different number of activations; cannot plan per tensor")
    slots = []
    for a, b in zip(r1.stashes, r2.stashes):
        if b.kept == "reference":
            continue  # alive anyway (input features): kept by reference at no cost, nothing to choose
        rows = int(round(_extrapolate(a.shape[0], b.shape[0], s1, s2))) if b.shape else 1
        width = math.prod(b.shape[1:]) if len(b.shape) > 1 else (1 if b.shape else 1)
        size = torch.empty((), dtype=getattr(torch, b.dtype)).element_size()
        slot = Slot(b.index, max(rows, 0), width, size, b.projectable, b.shape)
        slot.bytes = {n: slot.nbytes(n) for n in slot.allowed()}
        slots.append(slot)
    return slots


def keep(x: torch.Tensor, op_cfg: CompressionConfig, kept: CompressionConfig, force: bool,
         stash: Optional[Callable] = None):
    """``stash(x, kept, force)`` (default :func:`~dgl_exact.ops.keep.default_stash`) for an op that asked
    for ``op_cfg``, with an exact copy of ``x`` where the plan keeps it exactly but the op may overwrite it.

    An op that compresses a tensor it owns (``force`` under an enabled ``op_cfg``) may then overwrite that
    tensor in place (``ops.linear_reusing`` in GCN's square layers, GCNII's fused step): it only needs the
    compressed copy. Kept by reference, the buffer would be overwritten before backward reads it (autograd
    refuses: "modified by an inplace operation"). The copy has the bytes an exact slot is planned with."""
    stash = stash or keeping.default_stash
    if force and op_cfg.enabled and not kept.enabled and kept.kept_frac >= 1.0:
        x = x.detach().clone()
    return stash(x, kept, force)


# --- sensitivity --------------------------------------------------------------------------------------------
#: a parameter tensor whose exact gradient has less than this fraction of the mean tensor's squared norm has no
#: gradient signal to drown (a bias followed by batch norm, whose exact gradient is zero): its noise counts
#: relative to this floor, not to its own near-zero norm
REL_FLOOR = 1e-3


def per_parameter_steps(optimizer: str) -> bool:
    """Whether ``optimizer`` (a training config's name) scales each parameter's step by its own gradient's
    magnitude, so that a plan should minimise the relative gradient variance (:func:`relative_weights`)."""
    return optimizer.lower() != "sgd"


def relative_weights(exact: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per element of the flattened gradient, ``1 / (||g_p||^2 + floor)`` for the parameter tensor ``p`` it
    belongs to (``exact``: the exact gradient per tensor; ``floor``: :data:`REL_FLOOR` times the tensors' mean
    squared norm). ``sum(weight * (g - g_exact)^2)`` is then the gradient variance **relative to each
    tensor's own gradient**, summed over tensors: what an optimizer that scales each parameter's step by its
    gradient's magnitude (Adam, RMSprop) feels. The plain sum ``||g - g_exact||^2`` weighs tensors by their
    gradient's size instead; on a 20k-node GCN 4x128 with batch norm it ranked INT1 on batch norm's inputs
    cheap (their noise lands on the small gradients of BN's scale, 2.6-4x their own squared norm at INT1)
    and the plan that followed trained 1.6 points below uniform INT2 (20 seeds)."""
    norms = torch.stack([(g.double() ** 2).sum() for g in exact]) if exact else torch.zeros(0, dtype=torch.float64)
    floor = REL_FLOOR * float(norms.mean()) if norms.numel() else 0.0
    floor = floor if floor > 0 else 1.0  # all gradients zero: plain squared error
    return torch.cat([torch.full((g.numel(),), 1.0 / (float(n) + floor), dtype=g.dtype, device=g.device)
                      for g, n in zip(exact, norms)]) if exact else torch.zeros(0)


def estimate_sensitivity(model: torch.nn.Module, graph, feat, label, idx, slots: Sequence[Slot], replicas: int = 2,
                         seed: int = 0, loss: Optional[Callable] = None, relative: bool = True) -> None:
    """Fill ``slot.variance[option]`` (the gradient variance it adds, relative to each parameter tensor's exact
    gradient and summed over tensors: :func:`relative_weights`; with ``relative=False`` the plain
    ``||g - g0||^2``, what plain SGD's step feels) for every slot, from ``1 + probes * replicas`` training
    forwards and backwards of ``model`` on the given data."""
    loss = loss or (lambda logits: ops.cross_entropy(logits, label, idx))
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    wanted = {s.index: s for s in slots}
    errors: Dict[int, Dict[str, float]] = {}

    def gradient(hook) -> torch.Tensor:
        for p in params:
            p.grad = None
        torch.manual_seed(seed)  # the same dropout masks every time
        with keeping.stash_hook(hook):
            out = loss(model(graph, feat))
        out.backward()
        return [(p.grad if p.grad is not None else torch.zeros_like(p)) for p in params]

    def probe_hook(target: Optional[int], replica: int, probe: str = PROBE):
        count = [0]

        def hook(x, cfg, force):
            i = count[0]
            count[0] += 1
            if i != target or keeping.alive_anyway(x) and not force:
                return keep(x, cfg, FP, force)
            slot = wanted[i]
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(10_000 + 97 * i + replica)
                if i not in errors:
                    xd = x.detach()
                    errors[i] = {}
                    for name in slot.allowed():
                        c = OPTIONS[name]
                        if c.enabled:
                            errors[i][name] = float(((decompress(compress(xd, c)).to(xd.dtype) - xd) ** 2).sum())
                        else:
                            errors[i][name] = 0.0
                return keeping.default_stash(x, OPTIONS[probe], force)

        return hook

    exact = gradient(probe_hook(None, 0))
    weight = relative_weights(exact)
    g0 = torch.cat([g.flatten() for g in exact])
    del exact
    for slot in slots:
        probes = sorted({_family(n) for n in slot.allowed() if OPTIONS[n].enabled})
        v, w = {}, {}  # relative, plain
        for probe in probes:
            v[probe] = w[probe] = 0.0
            for r in range(replicas):
                err = (torch.cat([g.flatten() for g in gradient(probe_hook(slot.index, r, probe))]) - g0) ** 2
                v[probe] += float((weight * err).sum()) / replicas
                w[probe] += float(err.sum()) / replicas
        e = errors.get(slot.index, {})

        def scaled(n, v):
            if not OPTIONS[n].enabled:
                return 0.0
            ref = e.get(_family(n), 0.0)
            return v[_family(n)] * e.get(n, 0.0) / ref if ref > 0 else 0.0

        rel = {n: scaled(n, v) for n in slot.allowed()}
        plain = {n: scaled(n, w) for n in slot.allowed()}
        slot.variance, slot.other_variance = (rel, plain) if relative else (plain, rel)
    for p in params:
        p.grad = None


# --- allocation ---------------------------------------------------------------------------------------------
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
        err = BudgetError(f"kept activations need at least {memory.format_bytes(used)}")
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


def _uniform_option(name: str) -> Optional[str]:
    """The :data:`OPTIONS` name a uniform setting keeps every slot with (None: not one of them)."""
    setting = select(name)[0]
    if not setting.compression.enabled:
        return "fp32"
    return next((n for n, c in OPTIONS.items() if c == setting.compression), None)


def _bytes_under(s: Slot, ref: str) -> int:
    """The slot's bytes under the uniform option ``ref`` (an op that does not allow projection keeps it
    unprojected)."""
    if ref in s.bytes:
        return s.bytes[ref]
    return compressed_nbytes((s.rows, s.width), OPTIONS[ref].replace(kept_frac=1.0))


def _variance(slots: Sequence[Slot]) -> float:
    return sum(s.variance.get(s.choice, 0.0) for s in slots)


def allocate_for_peak(slots: Sequence[Slot], room: int, uniform: Dict[str, PlanRecord]) -> str:
    """Choose every ``slot.choice`` so that the predicted step peak stays within ``room`` bytes, with the least
    summed variance; returns the name of the uniform setting whose bound was used.

    A slot's bytes change a step's peak by at most their own change, so for any uniform setting ``u`` whose
    peak was predicted, ``peak(plan) <= peak(u) + sum_i max(0, bytes_i(plan) - bytes_i(u))``. One greedy
    allocation per ``u`` (costs: the bytes above ``u``'s, limit ``room - peak(u)``); the least variance wins.
    :class:`BudgetError` (``needed``: the smallest peak bound) when none fits."""
    best, needed = None, math.inf
    for name, rec in uniform.items():
        ref = _uniform_option(name)
        if ref is None:
            continue

        def cost(s, n, ref=ref):
            return max(0, s.bytes[n] - _bytes_under(s, ref))

        try:
            allocate(slots, room - rec.step_peak_bytes, cost)
        except BudgetError as e:
            needed = min(needed, rec.step_peak_bytes + e.needed)
            continue
        needed = min(needed, rec.step_peak_bytes)
        var = _variance(slots)
        if best is None or var < best[0]:
            best = (var, name, [s.choice for s in slots])
    if best is None:
        err = BudgetError("no plan fits")
        err.needed = needed
        raise err
    for s, c in zip(slots, best[2]):
        s.choice = c
    return best[1]


class PeakModel:
    """The step's memory timeline under a uniform setting ``u`` with the life of every kept activation: the
    step peak of any plan is ``max_j (base_j + sum of bytes_i(plan) over the slots i alive at point j)``,
    ``base_j`` being ``u``'s extrapolated point ``j`` less ``u``'s bytes of the slots alive there.

    So a slot freed before the peak (the last layers' inputs, when the peak is in an earlier layer's
    backward) can be kept in more bytes, even exactly, without raising the peak, as long as no other point
    becomes the peak; slots alive at the peak trade bytes with each other. Exact where the plan's own
    transients are ``u``'s (compression buffers can differ): :func:`budget_plan` verifies every plan on its
    recorded step. ``shift``: added to every point (the caller's prediction of ``u`` less this recording's)."""

    def __init__(self, slots: Sequence[Slot], r1, r2, s1: float, s2: float, ref: str, shift: int = 0):
        by_index = {st.index: st for st in r2.stashes}
        lives = []
        for s in slots:
            st = by_index.get(s.index)
            if st is None or st.born < 0 or st.shape != s.shape:
                raise ValueError(f"slot {s.index} has no recorded life under this setting")
            lives.append((st.born, math.inf if st.died is None else st.died))
        under = [_bytes_under(s, ref) for s in slots]
        points: Dict[tuple, float] = {}
        for value, j in extrapolated_points(r1, r2, s1, s2):
            alive = tuple(p for p, (born, died) in enumerate(lives) if born <= j < died)
            base = value + shift - sum(under[p] for p in alive)
            if base > points.get(alive, -math.inf):
                points[alive] = base
        self.points = sorted(points.items(), key=lambda kv: -kv[1])  # (slot positions alive, base bytes)

    def _kept(self, alive, nbytes) -> int:
        return sum(nbytes[p] for p in alive)

    def peak(self, nbytes: Sequence[int]) -> int:
        """The predicted step peak when slot position ``p`` keeps ``nbytes[p]`` bytes."""
        return int(max([0.0] + [base + self._kept(alive, nbytes) for alive, base in self.points]))

    def alive_at_peak(self, nbytes: Sequence[int]) -> set:
        alive, _ = max(self.points, key=lambda pb: pb[1] + self._kept(pb[0], nbytes), default=((), 0))
        return set(alive)

    def limits(self, room: int) -> Dict[int, int]:
        """Prefix limits for :func:`allocate` keeping every point within ``room``: each point's slots, widened
        to all slots created up to its last one (exact when activations die in reverse order of creation, as
        a backward pass frees them; conservative otherwise). Position -1: the points with no slot alive."""
        out: Dict[int, int] = {}
        for alive, base in self.points:
            k = max(alive) if alive else -1
            out[k] = min(out.get(k, math.inf), round(room - base))  # extrapolated points are floats
        return out


def _allocate_against(slots: Sequence[Slot], name: str, room: int, uniform: Dict[str, PlanRecord],
                      models: Dict[str, PeakModel]) -> int:
    """Allocate the slots so that the predicted step peak against uniform ``name`` stays within ``room``;
    returns the predicted peak. With a :class:`PeakModel` for ``name``, every point of its timeline is held
    within ``room`` with the slots alive there; else ``peak(u) + sum_i (bytes_i(plan) - bytes_i(u))`` (every
    slot counted as alive at the peak). :class:`BudgetError` (``needed``: the cheapest plan's peak)."""
    model = models.get(name)
    if model is None:
        ref = _uniform_option(name)
        other = uniform[name].step_peak_bytes - sum(_bytes_under(s, ref) for s in slots)
        try:
            return other + allocate(slots, room - other)  # plain bytes: the signed sum, shifted by u's kept bytes
        except BudgetError as e:
            e.needed = other + e.needed
            raise
    limits = model.limits(room)
    if limits.pop(-1, 0) < 0:
        cheapest = [min(s.bytes.values()) for s in slots]
        err = BudgetError("no plan fits")
        err.needed = model.peak(cheapest)
        raise err
    try:
        allocate(slots, math.inf, prefix=limits)
    except BudgetError as e:
        e.needed = model.peak([min(s.bytes.values()) for s in slots])
        raise
    return model.peak([s.bytes[s.choice] for s in slots])


def trade_plans(slots: Sequence[Slot], room: int, uniform: Dict[str, PlanRecord],
                models: Optional[Dict[str, PeakModel]] = None) -> List[tuple]:
    """Plans that trade bytes between slots: per uniform setting ``u``, the allocation whose predicted step
    peak stays within ``room`` (:func:`_allocate_against`: a slot below ``u``'s bytes pays for one above, and
    with a :class:`PeakModel` in ``models`` a slot freed before the peak is free up to the next point); as
    ``(variance, u, choices, room)``, distinct choices only, least variance first. Exact when the plan's
    transients are ``u``'s (and, without a model, every kept activation is alive at the peak), optimistic
    otherwise: verify the plan's own step (:func:`budget_plan` does). The slots' choices are left as the
    last allocation made. :class:`BudgetError` (``needed``: the smallest predicted peak) when none fits."""
    out, seen, needed = [], set(), math.inf
    for name in uniform:
        if _uniform_option(name) is None:
            continue
        try:
            peak = _allocate_against(slots, name, room, uniform, models or {})
        except BudgetError as e:
            needed = min(needed, e.needed)
            continue
        needed = min(needed, peak)
        choices = tuple(s.choice for s in slots)
        if choices not in seen:
            seen.add(choices)
            out.append((_variance(slots), name, list(choices), room))
    if not out:
        err = BudgetError("no plan fits")
        err.needed = needed
        raise err
    return sorted(out, key=lambda c: c[0])


def allocate_with_trades(slots: Sequence[Slot], room: int, uniform: Dict[str, PlanRecord],
                         models: Optional[Dict[str, PeakModel]] = None) -> str:
    """The least-variance plan of :func:`trade_plans`, applied to ``slot.choice``; returns the name of the
    uniform setting it trades against (its peak is predicted, not bounded: verify it)."""
    _, name, choices, _ = trade_plans(slots, room, uniform, models)[0]
    for s, c in zip(slots, choices):
        s.choice = c
    return name


# --- the plan -----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class BudgetPlan:
    """A compression per kept activation, and what it is predicted to cost."""

    spec: PlanSpec
    budget: int
    slots: List[Slot]
    record: PlanRecord            # predicted memory of a step under this plan
    uniform: Dict[str, PlanRecord]
    variance: float               # predicted added gradient variance (relative, sum over slots)
    uniform_variance: Dict[str, float]
    calls: int                    # stash calls per training forward (kept-by-reference ones included)
    #: how the step peak was held within the budget: "trades (verified)" or "sound bound"; with the reason
    allocation: str = ""
    #: the variance is relative to each parameter tensor's gradient (:func:`relative_weights`), else plain
    relative: bool = True
    #: the uniform setting whose step the plan's peak was predicted against
    reference: str = ""
    #: the compression in force when the slots were recorded: ops choose what to keep from the configuration
    #: in force (GAT keeps a second copy only when compressing), so a training forward matches the slots
    #: only under this scope (:meth:`active` enters it; a trainer must train under it)
    scope: CompressionConfig = dataclasses.field(default_factory=lambda: OPTIONS[PROBE])

    def config_for(self, index: int) -> Optional[CompressionConfig]:
        for s in self.slots:
            if s.index == index:
                return OPTIONS[s.choice]
        return None

    def hook(self, fallback=None):
        """A stash hook applying the plan; the slot counter restarts after the last slot. A kept activation
        whose shape (beyond its rows) is not its slot's raises :class:`PlanMismatchError`: the forward is not
        the one planned, and a choice applied to the wrong tensor would break the plan's peak and variance
        without a sign."""
        by_index = {s.index: s for s in self.slots}
        count = [0]

        def hook(x, cfg, force):
            i = count[0]
            count[0] = (i + 1) % max(self.calls, 1)
            if cfg.enabled != self.scope.enabled:  # ops keep other tensors with compression on than off
                count[0] = 0
                raise PlanMismatchError(
                    f"memory budget plan: it was recorded under {self.scope.describe()}, and this forward runs "
                    f"under {cfg.describe()}: its kept activations are not the planned ones. Train the planned "
                    "model under the plan's compression scope (`with plan.active():` enters it; a Trainer needs "
                    "cfg.compression = plan.scope)")
            slot = by_index.get(i)
            if slot is None:  # kept by reference when planned (a leaf, or alive anyway)
                return fallback(x, cfg, force) if fallback else keeping.default_stash(x, cfg, force)
            if tuple(x.shape[1:]) != tuple(slot.shape[1:]) or x.dim() != len(slot.shape):
                count[0] = 0  # the next forward starts afresh
                raise PlanMismatchError(
                    f"memory budget plan: kept activation {i} of this forward has shape {tuple(x.shape)}, the "
                    f"plan's slot {i} was recorded as {slot.shape} (rows at sample size); this forward keeps "
                    f"other activations than the planned one ({self.calls} per forward, recorded under "
                    f"{self.scope.describe()}). Train the planned model under the plan's compression scope "
                    "(`with plan.active():` enters it; a Trainer needs cfg.compression = plan.scope), or plan "
                    "again for this model")
            return keep(x, cfg, OPTIONS[slot.choice], force, fallback)

        return hook

    @contextlib.contextmanager
    def active(self):
        """Within this scope, training forwards keep their activations as planned (under :attr:`scope`, the
        compression in force when the slots were recorded)."""
        from ..compression_config import config as compression_scope

        with compression_scope(self.scope), keeping.stash_hook(self.hook()):
            yield self

    def table(self) -> str:
        fb = memory.format_bytes
        kind = "relative" if self.relative else "plain"
        lines = [f"| slot | shape (full size) | kept as | bytes | alive at the step peak | added grad. variance "
                 f"({kind}) |", "|---|---|---|---|---|---|"]
        for s in self.slots:
            alive = {True: "yes", False: "no", None: "?"}[s.at_peak]
            lines.append(f"| {s.index} | {s.rows:,} x {s.width} | {s.choice} | {fb(s.bytes[s.choice])} | {alive} | "
                         f"{s.variance.get(s.choice, 0.0):.3g} |")
        return "\n".join(lines)

    def summary(self) -> str:
        fb = memory.format_bytes
        r = self.record
        uni = ", ".join(f"{n} {v:.3g}" for n, v in self.uniform_variance.items())
        kind = "relative to each parameter's gradient" if self.relative else "plain"
        return (f"memory budget {fb(self.budget)}: predicted static {fb(r.static_bytes)}, activations "
                f"{fb(r.activation_bytes)}, step peak {fb(r.step_peak_bytes)}, total {fb(r.total_bytes)}; "
                f"predicted added gradient variance ({kind}) {self.variance:.3g} "
                f"(uniform: {uni})")


def _uniform_variance(slots: Sequence[Slot], name: str) -> float:
    cfg = OPTIONS[name]
    total = 0.0
    for s in slots:
        n = name if name in s.bytes else (name if cfg.kept_frac >= 1.0 else "INT2")
        if n not in s.variance:
            n = "INT2"
        total += s.variance.get(n, 0.0)
    return total


def _refusal(spec: PlanSpec, budget: int, needed_total: int, uniform: Dict[str, PlanRecord],
             suggestion: Optional[str] = None, checked: bool = False) -> str:
    fb = memory.format_bytes
    if suggestion is None:
        suggestion = suggested_budget(needed_total)[0]
    fit = (f"It would fit with --memory-budget {suggestion} (checked: a plan within it was found)" if checked
           else f"It would fit with --memory-budget {suggestion} or more")
    fits = [f"{n} ({fb(r.total_bytes)})" for n, r in uniform.items() if r.total_bytes <= budget]
    smallest = min(uniform.values(), key=lambda r: r.total_bytes)
    static = ", ".join(f"{k[:-6].replace('_', ' ')} {fb(v)}" for k, v in smallest.breakdown.items() if v >= 2**20)
    return (f"memory budget {fb(budget)} cannot be met for {spec.describe()}: the most aggressive per-tensor plan "
            f"needs {fb(needed_total)} (static memory alone {fb(smallest.static_bytes)}: {static}). {fit}"
            + (f"; uniform settings within the budget: {', '.join(fits)}" if fits else "")
            + "; or train on subgraphs (--sampler cluster or saint), or with fewer layers or a smaller hidden size.")


def budget_report(plan: "BudgetPlan", measured_step_peak: Optional[int]) -> dict:
    """What ``train --memory-budget`` writes to its ``--json``: the budget, the plan's prediction and the
    measured step (total = predicted static memory + measured step peak), and by how much that is over."""
    r = plan.record
    measured_total = None if measured_step_peak is None else r.static_bytes + int(measured_step_peak)
    return {"budget_bytes": int(plan.budget), "predicted_static_bytes": int(r.static_bytes),
            "predicted_step_peak_bytes": int(r.step_peak_bytes), "predicted_total_bytes": int(r.total_bytes),
            "measured_step_peak_bytes": measured_step_peak, "measured_total_bytes": measured_total,
            "over_budget_bytes": max(0, measured_total - int(plan.budget)) if measured_total is not None else 0}


def suggested_budget(needed: int) -> tuple:
    """``(text, bytes)``: ``needed`` rounded up to what :func:`~dgl_exact.memory.format_bytes` shows (two
    decimals of its unit), written so that giving ``text`` back as a budget is at least ``needed`` bytes."""
    from .predict import parse_bytes

    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if needed >= scale:
            text = f"{-(-needed * 100 // scale) / 100:.2f}{unit}"
            value = parse_bytes(text)
            while value < needed:  # float formatting fell a hair short
                text = f"{float(text[:-3]) + 0.01:.2f}{unit}"
                value = parse_bytes(text)
            return text, value
    return f"{int(needed)}B", int(needed)


def budget_plan(spec: PlanSpec, budget: int, data=None, replicas: int = 2, gpu: bool = False,
                samples: Optional[tuple] = None, probe_nodes: int = 200_000, log: Callable[[str], None] = None,
                seed: int = 0, sample_nodes: int = SAMPLE_NODES,
                uniform: Optional[Dict[str, PlanRecord]] = None, relative: bool = True,
                tries: int = 4) -> BudgetPlan:
    """:func:`_budget_plan_once`, and on a refusal the minimum it suggests is checked: the planner is run at the
    suggested budget (rounded up to what is printed) and, where that is refused too, at the larger minimum it
    then names, up to ``tries`` times; the refusal names a budget that was accepted, so giving it back works
    (the minimum is a fixed point). Where no try is accepted, it says so."""
    kwargs = dict(data=data, replicas=replicas, gpu=gpu, probe_nodes=probe_nodes, seed=seed,
                  sample_nodes=sample_nodes, uniform=uniform, relative=relative)
    with single_thread() if data is None else contextlib.nullcontext():
        samples = samples or samples_for(spec, gpu, sample_nodes)
    try:
        return _budget_plan_once(spec, budget, samples=samples, log=log, **kwargs)
    except BudgetError as err:
        first = err
    needed = getattr(first, "needed_total", None)
    for _ in range(tries if needed is not None else 0):
        text, candidate = suggested_budget(max(needed, budget + 1))
        try:
            _budget_plan_once(spec, candidate, samples=samples, log=None, **kwargs)
        except BudgetError as again:
            needed = max(getattr(again, "needed_total", None) or 0, candidate + 1)
            continue
        raise BudgetError(first.reason_at(text) if hasattr(first, "reason_at") else str(first)) from None
    if needed is not None and tries:
        text, _ = suggested_budget(needed)
        raise BudgetError(first.reason_at(text, checked=False)) from None
    raise first


class _Refusal(BudgetError):
    """A refusal whose suggested budget is filled in by :func:`budget_plan` once checked."""

    def __init__(self, spec, budget, needed_total, uniform):
        self.spec, self.budget, self.needed_total, self.uniform = spec, budget, int(needed_total), uniform
        super().__init__(_refusal(spec, budget, needed_total, uniform))

    def reason_at(self, text: str, checked: bool = True) -> str:
        return _refusal(self.spec, self.budget, self.needed_total, self.uniform, text, checked)


def _budget_plan_once(spec: PlanSpec, budget: int, data=None, replicas: int = 2, gpu: bool = False,
                      samples: Optional[tuple] = None, probe_nodes: int = 200_000, log: Callable[[str], None] = None,
                      seed: int = 0, sample_nodes: int = SAMPLE_NODES,
                      uniform: Optional[Dict[str, PlanRecord]] = None, relative: bool = True) -> BudgetPlan:
    """Plan a compression per kept activation of ``spec`` so that static memory + step peak stays within
    ``budget`` bytes. ``data``: ``(graph, feat, label_rows, train_idx)`` to estimate sensitivities on (the
    training data; a random subgraph of ``probe_nodes`` nodes when larger); default: the planner's sample
    graph (random data: sizes are exact, sensitivities only indicative). :class:`BudgetError` when nothing
    fits, saying what would. ``uniform``: the caller's predictions of uniform settings (:func:`.predict.plan`),
    used for the step-peak bounds in place of this call's own: two recordings of the same step can differ
    by a few hundred bytes, and a budget read off a uniform setting's predicted total must admit that
    setting itself. ``relative``: the variance minimised is relative to each parameter tensor's gradient
    (:func:`relative_weights`; for optimizers that scale each parameter's step, Adam and RMSprop), else
    plain (SGD)."""
    given = dict(uniform or {})
    with single_thread() if data is None else contextlib.nullcontext():
        g1, g2 = samples or samples_for(spec, gpu, sample_nodes)
        names = ["INT2", "INT1", "INT2 + RP(0.125) + blocks(64) + optimal", "dgl_exact fp32", "INT8", "INT4",
                 "INT2 + RP(0.125)"]
        uniform, runs, own = {}, {}, {}
        for s in select(",".join(names)):
            r1, r2 = g1.record(s), g2.record(s)
            runs[s.name] = (r1, r2)
            own[s.name] = combine(spec, s.name, r1, r2, g1.scale, g2.scale, budget)
            uniform[s.name] = given.get(s.name) or own[s.name]
        slots = _slots_from_runs(*runs["INT2"], g1.scale, g2.scale)
        ref = uniform["INT2"]
        room = budget - ref.static_bytes    # for the step peak
        for s in slots:  # sizes only: is there any plan at all?
            s.variance = {n: float(-s.bytes[n]) for n in s.allowed()}
        try:
            allocate_for_peak(slots, room, uniform)
        except BudgetError as e:
            try:
                trade_plans(slots, room, uniform)  # a trade plan may fit (if its recorded step confirms it)
            except BudgetError as e2:
                raise _Refusal(spec, budget, ref.static_bytes + min(e.needed, e2.needed), uniform) from None
    if data is None:
        graph, feat, label, idx = g2.graph, g2.feat, g2.label, g2.idx
    else:
        graph, feat, label, idx = _probe_data(data, probe_nodes, seed)
    model = build_for(spec, "exact", seed)
    if log:
        probes = sum(len({_family(n) for n in sl.allowed() if OPTIONS[n].enabled}) for sl in slots)
        log(f"estimating per-tensor sensitivity: {1 + probes * replicas} forward/backward passes on "
            f"{graph.num_nodes():,} nodes")
    estimate_sensitivity(model, graph, feat, label, idx, slots, replicas, seed, relative=relative)
    sound = None
    try:
        sound_ref = allocate_for_peak(slots, room, uniform)
        sound = (_variance(slots), sound_ref, [s.choice for s in slots])
    except BudgetError:
        pass
    models = {}
    for name, (r1, r2) in runs.items():
        option = _uniform_option(name)
        if option is not None and all(r.born >= 0 for r in r2.stashes if r.kept != "reference"):
            try:
                # on the verification's scale: own total + _shift within the budget, the room being the budget
                # less the reference's static bytes
                shift = _shift(uniform, own, name) + own[name].static_bytes - ref.static_bytes
                models[name] = PeakModel(slots, r1, r2, g1.scale, g2.scale, option, shift)
            except ValueError:  # a setting whose ops keep other activations (GAT's second copy when exact)
                pass
    try:
        candidates = trade_plans(slots, room, uniform, models)
    except BudgetError as e:
        candidates, least = [], ref.static_bytes + e.needed
    if sound is not None:  # trades only where they lower the variance below the sound bound's plan
        candidates = [c for c in candidates if c[0] < sound[0] * (1 - 1e-9) and c[2] != sound[2]]
    plan = BudgetPlan(spec, budget, slots, ref, uniform, 0.0,
                      {n: _uniform_variance(slots, n) for n in ("INT8", "INT4", "INT2", "INT1")},
                      len(runs["INT2"][1].stashes), relative=relative)
    fb = memory.format_bytes
    verified, rejected, totals = _verify_trades(plan, candidates, sound[0] if sound else math.inf, g1, g2, own,
                                                models)
    if verified is not None:
        plan.record, plan.allocation = verified
    else:
        if sound is None:  # only trade plans could fit, and none did on its recorded step
            raise _Refusal(spec, budget, min(totals) if totals else least, uniform)
        for s, c in zip(slots, sound[2]):
            s.choice = c
        plan.record = _record_plan(plan, g1, g2)
        shift = _shift(uniform, own, sound[1])
        plan.record.step_peak_bytes += shift  # on the scale of the reference's prediction, as a verified trade
        plan.record.total_bytes += shift
        why = (f"trade plans tried: {len(rejected)}, over the budget on their recorded steps, least total "
               f"{fb(min(totals))}") if rejected else "no trade plan lowers the variance"
        plan.allocation = f"sound bound against {sound[1]} ({why})"
        plan.reference = sound[1]
    fallback = _no_worse_than_uniform(plan)
    if fallback in models:
        _upgrade_uniform(plan, fallback, room, models, g1, g2, own)
    plan.variance = _variance(slots)
    model = models.get(plan.reference) or models.get(PROBE)
    if model is not None:
        alive = model.alive_at_peak([s.bytes[s.choice] for s in slots])
        for p, s in enumerate(slots):
            s.at_peak = p in alive
    plan.record.fits = plan.record.total_bytes <= budget
    plan.record.note = "; ".join(f"{n}: {sum(1 for s in slots if s.choice == n)}"
                                 for n in OPTIONS if any(s.choice == n for s in slots))
    plan.record.note += f" [{plan.allocation}]"
    if log:
        log(f"allocation: {plan.allocation}")
    return plan


def _uniform_choice(slot: Slot, ref: str) -> str:
    """The option a uniform setting ``ref`` keeps ``slot`` with (unprojected where the op forbids projection)."""
    if ref in slot.variance:
        return ref
    flat = OPTIONS[ref].replace(kept_frac=1.0)
    return next((n for n, c in OPTIONS.items() if c == flat and n in slot.variance), "INT2")


def _no_worse_than_uniform(plan: BudgetPlan) -> Optional[str]:
    """Keep the plan only if it is no worse than the best uniform setting within the budget on **both**
    measures of added gradient variance (relative and plain); otherwise apply that uniform setting.

    Why: the two disagree, and each has trained worse where only the other was lower. On a 20,000-node GCN
    4x128 with batch norm a plan with 7 % less plain variance (more relative) trained 1.6 points below INT2
    over 20 seeds (2.7 standard errors); on GCN 3x256 one with 4.5x less relative variance (4.5x more plain)
    trained 0.4 points below (1.0 standard error). A plan better on both is better in every sense these
    probes can measure; one that is not falls back to the setting it was meant to beat (returned; None when
    the plan is kept)."""
    slots = plan.slots
    best = None
    for name, rec in plan.uniform.items():
        ref = _uniform_option(name)
        if ref is None or rec.total_bytes > plan.budget:
            continue
        choices = [_uniform_choice(s, ref) for s in slots]
        own = sum(s.variance.get(c, 0.0) for s, c in zip(slots, choices))
        other = sum(s.other_variance.get(c, 0.0) for s, c in zip(slots, choices))
        if best is None or (own, other) < best[:2]:
            best = (own, other, name, choices, rec)
    if best is None:
        return None
    own = _variance(slots)
    other = sum(s.other_variance.get(s.choice, 0.0) for s in slots)
    if own <= best[0] * (1 + 1e-9) and other <= best[1] * (1 + 1e-9):
        return None
    u_own, u_other, name, choices, rec = best
    kinds = ("relative", "plain") if plan.relative else ("plain", "relative")
    for s, c in zip(slots, choices):
        s.choice = c
    plan.reference = name
    plan.record = dataclasses.replace(rec, setting=plan.record.setting, breakdown=dict(rec.breakdown))
    plan.allocation = (f"uniform {name}: the per-tensor plan ({plan.allocation}) added {kinds[0]} variance "
                       f"{own:.3g} and {kinds[1]} {other:.3g} against {name}'s {u_own:.3g} and {u_other:.3g}; "
                       "a plan must be no worse on both")
    return name


def _upgrade_uniform(plan: BudgetPlan, name: str, room: int, models: Dict[str, PeakModel], g1, g2,
                     own: Dict[str, PlanRecord]) -> None:
    """Uniform ``name`` (applied), with slots kept in more bytes where its step's timeline has room (a slot
    freed before the peak), each only in an option no worse than ``name``'s on both measures, so the plan
    stays no worse on both slot by slot; kept when its recorded step is within the budget."""
    slots = plan.slots
    base = [s.choice for s in slots]
    shadow = []
    for s, c in zip(slots, base):
        v, o = s.variance.get(c, 0.0), s.other_variance.get(c, 0.0)
        allowed = {n: x for n, x in s.variance.items() if x <= v and s.other_variance.get(n, 0.0) <= o}
        shadow.append(dataclasses.replace(s, variance={n: allowed.get(n, math.inf) for n in s.allowed()}))
    try:
        _allocate_against(shadow, name, room, plan.uniform, models)
    except BudgetError:
        return
    choices = [s.choice for s in shadow]
    var = sum(s.variance.get(c, 0.0) for s, c in zip(slots, choices))
    if choices == base or var >= _variance(slots):
        return
    verified, _, _ = _verify_trades(plan, [(var, name, choices, room)], math.inf, g1, g2, own, models,
                                    per_reference=1)
    if verified is None:
        for s, c in zip(slots, base):
            s.choice = c
        return
    plan.record, how = verified
    plan.allocation = (f"uniform {name} with {sum(a != b for a, b in zip(choices, base))} tensor(s) kept in more "
                       f"bytes where the step's timeline has room ({how}); {plan.allocation}")


def _shift(uniform: Dict[str, PlanRecord], own: Dict[str, PlanRecord], name: str) -> int:
    """The caller's predicted total of ``name`` less this call's own recording's: two recordings of one step
    differ by a few hundred bytes, and a budget read off a setting's predicted total must admit the setting.
    A difference beyond :data:`SHIFT_TOLERANCE` of the total is not a recording's jitter (another graph,
    another version): 0, and this call's own recording decides."""
    if name not in own or name not in uniform:
        return 0
    d = uniform[name].total_bytes - own[name].total_bytes
    return d if abs(d) <= max(SHIFT_FLOOR, SHIFT_TOLERANCE * own[name].total_bytes) else 0


#: :func:`_shift` trusts a caller's prediction over this call's own recording by at most this fraction of the
#: total (or :data:`SHIFT_FLOOR` bytes)
SHIFT_TOLERANCE = 1e-3
SHIFT_FLOOR = 64 * 1024


def _verify_trades(plan: BudgetPlan, candidates: Sequence[tuple], worst: float, g1, g2,
                   own: Dict[str, PlanRecord], models: Optional[Dict[str, PeakModel]] = None, tries: int = 8,
                   per_reference: int = 2):
    """The first trade plan of ``candidates`` (:func:`trade_plans`, least variance first) whose recorded step's
    total is within the budget: ``((record, description), rejected, totals)``, ``(None, ...)`` when none is.

    The plan's step is recorded on the same samples as ``own[u]``, this call's recording of its uniform
    reference ``u``, and is compared with it: ``total(plan) = total(u) + (recorded(plan) - own[u])``, where
    ``total(u)`` is the prediction the allocation used (the caller's, if given). Two recordings of the same
    step can differ by a few hundred bytes, and a trade plan with exactly ``u``'s bytes and peak must pass
    at ``u``'s predicted total; the returned record is shifted by that difference (``note`` says by how much).
    A candidate over the budget by ``d`` bytes is allocated again with ``d`` fewer (its transients were
    larger than its uniform reference's) while that still lowers the variance below ``worst``; at most
    ``per_reference`` recordings per uniform reference and ``tries`` in all."""
    fb = memory.format_bytes
    slots, rejected, totals, cache, done = plan.slots, [], [], {}, set()
    for _, name, choices, room in candidates:
        for _ in range(per_reference):
            key = tuple(choices)
            if (name, key) in done or key not in cache and len(cache) >= tries:
                break
            done.add((name, key))
            for s, c in zip(slots, choices):
                s.choice = c
            if key not in cache:
                cache[key] = _record_plan(plan, g1, g2)
            rec = dataclasses.replace(cache[key])
            shift = _shift(plan.uniform, own, name)
            rec.step_peak_bytes += shift
            rec.total_bytes += shift
            if rec.total_bytes <= plan.budget:
                rel = rec.total_bytes - plan.uniform[name].total_bytes
                plan.reference = name
                how = "timeline" if name in (models or {}) else "sum"
                return (rec, f"trades against {name} ({how}), verified: recorded step peak "
                             f"{'+' if rel >= 0 else '-'}"
                             f"{fb(abs(rel))} from {name}'s, total {fb(rec.total_bytes)} within the budget"
                             + (f"; shifted {shift:+d} B to {name}'s prediction" if shift else "")), \
                    rejected, totals
            rejected.append(f"against {name} {fb(rec.total_bytes)}")
            totals.append(rec.total_bytes)
            room -= rec.total_bytes - plan.budget
            try:
                _allocate_against(slots, name, room, plan.uniform, models or {})
            except BudgetError:
                break
            if _variance(slots) >= worst:
                break
            choices = [s.choice for s in slots]
    return None, rejected, totals


def _record_plan(plan: BudgetPlan, g1, g2) -> PlanRecord:
    """The plan's own training step (its current choices), recorded on the planner's two samples and
    extrapolated to full size."""
    with single_thread():
        setting = Setting(f"budget {memory.format_bytes(plan.budget)}", "exact", OPTIONS["INT2"])
        r1 = g1.record(setting, hook=lambda rec: plan.hook(rec))
        r2 = g2.record(setting, hook=lambda rec: plan.hook(rec))
    return combine(plan.spec, "budget", r1, r2, g1.scale, g2.scale, plan.budget,
                   f"per tensor, {len(plan.slots)} tensors")


def _probe_data(data, probe_nodes: int, seed: int):
    graph, feat, label, idx = data
    n = graph.num_nodes()
    if n <= probe_nodes:
        return graph, feat, label, idx
    from .._compat import import_dgl

    dgl = import_dgl()
    gen = torch.Generator().manual_seed(seed)
    keep = torch.randperm(n, generator=gen)[:probe_nodes].sort().values
    sub = dgl.node_subgraph(graph, keep.to(graph.device))
    full_label = torch.full((n,), -1, dtype=label.dtype, device=label.device)
    full_label[idx] = label
    new_of_old = torch.full((n,), -1, dtype=torch.long)
    new_of_old[keep] = torch.arange(keep.numel())
    sub_idx = new_of_old[idx.cpu()]
    sub_idx = sub_idx[sub_idx >= 0].to(idx.device)
    return sub, feat[keep.to(feat.device)], full_label[keep.to(label.device)][sub_idx], sub_idx


def plan_row(spec: PlanSpec, budget: int, device: str = "cpu",
             uniform: Optional[Dict[str, PlanRecord]] = None) -> PlanRecord:
    """The budgeted plan as one :class:`PlanRecord` of ``dgl-exact plan`` (sensitivities on the sample graph);
    a record that does not fit, with the reason in ``note``, when the budget cannot be met."""
    total, _ = device_bytes(device)
    try:
        p = budget_plan(spec, budget, gpu=str(device).startswith("cuda"), uniform=uniform)
    except BudgetError as e:
        return PlanRecord(f"budget {memory.format_bytes(budget)}", 0, 0, 0, 0, False, total, "per tensor", {},
                          str(e))
    rec = p.record
    rec.setting = f"budget {memory.format_bytes(budget)}"
    rec.device_bytes = total
    rec.fits = rec.total_bytes <= budget and (total is None or rec.total_bytes <= total)
    return rec


def plan_for_training(trainer, budget, log: Callable[[str], None] = print, replicas: int = 2) -> BudgetPlan:
    """The :class:`BudgetPlan` for a :class:`~dgl_exact.training.trainer.Trainer`'s full-graph training
    within ``budget`` (bytes or a size such as ``"2GiB"``), sensitivities from probe steps of a freshly
    initialised model on the trainer's own graph and training rows; the plan is logged."""
    from .predict import parse_bytes, spec_from_graph

    cfg = trainer.cfg
    limit = parse_bytes(budget)
    if trainer.device.type == "cpu":
        memory.prepare_cpu_peak()  # the run measures its step peak: planning must not grow a heap it reuses
    if cfg.sampler != "full":
        raise ValueError(f"--memory-budget plans full-graph training; the {cfg.sampler} sampler trains on "
                         "subgraphs whose size it sets (leave --memory-budget out)")
    if cfg.amp or cfg.use_labels or cfg.inductive:
        raise ValueError("--memory-budget does not yet plan --amp, --use-labels or --inductive training")
    recorded = OPTIONS[PROBE]  # the scope the planner recorded the slots under
    if cfg.compression != recorded:
        # ops decide which activations to keep from the configuration in force (e.g. GAT keeps a second copy
        # only when compressing): train under the recorded scope, so that the slots are the planned ones
        log(f"memory budget: the plan chooses each kept activation's compression; training runs under "
            f"{recorded.describe()} (the scope it was planned under) in place of {cfg.compression.describe()}")
        trainer.cfg = cfg = cfg.replace(compression=recorded)
    ds = trainer.dataset
    idx = trainer.split["train"]
    spec = spec_from_graph(ds.graph, ds.num_features, ds.num_classes, int(idx.numel()), cfg.model, name=ds.name,
                           hidden=cfg.hidden, layers=cfg.layers, dropout=cfg.dropout, batch_norm=cfg.batch_norm,
                           heads=cfg.heads)
    data = (trainer.graph, trainer.feat, trainer.label[idx], idx)
    plan = budget_plan(spec, limit, data=data, replicas=replicas, gpu=trainer.device.type == "cuda", log=log,
                       seed=cfg.seed, relative=per_parameter_steps(cfg.optimizer))
    log(plan.summary())
    log(plan.table())
    return plan
