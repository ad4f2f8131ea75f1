"""GCNII's fused stack (:mod:`dgl_exact.ops.gcn2`) in recomputed segments: "INT2 + recompute" at the fused
stack's two-buffer peak.

:func:`gcnii_layers_recomputed` computes what :func:`dgl_exact.ops.gcn2.gcnii_layers` computes (the hidden
layers and the output linear as one autograd Function), but keeps for backward only

* ``h0``, once (compressed unless it is alive anyway: :func:`.keep.as_kept`),
* each segment's input boundary (the output of the layer before it, compressed under that layer's
  configuration; the first segment's input is ``dropout(h0)``, redrawn from ``h0``),
* the dropout seeds of every layer (two integers per row chunk) and the last layer's output for the
  output linear's weight gradient, as the fused stack does.

The forward runs every layer through the fused stack's own layer loop (``gcn2.layer_forward``) keeping
nothing. The backward walks the segments from the last: it decodes the segment's boundary into a buffer
of its own, runs the segment's layers forward again with the same loop, keeping what the fused stack
keeps for those layers only, and runs their backward in place in the one gradient buffer
(``gcn2.layers_backward``), summing the ``h0`` gradient in a second. ``h0`` is decoded row chunk by row
chunk where the layers read it, never whole. Besides the kept tensors the backward holds three
layer-sized blocks at most (the gradient, the ``h0`` gradient and the segment's recompute buffer), the
forward two (``h0`` and the layers' buffer).

**The input layer folded in** (``stem``). GCNII's initial representation is ``h0 = relu(dropout(x) W_in^T +
b_in)``. Given that layer (:class:`StemArgs`), the stack computes ``h0`` itself from the features ``x``
and never forms ``h0``'s gradient: every contribution to it (``alpha`` times each layer's mix gradient, and
the first layer's input gradient) is summed, row chunk by row chunk, straight into ``W_in``'s and ``b_in``'s
gradients through the ReLU's mask and the dropout mask of ``x`` (one bit per element each, packed in
the forward: ``N * in_feats / 8`` bytes). The backward then holds two layer-sized blocks, not three, at
the price of one ``[in_feats, N] x [N, hidden]`` product per layer (where the modules do it once), which is
why :func:`dgl_exact.nn.gcnii_stack` folds the input layer in only where ``in_feats <= hidden``. ``x`` is
kept as the input layer keeps it (itself where it is alive anyway, as the features are; else compressed),
so ``W_in``'s gradient reads ``dropout(x)`` exactly where the modules read a compressed copy of it: the
same expectation, less noise. The forward (and ``h0``) equals the modules' bit for bit: the dropout mask
of ``x`` is drawn as
:func:`dgl_exact.ops.dropout` draws it.

**What the backward approximates.** The forward is exact. The recompute starts from the decoded boundary
``x_hat = x + e`` and decoded ``h0`` (``e``: the quantisation error, zero mean under stochastic rounding),
so the activations the segment's backward reads are those of ``x_hat``: batch-norm statistics, ReLU masks
(they may flip where ``|pre-activation|`` is within the propagated error) and the kept ``s`` and ``o``
differ from the forward's, and the layers are nonlinear in ``e``: the gradient is biased, more so for long
segments. With a boundary kept exactly (compression off) the recomputed activations equal the forward's
bit for bit and the gradients equal the fused stack's. The dropout masks are the forward's (its seeds are
replayed). The compression inside a recomputed segment draws its rounding noise from a stream of its own
(one seed per segment, drawn in the forward): independent of the noise of the boundaries, of ``h0`` and of
the other segments, and the same on every backward of the step (``retain_graph``). Torch's global
generator is left as it was. Batch norm's running statistics are updated once, in the forward.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .. import kernels
from ..compression import draw_seed, seed_stream
from ..compression_config import CompressionConfig
from .gcn2 import GCN2Layer, layer_forward, row_ranges, degree_norm, layers_backward
from .keep import as_kept, restore
from .chunks import row_chunks, weight_grad
from .double_backward import refuse_double_backward
from .saved import load_kept, save_kept
from .function import Function

__all__ = ["StemArgs", "gcnii_layers_recomputed", "segments_of"]


@dataclasses.dataclass(frozen=True)
class StemArgs:
    """GCNII's input layer ``h0 = relu(dropout(x, dropout) weight^T + bias)`` folded into the recomputed
    stack (see the module docstring); ``bias`` may be None; ``config``: how ``x`` is kept."""

    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    dropout: float
    config: CompressionConfig


def segments_of(n_layers: int, length: int) -> List[Tuple[int, int]]:
    """``[start, end)`` of consecutive segments of ``length`` layers (the last may be shorter)."""
    if length < 1:
        raise ValueError(f"segment length must be >= 1, got {length}")
    return [(s, min(n_layers, s + length)) for s in range(0, n_layers, length)]


class _KeptRows:
    """Row slices ``[r0:r1]`` of a kept ``[N, D]`` item, decoded chunk by chunk (:func:`.chunks.row_chunks`) as
    they are read: a compressed ``h0`` is never decoded whole. Reads in increasing row order are cheap (one
    decoded chunk is held); a read before the held chunk starts the chunks again."""

    def __init__(self, item, dtype, device):
        self.item, self.dtype, self.device = item, dtype, device
        self.shape = tuple(item.shape)
        self._chunks, self._held = None, []   # held: [(r0, r1, rows)], at most the chunks of one read

    def __getitem__(self, sl: slice) -> torch.Tensor:
        r0, r1 = sl.start, sl.stop
        if isinstance(self.item, torch.Tensor):
            return self.item[r0:r1]
        if not self._held or r0 < self._held[0][0]:
            self._chunks, self._held = row_chunks(self.item), []
        self._held = [c for c in self._held if c[1] > r0]
        while not self._held or self._held[-1][1] < r1:
            self._held.append(next(self._chunks))
            self._held = [c for c in self._held if c[1] > r0]
        parts = [rows[max(r0, c0) - c0:min(r1, c1) - c0] for c0, c1, rows in self._held if c0 < r1]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.to(self.dtype)


def _no_running_stats(bn):
    """A recompute's batch norm: batch statistics, running statistics left alone (updated in the forward)."""
    if bn is None or not bn.batch_stats:
        return bn
    return dataclasses.replace(bn, running_mean=None, running_var=None)


