"""GCNII's hidden layers and output linear as one op: two layer-sized buffers at the step's peak, not three.

A GCNII hidden layer (``GCN2Conv`` with ``project_initial_features``, then BatchNorm, ReLU and dropout) is

    a = (1 - alpha) D^-1/2 A D^-1/2 x        (propagation; D: in-degrees)
    s = a + alpha h0                           (kept: the weight gradient reads it)
    o = (1 - beta) s + beta s W + b
    y = dropout(relu(BN(o)))                   (BN keeps o; ReLU and dropout keep one bit per element)

Composed from separate ops, each step allocates its output while its input is alive, and the layer's
input is alive in the caller's frame: the forward holds ``h0``, the input and a new buffer (three
``[N, D]`` blocks), and so does the backward (the ``h0`` gradient accumulator, the incoming gradient and a
new one). At GCNII's depth those three blocks, beside every layer's compressed activations, are the step's
peak.

:func:`gcnii_layers` runs every hidden layer and the output linear inside one autograd Function (the
pattern of ``torch.utils.checkpoint``), so every buffer it writes in place was allocated inside it
(:mod:`dgl_exact.ops.keep`, rule 2); nothing is guessed about who else holds a tensor:

* **forward**: the first layer draws ``dropout(h0)`` into a new buffer, and every layer writes into it: the
  propagation column chunk by column chunk (a column of the output depends only on the same column of the
  input: two ``[N, c]`` temporaries), the mix, batch norm (statistics first, then normalised in place),
  ReLU and dropout row chunk by row chunk. The output linear reads the buffer last; a donated ``h0``
  (keep.py, rule 5; GCNII's model donates it) is released before it, so the forward ends with one block.
* **backward**: the logits' gradient (``[N, classes]``, never written) times the output weight is a new
  buffer; the layers' backward steps run in reverse in place in it, and the ``h0`` gradient of every layer
  is summed in a second one. The ``h0`` gradient and the layers' gradient are the only blocks. Each
  layer's compressed copies and masks are dropped as soon as its backward step has read them (before the
  top layer forms the ``h0`` gradient, the backward's peak), where no saved-tensor hook must see them and
  the graph is not retained (keep.py, rule 8), as separate per-layer nodes would free them. The logits'
  gradient, ``[N, classes]``, stays alive through the whole backward (autograd holds it until the
  Function returns).

On a device where a layer is not chunked (a GPU at arxiv size, :func:`.chunks.chunk_elements_for`) the
propagation runs at full width: one sparse product, three blocks, as the composed ops.

Same values as the composed layers up to float rounding; the input and ``h0`` gradients need no activation
and equal the composed layers'; the weight gradients are unbiased estimates from the kept (compressed)
tensors. Taken by :class:`dgl_exact.training.models.GCNII` through
:func:`dgl_exact.nn.conv.gcn2conv.gcnii_stack` where it is equivalent to the modules (see there);
everything else runs the composed ops.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch
import torch.nn.functional as F

from .. import kernels
from ..compression import draw_seed
from ..compression_config import CompressionConfig
from .keep import as_kept
from .chunks import chunk_elements_for, chunk_rows, row_chunks, weight_grad
from .donation import release
from .double_backward import refuse_double_backward
from .saved import (SECOND_BACKWARD_MESSAGE, graph_freed_after_backward, load_kept, private_keeping_allowed, save_kept,
                    show_private)
from .function import Function

__all__ = ["AddScaledGCN2", "BatchNormArgs", "GCN2Layer", "GCN2Step", "MixGCN2", "degree_norm", "gcn2_mix",
           "gcnii_layers", "layer_forward", "row_ranges"]

#: columns per chunk of the propagation (both directions) where a layer is chunked on its device
COLUMN_CHUNK = 16


@dataclasses.dataclass(frozen=True)
class BatchNormArgs:
    """What batch norm reads in :func:`gcnii_layers` (as :meth:`dgl_exact.nn.BatchNorm1d.batch_norm_args`
    gives it): ``weight``/``bias`` may be None; running statistics are updated in place when given and
    ``batch_stats``."""

    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    running_mean: Optional[torch.Tensor]
    running_var: Optional[torch.Tensor]
    batch_stats: bool
    momentum: float
    eps: float


@dataclasses.dataclass(frozen=True)
class GCN2Step:
    """The constants of one fused layer: ``alpha``, ``beta``, the dropout after the ReLU, the dropout of the
    first layer's input (``dropout(h0)``, used when ``x`` is None), its position in the stack."""

    alpha: float
    beta: float
    dropout: float
    input_dropout: float
    index: int


