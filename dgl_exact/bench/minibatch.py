"""``dgl-exact bench minibatch``: per setting, the largest neighbour-sampled batch that fits a memory budget
(picked by the per-batch planner, :mod:`dgl_exact.planning.minibatch`), its measured step peak and the epoch
time at that batch size."""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .. import memory
from ..compression_config import config as compression_scope
from ..planning.minibatch import MinibatchPlanner, largest_batch
from ..planning.predict import loss_fn
from ..planning.settings import Setting

__all__ = ["MINIBATCH_COLUMNS", "minibatch_rows", "measured_peak", "time_batches"]

MINIBATCH_COLUMNS = ["setting", "batch_size", "predicted_step_peak_mib", "measured_step_peak_mib", "error_pct",
                     "budget_mib", "s_per_batch", "batches_per_epoch", "epoch_s", "timed_batches"]


def _scope(setting: Setting):
    return compression_scope(setting.compression) if setting.compression else contextlib.nullcontext()


def measured_peak(planner: MinibatchPlanner, setting: Setting, batch_size: int) -> Optional[int]:
    """The largest measured step peak (:func:`dgl_exact.memory.measure_step`) over the planner's sampled
    batches at ``batch_size`` (the same batches it predicted), after one unmeasured warm-up measurement
    (the first measured step of a process holds one-off allocations). None where the CPU peak cannot be read."""
    peaks = []
    batches = planner.batches(batch_size)
    for b in [batches[0]] + planner.batches(batch_size):
        model, opt = planner._model(setting)
        y = b.node_data["label"]
        idx = torch.arange(y.shape[0])
        lf = loss_fn(setting.impl)
        feat = b.node_data["feat"]
        with _scope(setting):
            # the batch's features, labels and rows exist before the step (the planner counts them as batch
            # data, not activations): excluded, or a first layer keeping its input features by reference
            # counts them as activations, more than the step's high-water mark rises, and no peak is read
            rep = memory.measure_step(lambda: lf(model(b.blocks, feat), y, idx), opt, modules=[model],
                                      exclude=[feat, y, idx])
        if rep.peak_bytes is None:
            return None
        peaks.append(rep.peak_bytes)
    return max(peaks[1:])


def time_batches(planner: MinibatchPlanner, setting: Setting, batch_size: int, max_batches: int) -> tuple:
    """``(seconds per batch, batches timed)``: training steps (sampling included) on the first ``max_batches``
    batches of an epoch, after one untimed step."""
    model, opt = planner._model(setting)
    lf = loss_fn(setting.impl)
    sampler = planner.sampler(batch_size)
    timed, t0 = 0, None
    with _scope(setting):
        for i, b in enumerate(sampler.iter_epoch(0)):
            if i > max_batches:
                break
            if i == 1:
                t0 = time.perf_counter()
            y = b.node_data["label"]
            lf(model(b.blocks, b.node_data["feat"]), y, torch.arange(y.shape[0])).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            timed += i >= 1
    if not timed:
        return None, 0
    return (time.perf_counter() - t0) / timed, timed


def minibatch_rows(planner: MinibatchPlanner, settings: Sequence[Setting], budget: int, max_batches: int, sink=None,
                   log: Optional[Callable[[str], None]] = None) -> List[Dict]:
    """One row per setting (:data:`MINIBATCH_COLUMNS`), added to ``sink`` as it finishes."""
    rows = []
    mib = 2 ** 20
    for s in settings:
        pick = largest_batch(planner, s, budget, log=log)
        measured = measured_peak(planner, s, pick.batch_size)
        per_batch, timed = time_batches(planner, s, pick.batch_size, max_batches)
        n = planner.sampler(pick.batch_size).num_global_batches
        pred = pick.record.step_peak_bytes
        row = {"setting": s.name, "batch_size": pick.batch_size, "predicted_step_peak_mib": round(pred / mib, 2),
               "measured_step_peak_mib": None if measured is None else round(measured / mib, 2),
               "error_pct": None if not measured else round(100 * (pred - measured) / measured, 1),
               "budget_mib": round(budget / mib, 2),
               "s_per_batch": None if per_batch is None else round(per_batch, 4), "batches_per_epoch": n,
               "epoch_s": None if per_batch is None else round(per_batch * n, 1), "timed_batches": timed,
               "tried": {str(k): v for k, v in pick.tried.items()}}
        rows.append(row)
        if sink is not None:
            sink.add(row)
        if log:
            log(f"{s.name}: batch size {pick.batch_size}, predicted {pred / mib:.2f} MiB, measured "
                f"{row['measured_step_peak_mib']} MiB, {row['s_per_batch']} s per batch")
    return rows
