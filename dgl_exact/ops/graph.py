"""Autograd graph ops (the GSpMM family and GAT's edge ops) that keep only what backward needs.

=================  ==========================================  =====================================
op                 backward needs                              kept
=================  ==========================================  =====================================
copy_u sum/mean    nothing (grad_x = A^T grad)                  nothing (EXACT keeps compressed x)
u_mul_e sum        x for grad_e, edge values for grad_x         compressed x, exact edge values
copy_u max/min     which source won                             arg indices, narrowest signed int
u_add_v            nothing                                      nothing
edge_softmax       its output                                   compressed output
gat_attention      feat, el/er (attention is recomputed)        compressed feat (twice, independently:
                                                               unbiased attention-vector gradients),
                                                               el and er ([N, H])
=================  ==========================================  =====================================

Features are ``[N, D]`` or ``[N, H, D]`` (or more dims, as DGL accepts); edge values ``[E]``, ``[E, H]`` or
``[E, H, 1]``. The graph may stay on the CPU while features live on a GPU (see :mod:`dgl_exact.ops.structure`).

Double backward (``create_graph=True``): each backward is then computed with plain differentiable torch
ops (per-edge gathers and ``index_add``; they materialise ``[E, ...]`` messages, so this path costs
memory like PyG's, and is taken only when asked for) from the exactly kept tensors, hence exact to any
order; an op whose kept tensor is compressed raises a clear error instead.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from .._compat import compiling
from ..compression import draw_seed
from ..compression_config import CompressionConfig, resolve_config
from .. import kernels
from ..kernels import reference as kernel_reference
from .keep import (check_double_backward, create_graph_requested, fresh_outputs, load_kept, needs_saving, recompute_vjp,
                   row_chunks, save_kept, stash, unstash)
from .structure import GraphStructure, edge_softmax_forward, structure_of
from . import captured

__all__ = ["normalize_edge_weight", "copy_u_sum", "copy_u_mean", "u_mul_e_sum", "copy_u_max", "copy_u_min", "u_add_v",
           "edge_softmax",
           "gat_attention"]


def _as3(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 2:
        return x.unsqueeze(1)
    if x.dim() == 3:
        return x
    if x.dim() == 1:
        return x.view(-1, 1, 1)
    return x.reshape(x.shape[0], x.shape[1], -1)


def _node_output(out: torch.Tensor, shape) -> torch.Tensor:
    """``out.view(shape)`` for an op's output, as a tensor of its own rather than a view: autograd refuses
    in-place updates of a view returned by a custom Function, and callers that own an aggregation's output
    scale it in place (one layer-sized buffer fewer). Under capture: the plain view."""
    shape = torch.Size(shape)
    if out.shape == shape or captured.active() or compiling():
        return out.view(shape)
    view = out.view(shape)
    return out.new_empty(0).set_(out.untyped_storage(), out.storage_offset(), shape, view.stride())


def _check_nodes(st: GraphStructure, x: torch.Tensor, side: str = "src"):
    n = st.num_src if side == "src" else st.num_dst
    if x.shape[0] != n:
        raise ValueError(f"features have {x.shape[0]} rows but the graph has {n} {side} nodes; pass one row per "
                         f"{'source' if side == 'src' else 'destination'} node")


def _spmm_ref(st: GraphStructure, x3: torch.Tensor, w2: Optional[torch.Tensor] = None,
              transpose: bool = False) -> torch.Tensor:
    """``st.aggregate`` in differentiable torch ops (any order): ``x3 [n, H, D]``, ``w2 [E, H]`` or None."""
    src, dst, n = (st.dst, st.src, st.num_src) if transpose else (st.src, st.dst, st.num_dst)
    m = x3.index_select(0, src)
    if w2 is not None:
        m = m * w2.to(m.dtype).unsqueeze(-1)
    return m.new_zeros((n,) + tuple(m.shape[1:])).index_add(0, dst, m)


def _edge_dot_ref(st: GraphStructure, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``st.edge_dot`` in differentiable torch ops."""
    return (a.index_select(0, st.src) * b.index_select(0, st.dst)).sum(-1)


def _edge_softmax_ref(st: GraphStructure, e: torch.Tensor) -> torch.Tensor:
    """Per-destination softmax of ``e [E, ...]`` in differentiable torch ops (the max shift is a constant)."""
    with torch.no_grad():
        idx = st.dst.view(-1, *([1] * (e.dim() - 1))).expand_as(e)
        emax = e.new_full((st.num_dst,) + tuple(e.shape[1:]), float("-inf")).scatter_reduce_(
            0, idx, e, reduce="amax", include_self=True)
    ex = (e - emax.index_select(0, st.dst)).exp()
    return ex / st.edge_sum_to(ex, "dst").index_select(0, st.dst)


def _narrow_index(arg: torch.Tensor, n: int) -> torch.Tensor:
    for dtype in (torch.int8, torch.int16, torch.int32):
        if n <= torch.iinfo(dtype).max:
            return arg.to(dtype)
    return arg