def _column_width(n: int, d: int, device) -> int:
    """The whole width where a layer-sized buffer is not chunked on ``device``, else :data:`COLUMN_CHUNK`.
    Depends on the graph's size only through that test (a planner's samples run the same operators)."""
    return d if n * d <= chunk_elements_for(device) else min(d, COLUMN_CHUNK)


def _propagate_(st, x: torch.Tensor, norm: torch.Tensor, scale: float, transpose: bool) -> None:
    """``x <- scale * D^-1/2 A D^-1/2 x`` (``transpose``: with ``A^T``) in place, in column chunks."""
    n, d = x.shape
    width = _column_width(n, d, x.device)
    post = norm * scale
    if width >= d:
        a = st.aggregate(x.mul_(norm).unsqueeze(1), transpose=transpose).view(n, d)
        x.copy_(a.mul_(post))
        return
    for c0 in range(0, d, width):
        c1 = min(d, c0 + width)
        t = x[:, c0:c1] * norm
        a = st.aggregate(t.unsqueeze(1), transpose=transpose).view(n, c1 - c0)
        del t
        x[:, c0:c1] = a.mul_(post)
        del a


def row_ranges(x):
    """Row chunks of a layer-sized ``[N, D]`` tensor (or anything with its ``shape`` and ``device``)."""
    n, d = x.shape[0], x.shape[1] if len(x.shape) > 1 else 1
    rows = chunk_rows(n, max(1, d) if n else 1, x.device)
    return [(r0, min(n, r0 + rows)) for r0 in range(0, n, rows)]



@dataclasses.dataclass
class _LayerRecord:
    """What one layer's backward needs besides its kept tensors: where its items sit in the saved list and
    the seeds and row ranges of its forward."""

    step: GCN2Step
    first: bool
    has_bias: bool
    bn_batch_stats: Optional[bool]  # None: no batch norm
    input_seeds: List[int]
    ranges: list
    n_stats: int
    n_masks: int
    start: int = 0  # index of the layer's first item in the saved list
    mask_seeds: List[int] = dataclasses.field(default_factory=list)  # the dropout seeds, per row chunk