@dataclasses.dataclass(frozen=True)
class _Plan:
    steps: tuple
    bns: tuple
    cfgs: tuple
    segments: tuple
    stem_dropout: Optional[float] = None   # None: no input layer folded in (h0 given)
    stem_config: Optional[CompressionConfig] = None


def _stem_forward(x, w, b, p: float):
    """``h0 = relu(dropout(x, p) w^T + b)`` in a new buffer, the dropout seed drawn as
    :func:`dgl_exact.ops.dropout` draws it. Returns ``(h0, relu masks, dropout masks)``, one packed mask per
    row chunk of ``h0`` each (no dropout masks where ``p == 0``). A dropout mask's bit is ``dropout(x) !=
    0``: ``masked_scale(x, bit, 1 / (1 - p), 0)`` is then ``dropout(x)`` bit for bit for finite ``x`` (where
    ``x == 0`` the bit does not matter), read in the backward without drawing the mask again."""
    xd = x
    if p > 0:
        xd = kernels.get("dropout", x.device)(x.contiguous(), p, draw_seed())
    h0 = F.linear(xd, w, b)
    ranges = row_ranges(h0)
    pack = kernels.get("pack_mask", x.device)
    drop_masks = [pack(xd[r0:r1] != 0) for r0, r1 in ranges] if p > 0 else []
    del xd
    relu_ = kernels.get("relu_dropout_inplace", h0.device)
    masks = [relu_(h0[r0:r1], 0.0, 0) for r0, r1 in ranges]
    return h0, masks, drop_masks


