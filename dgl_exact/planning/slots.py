"""The vocabulary of a budget plan: the options a kept activation may get, the slots (one per kept
activation of a training forward), the keep hook's ``keep``, and the planner's errors.

Every activation a training forward keeps goes through :func:`dgl_exact.ops.keep.as_kept`, in
the same order every step; slot ``i`` is the ``i``-th call. Its full-size shape comes from the planner's
sample runs (:mod:`.predict`), so its bytes under every option are exact
(:func:`~dgl_exact.compression.compressed_nbytes`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Dict, List, Optional

import torch

from ..compression import compressed_nbytes
from ..compression_config import CompressionConfig
from ..ops import keep as keeping
from .settings import OPTIONS
from .predict import extrapolate


#: what a slot may get, by name (the presets of :mod:`.settings`)
FP = OPTIONS["fp32"]
PROBE = "INT2"
#: the probe of the options with random projection: their error is shared by all rows (one projection
#: matrix), so it adds up across rows in a weight gradient and does not scale like quantisation noise
PROBE_RP = "INT2 + RP(0.125)"


def probe_family(name: str) -> str:
    """The probe an option's variance is estimated with: with or without random projection."""
    return PROBE_RP if OPTIONS[name].kept_frac < 1.0 else PROBE


class BudgetError(ValueError):
    """The budget cannot be met by any plan; the message says what would fit."""


class PlanMismatchError(RuntimeError):
    """A forward under a :class:`BudgetPlan` keeps other activations than the ones planned."""


@dataclasses.dataclass
class Slot:
    """One kept activation of a training forward (the ``index``-th keep call)."""

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


def slots_from_runs(r1, r2, s1: float, s2: float) -> List[Slot]:
    """One :class:`Slot` per activation kept by both sample runs, its bytes extrapolated to full size."""
    if len(r1.keeps) != len(r2.keeps):
        raise RuntimeError("the two sample runs kept a different number of activations; cannot plan per tensor")
    slots = []
    for a, b in zip(r1.keeps, r2.keeps):
        if b.kept in ("reference", "shared"):
            # alive anyway (input features): kept by reference at no cost, nothing to choose; shared: the copy
            # of an earlier slot's tensor, kept as that slot chooses (planning.budgeted)
            continue
        rows = int(round(extrapolate(a.shape[0], b.shape[0], s1, s2))) if b.shape else 1
        width = math.prod(b.shape[1:]) if len(b.shape) > 1 else (1 if b.shape else 1)
        size = torch.empty((), dtype=getattr(torch, b.dtype)).element_size()
        slot = Slot(b.index, max(rows, 0), width, size, b.projectable, b.shape)
        slot.bytes = {n: slot.nbytes(n) for n in slot.allowed()}
        slots.append(slot)
    return slots


def keep(x: torch.Tensor, op_cfg: CompressionConfig, kept: CompressionConfig, force: bool,
         as_kept: Optional[Callable] = None):
    """``as_kept(x, kept, force)`` (default :func:`~dgl_exact.ops.keep.default_keep`) for an op that asked
    for ``op_cfg``, with an exact copy of ``x`` where the plan keeps it exactly but the op may overwrite it.

    An op that compresses a tensor it owns (``force`` under an enabled ``op_cfg``) may then overwrite that
    tensor in place (``ops.linear_reusing`` in GCN's square layers, GCNII's fused step): it only needs the
    compressed copy. Kept by reference, the buffer would be overwritten before backward reads it (autograd
    refuses: "modified by an inplace operation"). The copy has the bytes an exact slot is planned with."""
    as_kept = as_kept or keeping.default_keep
    if force and op_cfg.enabled and not kept.enabled and kept.kept_frac >= 1.0:
        x = x.detach().clone()
    return as_kept(x, kept, force)