def layer_forward(x, h0, weight1, bias, bn_weight, bn_bias, st, norm, step: GCN2Step,
                   bn: Optional[BatchNormArgs], cfg: CompressionConfig, need_weight: bool, keep: bool = True,
                   replay: Optional["_LayerRecord"] = None):
    """One hidden layer written into ``x`` (allocated by this stack; a new buffer holding ``dropout(h0)`` when
    ``x`` is None). Returns ``(x, items, record)``: the items to keep for backward and the layer's record.
    ``h0``: a tensor, or anything whose row slices ``h0[r0:r1]`` are its rows (``shape``, ``dtype`` and
    ``device`` too: a kept copy decoded row chunk by row chunk). ``keep=False``: nothing is kept (no items;
    the forward of a recomputed segment). ``replay``: the record of an earlier forward of this layer, whose
    dropout seeds are drawn again (its recompute: the same masks)."""
    kernel_dropout = kernels.get("dropout", h0.device)
    kernel_relu_dropout = kernels.get("relu_dropout", h0.device)
    ranges = row_ranges(h0)
    if replay is not None and replay.ranges != ranges:
        raise RuntimeError("gcn2: a recomputed layer's row chunks differ from its forward's")
    first = x is None
    input_seeds: List[int] = []
    if first:  # the first layer's input, dropout(h0), in a buffer of the stack's own
        x = torch.empty(tuple(h0.shape), dtype=h0.dtype, device=h0.device)
        for j, (r0, r1) in enumerate(ranges):
            if step.input_dropout > 0:
                input_seeds.append(draw_seed() if replay is None else replay.input_seeds[j])
                x[r0:r1] = kernel_dropout(h0[r0:r1].contiguous(), step.input_dropout, input_seeds[-1])
            else:
                x[r0:r1] = h0[r0:r1]
    _propagate_(st, x, norm, 1.0 - step.alpha, transpose=False)
    for r0, r1 in ranges:  # s
        x[r0:r1].add_(h0[r0:r1] * step.alpha)
    # x is overwritten below: an exactly kept s is a copy (keep.py, rule 3)
    kept_s = as_kept(x, cfg, force=True, overwritten=True) if need_weight and keep else None
    for r0, r1 in ranges:  # o
        part = x[r0:r1]
        proj = F.linear(part, weight1.t()).mul_(step.beta)
        part.mul_(1.0 - step.beta).add_(proj)
        if bias is not None:
            part.add_(bias)
        del proj
    stats: tuple = ()
    kept_o = None
    if bn is not None:
        # batch norm's input, never projected; overwritten below
        kept_o = as_kept(x, cfg.replace(kept_frac=1.0), force=True, overwritten=True) if keep else None
        if bn.batch_stats:
            var, mean = torch.var_mean(x, 0, correction=0)
            if bn.running_mean is not None:
                n = x.shape[0]
                bn.running_mean.mul_(1.0 - bn.momentum).add_(mean, alpha=bn.momentum)
                bn.running_var.mul_(1.0 - bn.momentum).add_(var * (n / max(n - 1, 1)), alpha=bn.momentum)
        else:
            mean, var = bn.running_mean, bn.running_var
        invstd = (var + bn.eps).rsqrt()
        scale = invstd if bn_weight is None else invstd * bn_weight
        for r0, r1 in ranges:
            part = x[r0:r1].sub_(mean).mul_(scale)
            if bn_bias is not None:
                part.add_(bn_bias)
        stats = (mean, invstd)
    masks, mask_seeds = [], []
    for j, (r0, r1) in enumerate(ranges):  # ReLU and dropout: one bit per element
        seed = (draw_seed() if step.dropout > 0 else 0) if replay is None else replay.mask_seeds[j]
        mask_seeds.append(seed)
        y, packed = kernel_relu_dropout(x[r0:r1], step.dropout, seed)
        x[r0:r1] = y
        if keep:
            masks.append(packed)
        del y, packed
    record = _LayerRecord(step, first, bias is not None, None if bn is None else bn.batch_stats, input_seeds,
                          ranges, len(stats), len(masks), mask_seeds=mask_seeds)
    if not keep:
        return x, [], record
    return x, [kept_s, kept_o, weight1, bn_weight, *stats, *masks], record