class _StemGradient:
    """Stands where the ``h0`` gradient accumulator stands in :func:`.gcn2.layers_backward` (it is only ever
    ``add_``-ed to) and sums each contribution into the input layer's weight and bias gradients instead,
    row chunk by row chunk: ``d pre = relu_mask * alpha g``, ``dW += d_pre^T dropout(x)``, ``db += sum
    d_pre``. Nothing ``[N, D]``-sized is allocated."""

    def __init__(self, x_rows, p: float, masks: list, drop_masks: list, ranges: list, need_w: bool,
                 need_b: bool):
        self.x_rows, self.p, self.masks, self.drop_masks, self.ranges = x_rows, p, masks, drop_masks, ranges
        self.need_w, self.need_b = need_w, need_b
        self.gw = self.gb = None

    def add_(self, g: torch.Tensor, alpha: float = 1.0) -> "_StemGradient":
        masked_scale = kernels.get("masked_scale", g.device)
        for j, (r0, r1) in enumerate(self.ranges):
            d = masked_scale(g[r0:r1], self.masks[j], float(alpha), 0.0)
            if self.need_w:
                x = self.x_rows[r0:r1]
                if self.p > 0:   # dropout(x) from the forward's mask (see _stem_forward)
                    x = masked_scale(x.contiguous(), self.drop_masks[j], 1.0 / (1.0 - self.p), 0.0)
                part = d.t().matmul(x)
                self.gw = part if self.gw is None else self.gw.add_(part)
            if self.need_b:
                part = d.sum(0)
                self.gb = part if self.gb is None else self.gb.add_(part)
        return self

class _GCNIIRecomputed(Function):
    """The fused GCNII stack keeping only segment boundaries (see the module docstring). Every layer-sized
    buffer written in place is allocated inside it (keep.py, rule 2): the layers' buffer in the forward, and
    in the backward the gradient ``g W_out``, the ``h0`` gradient and each segment's decoded boundary."""

    @staticmethod
    def forward(ctx, h0, norm, head_w, head_b, stem_w, stem_b, st, plan: _Plan, head_cfg, *params):
        needs = ctx.needs_input_grad
        stem = None
        if plan.stem_dropout is not None:   # h0 is the features x: the input layer runs here
            x_in = h0
            h0, masks, drop_masks = _stem_forward(x_in, stem_w, stem_b, plan.stem_dropout)
            stem = (as_kept(x_in, plan.stem_config), masks + drop_masks, row_ranges(h0))
        # read by every recompute; never written (made here when the input layer is folded in: compressed)
        kept_h0 = as_kept(h0, plan.cfgs[0], force=stem is not None)
        x, boundaries, seeds, records = None, [], [], []
        for s, e in plan.segments:
            # the layers' buffer is overwritten below: an exactly kept boundary is a copy (keep.py, rule 3)
            boundaries.append(None if x is None else as_kept(x, plan.cfgs[s], force=True, overwritten=True))
            seeds.append(draw_seed())   # the segment's own stream for its recompute's compression
            for i in range(s, e):
                w1, b, bw, bb = params[4 * i:4 * i + 4]
                x, _, rec = layer_forward(x, h0, w1, b, bw, bb, st, norm, plan.steps[i], plan.bns[i],
                                           plan.cfgs[i], False, keep=False)
                records.append(rec)
        logits = F.linear(x, head_w, head_b)
        kept_head = as_kept(x, head_cfg, force=True) if needs[2] else None
        del x
        ctx.st, ctx.plan, ctx.records, ctx.seeds = st, plan, records, seeds
        ctx.has_head_bias, ctx.h0_meta = head_b is not None, (h0.dtype, h0.device)
        ctx.stem_meta = None if stem is None else stem[2]   # the row chunks: one ReLU and one dropout mask each
        stem_masks = [] if stem is None else stem[1]
        ctx.n_params = len(params)
        del h0
        save_kept(ctx, norm, head_w, kept_head, kept_h0, None if stem is None else stem[0], stem_w, *boundaries,
                  *params, *stem_masks)
        return logits

    @staticmethod
    def backward(ctx, grad):
        refuse_double_backward("the recomputed GCNII stack")
        plan, records = ctx.plan, ctx.records
        n_seg = len(plan.segments)
        norm, head_w, kept_head, kept_h0, kept_x, stem_w, *rest = load_kept(ctx)
        boundaries, params, masks = rest[:n_seg], rest[n_seg:n_seg + ctx.n_params], rest[n_seg + ctx.n_params:]
        needs = ctx.needs_input_grad
        g_head_w = g_head_b = None
        if needs[2]:
            g_head_w = weight_grad(grad, kept_head)
        if ctx.has_head_bias and needs[3]:
            g_head_b = grad.sum(0)
        param_needs = needs[9:]
        param_grads: list = [None] * len(params)
        gh0 = sink = None
        need_h0 = needs[0]
        if ctx.stem_meta is not None:   # the h0 gradient goes straight into the input layer's (see above)
            need_h0 = needs[4] or needs[5]
            ranges = ctx.stem_meta
            if need_h0:
                gh0 = sink = _StemGradient(_KeptRows(kept_x, stem_w.dtype, stem_w.device), plan.stem_dropout,
                                           masks[:len(ranges)], masks[len(ranges):], ranges, needs[4], needs[5])
        if need_h0 or any(param_needs):
            h0 = _KeptRows(kept_h0, *ctx.h0_meta)
            g = grad.matmul(head_w.to(grad.dtype))  # allocated here: the loops may write it (rule 2)
            for k in range(n_seg - 1, -1, -1):
                s, e = plan.segments[k]
                # a buffer of its own: the decoded copy, or a copy of an exactly kept boundary
                x = None if boundaries[k] is None else (
                    boundaries[k].clone() if isinstance(boundaries[k], torch.Tensor) else restore(boundaries[k]))
                seg_records: list = [None] * e
                seg_items: list = [None] * e
                with seed_stream(ctx.seeds[k]):   # the compression's noise: a stream of the segment's own
                    for i in range(s, e):
                        w1, b, bw, bb = params[4 * i:4 * i + 4]
                        x, items, rec = layer_forward(x, h0, w1, b, bw, bb, ctx.st, norm, plan.steps[i],
                                                       _no_running_stats(plan.bns[i]), plan.cfgs[i],
                                                       param_needs[4 * i], replay=records[i])
                        seg_records[i], seg_items[i] = rec, items
                del x
                g, gh0 = layers_backward(ctx.st, norm, g, gh0, seg_records, seg_items, range(e - 1, s - 1, -1),
                                         need_h0, param_needs, param_grads)
                del seg_items
                if g is None:
                    break
            del g
        if sink is not None:
            return (None, None, g_head_w, g_head_b, sink.gw, sink.gb, None, None, None, *param_grads)
        return (gh0, None, g_head_w, g_head_b, None, None, None, None, None, *param_grads)


