"""Spend the bits where they matter: a compression per kept activation that fits a memory budget and adds
the least gradient variance (GACT's idea, Liu et al., ICML 2022, for full-graph GNNs).

The steps, one module each: :mod:`.slots` (what is kept, the options), :mod:`.sensitivity` (the
variance each option adds), :mod:`.allocation` (the choice under a byte limit), :mod:`.peak` (the step
peak of a plan: sound bound and trades), :mod:`.budgeted` (:class:`BudgetPlan` and its hook). This module
runs them (:func:`budget_plan`) and keeps a plan no worse than uniform:

**No worse than uniform.** A plan is kept only when its added variance is no more than the best uniform
setting's within the budget on both measures (relative and plain, :func:`_no_worse_than_uniform`); else
that setting is applied, with the free upgrades its timeline allows (each slot only to an option no
worse on both measures, verified the same way).

``BudgetPlan.allocation`` and the record's ``note`` say which was used.

:class:`BudgetPlan.active` installs the plan (a keep hook) for a training run; when a training forward does
not match the recorded slots (another model, a kept activation of another shape, another compression scope)
the hook raises :class:`PlanMismatchError` rather than apply a choice to the wrong tensor.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Callable, Dict, Optional, Sequence

import torch

from .. import memory
from .settings import OPTIONS, Setting, select
from .predict import (DEFAULT_SETTINGS, SAMPLE_NODES, PlanRecord, PlanSpec, build_for, check_depth, combine,
                      device_bytes, samples_for, single_thread)
from .slots import (FP, PROBE, PROBE_RP, BudgetError, PlanMismatchError, Slot, probe_family, slots_from_runs,
                    keep)
from .budgeted import BudgetPlan
from .peak import PeakModel, allocate_against, allocate_for_peak, allocate_with_trades, trade_plans
from .allocation import uniform_option, total_variance, allocate
from .sensitivity import REL_FLOOR, estimate_sensitivity, per_parameter_steps, relative_weights
from ..units import format_bytes, parse_bytes, round_up_size

__all__ = ["OPTIONS", "Slot", "BudgetPlan", "BudgetError", "budget_plan", "plan_row", "estimate_sensitivity",
           "allocate", "allocate_for_peak", "trade_plans", "allocate_with_trades", "PeakModel", "keep",
           "relative_weights", "per_parameter_steps", "PlanMismatchError", "FP", "PROBE", "PROBE_RP", "REL_FLOOR"]


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
    fb = format_bytes
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


#: ``(text, bytes)``: a byte count rounded up to what :func:`~dgl_exact.units.format_bytes` shows
suggested_budget = round_up_size


def budget_plan(spec: PlanSpec, budget: int, data=None, replicas: int = 2, gpu: bool = False,
                samples: Optional[tuple] = None, probe_nodes: int = 200_000, log: Callable[[str], None] = None,
                seed: int = 0, sample_nodes: int = SAMPLE_NODES,
                uniform: Optional[Dict[str, PlanRecord]] = None, relative: bool = True,
                tries: int = 4) -> BudgetPlan:
    """:func:`_budget_plan_once`, and on a refusal the minimum it suggests is checked: the planner is run at the
    suggested budget (rounded up to what is printed) and, where that is refused too, at the larger minimum it
    then names, up to ``tries`` times; the refusal names a budget that was accepted, so giving it back works
    (the minimum is a fixed point). Where no try is accepted, it says so."""
    check_depth(spec.layers, len(DEFAULT_SETTINGS), "a --memory-budget plan")  # about as many steps as those
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
    with single_thread() if data is None else contextlib.nullcontext():
        g1, g2 = samples or samples_for(spec, gpu, sample_nodes)
        uniform, runs, own = _record_uniform(spec, budget, g1, g2, dict(uniform or {}))
        slots = slots_from_runs(*runs["INT2"], g1.scale, g2.scale)
        ref = uniform["INT2"]
        room = budget - ref.static_bytes    # for the step peak
        _refuse_unless_any_plan(spec, budget, slots, room, uniform)
    if data is None:
        graph, feat, label, idx = g2.graph, g2.feat, g2.label, g2.idx
    else:
        graph, feat, label, idx = _probe_data(data, probe_nodes, seed)
    model = build_for(spec, "exact", seed)
    if log:
        probes = sum(len({probe_family(n) for n in sl.allowed() if OPTIONS[n].enabled}) for sl in slots)
        log(f"estimating per-tensor sensitivity: {1 + probes * replicas} forward/backward passes on "
            f"{graph.num_nodes():,} nodes")
    estimate_sensitivity(model, graph, feat, label, idx, slots, replicas, seed, relative=relative)
    sound = None
    try:
        sound_ref = allocate_for_peak(slots, room, uniform)
        sound = (total_variance(slots), sound_ref, [s.choice for s in slots])
    except BudgetError:
        pass
    models = _peak_models(slots, runs, uniform, own, g1, g2)
    try:
        candidates = trade_plans(slots, room, uniform, models)
    except BudgetError as e:
        candidates, least = [], ref.static_bytes + e.needed
    if sound is not None:  # trades only where they lower the variance below the sound bound's plan
        candidates = [c for c in candidates if c[0] < sound[0] * (1 - 1e-9) and c[2] != sound[2]]
    plan = BudgetPlan(spec, budget, slots, ref, uniform, 0.0,
                      {n: _uniform_variance(slots, n) for n in ("INT8", "INT4", "INT2", "INT1")},
                      len(runs["INT2"][1].keeps), relative=relative)
    fb = format_bytes
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
    _finish(plan, models)
    if log:
        log(f"allocation: {plan.allocation}")
    return plan


#: the uniform settings a budget plan records on its samples: its references and bounds
_RECORDED = ["INT2", "INT1", "INT2 + RP(0.125) + blocks(64) + optimal", "dgl_exact fp32", "INT8", "INT4",
             "INT2 + RP(0.125)"]


def _record_uniform(spec: PlanSpec, budget: int, g1, g2, given: Dict[str, PlanRecord]):
    """``(uniform, runs, own)`` by setting name of :data:`_RECORDED`: the prediction used (the caller's in
    ``given`` where it has one, else this recording's), the two sample runs, and this recording's own."""
    uniform, runs, own = {}, {}, {}
    for s in select(",".join(_RECORDED)):
        r1, r2 = g1.record(s), g2.record(s)
        runs[s.name] = (r1, r2)
        own[s.name] = combine(spec, s.name, r1, r2, g1.scale, g2.scale, budget)
        uniform[s.name] = given.get(s.name) or own[s.name]
    return uniform, runs, own


def _refuse_unless_any_plan(spec: PlanSpec, budget: int, slots: Sequence[Slot], room: int,
                            uniform: Dict[str, PlanRecord]) -> None:
    """:class:`_Refusal` (saying what would fit) unless some choice of the slots fits ``room`` on sizes alone
    (a sound plan, or a trade plan its recorded step may confirm). Leaves size-only variances in the slots."""
    for s in slots:
        s.variance = {n: float(-s.bytes[n]) for n in s.allowed()}
    try:
        allocate_for_peak(slots, room, uniform)
    except BudgetError as e:
        try:
            trade_plans(slots, room, uniform)  # a trade plan may fit (if its recorded step confirms it)
        except BudgetError as e2:
            needed = uniform["INT2"].static_bytes + min(e.needed, e2.needed)
            raise _Refusal(spec, budget, needed, uniform) from None


def _peak_models(slots: Sequence[Slot], runs: Dict[str, tuple], uniform: Dict[str, PlanRecord],
                 own: Dict[str, PlanRecord], g1, g2) -> Dict[str, PeakModel]:
    """A :class:`PeakModel` per recorded uniform setting whose kept activations were all tracked, on the
    verification's scale: its own total + :func:`_shift` within the budget, the room being the budget less
    the reference's (INT2's) static bytes."""
    models = {}
    ref = uniform["INT2"]
    for name, (r1, r2) in runs.items():
        option = uniform_option(name)
        if option is not None and all(r.born >= 0 for r in r2.keeps if r.kept not in ("reference", "shared")):
            try:
                shift = _shift(uniform, own, name) + own[name].static_bytes - ref.static_bytes
                models[name] = PeakModel(slots, r1, r2, g1.scale, g2.scale, option, shift)
            except ValueError:  # a setting whose ops keep other activations (GAT's second copy when exact)
                pass
    return models


def _finish(plan: BudgetPlan, models: Dict[str, PeakModel]) -> None:
    """The plan's variance, which slots are alive at its step peak, whether it fits, and its note."""
    slots = plan.slots
    plan.variance = total_variance(slots)
    model = models.get(plan.reference) or models.get(PROBE)
    if model is not None:
        alive = model.alive_at_peak([s.bytes[s.choice] for s in slots])
        for p, s in enumerate(slots):
            s.at_peak = p in alive
    plan.record.fits = plan.record.total_bytes <= plan.budget
    plan.record.note = "; ".join(f"{n}: {sum(1 for s in slots if s.choice == n)}"
                                 for n in OPTIONS if any(s.choice == n for s in slots))
    plan.record.note += f" [{plan.allocation}]"


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
        ref = uniform_option(name)
        if ref is None or rec.total_bytes > plan.budget:
            continue
        choices = [_uniform_choice(s, ref) for s in slots]
        own = sum(s.variance.get(c, 0.0) for s, c in zip(slots, choices))
        other = sum(s.other_variance.get(c, 0.0) for s, c in zip(slots, choices))
        if best is None or (own, other) < best[:2]:
            best = (own, other, name, choices, rec)
    if best is None:
        return None
    own = total_variance(slots)
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
        allocate_against(shadow, name, room, plan.uniform, models)
    except BudgetError:
        return
    choices = [s.choice for s in shadow]
    var = sum(s.variance.get(c, 0.0) for s, c in zip(slots, choices))
    if choices == base or var >= total_variance(slots):
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
    fb = format_bytes
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
                allocate_against(slots, name, room, plan.uniform, models or {})
            except BudgetError:
                break
            if total_variance(slots) >= worst:
                break
            choices = [s.choice for s in slots]
    return None, rejected, totals