def _layer_backward(g, items: list, rec: _LayerRecord, gh0, need_w: bool, need_b: bool, need_x: bool,
                    need_h0: bool):
    """One layer's backward, in place in ``g`` (the stack allocated it: keep.py, rule 2). Returns ``(gx, gh0,
    gw, gb, g_bnw, g_bnb)``; ``gh0`` accumulates ``alpha`` times every layer's mix gradient.

    ``items``: the layer's kept items; this call empties the list and lets go of each item once read (the
    masks after the dropout step, batch norm's input after its backward, ``s`` after the weight gradient).
    Where the list was their last holder (rule 8) they are freed before :func:`_mix_backward` allocates the
    ``h0`` gradient: at the top layer, where every layer's kept tensors are still alive, that is the
    backward's peak."""
    kept_s, kept_o, weight1, bn_weight = items[:4]
    stats, masks = items[4:4 + rec.n_stats], items[4 + rec.n_stats:]
    items.clear()
    step, ranges = rec.step, rec.ranges
    masked_scale = kernels.get("masked_scale", g.device)
    scale = 1.0 / (1.0 - step.dropout) if step.dropout > 0 else 1.0
    for j, (r0, r1) in enumerate(ranges):
        g[r0:r1] = masked_scale(g[r0:r1], masks[j], scale, 0.0)
        masks[j] = None
    del masks
    g_bnw = g_bnb = None
    if kept_o is not None:  # batch norm, from its compressed input in row chunks (as ops.batch_norm)
        mean, invstd = stats
        sum_g = g.sum(0)
        sum_gxhat = torch.zeros_like(sum_g)
        for r0, r1, o in row_chunks(kept_o):
            sum_gxhat += (g[r0:r1] * ((o.to(g.dtype) - mean) * invstd)).sum(0)
            del o  # before the next chunk is decoded (see row_chunks)
        w = invstd if bn_weight is None else bn_weight * invstd
        if rec.bn_batch_stats:
            n = g.shape[0]
            mean_g, proj = sum_g / n, sum_gxhat * invstd / n
            for r0, r1, o in row_chunks(kept_o):
                g[r0:r1].sub_(mean_g).sub_((o.to(g.dtype) - mean) * proj).mul_(w)
                del o
        else:
            g.mul_(w)
        if bn_weight is not None:
            g_bnw, g_bnb = sum_gxhat.to(bn_weight.dtype), sum_g.to(bn_weight.dtype)
    kept_o = o = None
    gw = gb = None
    if need_w:
        gw = weight_grad(g, kept_s, kept_first=True).mul_(step.beta)
    kept_s = None
    if rec.has_bias and need_b:
        gb = g.sum(0)
    need_x = need_x and not rec.first
    if not (need_x or need_h0):
        return None, gh0, gw, gb, g_bnw, g_bnb
    gh0 = _mix_backward(g, weight1, step, ranges, gh0, need_h0)
    return g, gh0, gw, gb, g_bnw, g_bnb


def _mix_backward(g, weight1, step: GCN2Step, ranges, gh0, need_h0: bool):
    """``g <- (1 - beta) g + beta g W^T`` in place (the gradient of the mix's input ``s``), and ``alpha g``
    summed into ``gh0`` (allocated here at the first layer that needs it). Returns ``gh0``."""
    for r0, r1 in ranges:
        part = g[r0:r1]
        proj = part.matmul(weight1.t()).mul_(step.beta)
        part.mul_(1.0 - step.beta).add_(proj)
        del proj
    if need_h0:
        gh0 = g * step.alpha if gh0 is None else gh0.add_(g, alpha=step.alpha)
    return gh0