# --- copy_u sum / mean ------------------------------------------------------------------------------
@captured.capturable
class _CopyUReduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, st: GraphStructure, mean: bool):
        out = st.aggregate(_as3(x))
        if mean:
            out = out / st.in_degrees().clamp(min=1).to(out.dtype).view(-1, 1, 1)
        ctx.st, ctx.mean, ctx.xshape = st, mean, x.shape
        return _node_output(out, (st.num_dst,) + tuple(x.shape[1:]))

    @staticmethod
    def backward(ctx, grad):
        st = ctx.st
        g = _as3(grad.contiguous())
        if ctx.mean:
            g = g / st.in_degrees().clamp(min=1).to(g.dtype).view(-1, 1, 1)
        if create_graph_requested():  # linear: nothing kept, always exact
            return _spmm_ref(st, g, transpose=True).reshape(ctx.xshape), None, None
        return st.aggregate(g, transpose=True).view(ctx.xshape), None, None


@fresh_outputs
def copy_u_sum(g, x: torch.Tensor) -> torch.Tensor:
    """``out[v] = sum_{u -> v} x[u]``; keeps nothing for backward."""
    st = structure_of(g, x.device)
    _check_nodes(st, x)
    return captured.apply("_CopyUReduce", x, st, False)


@fresh_outputs
def copy_u_mean(g, x: torch.Tensor) -> torch.Tensor:
    """``out[v] = mean_{u -> v} x[u]`` (0 without in-edges); keeps nothing for backward."""
    st = structure_of(g, x.device)
    _check_nodes(st, x)
    return captured.apply("_CopyUReduce", x, st, True)


# --- u_mul_e sum ------------------------------------------------------------------------------------
def _pad_feature_shapes(xs: tuple, ws: tuple):
    """DGL's ``reshape_lhs_rhs``: the shorter feature shape padded with leading 1s (numpy's right alignment)."""
    k = max(len(xs), len(ws))
    return (1,) * (k - len(xs)) + tuple(xs), (1,) * (k - len(ws)) + tuple(ws)


def _mul_layout(xs: tuple, ws: tuple) -> Optional[tuple]:
    """``(out_shape, heads, dim)`` when ``x * w`` (DGL's broadcasting of feature shapes ``xs`` and ``ws``) is the
    kernel's ``x [n, heads, dim] * w [E, heads, 1]``: ``w``'s feature shape, right-aligned, is a prefix of
    ``x``'s followed by 1s, and ``x`` is not broadcast. Else None (the general path, :mod:`.dgl_ops`)."""
    xp, wp = _pad_feature_shapes(xs, ws)
    try:
        out = tuple(torch.broadcast_shapes(xp, wp))
    except RuntimeError:
        return None
    if out != xp:
        return None
    j = max((i for i, d in enumerate(wp) if d != 1), default=-1)
    if wp[: j + 1] != xp[: j + 1]:
        return None
    return out, math.prod(xp[: j + 1]), math.prod(xp[j + 1:])


@captured.capturable
class _UMulESum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, st: GraphStructure, out_shape: tuple, heads: int, dim: int, cfg: CompressionConfig):
        x3, w2 = x.reshape(x.shape[0], heads, dim), w.reshape(w.shape[0], heads)
        out = st.aggregate(x3, w2.to(x3.dtype))
        ctx.st, ctx.xshape, ctx.wshape, ctx.heads, ctx.dim = st, x.shape, w.shape, heads, dim
        # stash x itself, not the view x3: views made inside forward have no grad_fn and would pass for
        # tensors alive anyway (kept uncompressed, by reference). The edge values are kept exactly, by
        # reference (the input itself: double backward differentiates through it).
        save_kept(ctx, stash(x, cfg) if ctx.needs_input_grad[1] else None, w if ctx.needs_input_grad[0] else None)
        return _node_output(out, (st.num_dst,) + tuple(out_shape))

    @staticmethod
    def backward(ctx, grad):
        x_s, w = load_kept(ctx)
        st = ctx.st
        g = grad.contiguous().reshape(grad.shape[0], ctx.heads, ctx.dim)
        gx = gw = None
        if create_graph_requested():
            check_double_backward("u_mul_e_sum", x_s)
            aggregate, edge_dot = functools.partial(_spmm_ref, st), functools.partial(_edge_dot_ref, st)
        else:
            aggregate, edge_dot = st.aggregate, st.edge_dot
        if ctx.needs_input_grad[0]:
            w2 = w.reshape(w.shape[0], ctx.heads)
            gx = aggregate(g, w2.to(g.dtype), transpose=True).reshape(ctx.xshape)
        if ctx.needs_input_grad[1]:
            x3 = unstash(x_s).reshape(ctx.xshape[0], ctx.heads, ctx.dim)
            gw = edge_dot(x3.to(g.dtype), g).reshape(ctx.wshape)
        return gx, gw, None, None, None, None, None