def _record_plan(plan: BudgetPlan, g1, g2) -> PlanRecord:
    """The plan's own training step (its current choices), recorded on the planner's two samples and
    extrapolated to full size."""
    with single_thread():
        setting = Setting(f"budget {format_bytes(plan.budget)}", "exact", OPTIONS["INT2"])
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
        return PlanRecord(f"budget {format_bytes(budget)}", 0, 0, 0, 0, False, total, "per tensor", {},
                          str(e))
    rec = p.record
    rec.setting = f"budget {format_bytes(budget)}"
    rec.device_bytes = total
    rec.fits = rec.total_bytes <= budget and (total is None or rec.total_bytes <= total)
    return rec


def plan_for_training(trainer, budget, log: Callable[[str], None] = print, replicas: int = 2) -> BudgetPlan:
    """The :class:`BudgetPlan` for a :class:`~dgl_exact.training.trainer.Trainer`'s full-graph training
    within ``budget`` (bytes or a size such as ``"2GiB"``), sensitivities from probe steps of a freshly
    initialised model on the trainer's own graph and training rows; the plan is logged."""
    from .predict import spec_from_graph

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
    spec = spec_from_graph(trainer.graph, ds.num_features, ds.num_classes, int(idx.numel()), cfg.model, name=ds.name,
                           hidden=cfg.hidden, layers=cfg.layers, dropout=cfg.dropout, batch_norm=cfg.batch_norm,
                           heads=cfg.heads)
    data = (trainer.graph, trainer.feat, trainer.label[idx], idx)
    plan = budget_plan(spec, limit, data=data, replicas=replicas, gpu=trainer.device.type == "cuda", log=log,
                       seed=cfg.seed, relative=per_parameter_steps(cfg.optimizer))
    log(plan.summary())
    log(plan.table())
    return plan
