"""Predict the memory of one neighbour-sampled mini-batch step, and the largest batch size within a budget.

A mini-batch is small, so nothing is extrapolated: the real graph's real sampler
(:class:`~dgl_exact.training.neighbor.NeighborSampler`) samples a few batches of the requested size, and the
real model takes one recorded training step (``forward on the blocks -> loss -> backward -> Adam step``) on
each under the full-graph planner's memory timeline (:class:`~dgl_exact.planning.timeline.Timeline`). The
step peak is the largest point over the sampled batches. Static memory is what lives across steps: the graph
(its created sparse formats), features, labels, parameters and Adam's state, plus the largest batch's own
data (input-node features, seed labels, the blocks' structure), which exists before its step starts.

:func:`largest_batch` searches the batch size on a model of the recorded steps, not by running a step at
every candidate: the step peak is close to affine in the sampled batch's elements (rows times widths, and
edges: :func:`batch_elements`, from sampled block sizes alone: no features gathered, no step), so a line
through the recorded peaks names the next size to record, until a size that fits and one at most
``tolerance`` larger that does not are bracketed, recorded or on the line. Of the pick's other sampled
batches only the one with the most elements is recorded (one step, not one per batch).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Dict, Optional, Sequence

import torch

from .. import memory
from .predict import PlanRecord, build_for, check_depth, loss_fn, single_thread, spec_from_graph
from .settings import Setting
from .timeline import Timeline
from ..compression_config import config as compression_scope
from ..training.neighbor import NeighborSampler
from ..training.workloads import PYG_MODELS

__all__ = ["BatchPrediction", "MinibatchPlanner", "largest_batch", "batch_elements", "format_batch_table",
           "pick_training_batch"]

#: sampled batches per predicted batch size (the largest step peak of them is taken)
DEFAULT_BATCHES = 3
#: the search's pick is recorded on its first sampled batch; another of its batches with more elements is
#: recorded too where the elements line puts its step peak more than this share above (else the line's rise
#: is added: a fraction of a percent, where the line's error is a fraction of that)
OTHER_BATCH_SHARE = 0.01
#: a recorded step of fewer :func:`batch_elements` runs in one thread (see :meth:`MinibatchPlanner.record`)
ONE_THREAD_ELEMENTS = 2**24


@dataclasses.dataclass
class BatchPrediction:
    """A setting's predicted largest batch size within ``budget`` and its :class:`PlanRecord`."""

    setting: str
    batch_size: int
    budget: int
    record: PlanRecord
    tried: Dict[int, int]   # batch size -> predicted step peak (bytes)

    def to_dict(self) -> Dict:
        d = {"setting": self.setting, "batch_size": self.batch_size, "budget": self.budget,
             "step_peak_bytes": self.record.step_peak_bytes, "tried": self.tried}
        d["record"] = self.record.to_dict()
        return d


@dataclasses.dataclass(frozen=True)
class SampledBatch:
    """A sampled batch's sizes: :func:`batch_elements`, input and seed nodes, and per block ``(source,
    destination, edges)``."""

    elements: int
    input_nodes: int
    seeds: int
    blocks: tuple


def _block_bytes(blocks) -> int:
    total = 0
    for b in blocks:
        item = 4 if b.idtype == torch.int32 else 8
        for fmt in b.formats()["created"]:
            total += item * (2 * b.num_edges() if fmt == "coo" else b.num_dst_nodes() + 1 + 2 * b.num_edges())
    return total


