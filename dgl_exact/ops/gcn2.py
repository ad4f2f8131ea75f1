"""GCNII's hidden layer as one in-place op: two layer-sized buffers at the step's peak instead of three.

A GCNII hidden layer (``GCN2Conv`` with ``project_initial_features``, then BatchNorm, ReLU and dropout) is

    a = (1 - alpha) D^-1/2 A D^-1/2 x        (propagation; D: in-degrees)
    s = a + alpha h0                           (kept: the weight gradient reads it)
    o = (1 - beta) s + beta s W + b
    y = dropout(relu(BN(o)))                   (BN keeps o; ReLU and dropout keep one bit per element)

Composed from separate ops, each step allocates its output while its input is alive, and the layer's
input is alive in the caller's frame: the forward holds ``h0``, the input and a new buffer (three
``[N, D]`` blocks), and so does the backward (the ``h0`` gradient accumulator, the incoming gradient and a
new one). At GCNII's depth those three blocks, beside every layer's compressed activations, are the step's
peak (issue 12: 796 MiB for 16 x 256 on an arxiv-sized graph).

:func:`gcn2_layer_` writes every step into the layer's own buffer:

* **forward**: the propagation runs column chunk by column chunk (a column of the output depends only on
  the same column of the input), each chunk scaled, aggregated and written back, so only two ``[N, c]``
  temporaries exist besides the buffer; the mix, batch norm (statistics first, then normalised in place),
  ReLU and dropout run row chunk by row chunk in place. ``h0`` and the buffer are the only blocks.
* **backward**: the same steps in reverse, each in place in the incoming gradient when nobody else can see
  that tensor (:func:`._saving.grad_is_private`; else it is copied once); the ``h0`` gradient of every
  layer goes into one buffer the stack shares (:class:`InitialGradient`), handed to ``h0`` by the first
  layer. The ``h0`` gradient and the layer's gradient are the only blocks.

The first layer takes ``x = None`` and draws its input ``dropout(h0)`` itself into a new buffer (its
backward then returns the whole ``h0`` gradient in one tensor). On a device where a layer is not chunked
(a GPU at arxiv size, :func:`._saving.chunk_elements_for`) the propagation runs at full width: one sparse
product, three blocks, as the composed ops.

Same values as the composed layer up to float rounding; the input and ``h0`` gradients need no activation
and equal the composed layer's; the weight gradients are unbiased estimates from the kept (compressed)
tensors. Taken by :class:`dgl_exact.training.models.GCNII` through :func:`dgl_exact.nn.conv.gcn2conv.gcnii_stack`
where it applies (training with compression on, shared weights, no residual, whole graph, no edge weights,
no autocast or capture); everything else runs the composed ops.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch
import torch.nn.functional as F

from .. import kernels
from ..compression import draw_seed
from ..config import CompressionConfig
from ._saving import (DOUBLE_BACKWARD_MESSAGE, _calibrate_private_refs, chunk_elements_for, chunk_rows,
                      create_graph_requested, grad_is_private, load, row_chunks, save, stash)

__all__ = ["BatchNormArgs", "GCN2Step", "InitialGradient", "degree_norm", "gcn2_layer_"]

#: columns per chunk of the propagation (both directions) where a layer is chunked on its device
COLUMN_CHUNK = 16


@dataclasses.dataclass(frozen=True)
class BatchNormArgs:
    """What batch norm reads in :func:`gcn2_layer_` (as :meth:`dgl_exact.nn.BatchNorm1d.batch_norm_args`
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


class InitialGradient:
    """The ``h0`` gradient of a stack of ``layers`` fused layers, summed in one buffer. Backward runs the
    layers last to first: the last one starts the buffer (so a repeated backward, ``retain_graph``, starts
    anew), the first one returns it as ``h0``'s gradient and lets go of it."""

    def __init__(self, layers: int):
        self.layers = layers
        self.buffer: Optional[torch.Tensor] = None


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


def _row_ranges(x: torch.Tensor):
    n = x.shape[0]
    rows = chunk_rows(n, max(1, x[0].numel()) if n else 1, x.device)
    return [(r0, min(n, r0 + rows)) for r0 in range(0, n, rows)]


class _GCN2Layer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, h0, weight1, bias, bn_weight, bn_bias, st, norm, step: GCN2Step, bn: Optional[BatchNormArgs],
                grads: InitialGradient, cfg: CompressionConfig):
        kernel_dropout = kernels.get("dropout", h0.device)
        kernel_relu_dropout = kernels.get("relu_dropout", h0.device)
        ranges = _row_ranges(h0)
        first = x is None
        input_seeds: List[int] = []
        if first:  # the first layer's input, dropout(h0), in a buffer of its own
            x = torch.empty_like(h0, memory_format=torch.contiguous_format)
            for r0, r1 in ranges:
                if step.input_dropout > 0:
                    input_seeds.append(draw_seed())
                    x[r0:r1] = kernel_dropout(h0[r0:r1].contiguous(), step.input_dropout, input_seeds[-1])
                else:
                    x[r0:r1] = h0[r0:r1]
        _propagate_(st, x, norm, 1.0 - step.alpha, transpose=False)
        for r0, r1 in ranges:  # s
            x[r0:r1].add_(h0[r0:r1] * step.alpha)
        kept_s = stash(x, cfg, force=True) if ctx.needs_input_grad[2] else None  # force: overwritten next
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
            kept_o = stash(x, cfg.replace(kept_frac=1.0), force=True)  # batch norm's input, never projected
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
        masks, seeds = [], []
        for r0, r1 in ranges:  # ReLU and dropout: one bit per element
            seeds.append(draw_seed() if step.dropout > 0 else 0)
            y, packed = kernel_relu_dropout(x[r0:r1], step.dropout, seeds[-1])
            x[r0:r1] = y
            masks.append(packed)
            del y
        if not first:
            ctx.mark_dirty(x)
        ctx.st, ctx.step, ctx.grads, ctx.first = st, step, grads, first
        ctx.has_bias, ctx.bn_batch_stats = bias is not None, None if bn is None else bn.batch_stats
        ctx.input_seeds, ctx.ranges, ctx.masks = input_seeds, ranges, len(masks)
        save(ctx, kept_s, kept_o, weight1, bn_weight, norm, *stats, *masks)
        return x

    @staticmethod
    def backward(ctx, grad):
        if create_graph_requested():
            raise RuntimeError(DOUBLE_BACKWARD_MESSAGE.format(op="the fused GCNII layer"))
        kept_s, kept_o, weight1, bn_weight, norm, *rest = load(ctx)
        step, ranges, needs = ctx.step, ctx.ranges, ctx.needs_input_grad
        stats, masks = rest[:len(rest) - ctx.masks], rest[len(rest) - ctx.masks:]
        g = grad if grad_is_private(grad) else grad.clone(memory_format=torch.contiguous_format)
        del grad
        masked_scale = kernels.get("masked_scale", g.device)
        scale = 1.0 / (1.0 - step.dropout) if step.dropout > 0 else 1.0
        for (r0, r1), packed in zip(ranges, masks):
            g[r0:r1] = masked_scale(g[r0:r1], packed, scale, 0.0)
        g_bnw = g_bnb = None
        if kept_o is not None:  # batch norm, from its compressed input in row chunks (as ops.batch_norm)
            mean, invstd = stats
            sum_g = g.sum(0)
            sum_gxhat = torch.zeros_like(sum_g)
            for r0, r1, o in row_chunks(kept_o):
                sum_gxhat += (g[r0:r1] * ((o.to(g.dtype) - mean) * invstd)).sum(0)
            w = invstd if bn_weight is None else bn_weight * invstd
            if ctx.bn_batch_stats:
                n = g.shape[0]
                mean_g, proj = sum_g / n, sum_gxhat * invstd / n
                for r0, r1, o in row_chunks(kept_o):
                    part = g[r0:r1]
                    part.sub_(mean_g).sub_((o.to(g.dtype) - mean) * proj).mul_(w)
            else:
                g.mul_(w)
            if bn_weight is not None:
                g_bnw, g_bnb = sum_gxhat.to(bn_weight.dtype), sum_g.to(bn_weight.dtype)
        gw = gb = None
        if needs[2]:
            for r0, r1, s in row_chunks(kept_s):
                part = s.to(g.dtype).t().matmul(g[r0:r1])
                gw = part if gw is None else gw.add_(part)
            gw = gw.mul_(step.beta)
        if ctx.has_bias and needs[3]:
            gb = g.sum(0)
        need_x = needs[0] or (ctx.first and needs[1])
        if not (need_x or needs[1]):
            return None, None, gw, gb, g_bnw, g_bnb, None, None, None, None, None, None
        for r0, r1 in ranges:  # gs = (1 - beta) g + beta g W^T
            part = g[r0:r1]
            proj = part.matmul(weight1.t()).mul_(step.beta)
            part.mul_(1.0 - step.beta).add_(proj)
            del proj
        grads = ctx.grads
        if needs[1]:
            if step.index == grads.layers - 1 or grads.buffer is None:
                grads.buffer = g * step.alpha
            else:
                grads.buffer.add_(g, alpha=step.alpha)
        gx = gh0 = None
        if need_x:
            _propagate_(ctx.st, g, norm, 1.0 - step.alpha, transpose=True)
            gx = g
        if ctx.first:
            if needs[1]:
                if ctx.input_seeds:
                    kernel_dropout = kernels.get("dropout", g.device)
                    for (r0, r1), seed in zip(ranges, ctx.input_seeds):
                        g[r0:r1] = kernel_dropout(g[r0:r1], step.input_dropout, seed)
                gh0 = grads.buffer.add_(g)
                grads.buffer = None
            gx = None
        return gx, gh0, gw, gb, g_bnw, g_bnb, None, None, None, None, None, None


