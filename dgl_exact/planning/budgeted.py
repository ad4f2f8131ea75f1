""":class:`BudgetPlan`: a plan's choice per slot, what it is predicted to cost, and the keep hook that
applies it during training (:meth:`BudgetPlan.active`).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Dict, List, Optional

from torch.utils.weak import WeakIdKeyDictionary

from ..compression_config import CompressionConfig
from ..ops import keep as keeping
from .settings import OPTIONS
from .predict import PlanRecord, PlanSpec
from .slots import PROBE, PlanMismatchError, Slot, keep
from ..units import format_bytes


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
    calls: int                    # keep calls per training forward (kept-by-reference ones included)
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

    def choices(self) -> List[List[Any]]:
        """The plan per tensor as plain values, ``[[slot index, option name], ...]`` (what a training checkpoint
        records and ``--resume`` compares: :mod:`dgl_exact.training.resume`)."""
        return [[int(s.index), str(s.choice)] for s in self.slots]

    def hook(self, fallback=None):
        """A keep hook applying the plan; the slot counter restarts after the last slot. A kept activation
        whose shape (beyond its rows) is not its slot's raises :class:`PlanMismatchError`: the forward is not
        the one planned, and a choice applied to the wrong tensor would break the plan's peak and variance
        without a sign."""
        by_index = {s.index: s for s in self.slots}
        count = [0]
        chosen = WeakIdKeyDictionary()  # tensor -> (version, the option its slot chose), for later keepers

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
            if slot is None:  # kept by reference when planned (a leaf, or alive anyway), or shared (rule 6)
                earlier = chosen.get(x)  # kept by an earlier slot: as that slot chose (its copy, when compressed)
                if earlier is not None and earlier[0] == x._version:
                    return keep(x, cfg, earlier[1], force, fallback)
                return fallback(x, cfg, force) if fallback else keeping.default_keep(x, cfg, force)
            if tuple(x.shape[1:]) != tuple(slot.shape[1:]) or x.dim() != len(slot.shape):
                count[0] = 0  # the next forward starts afresh
                raise PlanMismatchError(
                    f"memory budget plan: kept activation {i} of this forward has shape {tuple(x.shape)}, the "
                    f"plan's slot {i} was recorded as {slot.shape} (rows at sample size); this forward keeps "
                    f"other activations than the planned one ({self.calls} per forward, recorded under "
                    f"{self.scope.describe()}). Train the planned model under the plan's compression scope "
                    "(`with plan.active():` enters it; a Trainer needs cfg.compression = plan.scope), or plan "
                    "again for this model")
            chosen[x] = (x._version, OPTIONS[slot.choice])
            return keep(x, cfg, OPTIONS[slot.choice], force, fallback)

        return hook

    @contextlib.contextmanager
    def active(self):
        """Within this scope, training forwards keep their activations as planned (under :attr:`scope`, the
        compression in force when the slots were recorded)."""
        from ..compression_config import config as compression_scope

        with compression_scope(self.scope), keeping.keep_hook(self.hook()):
            yield self

    def table(self) -> str:
        fb = format_bytes
        kind = "relative" if self.relative else "plain"
        lines = [f"| slot | shape (full size) | kept as | bytes | alive at the step peak | added grad. variance "
                 f"({kind}) |", "|---|---|---|---|---|---|"]
        for s in self.slots:
            alive = {True: "yes", False: "no", None: "?"}[s.at_peak]
            lines.append(f"| {s.index} | {s.rows:,} x {s.width} | {s.choice} | {fb(s.bytes[s.choice])} | {alive} | "
                         f"{s.variance.get(s.choice, 0.0):.3g} |")
        return "\n".join(lines)

    def summary(self) -> str:
        fb = format_bytes
        r = self.record
        uni = ", ".join(f"{n} {v:.3g}" for n, v in self.uniform_variance.items())
        kind = "relative to each parameter's gradient" if self.relative else "plain"
        return (f"memory budget {fb(self.budget)}: predicted static {fb(r.static_bytes)}, activations "
                f"{fb(r.activation_bytes)}, step peak {fb(r.step_peak_bytes)}, total {fb(r.total_bytes)}; "
                f"predicted added gradient variance ({kind}) {self.variance:.3g} "
                f"(uniform: {uni})")