@fresh_outputs
def u_mul_e_sum(g, x: torch.Tensor, y: torch.Tensor, *, config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``out[v] = sum_{(u, e, v)} x[u] * y[e]`` (DGL's ``u_mul_e_sum``, its broadcasting: feature shapes
    right-aligned as numpy does); keeps compressed ``x`` (for the edge gradient) and the edge values
    exactly (for the feature gradient). Shapes the fused kernel does not take (``y`` broadcasting against
    a trailing feature dim, ``x`` broadcast by ``y``) run the general path of :mod:`.dgl_ops`, which keeps
    the same."""
    st = structure_of(g, x.device)
    _check_nodes(st, x)
    if y.shape[0] != st.num_edges:
        raise ValueError(f"edge values have {y.shape[0]} rows but the graph has {st.num_edges} edges")
    layout = _mul_layout(tuple(x.shape[1:]), tuple(y.shape[1:]))
    if layout is None:
        from .dgl_ops import gspmm

        return gspmm(g, "mul", "sum", x, y, config=config)
    out_shape, heads, dim = layout
    if not needs_saving(x, y):
        out = st.aggregate(x.reshape(x.shape[0], heads, dim), y.reshape(y.shape[0], heads).to(x.dtype))
        return _node_output(out, (st.num_dst,) + out_shape)
    return captured.apply("_UMulESum", x, y, st, out_shape, heads, dim, resolve_config(config))


# --- copy_u max / min -------------------------------------------------------------------------------
@captured.capturable
class _CopyUMinMax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, st: GraphStructure, reduce: str):
        out, arg = st.aggregate_minmax(_as3(x), reduce)
        ctx.st, ctx.xshape = st, x.shape
        save_kept(ctx, _narrow_index(arg, st.num_src))
        return out.view((st.num_dst,) + tuple(x.shape[1:]))

    @staticmethod
    def backward(ctx, grad):
        (arg,) = load_kept(ctx)
        st = ctx.st
        g = _as3(grad.contiguous())
        arg = arg.long()
        valid = arg >= 0
        gx = g.new_zeros((st.num_src,) + tuple(g.shape[1:]))
        gx.scatter_add_(0, arg.clamp(min=0), g * valid.to(g.dtype))
        return gx.view(ctx.xshape), None, None


@fresh_outputs
def copy_u_max(g, x: torch.Tensor) -> torch.Tensor:
    """``out[v] = max_{u -> v} x[u]`` (0 without in-edges); keeps the winning source per element."""
    st = structure_of(g, x.device)
    _check_nodes(st, x)
    return captured.apply("_CopyUMinMax", x, st, "max")


@fresh_outputs
def copy_u_min(g, x: torch.Tensor) -> torch.Tensor:
    st = structure_of(g, x.device)
    _check_nodes(st, x)
    return captured.apply("_CopyUMinMax", x, st, "min")


# --- u_add_v -----------------------------------------------------------------------------------------
@captured.capturable
class _UAddV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, st: GraphStructure):
        ctx.st = st
        return a[st.src] + b[st.dst]

    @staticmethod
    def backward(ctx, grad):
        st = ctx.st
        ga = st.edge_sum_to(grad, "src") if ctx.needs_input_grad[0] else None
        gb = st.edge_sum_to(grad, "dst") if ctx.needs_input_grad[1] else None
        return ga, gb, None


@fresh_outputs
def u_add_v(g, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-edge ``x[src] + y[dst]`` (DGL's ``u_add_v``, its broadcasting); keeps nothing."""
    st = structure_of(g, x.device)
    _check_nodes(st, x, "src")
    _check_nodes(st, y, "dst")
    xp, yp = _pad_feature_shapes(tuple(x.shape[1:]), tuple(y.shape[1:]))
    if xp != yp:  # broadcast between the operands: DGL's kernel (nothing kept either)
        from .dgl_ops import gsddmm

        return gsddmm(g, "add", x, y, "u", "v")
    return captured.apply("_UAddV", x.reshape((x.shape[0],) + xp), y.reshape((y.shape[0],) + yp), st)


# --- edge softmax ------------------------------------------------------------------------------------
def _softmax_backward(st: GraphStructure, s: torch.Tensor, gs: torch.Tensor, by: str = "dst") -> torch.Tensor:
    """Gradient of a per-destination (``by='src'``: per-source) softmax with output ``s`` given output
    gradient ``gs``."""
    return s * (gs - st.edge_sum_to(gs * s, by)[st.dst if by == "dst" else st.src])


def _softmax_forward(st: GraphStructure, e: torch.Tensor, by: str) -> torch.Tensor:
    if by == "dst":
        return edge_softmax_forward(st, e)
    return kernel_reference.edge_softmax_by_dst(st.src, st.num_src, e)


@captured.capturable
class _EdgeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, e, st: GraphStructure, cfg: CompressionConfig, by: str = "dst"):
        s = _softmax_forward(st, e, by)
        ctx.st, ctx.by = st, by
        save_kept(ctx, stash(s, cfg, force=True) if cfg.enabled else s)
        return s

    @staticmethod
    def backward(ctx, grad):
        (s,) = load_kept(ctx)
        if create_graph_requested():  # differentiable ops below; exact when s is the output itself
            check_double_backward("edge_softmax", s)
        s = unstash(s).to(grad.dtype)
        return _softmax_backward(ctx.st, s, grad, ctx.by), None, None, None