def degree_norm(st, dtype) -> torch.Tensor:
    """``in_degree^-1/2`` (clamped at 1) as an ``[N, 1]`` column, GCN2Conv's normalisation on both sides."""
    return st.in_degrees().to(dtype).clamp(min=1).pow(-0.5).unsqueeze(1)


def gcn2_layer_(st, x: Optional[torch.Tensor], h0: torch.Tensor, weight1: torch.Tensor, bias: Optional[torch.Tensor],
                step: GCN2Step, bn: Optional[BatchNormArgs], grads: InitialGradient,
                config: CompressionConfig, norm: Optional[torch.Tensor] = None) -> torch.Tensor:
    """One GCNII hidden layer (propagation, mix, batch norm, ReLU, dropout) written into ``x``, which the
    caller must own (nobody else reads it afterwards); ``x = None`` for the first layer, whose input
    ``dropout(h0, step.input_dropout)`` is drawn here. ``st``: the graph's
    :class:`~dgl_exact.ops.structure.GraphStructure` (homogeneous, whole graph); ``bn``: None for no batch
    norm. All layers of one stack share ``grads``, and may share ``norm`` (:func:`degree_norm`: each layer
    keeps it)."""
    _calibrate_private_refs()  # here, not inside the first backward
    norm = degree_norm(st, h0.dtype) if norm is None else norm
    bn_weight = bn.weight if bn is not None else None
    bn_bias = bn.bias if bn is not None else None
    return _GCN2Layer.apply(x, h0, weight1, bias, bn_weight, bn_bias, st, norm, step, bn, grads, config)