class _GCNIIStack(Function):
    """GCNII's hidden layers and the output linear as one autograd region (the pattern of
    ``torch.utils.checkpoint``: the layers' forward and backward loops run inside one Function). Every
    layer-sized buffer the loops write in place is allocated inside it (keep.py, rule 2): the layers' shared
    working buffer in the forward, and in the backward the gradient ``g W_out`` formed from the logits'
    gradient, which is ``[N, classes]`` and never written."""

    @staticmethod
    def forward(ctx, h0, norm, head_w, head_b, st, steps, bns, cfgs, head_cfg, release_h0, *params):
        needs = ctx.needs_input_grad
        # what the stack allocated for a layer's backward (its compressed copies and masks) is held on ctx and
        # dropped layer by layer in the backward where no saved-tensor hook must see it (keep.py, rule 8)
        private = private_keeping_allowed()
        x, kept, records, own = None, [], [], []
        for i, (step, bn, cfg) in enumerate(zip(steps, bns, cfgs)):
            w1, b, bw, bb = params[4 * i:4 * i + 4]
            x, items, rec = layer_forward(x, h0, w1, b, bw, bb, st, norm, step, bn, cfg, needs[10 + 4 * i])
            rec.start = len(kept)
            if private:  # the kept s and o and the masks: made here from x, never returned
                own.append([items[0], items[1], *items[4 + rec.n_stats:]])
                items = [None, None, *items[2:4 + rec.n_stats]]
            kept.extend(items)
            records.append(rec)
        if release_h0:  # donated, and no layer reads it any more; its gradient needs no value (rule 5)
            release(h0)
        logits = F.linear(x, head_w, head_b)
        # the last layer's output, made here and never overwritten: compressed (or itself when exact)
        kept_head = as_kept(x, head_cfg, force=True) if needs[2] else None
        del x
        ctx.st, ctx.records, ctx.has_head_bias = st, records, head_b is not None
        ctx.own = [kept_head, *own] if private else None
        if private:  # a memory meter observing what is kept sees these too (rule 8)
            show_private(kept_head, *(item for layer in own for item in layer))
        save_kept(ctx, norm, head_w, None if private else kept_head, *kept)
        return logits

    @staticmethod
    def backward(ctx, grad):
        refuse_double_backward("the fused GCNII stack")
        norm, head_w, kept_head, *kept = load_kept(ctx)
        own = ctx.own
        if own is not None:
            if getattr(ctx, "own_dropped", False):
                raise RuntimeError(SECOND_BACKWARD_MESSAGE.format(op="the fused GCNII stack"))
            drop = graph_freed_after_backward()
            ctx.own_dropped = drop
            kept_head = own[0]
            if drop:
                own[0] = None
        needs = ctx.needs_input_grad
        records = ctx.records
        g_head_w = g_head_b = None
        if needs[2]:
            g_head_w = weight_grad(grad, kept_head)
        del kept_head
        if ctx.has_head_bias and needs[3]:
            g_head_b = grad.sum(0)
        param_grads: list = [None] * (4 * len(records))
        gh0 = None
        if needs[0] or any(needs[10:]):
            g = grad.matmul(head_w.to(grad.dtype))  # allocated here: the loops may write it (rule 2)
            items = _layer_items(ctx, kept, own, records)
            g, gh0 = layers_backward(ctx.st, norm, g, gh0, records, items, range(len(records) - 1, -1, -1),
                                     needs[0], needs[10:], param_grads)
            del g
        return (gh0, None, g_head_w, g_head_b, None, None, None, None, None, None, *param_grads)


def _layer_items(ctx, kept, own, records) -> list:
    """Each layer's kept items for :func:`layers_backward`: what ``save_for_backward`` held, with the layer's
    own items (rule 8) put back from ``own``. When they are dropped (``ctx.own_dropped``), ``own`` lets go of
    them here, so the list returned is their last holder and the loop frees each layer's as it goes."""
    items = []
    for i, rec in enumerate(records):
        layer = kept[rec.start:rec.start + 4 + rec.n_stats + rec.n_masks]
        if own is not None:
            mine = own[1 + i]
            layer[0], layer[1], layer[4 + rec.n_stats:] = mine[0], mine[1], mine[2:]
            if ctx.own_dropped:
                own[1 + i] = None
        items.append(layer)
    return items