class MinibatchPlanner:
    """Per-batch memory predictions of neighbour-sampled training on ``dataset`` (a
    :class:`~dgl_exact.data.base.GraphDataset`) with ``model`` (sage, gcn, gat or a PyG model; hyperparameters as
    :class:`~dgl_exact.planning.predict.PlanSpec`) and ``fanouts`` (one per layer)."""

    def __init__(self, dataset, model: str, fanouts: Sequence[int], num_batches: int = DEFAULT_BATCHES, seed: int = 0,
                 **hyper):
        if model not in ("sage", "gcn", "gat") + PYG_MODELS:
            raise ValueError(f"--sampler neighbor plans sage, gcn, gat (blocks) or PyG models "
                             f"({', '.join(PYG_MODELS)}: the sampled subgraph), not {model}")
        check_depth(len(fanouts), 1, "the mini-batch planner")
        self.dataset, self.fanouts, self.num_batches, self.seed = dataset, list(fanouts), num_batches, seed
        hyper = {k: v for k, v in hyper.items() if v is not None}
        # symmetric=False: blocks are bipartite, and a spec's symmetry only shapes the full-graph planner's
        # sample graphs; the exact symmetry test reads every edge (minutes on a products-sized graph)
        self.spec = spec_from_graph(dataset.graph, dataset.num_features, dataset.num_classes,
                                    len(dataset.train_idx), model, name=dataset.name, layers=len(self.fanouts),
                                    symmetric=False, **{k: v for k, v in hyper.items() if k not in ("layers",
                                                                                                  "symmetric")})
        if hyper.get("layers") not in (None, len(self.fanouts)):
            raise ValueError(f"--layers {hyper['layers']} but {len(self.fanouts)} fan-outs: give one fan-out per "
                             f"layer")
        self._warm = set()
        self._sampled: Dict[tuple, SampledBatch] = {}
        self.last_activation_bytes = 0

    def sampler(self, batch_size: int) -> NeighborSampler:
        """The trainer's sampler at ``batch_size`` (seed nodes: the training split)."""
        return NeighborSampler(self.dataset.graph, self.fanouts, batch_size, seed=self.seed)

    def batches(self, batch_size: int, num_batches: Optional[int] = None, start: int = 0) -> list:
        """Batches ``start, start + 1, ...`` of epoch 0 at ``batch_size``, up to batch :attr:`num_batches`
        (``num_batches`` counts from the first batch of the epoch)."""
        out = []
        for i, batch in enumerate(self.sampler(batch_size).iter_epoch(0, start=start), start):
            if i >= (num_batches or self.num_batches):
                break
            out.append(batch)
        return out

    def sampled(self, batch_size: int, index: int = 0) -> "SampledBatch":
        """The sizes of batch ``index`` of epoch 0 at ``batch_size`` (the batch :meth:`batches` yields there),
        from sampling alone (no features gathered, no step); cached."""
        key = (int(batch_size), int(index))
        if key not in self._sampled:
            inp, seeds, blocks = self.sampler(batch_size).blocks_of(0, index)
            self._remember(key, int(inp.numel()), int(seeds.numel()), blocks)
        return self._sampled[key]

    def _remember(self, key: tuple, input_nodes: int, seeds: int, blocks) -> None:
        hidden, elements = self.spec.hidden_size, 0
        for i, block in enumerate(blocks):
            width = self.spec.features if i == 0 else hidden
            elements += block.num_dst_nodes() * (width + hidden) + block.num_edges()
        self._sampled[key] = SampledBatch(elements, input_nodes, seeds, tuple(
            (b.num_src_nodes(), b.num_dst_nodes(), b.num_edges()) for b in blocks))

    def num_sampled(self, batch_size: int) -> int:
        """How many batches :meth:`record` samples at ``batch_size`` (fewer where the epoch has fewer)."""
        return min(self.num_batches, -(-self.max_batch_size // int(batch_size)))

    def _model(self, setting: Setting):
        model = build_for(self.spec, setting.impl, self.seed)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()  # Adam's state exists, as after a first step; the parameters do not move
        opt.zero_grad(set_to_none=True)
        return model, opt

    def _step(self, setting: Setting, batch, timeline: Optional[Timeline]) -> int:
        """One training step on ``batch``; returns the bytes of the sparse formats DGL created for the blocks
        during the step (C++ allocations the timeline does not see)."""
        before = _block_bytes(batch.blocks)
        model, opt = self._model(setting)
        loss_of = loss_fn(setting.impl)
        feat, y = batch.node_data["feat"], batch.node_data["label"]
        idx = torch.arange(y.shape[0])
        with (compression_scope(setting.compression) if setting.compression else _null()):
            with (timeline if timeline is not None else _null()):
                with memory.saved_storages() as saved:
                    logits = model(batch.blocks, feat)
                    loss = loss_of(logits, y, idx)
                self.last_activation_bytes, _ = memory.activation_bytes(saved, [model], [feat, y, idx],
                                                                         (loss, logits))
                del logits
                loss.backward()
                opt.step()
                del loss
        return _block_bytes(batch.blocks) - before

    def record(self, setting: Setting, batch_size: int, device_total: Optional[int] = None,
               num_batches: Optional[int] = None, index: Optional[int] = None) -> PlanRecord:
        """``setting``'s :class:`PlanRecord` for one mini-batch step of ``batch_size`` seed nodes: the largest
        recorded step peak and the largest saved activations over the sampled batches (the first
        ``num_batches``, default :attr:`num_batches`; or batch ``index`` alone)."""
        if setting.impl not in self._warm:  # lazy initialisation outside any recorded step
            with single_thread():
                self._step(setting, self.batches(batch_size, 1)[0], None)
            self._warm.add(setting.impl)
        # fresh blocks: no formats created by an earlier step
        start = 0 if index is None else index
        batches = self.batches(batch_size, num_batches if index is None else index + 1, start=start)
        for i, b in enumerate(batches, start):  # their sizes, for the search: no sampling again
            self._remember((int(batch_size), i), b.node_data["feat"].shape[0], b.node_data["label"].shape[0],
                           b.blocks)
        peaks, acts = [], []
        for i, b in enumerate(batches, start):
            timeline = Timeline(touched=True)
            # one thread is faster for a small step (no waiting on a descheduled worker per small operator);
            # a large one computes for seconds: all threads (the recorded tensors do not depend on them)
            small = self.sampled(batch_size, i).elements < ONE_THREAD_ELEMENTS
            with (single_thread() if small else _null()):
                formats = self._step(setting, b, timeline)
            peaks.append(max([0] + timeline.totals) + formats)
            acts.append(self.last_activation_bytes)
        model, opt = self._model(setting)
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        state = memory.tensor_bytes([t for st in opt.state.values() for t in st.values()
                                     if isinstance(t, torch.Tensor)])
        g = self.dataset.graph
        item = 4 if g.idtype == torch.int32 else 8
        big = max(batches, key=lambda b: b.node_data["feat"].numel())
        breakdown = {
            "graph_bytes": sum(item * (2 * g.num_edges() if f == "coo" else g.num_nodes() + 1 + 2 * g.num_edges())
                               for f in g.formats()["created"]),
            "feature_bytes": memory.tensor_bytes([g.ndata["feat"]]),
            "label_bytes": memory.tensor_bytes([g.ndata["label"]]) + len(self.dataset.train_idx) * 8,
            "parameter_bytes": params,
            "optimizer_bytes": state,
            "batch_bytes": memory.tensor_bytes(big.node_data.values()) + _block_bytes(big.blocks),
        }
        static, peak = sum(breakdown.values()), max(peaks)
        total = static + peak
        fits = None if device_total is None else total <= device_total
        note = "blocks per layer (src, dst, edges), largest batch: " + "; ".join(
            f"{b.num_src_nodes()}, {b.num_dst_nodes()}, {b.num_edges()}" for b in big.blocks)
        return PlanRecord(setting.name, static, max(acts), peak, total, fits, device_total,
                          setting.compression.describe() if setting.compression else "none (plain autograd)",
                          breakdown, note)

    @property
    def max_batch_size(self) -> int:
        """The largest batch size that means anything: all training nodes in one batch."""
        return len(self.dataset.train_idx)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def refuse_recompute(settings: Sequence[Setting]) -> None:
    """Mini-batch steps run on sampled blocks; the recompute mode is GCNII's, which needs whole graphs."""
    for s in settings:
        if s.recompute:
            raise ValueError(f"{s.name!r}: recompute is GCNII's, which trains on whole graphs, not on sampled "
                             "blocks (plan it with --sampler full)")


def batch_elements(planner: MinibatchPlanner, batch_size: int, index: int = 0) -> int:
    """What a step at ``batch_size`` is made of, in elements: over the blocks of sampled batch ``index``
    (default the first), each block's output rows times its input width (the aggregated neighbours: features
    at the first layer, the hidden width after) plus the hidden width (what the layer computes from them), and
    its edges. A block's input rows are the previous block's output rows, or the batch's input features, which
    are static memory (before the step), not step peak: they are left out (they also saturate sooner, as
    neighbourhoods overlap, and made the line overshoot). Sampling only, no step, no features gathered
    (:meth:`MinibatchPlanner.sampled`, cached). The step peak is close to affine in it, which
    :func:`largest_batch` uses to choose the batch sizes it records."""
    return planner.sampled(batch_size, index).elements


def _batch_for(planner: MinibatchPlanner, target: float, lo: int, hi: int, resolution: float = 0.02) -> int:
    """About the largest batch size in ``[lo, hi]`` whose :func:`batch_elements` is at most ``target``, to
    within ``resolution`` (relative; the target is itself a line's estimate, and the search's tolerance is
    larger). The elements grow with the batch size as a slowly bending power (neighbourhoods overlap): sizes
    sampled before (by this or another setting's search, or recorded) narrow the bracket; without a size known
    above the target, the log-log line through the two largest sampled sizes (slope 1 with one) names a size
    a little past the target, sampled next (never ``hi`` itself unless named: sampling all training nodes is
    the costliest sampling there is); then the next size is interpolated between the bracket's ends on a
    log-log line (regula falsi), kept a sixteenth of the bracket inside it. A few samplings, each cached."""
    def elements(b: int) -> int:
        return batch_elements(planner, b)

    if lo >= hi or elements(lo) > target:
        return lo
    upper = None
    for b in sorted(b for (b, i) in _sampled_keys(planner) if i == 0 and lo < b <= hi):
        if elements(b) <= target:
            lo = b
        else:
            upper = b
            break
    while upper is None:  # extrapolate past the target, step by step
        below = sorted(b for (b, i) in _sampled_keys(planner) if i == 0 and b <= lo)[-2:]
        slope = 1.0
        if len(below) == 2 and elements(below[0]) > 0 and elements(below[1]) > elements(below[0]):
            slope = math.log(elements(below[1]) / elements(below[0])) / math.log(below[1] / below[0])
        slope = min(max(slope, 0.05), 1.0)
        guess = lo * (target / max(1, elements(lo))) ** (1 / slope) * (1 + 4 * resolution)
        b = int(min(hi, max(lo + 1, guess)))
        if elements(b) <= target:
            if b >= hi:
                return hi
            lo = b
        else:
            upper = b
    hi = upper
    while hi - lo > max(1, int(lo * resolution)):
        e_lo, e_hi = elements(lo), elements(hi)
        if e_lo > 0 and e_hi > e_lo and target > 0:
            frac = math.log(target / e_lo) / math.log(e_hi / e_lo)
            guess = math.exp(math.log(lo) + frac * math.log(hi / lo))
        else:
            guess = (lo + hi) / 2
        margin = max(1, (hi - lo) // 16)
        mid = int(min(max(guess, lo + margin), hi - margin))
        if elements(mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo


def _sampled_keys(planner) -> list:
    """The ``(batch size, index)`` pairs whose sizes ``planner`` has sampled (none for a planner without a
    cache)."""
    return list(getattr(planner, "_sampled", {}))


def _line(planner: MinibatchPlanner, tried: Dict[int, PlanRecord], budget: int):
    """``(x0, y0, slope, sizes)``: the line of step peak against :func:`batch_elements` through the two recorded
    batch sizes whose peaks are nearest ``budget`` (``x0, y0``: the nearer); None with fewer than two or a line
    that does not rise."""
    near = sorted(tried, key=lambda b: abs(tried[b].step_peak_bytes - budget))[:2]
    if len(near) < 2:
        return None
    xs = [batch_elements(planner, b) for b in near]
    ys = [tried[b].step_peak_bytes for b in near]
    if xs[0] == xs[1] or (ys[1] - ys[0]) / (xs[1] - xs[0]) <= 0:
        return None
    return xs[0], ys[0], (ys[1] - ys[0]) / (xs[1] - xs[0]), tuple(near)


def _search(planner: MinibatchPlanner, budget: float, tolerance: float, peak: Callable[[int], int],
            tried: Dict[int, PlanRecord], max_steps: int) -> int:
    """The largest batch size that fits ``budget`` found by recording few sizes (see :func:`largest_batch`);
    ``peak(b)`` records size ``b`` into ``tried`` (sizes already there are not recorded again)."""
    top = planner.max_batch_size
    lo = max([b for b in tried if tried[b].step_peak_bytes <= budget], default=1)
    over = [b for b in tried if tried[b].step_peak_bytes > budget and b > lo]
    hi = min(over) if over else None   # lo fits; hi (None: none known) does not
    steps = 0
    while steps < max_steps:
        step = max(1, int(lo * tolerance))
        if lo >= top or (hi is not None and hi - lo <= step):
            break
        line = _line(planner, tried, budget)
        if line is not None and lo in line[3] and lo + step <= top:
            x0, y0, slope, _ = line  # the line through lo says one step more does not fit: stop on it
            if y0 + slope * (batch_elements(planner, lo + step) - x0) > budget:
                break
        upper = top if hi is None else hi - 1
        # aim a quarter tolerance below the budget: a size the line puts exactly at the budget lands over it
        # about half the time (sampling noise), and each landing over costs one more record
        aim = budget * (1 - tolerance / 4)
        if line is not None:
            x0, y0, slope, _ = line
            target = x0 + (aim - y0) / slope
        else:  # one recorded size: peaks proportional to the elements (overshoots no batch size)
            x0 = batch_elements(planner, lo)
            target = x0 * aim / max(1, tried[lo].step_peak_bytes)
        guess = _batch_for(planner, target, lo, upper)
        low_end, high_end = lo + step, upper - step if hi is not None else upper
        b = min(max(guess, low_end), max(low_end, high_end), upper)
        steps += 1
        if peak(b) <= budget:
            lo = b
        else:
            hi = b
    return lo


def largest_batch(planner: MinibatchPlanner, setting: Setting, budget: int, tolerance: float = 0.05,
                  log: Optional[Callable[[str], None]] = None, max_steps: int = 12) -> BatchPrediction:
    """The largest batch size whose predicted step peak (:meth:`MinibatchPlanner.record`, recorded steps on
    all the planner's sampled batches) is at most ``budget`` bytes, to within ``tolerance`` (relative): a batch
    size that fits and one at most ``tolerance`` larger that does not, recorded or on the line below (or all
    training nodes).

    The search records few batch sizes, each on its first sampled batch only: the step peak is close to
    affine in the sampled batch's elements (:func:`batch_elements`, sampling only), so the line through the
    two recorded peaks nearest the budget (one recorded peak: proportional to the elements, which overshoots
    no batch size) names the batch size to record next; it is kept strictly inside the bracket, so the search
    ends, within ``max_steps`` records. Where that line, through the largest size that fits, puts the size
    ``tolerance`` larger over the budget, the search stops without recording it. The pick is then recorded on
    all the sampled batches; where another batch needs more than the first, the search goes on with the
    budget scaled down by the ratio (a few times at most). ValueError saying what to do when even batch size 1
    does not fit."""
    first: Dict[int, PlanRecord] = {}

    def peak(b: int) -> int:
        if b not in first:
            t0 = time.perf_counter()
            first[b] = planner.record(setting, b, num_batches=1)
            if log:
                log(f"{setting.name}: batch size {b:,}: step peak {memory.format_bytes(first[b].step_peak_bytes)} "
                    f"({time.perf_counter() - t0:.1f} s)")
        return first[b].step_peak_bytes

    def too_large(needed: int):
        return ValueError(f"{setting.name}: even batch size 1 needs a step peak of {memory.format_bytes(needed)}, "
                          f"more than the budget {memory.format_bytes(budget)}; give a larger --memory-budget")

    if peak(1) > budget:
        raise too_large(peak(1))
    target, final = float(budget), None
    for _ in range(4):
        lo = _search(planner, target, tolerance, peak, first, max_steps)
        final = first[lo]
        count = planner.num_sampled(lo)
        if count > 1:
            # of the pick's other sampled batches, the one with the most elements: where the line puts it more
            # than OTHER_BATCH_SHARE above the first, it is recorded (one step); else the line's rise is added
            elements = [batch_elements(planner, lo, i) for i in range(count)]
            largest = max(range(count), key=elements.__getitem__)
            if largest != 0 and elements[largest] > elements[0]:
                line = _line(planner, first, budget)
                slope = line[2] if line is not None else final.step_peak_bytes / max(1, elements[0])
                rise = int(math.ceil(slope * (elements[largest] - elements[0])))
                t0 = time.perf_counter()
                if rise > OTHER_BATCH_SHARE * final.step_peak_bytes:
                    final = _larger(final, planner.record(setting, lo, index=largest))
                    how = f"batch {largest + 1}, the most elements, recorded: {time.perf_counter() - t0:.1f} s"
                else:
                    final = _raised(final, rise)
                    how = (f"batch {largest + 1} has {elements[largest] / elements[0] - 1:.2%} more elements: "
                           f"+{memory.format_bytes(rise)} on the line")
            else:
                how = "the first has the most elements"
            if log:
                log(f"{setting.name}: batch size {lo:,}: step peak {memory.format_bytes(final.step_peak_bytes)} "
                    f"over {count} sampled batches ({how})")
        if final.step_peak_bytes <= budget:
            break
        if lo == 1:
            raise too_large(final.step_peak_bytes)
        # another sampled batch needs more than the first: fit the first batches to a budget scaled by the ratio
        target = min(target * first[lo].step_peak_bytes / final.step_peak_bytes, first[lo].step_peak_bytes - 1)
        final = None
    if final is None:
        raise ValueError(f"{setting.name}: no batch size found whose sampled batches all fit "
                         f"{memory.format_bytes(budget)}; give a larger --memory-budget")
    sizes = {b: r.step_peak_bytes for b, r in sorted(first.items())}
    sizes[lo] = final.step_peak_bytes
    if log:
        log(f"{setting.name}: batch size {lo:,} (step peak {memory.format_bytes(final.step_peak_bytes)} of "
            f"{memory.format_bytes(budget)}; {len(first)} batch sizes recorded)")
    return BatchPrediction(setting.name, lo, budget, final, sizes)


def _raised(record: PlanRecord, rise: int) -> PlanRecord:
    """``record`` with ``rise`` bytes more step peak (and total)."""
    total = record.total_bytes + rise
    fits = None if record.device_bytes is None else total <= record.device_bytes
    return dataclasses.replace(record, step_peak_bytes=record.step_peak_bytes + rise, total_bytes=total, fits=fits)


def _larger(a: PlanRecord, b: PlanRecord) -> PlanRecord:
    """One record for the step peak over two sampled batches: the larger step peak and saved activations,
    and the larger batch's data as static memory."""
    big, small = (a, b) if a.step_peak_bytes >= b.step_peak_bytes else (b, a)
    if not big.breakdown or not small.breakdown:
        return big
    breakdown = dict(big.breakdown)
    breakdown["batch_bytes"] = max(big.breakdown.get("batch_bytes", 0), small.breakdown.get("batch_bytes", 0))
    static = sum(breakdown.values())
    total = static + big.step_peak_bytes
    fits = None if big.device_bytes is None else total <= big.device_bytes
    return dataclasses.replace(big, static_bytes=static, activation_bytes=max(a.activation_bytes,
                                                                             b.activation_bytes),
                               total_bytes=total, fits=fits, breakdown=breakdown)


def format_batch_table(rows: Sequence[BatchPrediction]) -> str:
    """Markdown: setting, largest batch size, its predicted step peak, the budget."""
    fb = memory.format_bytes
    lines = ["| setting | batch size | predicted step peak | budget |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.setting} | {r.batch_size:,} | {fb(r.record.step_peak_bytes)} | {fb(r.budget)} |")
    return "\n".join(lines)


def pick_training_batch(dataset, cfg, budget: int, log: Optional[Callable[[str], None]] = None) -> BatchPrediction:
    """``dgl-exact train --sampler neighbor --batch-size auto --memory-budget SIZE``: the largest batch of the
    run described by ``cfg`` (a :class:`~dgl_exact.training.config.TrainConfig`: model, layers, hidden width,
    dropout, batch norm, heads, fan-outs, compression) whose predicted step peak fits ``budget`` bytes, searched
    by :func:`largest_batch` on sampled batches of ``dataset``'s graph. ValueError where even one seed node does
    not fit or the model has no block form."""
    planner = MinibatchPlanner(dataset, cfg.model, cfg.neighbor_fanouts(), seed=cfg.seed, hidden=cfg.hidden,
                               dropout=cfg.dropout, batch_norm=cfg.batch_norm, heads=cfg.heads)
    setting = Setting(cfg.compression.describe(), "exact", cfg.compression)
    return largest_batch(planner, setting, budget, log=log)
