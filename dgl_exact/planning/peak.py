"""The step peak of a plan, predicted from the uniform settings whose peaks were predicted: a sound
bound, and trades along a uniform setting's recorded timeline (:class:`PeakModel`); the allocations
that hold each within the budget.

Against each uniform setting ``u``, in two ways:

* **trades** (tried first), from ``u``'s recorded **timeline** (:class:`PeakModel`): every point ``j`` of
  ``u``'s step (extrapolated to full size) less ``u``'s bytes of the activations alive at ``j``, plus the
  plan's bytes of those same activations; the plan's peak is the largest point. So a slot kept in fewer
  bytes than under ``u`` pays for another kept in more where both are alive at the peak, and a slot
  freed before the peak (the last layers' inputs when the peak is in an earlier layer's backward: on a
  20,000-node GAT 3x128 the peak is in the second layer's attention backward, and the last four kept
  activations are gone by then) costs nothing there and is kept in more bytes, up to the point where
  another point of the timeline would become the peak. Allocated with one limit per point on the bytes
  of the slots created up to its last live one (exact when activations die in the reverse order of their
  creation, as a backward pass frees them). Where ``u``'s keeps were not all tracked, the signed sum
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
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence


from .predict import PlanRecord, extrapolated_points
from .slots import BudgetError, Slot
from .allocation import bytes_under, uniform_option, total_variance, allocate


def allocate_for_peak(slots: Sequence[Slot], room: int, uniform: Dict[str, PlanRecord]) -> str:
    """Choose every ``slot.choice`` so that the predicted step peak stays within ``room`` bytes, with the least
    summed variance; returns the name of the uniform setting whose bound was used.

    A slot's bytes change a step's peak by at most their own change, so for any uniform setting ``u`` whose
    peak was predicted, ``peak(plan) <= peak(u) + sum_i max(0, bytes_i(plan) - bytes_i(u))``. One greedy
    allocation per ``u`` (costs: the bytes above ``u``'s, limit ``room - peak(u)``); the least variance wins.
    :class:`BudgetError` (``needed``: the smallest peak bound) when none fits."""
    best, needed = None, math.inf
    for name, rec in uniform.items():
        ref = uniform_option(name)
        if ref is None:
            continue

        def cost(s, n, ref=ref):
            return max(0, s.bytes[n] - bytes_under(s, ref))

        try:
            allocate(slots, room - rec.step_peak_bytes, cost)
        except BudgetError as e:
            needed = min(needed, rec.step_peak_bytes + e.needed)
            continue
        needed = min(needed, rec.step_peak_bytes)
        var = total_variance(slots)
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
        by_index = {st.index: st for st in r2.keeps}
        lives = []
        for s in slots:
            st = by_index.get(s.index)
            if st is None or st.born < 0 or st.shape != s.shape:
                raise ValueError(f"slot {s.index} has no recorded life under this setting")
            lives.append((st.born, math.inf if st.died is None else st.died))
        under = [bytes_under(s, ref) for s in slots]
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


def allocate_against(slots: Sequence[Slot], name: str, room: int, uniform: Dict[str, PlanRecord],
                      models: Dict[str, PeakModel]) -> int:
    """Allocate the slots so that the predicted step peak against uniform ``name`` stays within ``room``;
    returns the predicted peak. With a :class:`PeakModel` for ``name``, every point of its timeline is held
    within ``room`` with the slots alive there; else ``peak(u) + sum_i (bytes_i(plan) - bytes_i(u))`` (every
    slot counted as alive at the peak). :class:`BudgetError` (``needed``: the cheapest plan's peak)."""
    model = models.get(name)
    if model is None:
        ref = uniform_option(name)
        other = uniform[name].step_peak_bytes - sum(bytes_under(s, ref) for s in slots)
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
    peak stays within ``room`` (:func:`allocate_against`: a slot below ``u``'s bytes pays for one above, and
    with a :class:`PeakModel` in ``models`` a slot freed before the peak is free up to the next point); as
    ``(variance, u, choices, room)``, distinct choices only, least variance first. Exact when the plan's
    transients are ``u``'s (and, without a model, every kept activation is alive at the peak), optimistic
    otherwise: verify the plan's own step (:func:`budget_plan` does). The slots' choices are left as the
    last allocation made. :class:`BudgetError` (``needed``: the smallest predicted peak) when none fits."""
    out, seen, needed = [], set(), math.inf
    for name in uniform:
        if uniform_option(name) is None:
            continue
        try:
            peak = allocate_against(slots, name, room, uniform, models or {})
        except BudgetError as e:
            needed = min(needed, e.needed)
            continue
        needed = min(needed, peak)
        choices = tuple(s.choice for s in slots)
        if choices not in seen:
            seen.add(choices)
            out.append((total_variance(slots), name, list(choices), room))
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