def layers_backward(st, norm, g, gh0, records, items, order, need_h0: bool, param_needs, param_grads: list):
    """The backward of the layers ``order`` (descending indices into ``records``/``items``: each layer's
    record and kept items), in place in ``g`` (the caller allocated it: keep.py, rule 2), the ``h0`` gradient
    summed into ``gh0``. ``param_needs``: four flags a layer (weight, bias, batch-norm weight and bias);
    their gradients are written into ``param_grads``. Returns ``(g, gh0)``: ``g`` is None once no earlier
    gradient is needed (the caller stops), else the gradient of the lowest layer's input."""
    for i in order:
        rec = records[i]
        need_x = need_h0 or any(param_needs[:4 * i])
        layer, items[i] = items[i], None  # what this layer kept is freed as soon as it has been read
        g, gh0, gw, gb, gbw, gbb = _layer_backward(g, layer, rec, gh0, param_needs[4 * i],
                                                   param_needs[4 * i + 1], need_x, need_h0)
        del layer
        param_grads[4 * i:4 * i + 4] = [gw, gb, gbw, gbb]
        if g is None:
            return None, gh0
        _propagate_(st, g, norm, 1.0 - rec.step.alpha, transpose=True)
        if rec.first:  # the first layer's input was dropout(h0)
            if rec.input_seeds:
                kernel_dropout = kernels.get("dropout", g.device)
                for (r0, r1), seed in zip(rec.ranges, rec.input_seeds):
                    g[r0:r1] = kernel_dropout(g[r0:r1], rec.step.input_dropout, seed)
            gh0 = gh0.add_(g)
    return g, gh0


def degree_norm(st, dtype) -> torch.Tensor:
    """``in_degree^-1/2`` (clamped at 1) as an ``[N, 1]`` column, GCN2Conv's normalisation on both sides."""
    return st.in_degrees().to(dtype).clamp(min=1).pow(-0.5).unsqueeze(1)


@dataclasses.dataclass(frozen=True)
class GCN2Layer:
    """One hidden layer of :func:`gcnii_layers`: its constants, its weights (``bias`` may be None) and its
    batch norm (None for none) and compression."""

    step: GCN2Step
    weight1: torch.Tensor
    bias: Optional[torch.Tensor]
    bn: Optional[BatchNormArgs]
    config: CompressionConfig


def gcnii_layers(st, h0: torch.Tensor, layers: List[GCN2Layer], head_weight: torch.Tensor,
                 head_bias: Optional[torch.Tensor], head_config: CompressionConfig,
                 release_h0: bool = False) -> torch.Tensor:
    """GCNII's hidden layers (propagation, mix, batch norm, ReLU, dropout each) and the output linear as one
    op: ``F.linear(h_L, head_weight, head_bias)`` with ``h_l = dropout(relu(BN_l(mix_l(h_{l-1}, h0))))``
    and ``h_0' = dropout(h0, layers[0].step.input_dropout)``. ``st``: the graph's
    :class:`~dgl_exact.ops.structure.GraphStructure` (homogeneous, whole graph). Two layer-sized buffers
    at the forward's and the backward's peak besides ``h0`` and the kept tensors. Double backward raises.

    ``release_h0``: ``h0`` was donated (:func:`dgl_exact.ops.donation.donate`, rule 5) and the caller checked
    that it may go (:func:`dgl_exact.nn.conv.gcn2conv.gcnii_stack` does): its memory is released once the
    last layer has read it, before the output layer, so the forward's end holds one layer-sized buffer,
    not two."""
    if not layers:
        raise ValueError("gcnii_layers needs at least one layer")
    if any(layer.bn is not None and layer.bn.batch_stats and h0.shape[0] < 2 for layer in layers):
        raise ValueError("Expected more than 1 value per channel when training (batch norm over 1 row)")
    norm = degree_norm(st, h0.dtype)  # one norm kept for all layers
    params = []
    for layer in layers:
        bn = layer.bn
        params += [layer.weight1, layer.bias, None if bn is None else bn.weight, None if bn is None else bn.bias]
    return _GCNIIStack.apply(h0, norm, head_weight, head_bias, st, [layer.step for layer in layers],
                             [layer.bn for layer in layers], [layer.config for layer in layers], head_config,
                             bool(release_h0), *params)