def _edge_config(cfg: CompressionConfig, heads: int) -> CompressionConfig:
    """Per-edge tensors have few columns (heads): group ~256 values so metadata stays negligible."""
    return cfg.replace(kept_frac=1.0, block_rows=max(cfg.block_rows, -(-256 // max(heads, 1))))


ALL = "__ALL__"  # dgl.base.ALL


@fresh_outputs
def edge_softmax(graph, logits, eids=ALL, norm_by: str = "dst", *,
                 config: Optional[CompressionConfig] = None):
    """DGL's ``edge_softmax``: softmax of edge scores over each destination's in-edges (``norm_by='src'``:
    each source's out-edges); keeps its output compressed. ``eids`` (a subset of edges) and a heterograph's
    per-type dict of scores run DGL's own op (its output kept exactly)."""
    if norm_by not in ("dst", "src"):
        raise ValueError(f"norm_by must be 'dst' or 'src', got {norm_by!r}")
    if isinstance(logits, dict) or not (isinstance(eids, str) and eids == ALL) \
            or len(getattr(graph, "canonical_etypes", ())) > 1:
        import dgl.ops

        return dgl.ops.edge_softmax(graph, logits, eids, norm_by)
    e = logits
    st = structure_of(graph, e.device)
    if e.shape[0] != st.num_edges:
        raise ValueError(f"edge scores have {e.shape[0]} rows but the graph has {st.num_edges} edges")
    if not needs_saving(e):
        return _softmax_forward(st, e, norm_by)
    cfg = resolve_config(config)
    heads = e[0].numel() if e.dim() > 1 else 1
    return captured.apply("_EdgeSoftmax", e, st, _edge_config(cfg, heads), norm_by)


# --- fused GAT attention + aggregation --------------------------------------------------------------
def _is_prefix_view(dst: torch.Tensor, src: torch.Tensor) -> bool:
    return (dst.data_ptr() == src.data_ptr() and dst.shape[1:] == src.shape[1:]
            and dst.stride() == src.stride() and dst.shape[0] <= src.shape[0])


def _attention(st, el, er, slope, p, seed, ew):
    """Recomputable forward of GAT's attention: returns (pre-activation scores, softmax, final weights)."""
    raw = el[st.src] + er[st.dst]
    e = torch.nn.functional.leaky_relu(raw, slope)
    s = edge_softmax_forward(st, e)
    a = kernels.get("dropout", s.device)(s, p, seed) if p > 0 else s
    if ew is not None:
        a = a * ew
    return raw, s, a


def _gat_reference(st, feat_src, feat_dst, attn_l, attn_r, ew, slope, p, seed):
    """GAT attention and aggregation in differentiable torch ops (double backward); same dropout mask."""
    el = (feat_src * attn_l).sum(dim=-1)
    er = (feat_dst * attn_r).sum(dim=-1)
    e = torch.nn.functional.leaky_relu(el.index_select(0, st.src) + er.index_select(0, st.dst), slope)
    a = _edge_softmax_ref(st, e)
    if p > 0:
        a = kernel_reference.dropout(a, p, seed)
    if ew is not None:
        a = a * ew
    return _spmm_ref(st, feat_src, a), a


def _add_product(buf: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``buf + a * b``, into ``buf`` (this op's own buffer) where that has the out-of-place result's dtype;
    else out of place (under autocast a bf16 ``buf`` with fp32 factors: the sum is formed in fp32, as before,
    and torch 2.1's in-place ``addcmul_`` refuses mixed dtypes)."""
    if torch.result_type(buf, a) == buf.dtype and torch.promote_types(a.dtype, b.dtype) == buf.dtype:
        return buf.addcmul_(a, b)
    return buf + a * b


def _node_sum(grad: torch.Tensor, item, dtype: torch.dtype, rows: int) -> torch.Tensor:
    """``sum_n grad[n, h] * x[n, h, d]`` over the first ``rows`` rows of a kept item ``x`` ([N, H, D]), decoded
    row chunk by row chunk (:func:`row_chunks`)."""
    out = None
    for r0, r1, x in row_chunks(item):
        if r0 >= rows:
            break
        r1 = min(r1, rows)
        part = torch.einsum("nh,nhd->hd", grad[r0:r1].to(dtype), x[: r1 - r0].to(dtype))
        out = part if out is None else out.add_(part)
    if out is None:  # no rows
        out = torch.zeros((grad.shape[1], item.shape[-1]), dtype=dtype, device=grad.device)
    return out


@captured.capturable
class _GATAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, feat_src, feat_dst, attn_l, attn_r, ew, st: GraphStructure, slope: float, p: float,
                seed: int, cfg: CompressionConfig):
        el = (feat_src * attn_l).sum(dim=-1)
        er = (feat_dst * attn_r).sum(dim=-1)
        _, _, a = _attention(st, el, er, slope, p, seed, ew)
        out = st.aggregate(feat_src, a.to(feat_src.dtype))
        prefix = _is_prefix_view(feat_dst, feat_src)
        ctx.st, ctx.slope, ctx.p, ctx.seed, ctx.prefix, ctx.n_dst = st, slope, p, seed, prefix, feat_dst.shape[0]
        # one tensor for both ends (GATConv on a graph, not a block): its two gradients are summed here, in
        # place, rather than returned as two [N, H, D] tensors for autograd to add into a third
        ctx.same = feat_dst is feat_src
        fs_kept = stash(feat_src, cfg)
        # The attention-vector gradients multiply the features by a gradient that is itself linear in the
        # (decompressed) source features: with a single compressed copy the product is biased
        # (E[x_hat x_hat^T] != x x^T; about 10% at INT2, ~100% with projection). A second, independently
        # compressed copy of the source features serves those products and keeps them unbiased.
        # Decided by the configuration, not by what the first stash returned, so that a forward makes the same
        # stash calls whatever a per-tensor plan keeps exactly (its slots are numbered by call); a copy of a
        # tensor alive anyway is kept by reference, at no cost.
        second = cfg.enabled and (ctx.needs_input_grad[2] or (prefix and ctx.needs_input_grad[3]))
        # feat_dst is kept by reference (a view, no memory) when feat_src is exact: double backward needs it
        fd_kept = (feat_dst if isinstance(fs_kept, torch.Tensor) else None) if prefix else stash(feat_dst, cfg)
        save_kept(ctx, fs_kept, stash(feat_src, cfg) if second else None, fd_kept, el, er, attn_l, attn_r, ew)
        return out, a

    @staticmethod
    def backward(ctx, g_out, g_a):
        fs_s, fs2_s, fd_s, el, er, attn_l, attn_r, ew = load_kept(ctx)
        st = ctx.st
        if create_graph_requested():
            check_double_backward("gat_attention", fs_s, fs2_s, fd_s)
            slope, p, seed = ctx.slope, ctx.p, ctx.seed
            grads = recompute_vjp(lambda *t: _gat_reference(st, *t, slope, p, seed),
                                  [fs_s, fd_s, attn_l, attn_r, ew], ctx.needs_input_grad[:5], [g_out, g_a])
            return (*grads, None, None, None, None, None)
        dtype = g_out.dtype
        raw, s, a = _attention(st, el, er, ctx.slope, ctx.p, ctx.seed, ew)
        g_out = g_out.contiguous()
        fs = unstash(fs_s)  # whole (edges read any source row), and dropped before the feature gradient exists
        grad_a = st.edge_dot(fs.to(dtype), g_out)
        del fs
        if g_a is not None:
            grad_a = grad_a + g_a
        grad_ew = None
        if ew is not None:
            if ctx.needs_input_grad[4]:
                d = kernels.get("dropout", s.device)(s, ctx.p, ctx.seed) if ctx.p > 0 else s
                grad_ew = (grad_a * d).sum(dim=tuple(range(1, grad_a.dim())), keepdim=False).view(ew.shape) \
                    if ew.shape[-1] == 1 else grad_a * d
            grad_a = grad_a * ew
        grad_s = kernels.get("dropout", s.device)(grad_a, ctx.p, ctx.seed) if ctx.p > 0 else grad_a
        grad_e = _softmax_backward(st, s, grad_s)
        grad_raw = torch.where(raw > 0, grad_e, grad_e * ctx.slope)
        del raw, s, grad_a, grad_s, grad_e
        grad_el = st.edge_sum_to(grad_raw, "src")
        grad_er = st.edge_sum_to(grad_raw, "dst")
        del grad_raw
        # the feature gradient's [N, H, D] buffer only now, after the per-edge tensors of the score gradient
        # are gone (they peaked beside it: six [E, H] tensors at once)
        grad_fs = st.aggregate(g_out, a.to(dtype), transpose=True)
        del a
        # the attention vectors' gradients from the second copy (independent of the first when compressed, see
        # forward; destination features: its first n_dst rows unless kept on their own), decoded row chunk by
        # row chunk: no whole decompressed copy and no [N, H, D] product
        ct = torch.promote_types(grad_el.dtype, dtype)
        second = fs_s if fs2_s is None else fs2_s
        grad_attn_l = _node_sum(grad_el, second, ct, grad_el.shape[0]).view(attn_l.shape) \
            if ctx.needs_input_grad[2] else None
        grad_attn_r = _node_sum(grad_er, second if fd_s is None else fd_s, ct, ctx.n_dst).view(attn_r.shape) \
            if ctx.needs_input_grad[3] else None
        grad_fs = _add_product(grad_fs, grad_el.unsqueeze(-1), attn_l)
        grad_fd = None
        if ctx.same:
            grad_fs = _add_product(grad_fs, grad_er.unsqueeze(-1), attn_r)
        elif ctx.needs_input_grad[1]:
            grad_fd = grad_er.unsqueeze(-1) * attn_r
        return grad_fs, grad_fd, grad_attn_l, grad_attn_r, grad_ew, None, None, None, None, None


# --- GAT attention in edge chunks ----------------------------------------------------------------------
def _chunk_softmax(rows: torch.Tensor, n: int, e: torch.Tensor):
    """Softmax of ``e [edges, H]`` over the edges sharing a row (all of a row's edges are in ``e``), and its
    per-row max and denominator (``[n, H]``): the ops of :func:`~dgl_exact.kernels.reference.edge_softmax_by_dst`,
    so that ``exp(e - max) / den`` recomputed elsewhere is the same value bit for bit."""
    idx = rows.view(-1, 1).expand_as(e)
    emax = e.new_full((n, e.shape[1]), float("-inf")).scatter_reduce_(0, idx, e, reduce="amax", include_self=True)
    ex = (e - emax[rows]).exp()
    den = e.new_zeros((n, e.shape[1])).index_add_(0, rows, ex)
    return ex / den[rows], emax, den


def _dst_chunk_attention(ch, el, er, slope, ew):
    """Attention of one destination chunk: (pre-activation scores, softmax, its max and denominator, weights)."""
    raw = el[ch.indices] + er[ch.r0:ch.r1][ch.rows]
    s, emax, den = _chunk_softmax(ch.rows, ch.num_rows, torch.nn.functional.leaky_relu(raw, slope))
    a = s if ew is None else s * ew[ch.eids]
    return raw, s, emax, den, a


def _gat_chunked_forward(st, feat_src, el, er, slope, ew, budget: int, need_attention: bool):
    """``out [N_dst, H, D]`` (and the attention ``[E, H]`` in edge-id order when asked for) computed one
    destination chunk at a time: no per-edge tensor larger than a chunk but the returned attention."""
    from .edge_chunks import csc_chunks

    out = feat_src.new_empty((st.num_dst,) + tuple(feat_src.shape[1:]))
    att = el.new_empty((st.num_edges, el.shape[1])) if need_attention else None
    for ch in csc_chunks(st, budget):
        _, _, _, _, a = _dst_chunk_attention(ch, el, er, slope, ew)
        out[ch.r0:ch.r1] = ch.aggregate(feat_src, a.to(feat_src.dtype))
        if att is not None:
            att[ch.eids] = a
    return out, att


class _GATAttentionChunked(torch.autograd.Function):
    """:class:`_GATAttention` without attention dropout, its per-edge tensors formed one edge chunk at a time
    (:mod:`.edge_chunks`) in forward and backward. Keeps exactly what :class:`_GATAttention` keeps."""

    @staticmethod
    def forward(ctx, feat_src, feat_dst, attn_l, attn_r, ew, st: GraphStructure, slope: float,
                cfg: CompressionConfig, budget: int, need_attention: bool):
        el = (feat_src * attn_l).sum(dim=-1)
        er = (feat_dst * attn_r).sum(dim=-1)
        out, att = _gat_chunked_forward(st, feat_src, el, er, slope, ew, budget, need_attention)
        prefix = _is_prefix_view(feat_dst, feat_src)
        ctx.st, ctx.slope, ctx.prefix, ctx.n_dst, ctx.budget = st, slope, prefix, feat_dst.shape[0], budget
        ctx.same = feat_dst is feat_src
        fs_kept = stash(feat_src, cfg)
        # the same stash calls as _GATAttention (see there: a second, independent copy for the attention
        # vectors' gradients; feat_dst by reference when it is a prefix of an exactly kept feat_src)
        second = cfg.enabled and (ctx.needs_input_grad[2] or (prefix and ctx.needs_input_grad[3]))
        fd_kept = (feat_dst if isinstance(fs_kept, torch.Tensor) else None) if prefix else stash(feat_dst, cfg)
        save_kept(ctx, fs_kept, stash(feat_src, cfg) if second else None, fd_kept, el, er, attn_l, attn_r, ew)
        if att is None:
            return out
        return out, att

    @staticmethod
    def backward(ctx, g_out, g_a=None):
        from .edge_chunks import csc_chunks, csr_chunks

        fs_s, fs2_s, fd_s, el, er, attn_l, attn_r, ew = load_kept(ctx)
        st, slope = ctx.st, ctx.slope
        if create_graph_requested():
            check_double_backward("gat_attention", fs_s, fs2_s, fd_s)
            grads = recompute_vjp(lambda *t: _gat_reference(st, *t, slope, 0.0, 0),
                                  [fs_s, fd_s, attn_l, attn_r, ew], ctx.needs_input_grad[:5], [g_out, g_a])
            return (*grads, None, None, None, None, None)
        dtype = g_out.dtype
        g_out = g_out.contiguous()
        heads = el.shape[1]
        ct = torch.promote_types(el.dtype, dtype)
        grad_el = torch.zeros((st.num_src, heads), dtype=ct, device=el.device)
        grad_er = torch.zeros((st.num_dst, heads), dtype=ct, device=el.device)
        emax_all = el.new_empty((st.num_dst, heads))
        den_all = el.new_empty((st.num_dst, heads))
        grad_ew = torch.zeros_like(ew) if ew is not None and ctx.needs_input_grad[4] else None
        # pass 1, destination chunks: the score gradients (a destination's softmax needs all its edges)
        fs = unstash(fs_s).to(dtype)  # whole (edges read any source row), dropped before the feature gradient
        for ch in csc_chunks(st, ctx.budget):
            raw, s, emax, den, _ = _dst_chunk_attention(ch, el, er, slope, None)
            emax_all[ch.r0:ch.r1], den_all[ch.r0:ch.r1] = emax, den
            grad_a = ch.edge_dot(fs, g_out[ch.r0:ch.r1])
            if g_a is not None:
                grad_a = grad_a + g_a[ch.eids]
            if ew is not None:
                if grad_ew is not None:
                    grad_ew[ch.eids] = (grad_a * s).sum(dim=1, keepdim=True) if ew.shape[-1] == 1 else grad_a * s
                grad_a = grad_a * ew[ch.eids]
            gs = grad_a * s
            grad_e = s * (grad_a - grad_a.new_zeros((ch.num_rows, heads)).index_add_(0, ch.rows, gs)[ch.rows])
            del gs, grad_a, s
            grad_raw = torch.where(raw > 0, grad_e, grad_e * slope)
            del raw, grad_e
            grad_el.index_add_(0, ch.indices, grad_raw.to(ct))
            grad_er[ch.r0:ch.r1].index_add_(0, ch.rows, grad_raw.to(ct))
            del grad_raw
        del fs
        # pass 2, source chunks: the feature gradient of the aggregation, each chunk's rows written once
        grad_fs = g_out.new_empty((st.num_src,) + tuple(g_out.shape[1:]))
        for ch in csr_chunks(st, ctx.budget):
            dst = ch.indices
            e = torch.nn.functional.leaky_relu(el[ch.r0:ch.r1][ch.rows] + er[dst], slope)
            a = (e - emax_all[dst]).exp() / den_all[dst]
            del e
            if ew is not None:
                a = a * ew[ch.eids]
            grad_fs[ch.r0:ch.r1] = ch.aggregate(g_out, a.to(dtype))
            del a
        del emax_all, den_all
        second = fs_s if fs2_s is None else fs2_s
        grad_attn_l = _node_sum(grad_el, second, ct, grad_el.shape[0]).view(attn_l.shape) \
            if ctx.needs_input_grad[2] else None
        grad_attn_r = _node_sum(grad_er, second if fd_s is None else fd_s, ct, ctx.n_dst).view(attn_r.shape) \
            if ctx.needs_input_grad[3] else None
        grad_fs = _add_product(grad_fs, grad_el.unsqueeze(-1), attn_l)
        grad_fd = None
        if ctx.same:
            grad_fs = _add_product(grad_fs, grad_er.unsqueeze(-1), attn_r)
        elif ctx.needs_input_grad[1]:
            grad_fd = grad_er.unsqueeze(-1) * attn_r
        if grad_ew is not None:
            grad_ew = grad_ew.view(ew.shape)
        return grad_fs, grad_fd, grad_attn_l, grad_attn_r, grad_ew, None, None, None, None, None


def _chunk_budget(st: GraphStructure, p: float, feat_src: Optional[torch.Tensor] = None) -> Optional[int]:
    """The edge budget of a chunked attention, or None where it runs over all edges at once: no chunk budget
    for this graph (:func:`dgl_exact.ops.edge_chunks.chunk_budget_for`), attention dropout (its mask is drawn
    over all edges), or under capture/compilation."""
    from .edge_chunks import chunk_budget_for

    if p > 0 or captured.active() or compiling():
        return None
    width = 1 if feat_src is None else feat_src.shape[-1]
    return chunk_budget_for(st.num_edges, st.num_src, width)


@fresh_outputs
def gat_attention(g, feat_src: torch.Tensor, feat_dst: torch.Tensor, attn_l: torch.Tensor, attn_r: torch.Tensor,
                  negative_slope: float = 0.2, attn_drop: float = 0.0, edge_weight: Optional[torch.Tensor] = None,
                  training: bool = True, config: Optional[CompressionConfig] = None, need_attention: bool = True):
    """GAT's attention and aggregation in one op: ``el = <feat_src, attn_l>``, ``er = <feat_dst, attn_r>``,
    ``a = dropout(edge_softmax(leaky_relu(el[u] + er[v])))`` (times ``edge_weight``), and
    ``out[v] = sum_u a[uv] * feat_src[u]``. ``feat_* [N, H, D]``, ``attn_* [1, H, D]``. Returns
    ``(out [N_dst, H, D], a [E, H, 1])``.

    Nothing per-edge is kept for backward: the attention is recomputed from ``el`` and ``er`` (``[N, H]``)
    and the dropout mask from its seed; only ``feat_src`` is kept, compressed (EXACT keeps every per-edge
    tensor in fp32), twice with independent noise when the attention vectors need gradients: their
    gradient is a product of two functions of the features, unbiased only with independent copies.

    Without attention dropout, on a graph with more edges than the edge chunk budget
    (:func:`dgl_exact.ops.edge_chunks.edge_chunks`), the per-edge tensors of forward and backward are formed
    one chunk of destination (or source) nodes at a time; ``need_attention=False`` then also spares the
    returned ``[E, H]`` attention (``None`` is returned in its place)."""
    st = structure_of(g, feat_src.device)
    _check_nodes(st, feat_src, "src")
    _check_nodes(st, feat_dst, "dst")
    if feat_src.dim() > 3:
        return _gat_attention_folded(g, feat_src, feat_dst, attn_l, attn_r, negative_slope, attn_drop, edge_weight,
                                     training, config, need_attention)
    p = float(attn_drop) if training else 0.0
    ew = None
    if edge_weight is not None:
        if edge_weight.shape[0] != st.num_edges:
            raise ValueError(f"edge_weight has {edge_weight.shape[0]} rows but the graph has {st.num_edges} edges")
        ew = edge_weight.reshape(st.num_edges, -1)
    budget = _chunk_budget(st, p, feat_src)
    if budget is not None:
        if not needs_saving(feat_src, feat_dst, attn_l, attn_r, ew):
            el = (feat_src * attn_l).sum(dim=-1)
            er = (feat_dst * attn_r).sum(dim=-1)
            out, att = _gat_chunked_forward(st, feat_src, el, er, float(negative_slope), ew, budget, need_attention)
        else:
            res = _GATAttentionChunked.apply(feat_src, feat_dst, attn_l, attn_r, ew, st, float(negative_slope),
                                             resolve_config(config), budget, need_attention)
            out, att = res if need_attention else (res, None)
        return out, (None if att is None else att.unsqueeze(-1))
    if not needs_saving(feat_src, feat_dst, attn_l, attn_r, ew):
        el = (feat_src * attn_l).sum(dim=-1)
        er = (feat_dst * attn_r).sum(dim=-1)
        _, _, a = _attention(st, el, er, negative_slope, p, draw_seed() if p > 0 else 0, ew)
        return st.aggregate(feat_src, a.to(feat_src.dtype)), a.unsqueeze(-1)
    seed = draw_seed() if p > 0 else 0
    out, a = captured.apply("_GATAttention", feat_src, feat_dst, attn_l, attn_r, ew, st, float(negative_slope), p, seed,
                                 resolve_config(config))
    return out, a.unsqueeze(-1)


def _gat_attention_folded(g, feat_src, feat_dst, attn_l, attn_r, negative_slope, attn_drop, edge_weight, training,
                          config, need_attention=True):
    """Features ``[N, *extra, H, D]`` (DGL accepts them): the extra dims are folded into the heads (the
    kernels take ``[N, H, D]``), the attention vectors repeated over them, and the results unfolded."""
    extra, (heads, dim) = feat_src.shape[1:-2], feat_src.shape[-2:]
    if feat_dst.shape[1:] != feat_src.shape[1:]:
        raise ValueError(f"source and destination features must have the same trailing shape, got "
                         f"{tuple(feat_src.shape[1:])} and {tuple(feat_dst.shape[1:])}")
    folds = math.prod(extra)

    def fold(t):
        return t.reshape(t.shape[0], folds * heads, dim)

    def fold_attn(a):
        return a.reshape(1, 1, heads, dim).expand(1, folds, heads, dim).reshape(1, folds * heads, dim)

    if edge_weight is not None and edge_weight[0].numel() == heads and heads > 1:
        n = edge_weight.shape[0]
        edge_weight = edge_weight.reshape(n, 1, heads).expand(n, folds, heads).reshape(n, folds * heads)
    out, a = gat_attention(g, fold(feat_src), fold(feat_dst), fold_attn(attn_l), fold_attn(attn_r), negative_slope,
                           attn_drop, edge_weight, training, config, need_attention)
    return out.view(out.shape[0], *extra, heads, dim), None if a is None else a.view(a.shape[0], *extra, heads, 1)


def normalize_edge_weight(g, edge_weight: torch.Tensor, norm: str = "both", eps: float = 0.0) -> torch.Tensor:
    """DGL's ``EdgeWeightNorm``: ``w / sqrt(out_w[src] in_w[dst])`` ('both') or ``w / in_w[dst]`` ('right'),
    where ``out_w``/``in_w`` sum the weights of each node's out-/in-edges. Differentiable, any device."""
    st = structure_of(g, edge_weight.device)
    if edge_weight.dim() > 1 and edge_weight.shape[1:].numel() > 1:
        raise ValueError("Currently the normalization is only defined on scalar edge weight")
    w = edge_weight.reshape(-1)
    if norm == "both":
        if bool((w <= 0).any()):
            raise ValueError('Non-positive edge weight detected with `norm="both"`. '
                             "This leads to square root of zero or negative values.")
        out_w = st.edge_sum_to(w, "src") + eps
        in_w = st.edge_sum_to(w, "dst") + eps
        return (w * out_w.pow(-0.5)[st.src] * in_w.pow(-0.5)[st.dst]).view(edge_weight.shape)
    if norm == "right":
        in_w = st.edge_sum_to(w, "dst") + eps
        return (w / in_w[st.dst]).view(edge_weight.shape)
    if norm == "none":
        return edge_weight
    raise ValueError(f"norm must be 'both', 'right' or 'none', got {norm!r}")
