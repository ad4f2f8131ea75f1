"""DGL's ``u_{add,sub,mul,div}_e_{sum,mean}`` for every broadcast of feature shapes DGL accepts, with a
backward that forms no tensor larger than the op's inputs and output.

DGL's own backward of these ops forms the per-edge broadcast gradient ``[E, *out]`` and then reduces it to
the operand's shape (``x [N, D, H]`` times ``y [E, 1, H]``: an ``[E, D, H]`` buffer, ``D`` times ``y``).
Here each broadcast gradient is reduced as it is formed:

* ``add``/``sub``: the output gradient is reduced over the operand's broadcast dims first (node-sized), then
  summed over edges (``x``) or gathered per edge (``y``);
* ``mul``/``div`` (``div`` runs as ``mul`` by ``1 / y``, as DGL's does) with ``x`` not broadcast: the
  output-sized tensors are permuted, node-sized, to ``[n, K, R]`` (``K``: the dims ``y`` has, ``R``: those it
  is broadcast over), so that ``y``'s gradient is the graph kernel's per-edge dot product over ``R`` and
  ``x``'s its weighted transposed sum (the layout of :func:`~.graph.u_mul_e_sum`'s fused kernel, for any
  broadcast);
* otherwise (``x`` broadcast too) per edge, in edge chunks of :func:`~.chunks.chunk_rows`' budget, each
  chunk's products reduced to the operand's shape before the next is formed; a chunk is never larger than
  the largest of the inputs and the output.

Kept for backward: ``mul``/``div``: ``x`` compressed (``y``'s gradient is linear in it) and ``y`` exactly,
by reference (a divisor enters the gradients nonlinearly); ``add``/``sub``: nothing. The forward runs DGL's
kernel (bound once, :mod:`.dgl_originals`), so values are DGL's. Double backward re-runs DGL's op with
autograd on the exactly kept operands (compressed ones raise, :mod:`.double_backward`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..compression_config import CompressionConfig, resolve_config
from .chunks import chunk_rows
from .dgl_general import readable
from .dgl_originals import originals
from .double_backward import double_backward, recompute_vjp
from .keep import as_kept, restore
from .saved import load_kept, needs_saving, save_kept
from .structure import GraphStructure, structure_of
from .function import Function

__all__ = ["BROADCAST_OPS", "BROADCAST_REDUCERS", "gspmm_broadcast", "pad_feature_shapes"]

#: the binary ops and reducers :func:`gspmm_broadcast` takes (max/min run DGL's op)
BROADCAST_OPS = ("add", "sub", "mul", "div")
BROADCAST_REDUCERS = ("sum", "mean")


def pad_feature_shapes(xs: tuple, ws: tuple):
    """DGL's ``reshape_lhs_rhs``: the shorter feature shape padded with leading 1s (numpy's right alignment)."""
    k = max(len(xs), len(ws))
    return (1,) * (k - len(xs)) + tuple(xs), (1,) * (k - len(ws)) + tuple(ws)


def _reduce_to(t: torch.Tensor, shape: tuple) -> torch.Tensor:
    """``t [n, *out]`` summed over the feature dims where ``shape`` (padded to ``out``'s length) is 1."""
    dims = [i + 1 for i, (s, o) in enumerate(zip(shape, t.shape[1:])) if s == 1 and o != 1]
    return t.sum(dims, keepdim=True) if dims else t


class _Layout:
    """Feature shapes of one call: ``xp``, ``yp`` padded, ``out`` their broadcast; ``perm`` orders ``out``'s
    dims as ``K`` (those ``y`` has, or of size 1) then ``R`` (those ``y`` is broadcast over)."""

    def __init__(self, xs: tuple, ys: tuple):
        self.xp, self.yp = pad_feature_shapes(xs, ys)
        self.out = tuple(torch.broadcast_shapes(self.xp, self.yp))
        r = [i for i, (y, o) in enumerate(zip(self.yp, self.out)) if y == 1 and o != 1]
        self.perm = [i for i in range(len(self.out)) if i not in r] + r
        self.k = math.prod(self.out[i] for i in self.perm[:len(self.out) - len(r)])
        self.r = math.prod(self.out[i] for i in r)

    def to_krr(self, t: torch.Tensor) -> torch.Tensor:
        """Node-sized ``t [n, *out]`` as ``[n, K, R]`` (a contiguous copy unless the order is already so)."""
        t = t.reshape((t.shape[0],) + self.out)
        return t.permute(0, *[i + 1 for i in self.perm]).reshape(t.shape[0], self.k, self.r)

    def from_krr(self, t: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`to_krr`: ``[n, K, R]`` as a contiguous ``[n, *out]``."""
        t = t.reshape((t.shape[0],) + tuple(self.out[i] for i in self.perm))
        inverse = [0] * len(self.perm)
        for pos, i in enumerate(self.perm):
            inverse[i] = pos + 1
        return t.permute(0, *inverse).contiguous()


def _edge_rows(st: GraphStructure, lay: _Layout, limit: int, device) -> int:
    """Edges per chunk of a per-edge loop over ``out``-shaped products: :func:`~.chunks.chunk_rows`' budget,
    and never more elements than ``limit`` (the largest input or output)."""
    per_edge = max(1, math.prod(lay.out))
    return max(1, min(chunk_rows(st.num_edges, per_edge, device), limit // per_edge))


def _mul_grads(st, lay: _Layout, g, x, w, need_x: bool, need_w: bool, limit: int):
    """Gradients of ``out[v] = sum_e x[u] * w[e]`` for output gradient ``g [n_dst, *out]``, ``x [n_src, *xp]``
    (or None where not needed), ``w [E, *yp]``: ``(gx [n_src, *xp], gw [E, *yp])``."""
    gx = gw = None
    if lay.xp == lay.out:  # x has every dim: the graph kernels on [n, K, R] copies
        g3 = lay.to_krr(g)
        if need_x:
            gx = lay.from_krr(st.aggregate(g3, w.reshape(w.shape[0], lay.k), transpose=True))
        if need_w:
            gw = st.edge_dot(lay.to_krr(x), g3)
        return gx, gw
    gx = g.new_zeros((st.num_src,) + lay.xp) if need_x else None
    gw = g.new_empty((st.num_edges,) + lay.yp) if need_w else None
    step = _edge_rows(st, lay, limit, g.device)
    src, dst = st.src, st.dst
    for e0 in range(0, st.num_edges, step):
        e1 = min(st.num_edges, e0 + step)
        gd = g.index_select(0, dst[e0:e1])
        if need_x:
            part = _reduce_to(gd * w[e0:e1], lay.xp)
            gx.index_add_(0, src[e0:e1], part)
            del part
        if need_w:
            xs = x.index_select(0, src[e0:e1])
            gw[e0:e1] = _reduce_to(xs * gd, lay.yp)
            del xs
        del gd  # before the next chunk is formed
    return gx, gw


class _BroadcastSpMM(Function):
    @staticmethod
    def forward(ctx, x, y, g, st: GraphStructure, op: str, reduce_op: str, cfg: CompressionConfig):
        dgl_gspmm = originals().gspmm
        with torch.no_grad():
            out = dgl_gspmm(g, op, reduce_op, x, y)
        ctx.fn = lambda a, b: dgl_gspmm(g, op, reduce_op, a, b)
        ctx.st, ctx.op, ctx.mean = st, op, reduce_op == "mean"
        ctx.lay = _Layout(tuple(x.shape[1:]), tuple(y.shape[1:]))
        ctx.meta = (x.shape, y.shape, max(x.numel(), y.numel(), out.numel()))
        need_x, need_y = ctx.needs_input_grad[:2]
        if op in ("mul", "div"):
            save_kept(ctx, as_kept(x, cfg) if need_y else None, y)
        else:
            save_kept(ctx, None, None)
        return out

    @staticmethod
    def backward(ctx, grad):
        x_s, y = load_kept(ctx)
        st, lay, op = ctx.st, ctx.lay, ctx.op
        xshape, yshape, limit = ctx.meta
        need_x, need_y = ctx.needs_input_grad[:2]
        if double_backward("u_" + op + "_e", x_s):
            x = x_s if x_s is not None else torch.zeros(xshape, dtype=grad.dtype, device=grad.device)
            y_in = y if y is not None else torch.zeros(yshape, dtype=grad.dtype, device=grad.device)
            gx, gy = recompute_vjp(ctx.fn, [x, y_in], [need_x, need_y], [grad])
            return gx, gy, None, None, None, None, None
        g = grad.reshape((grad.shape[0],) + lay.out)
        if ctx.mean:
            deg = st.in_degrees().clamp(min=1).to(g.dtype)
            g = g / deg.view((-1,) + (1,) * len(lay.out))
        if op in ("add", "sub"):
            gx = gy = None
            if need_x:
                gx = st.aggregate(_reduce_to(g, lay.xp).reshape(g.shape[0], 1, -1), transpose=True)
            if need_y:
                gy = _reduce_to(g, lay.yp).reshape(g.shape[0], -1).index_select(0, st.dst)
                gy = gy.neg_() if op == "sub" else gy
        else:
            y = y.to(g.dtype).reshape((yshape[0],) + lay.yp)
            w = y.reciprocal() if op == "div" else y
            x = restore(x_s)
            x = None if x is None else x.to(g.dtype).reshape((xshape[0],) + lay.xp)
            gx, gy = _mul_grads(st, lay, g, x, w, need_x, need_y, limit)
            del x
            if op == "div" and gy is not None:
                gy = gy.reshape(w.shape).mul_(w).mul_(w).neg_()  # d(1/y)/dy = -1/y^2
        return (None if gx is None else gx.reshape(xshape), None if gy is None else gy.reshape(yshape),
                None, None, None, None, None)


def gspmm_broadcast(g, op: str, reduce_op: str, x: torch.Tensor, y: torch.Tensor,
                    config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """DGL's ``gspmm(g, op, reduce_op, x, y)`` for ``op`` in :data:`BROADCAST_OPS` and ``reduce_op`` in
    :data:`BROADCAST_REDUCERS` on one edge type: DGL's values; a backward that forms nothing larger than the
    inputs and output (see the module doc); ``x`` kept compressed at ``config`` where ``y``'s gradient reads
    it."""
    if op not in BROADCAST_OPS or reduce_op not in BROADCAST_REDUCERS:
        raise ValueError(f"gspmm_broadcast: op in {BROADCAST_OPS} and reduce_op in {BROADCAST_REDUCERS}, "
                         f"got {op!r}, {reduce_op!r}")
    dg = readable(g)
    if not needs_saving(x, y):
        return originals().gspmm(dg, op, reduce_op, x, y)
    st = structure_of(g, x.device)
    return _BroadcastSpMM.apply(x, y, dg, st, op, reduce_op, resolve_config(config))