class AddScaledGCN2(Function):
    """GCNII's initial residual ``s = h + alpha h0`` written into the propagation's own buffer ``h`` (already
    times ``1 - alpha``), in row chunks: the same operations in the same order as the unfused chain. Keeps
    nothing. Backward: the incoming gradient itself for ``h`` (``ds/dh = I``, as torch's ``add`` returns it)
    and ``alpha`` times it for ``h0``: one new layer-sized buffer. A node of its own, apart from
    :class:`MixGCN2`, so that the mix's incoming gradient has gone when the ``h0`` gradient is formed
    (autograd frees a node's incoming gradient once its backward returns). Differentiable to any order."""

    @staticmethod
    def forward(ctx, h, feat_0, alpha):
        rows = chunk_rows(h.shape[0], h[0].numel(), h.device)
        for r0 in range(0, h.shape[0], rows):
            h[r0:r0 + rows].add_(feat_0[r0:r0 + rows] * alpha)
        ctx.mark_dirty(h)
        ctx.alpha = alpha
        return h

    @staticmethod
    def backward(ctx, grad):
        needs = ctx.needs_input_grad
        return (grad if needs[0] else None), (grad * ctx.alpha if needs[1] else None), None


class MixGCN2(Function):
    """GCNII's mix over the initial residual's buffer ``s`` (:class:`AddScaledGCN2`'s output):
    ``out = (1 - beta) s + beta s W (+ b)`` written into ``s``, the same operations in the same order as the
    unfused chain (bit-identical forward), keeping only ``s`` compressed. Backward: one new layer-sized
    buffer besides its incoming gradient (``gs = (1 - beta) g + beta g W^T``, returned as the gradient of
    ``s``; autograd's chain forms five), and the weight gradient from ``s`` in row chunks. Used only with
    compression on (compressed copies cannot do double backward anyway); otherwise
    :class:`dgl_exact.GCN2Conv` runs the unfused chain, exact to any order (:mod:`dgl_exact.nn.fastpaths`
    decides)."""

    @staticmethod
    def forward(ctx, s, weight1, bias, beta, cfg):
        # row chunks: every step is row-local, so only chunk-sized temporaries exist besides s itself
        rows = chunk_rows(s.shape[0], s[0].numel(), s.device)
        kept = as_kept(s, cfg, force=True, overwritten=True) if ctx.needs_input_grad[1] else None
        for r0 in range(0, s.shape[0], rows):
            part = s[r0:r0 + rows]
            proj = F.linear(part, weight1.t()).mul_(beta)
            part.mul_(1 - beta).add_(proj)
            if bias is not None:
                part.add_(bias)
            del proj, part
        ctx.mark_dirty(s)
        ctx.beta, ctx.has_bias = beta, bias is not None
        save_kept(ctx, kept, weight1)
        return s

    @staticmethod
    def backward(ctx, grad):
        kept, weight1 = load_kept(ctx)
        refuse_double_backward("GCN2Conv")  # only built with compression on
        needs = ctx.needs_input_grad
        gs = gw = gb = None
        if needs[1]:  # first: its decoded chunks are gone before gs is allocated
            gw = weight_grad(grad, kept, kept_first=True).mul_(ctx.beta)
        del kept
        if ctx.has_bias and needs[2]:
            gb = grad.sum(0)
        if needs[0]:
            gs = grad.matmul(weight1.t()).mul_(ctx.beta).add_(grad, alpha=1 - ctx.beta)
        return gs, gw, gb, None, None


def gcn2_mix(h: torch.Tensor, feat_0: torch.Tensor, weight1: torch.Tensor, bias: Optional[torch.Tensor], alpha: float,
             beta: float, config: CompressionConfig) -> torch.Tensor:
    """GCNII's mix ``(1 - beta) s + beta s W1 (+ b)`` with ``s = h + alpha feat_0``, written into ``h`` (the
    propagation's own buffer, already times ``1 - alpha``), keeping only ``s`` compressed: two autograd
    nodes (:class:`AddScaledGCN2`, then :class:`MixGCN2`), so that the backward holds at most two layer-sized
    buffers of its own besides the ``h0`` gradient's accumulator: the mix's incoming gradient and ``gs``,
    then ``gs`` and ``alpha gs``."""
    s = AddScaledGCN2.apply(h, feat_0, float(alpha))
    return MixGCN2.apply(s, weight1, bias, float(beta), config)