def gcnii_layers_recomputed(st, h0: torch.Tensor, layers: Sequence[GCN2Layer], head_weight: torch.Tensor,
                            head_bias: Optional[torch.Tensor], head_config: CompressionConfig,
                            segment: int, stem: Optional[StemArgs] = None) -> torch.Tensor:
    """:func:`dgl_exact.ops.gcn2.gcnii_layers` (same arguments, same logits) keeping only ``h0``, every
    ``segment``-th layer's input and the dropout seeds; the backward re-runs each segment of ``segment``
    layers from its kept input (see the module docstring for what it then approximates). Double backward
    raises. ``stem``: the input layer folded in; ``h0`` is then its input ``x`` (which must not need a
    gradient) and the stack computes ``h0 = relu(dropout(x) W^T + b)`` (see the module docstring)."""
    if stem is not None and h0.requires_grad:
        raise ValueError("gcnii_layers_recomputed: with a stem, x must not need a gradient")
    if not layers:
        raise ValueError("gcnii_layers_recomputed needs at least one layer")
    if any(layer.bn is not None and layer.bn.batch_stats and h0.shape[0] < 2 for layer in layers):
        raise ValueError("Expected more than 1 value per channel when training (batch norm over 1 row)")
    norm = degree_norm(st, h0.dtype)
    params: list = []
    for layer in layers:
        bn = layer.bn
        params += [layer.weight1, layer.bias, None if bn is None else bn.weight, None if bn is None else bn.bias]
    plan = _Plan(tuple(layer.step for layer in layers), tuple(layer.bn for layer in layers),
                 tuple(layer.config for layer in layers), tuple(segments_of(len(layers), segment)),
                 None if stem is None else float(stem.dropout), None if stem is None else stem.config)
    return _GCNIIRecomputed.apply(h0, norm, head_weight, head_bias, None if stem is None else stem.weight,
                                  None if stem is None else stem.bias, st, plan, head_config, *params)
