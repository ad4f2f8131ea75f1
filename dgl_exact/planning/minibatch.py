"""Predict the memory of one neighbour-sampled mini-batch step, and the largest batch size within a budget.

A mini-batch is small, so nothing is extrapolated: the real graph's real sampler
(:class:`~dgl_exact.training.neighbor.NeighborSampler`) samples a few batches of the requested size, and the
real model takes one recorded training step (``forward on the blocks -> loss -> backward -> Adam step``) on
each under the full-graph planner's memory timeline (:class:`~dgl_exact.planning.timeline._Timeline`). The
step peak is the largest point over the sampled batches. Static memory is what lives across steps: the graph
(its created sparse formats), features, labels, parameters and Adam's state, plus the largest batch's own
data (input-node features, seed labels, the blocks' structure), which exists before its step starts.

:func:`largest_batch` searches the batch size, recording few sizes: the step peak is close to affine in the
sampled batch's elements (rows times widths, and edges: :func:`batch_elements`, sampling only), so a line
through the recorded peaks names the next size to record, until a size that fits and one at most
``tolerance`` larger that does not are recorded.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable, Dict, Optional, Sequence

import torch

from .. import memory
from .predict import PlanRecord, build_for, check_depth, loss_fn, single_thread, spec_from_graph
from .settings import Setting
from .timeline import _Timeline
from ..compression_config import config as compression_scope
from ..training.neighbor import NeighborSampler

__all__ = ["BatchPrediction", "MinibatchPlanner", "largest_batch", "batch_elements", "format_batch_table",
           "pick_training_batch"]

#: sampled batches per predicted batch size (the largest step peak of them is taken)
DEFAULT_BATCHES = 3


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


def _block_bytes(blocks) -> int:
    total = 0
    for b in blocks:
        item = 4 if b.idtype == torch.int32 else 8
        for fmt in b.formats()["created"]:
            total += item * (2 * b.num_edges() if fmt == "coo" else b.num_dst_nodes() + 1 + 2 * b.num_edges())
    return total


class MinibatchPlanner:
    """Per-batch memory predictions of neighbour-sampled training on ``dataset`` (a
    :class:`~dgl_exact.data.base.GraphDataset`) with ``model`` (sage or gcn; hyperparameters as
    :class:`~dgl_exact.planning.predict.PlanSpec`) and ``fanouts`` (one per layer)."""

    def __init__(self, dataset, model: str, fanouts: Sequence[int], num_batches: int = DEFAULT_BATCHES, seed: int = 0,
                 **hyper):
        if model not in ("sage", "gcn", "gat"):
            raise ValueError(f"--sampler neighbor plans sage, gcn or gat models (blocks), not {model}")
        check_depth(len(fanouts), 1, "the mini-batch planner")
        self.dataset, self.fanouts, self.num_batches, self.seed = dataset, list(fanouts), num_batches, seed
        hyper = {k: v for k, v in hyper.items() if v is not None}
        self.spec = spec_from_graph(dataset.graph, dataset.num_features, dataset.num_classes,
                                    len(dataset.train_idx), model, name=dataset.name, layers=len(self.fanouts),
                                    **{k: v for k, v in hyper.items() if k != "layers"})
        if hyper.get("layers") not in (None, len(self.fanouts)):
            raise ValueError(f"--layers {hyper['layers']} but {len(self.fanouts)} fan-outs: give one fan-out per "
                             f"layer")
        self._warm = set()
        self.last_activation_bytes = 0

    def sampler(self, batch_size: int) -> NeighborSampler:
        """The trainer's sampler at ``batch_size`` (seed nodes: the training split)."""
        return NeighborSampler(self.dataset.graph, self.fanouts, batch_size, seed=self.seed)

    def batches(self, batch_size: int, num_batches: Optional[int] = None) -> list:
        """The first :attr:`num_batches` batches of epoch 0 at ``batch_size``."""
        out = []
        for i, batch in enumerate(self.sampler(batch_size).iter_epoch(0)):
            if i >= (num_batches or self.num_batches):
                break
            out.append(batch)
        return out

    def _model(self, setting: Setting):
        model = build_for(self.spec, setting.impl, self.seed)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()  # Adam's state exists, as after a first step; the parameters do not move
        opt.zero_grad(set_to_none=True)
        return model, opt

    def _step(self, setting: Setting, batch, timeline: Optional[_Timeline]) -> int:
        """One training step on ``batch``; returns the bytes of the sparse formats DGL created for the blocks
        during the step (C++ allocations the timeline does not see)."""
        before = _block_bytes(batch.blocks)
        model, opt = self._model(setting)
        loss_of = loss_fn(setting.impl)
        feat, y = batch.node_data["feat"], batch.node_data["label"]
        idx = torch.arange(y.shape[0])
        with (compression_scope(setting.compression) if setting.compression else _null()):
            with (timeline if timeline is not None else _null()):
                with memory._saved_tensors() as saved:
                    logits = model(batch.blocks, feat)
                    loss = loss_of(logits, y, idx)
                self.last_activation_bytes, _ = memory._activation_bytes(saved, [model], [feat, y, idx],
                                                                         (loss, logits))
                del logits
                loss.backward()
                opt.step()
                del loss
        return _block_bytes(batch.blocks) - before

    def record(self, setting: Setting, batch_size: int, device_total: Optional[int] = None,
               num_batches: Optional[int] = None) -> PlanRecord:
        """``setting``'s :class:`PlanRecord` for one mini-batch step of ``batch_size`` seed nodes: the largest
        recorded step peak and the largest saved activations over the sampled batches."""
        with single_thread():
            if setting.impl not in self._warm:  # lazy initialisation outside any recorded step
                self._step(setting, self.batches(batch_size, 1)[0], None)
                self._warm.add(setting.impl)
            batches = self.batches(batch_size, num_batches)  # fresh blocks: no formats created by an earlier step
            peaks, acts = [], []
            for b in batches:
                timeline = _Timeline(touched=True)
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


def batch_elements(planner: MinibatchPlanner, batch_size: int) -> int:
    """What a step at ``batch_size`` is made of, in elements: over the blocks of the first sampled batch, each
    block's output rows times its input width (the aggregated neighbours: features at the first layer, the
    hidden width after) plus the hidden width (what the layer computes from them), and its edges. A block's
    input rows are the previous block's output rows, or the batch's input features, which are static memory
    (before the step), not step peak: they are left out (they also saturate sooner, as neighbourhoods
    overlap, and made the line overshoot). Sampling only, no step; cached on the planner. The step peak is
    close to affine in it, which :func:`largest_batch` uses to choose the batch sizes it records."""
    cache = planner.__dict__.setdefault("_elements", {})
    if batch_size not in cache:
        batch = next(iter(planner.sampler(batch_size).iter_epoch(0)))
        hidden, total = planner.spec.hidden_size, 0
        for i, block in enumerate(batch.blocks):
            width = planner.spec.features if i == 0 else hidden
            total += block.num_dst_nodes() * (width + hidden) + block.num_edges()
        cache[batch_size] = total
    return cache[batch_size]


def _batch_for(planner: MinibatchPlanner, target: float, lo: int, hi: int) -> int:
    """The largest batch size in ``[lo, hi]`` whose :func:`batch_elements` is at most ``target``: bisection on
    the sampled sizes (they grow with the batch size), about ``log2(hi - lo)`` samplings, cached."""
    if batch_elements(planner, hi) <= target:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if batch_elements(planner, mid) <= target:
            lo = mid
        else:
            hi = mid
    return lo


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
        if planner.num_batches <= 1:
            final = first[lo]
        else:
            t0 = time.perf_counter()
            final = planner.record(setting, lo)
            if log:
                log(f"{setting.name}: batch size {lo:,}: step peak {memory.format_bytes(final.step_peak_bytes)} "
                    f"over {planner.num_batches} sampled batches ({time.perf_counter() - t0:.1f} s)")
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
