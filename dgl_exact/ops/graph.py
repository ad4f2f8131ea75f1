"""Autograd graph ops (the GSpMM family and edge softmax) that keep only what backward needs; GAT's
attention is in :mod:`dgl_exact.ops.gat`.

=================  ==========================================  =====================================
op                 backward needs                              kept
=================  ==========================================  =====================================
copy_u sum/mean    nothing (grad_x = A^T grad)                  nothing (EXACT keeps compressed x)
u_mul_e sum        x for grad_e, edge values for grad_x         compressed x, exact edge values
copy_u max/min     which source won                             arg indices, narrowest signed int
u_add_v            nothing                                      nothing
edge_softmax       its output                                   compressed output
gat_attention      feat, el/er (attention is recomputed)        compressed feat (twice, independently:
                                                               unbiased attention-vector gradients; the
                                                               second is fc's kept input where fc made
                                                               feat, ownership rule 10), el and er ([N, H])
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
from ..compression_config import CompressionConfig, resolve_config
from ..kernels import reference as kernel_reference
from .chunks import needs_chunks, row_chunks
from .edge_chunks import ChunkCSR
from .keep import fresh_outputs, as_kept, restore
from .double_backward import double_backward
from .saved import load_kept, needs_saving, save_kept
from .dgl_general import readable
from .dgl_originals import originals
from .spmm_broadcast import gspmm_broadcast, pad_feature_shapes
from .structure import GraphStructure, edge_softmax_forward, structure_of
from . import captured
from .function import Function

__all__ = ["normalize_edge_weight", "copy_u_sum", "copy_u_mean", "u_mul_e_sum", "copy_u_max", "copy_u_min", "u_add_v",
           "edge_softmax",
           # the pieces other ops build on: the shape check, the autograd Functions on a structure (the PyG
           # drop-ins run them on theirs), DGL's feature-shape rule, and the differentiable references
           "check_nodes", "CopyUReduce", "UMulESum", "CopyUMinMax", "mul_layout", "spmm_ref", "edge_softmax_ref",
           "softmax_backward"]


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
    if captured.active() or compiling():
        return out.view(shape)
    if out.shape == shape:
        return out  # not out.view(shape): a view all the same, which autograd would refuse to update in place
    view = out.view(shape)
    return out.new_empty(0).set_(out.untyped_storage(), out.storage_offset(), shape, view.stride())


def check_nodes(st: GraphStructure, x: torch.Tensor, side: str = "src"):
    """Raise a one-line ValueError unless ``x`` has one row per ``side`` ('src' or 'dst') node of ``st``."""
    n = st.num_src if side == "src" else st.num_dst
    if x.shape[0] != n:
        raise ValueError(f"features have {x.shape[0]} rows but the graph has {n} {side} nodes; pass one row per "
                         f"{'source' if side == 'src' else 'destination'} node")


def spmm_ref(st: GraphStructure, x3: torch.Tensor, w2: Optional[torch.Tensor] = None,
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


def edge_softmax_ref(st: GraphStructure, e: torch.Tensor) -> torch.Tensor:
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
class CopyUReduce(Function):
    """``apply(x, st, mean)``: the sum (``mean``: the mean) over each node's in-edges of ``x``'s source rows, on
    a structure ``st``; keeps nothing (the backward is the transposed sum)."""

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
        if double_backward("copy_u_sum"):  # linear: nothing kept, always exact
            return spmm_ref(st, g, transpose=True).reshape(ctx.xshape), None, None
        return st.aggregate(g, transpose=True).view(ctx.xshape), None, None


@fresh_outputs
def copy_u_sum(g, x: torch.Tensor) -> torch.Tensor:
    """``out[v] = sum_{u -> v} x[u]``; keeps nothing for backward."""
    st = structure_of(g, x.device)
    check_nodes(st, x)
    return captured.apply("CopyUReduce", x, st, False)


@fresh_outputs
def copy_u_mean(g, x: torch.Tensor) -> torch.Tensor:
    """``out[v] = mean_{u -> v} x[u]`` (0 without in-edges); keeps nothing for backward."""
    st = structure_of(g, x.device)
    check_nodes(st, x)
    return captured.apply("CopyUReduce", x, st, True)


# --- sum weighted by a source-node normalisation ----------------------------------------------------------
@captured.capturable
class _SrcNormSum(Function):
    @staticmethod
    def forward(ctx, x, st: GraphStructure, degrees: str, kind: str):
        x3 = _as3(x)
        # the node factors spread over the edges for this call: the forward aggregates x itself, no
        # layer-sized ``x * norm``
        w = st.src_edge_norm(degrees, kind, x3.dtype).unsqueeze(1)
        out = st.aggregate(x3, w)
        del w
        ctx.st, ctx.degrees, ctx.kind, ctx.xshape = st, degrees, kind, x.shape
        return _node_output(out, (st.num_dst,) + tuple(x.shape[1:]))

    @staticmethod
    def backward(ctx, grad):
        st = ctx.st
        g = _as3(grad.contiguous())
        norm = st.node_norm(ctx.degrees, ctx.kind, g.dtype).view(-1, 1, 1)
        if double_backward("src_norm_sum"):  # linear: nothing kept, always exact
            return (spmm_ref(st, g, transpose=True) * norm).reshape(ctx.xshape), None, None, None
        # every edge out of u carries u's factor: the transposed sum needs no edge weights (so a symmetric
        # graph's CSC serves it), and the factor scales the sum's own buffer in place
        return st.aggregate(g, transpose=True).mul_(norm).view(ctx.xshape), None, None, None


@fresh_outputs
def src_norm_sum(g, x: torch.Tensor, kind: str = "sqrt", degrees: str = "out") -> torch.Tensor:
    """``out[v] = sum_{u -> v} n(u) x[u]`` with ``n(u) = deg(u)^-1/2`` (``kind`` 'sqrt') or ``1 / deg(u)``
    ('inv'), ``deg`` the out-degree (``degrees`` 'out') or in-degree ('in'), clamped at 1: GraphConv's
    source normalisation inside the aggregation. Keeps nothing for backward. The forward spreads the factors
    over the edges for the call (``E`` values, freed on return; nothing per edge is cached); backward needs
    only the transposed sum without edge weights, scaled in place."""
    if kind not in ("sqrt", "inv") or degrees not in ("out", "in"):
        raise ValueError(f"src_norm_sum: kind is 'sqrt' or 'inv' and degrees 'out' or 'in', got {kind!r}, {degrees!r}")
    st = structure_of(g, x.device)
    check_nodes(st, x)
    return captured.apply("_SrcNormSum", x, st, degrees, kind)


# --- u_mul_e sum ------------------------------------------------------------------------------------
def mul_layout(xs: tuple, ws: tuple) -> Optional[tuple]:
    """``(out_shape, heads, dim, heads_last)`` when ``x * w`` (DGL's broadcasting of feature shapes ``xs`` and
    ``ws``) is the kernel's ``x [n, heads, dim] * w [E, heads, 1]``: ``w``'s feature shape, right-aligned, is a
    prefix of ``x``'s followed by 1s (``heads_last`` False), or 1s followed by a suffix of ``x``'s (``x [n,
    dim, heads] * w [E, 1, heads]``, heads last: ``heads_last`` True, run on heads-first copies of the
    node-sized tensors); and ``x`` is not broadcast. Else None (the general path, :mod:`.dgl_ops`)."""
    xp, wp = pad_feature_shapes(xs, ws)
    try:
        out = tuple(torch.broadcast_shapes(xp, wp))
    except RuntimeError:
        return None
    if out != xp:
        return None
    j = max((i for i, d in enumerate(wp) if d != 1), default=-1)
    if wp[: j + 1] == xp[: j + 1]:
        return out, math.prod(xp[: j + 1]), math.prod(xp[j + 1:]), False
    i = min(i for i, d in enumerate(wp) if d != 1)  # exists: j >= 0 here
    if wp[i:] == xp[i:]:
        return out, math.prod(xp[i:]), math.prod(xp[:i]), True
    return None


def _heads_first(t: torch.Tensor, heads: int, dim: int, heads_last: bool) -> torch.Tensor:
    """``t`` (node-sized, features ``heads x dim`` or, ``heads_last``, ``dim x heads``) as ``[n, heads, dim]``:
    a view, or a contiguous heads-first copy."""
    if not heads_last:
        return t.reshape(t.shape[0], heads, dim)
    return t.reshape(t.shape[0], dim, heads).transpose(1, 2).contiguous()


def _heads_back(t: torch.Tensor, heads_last: bool) -> torch.Tensor:
    """Inverse of :func:`_heads_first` for a ``[n, heads, dim]`` result: ``[n, dim, heads]`` where heads last."""
    return t.transpose(1, 2).contiguous() if heads_last else t


@captured.capturable
class UMulESum(Function):
    """``apply(x, w, st, out_shape, heads, dim, cfg, heads_last=False)``: ``out[v] = sum_{(u, e, v)} x[u] * w[e]``
    on a structure ``st`` with the layout :func:`mul_layout` gives; keeps ``x`` compressed under ``cfg`` (for
    the edge gradient) and ``w`` as per-edge values are kept (for the feature gradient, which is linear in
    ``w``: unbiased from an unbiased copy): by reference where alive anyway (edge weights given as data),
    else compressed under :func:`_edge_weight_config` (attention weights: at least 8 bits)."""

    @staticmethod
    def forward(ctx, x, w, st: GraphStructure, out_shape: tuple, heads: int, dim: int, cfg: CompressionConfig,
                heads_last: bool = False):
        x3, w2 = _heads_first(x, heads, dim, heads_last), w.reshape(w.shape[0], heads)
        out = _heads_back(st.aggregate(x3, w2.to(x3.dtype)), heads_last)
        del x3
        ctx.st, ctx.xshape, ctx.wshape, ctx.heads, ctx.dim = st, x.shape, w.shape, heads, dim
        ctx.heads_last = heads_last
        # keep x and w themselves, not the views x3, w2: views made inside forward have no grad_fn and would
        # pass for tensors alive anyway (kept uncompressed, by reference)
        # the edge gradient is linear in x: x may be kept through the op that made it (rules 10, 11)
        save_kept(ctx, as_kept(x, cfg, via_linear=True) if ctx.needs_input_grad[1] else None,
                  as_kept(w, _edge_weight_config(cfg, heads)) if ctx.needs_input_grad[0] else None)
        return _node_output(out, (st.num_dst,) + tuple(out_shape))

    @staticmethod
    def backward(ctx, grad):
        x_s, w_s = load_kept(ctx)
        st = ctx.st
        # heads last: the gradient as a heads-first copy (node-sized), so that the edge gradient is the kernel's
        # per-edge, per-head dot product: no [E, dim, heads] product is formed
        g = _heads_first(grad.contiguous(), ctx.heads, ctx.dim, ctx.heads_last)
        gx = gw = None
        if double_backward("u_mul_e_sum", x_s, w_s):
            aggregate, edge_dot = functools.partial(spmm_ref, st), functools.partial(_edge_dot_ref, st)
        else:
            aggregate, edge_dot = st.aggregate, st.edge_dot
        if ctx.needs_input_grad[0]:
            w2 = restore(w_s).reshape(ctx.wshape[0], ctx.heads)
            gx = _heads_back(aggregate(g, w2.to(g.dtype), transpose=True), ctx.heads_last).reshape(ctx.xshape)
            del w2
        if ctx.needs_input_grad[1] and edge_dot == st.edge_dot and needs_chunks(x_s):
            gw = _edge_dot_by_sources(st, x_s, g, ctx.heads, ctx.dim, ctx.heads_last).reshape(ctx.wshape)
        elif ctx.needs_input_grad[1]:
            x3 = _heads_first(restore(x_s), ctx.heads, ctx.dim, ctx.heads_last)
            gw = edge_dot(x3.to(g.dtype), g).reshape(ctx.wshape)
        return gx, gw, None, None, None, None, None, None


def _edge_dot_by_sources(st: GraphStructure, x_s, g: torch.Tensor, heads: int, dim: int,
                         heads_last: bool) -> torch.Tensor:
    """``st.edge_dot(x, g)`` (``[E, heads]``) for the kept source features ``x_s``, one decoded row chunk of the
    sources at a time (:func:`~.chunks.row_chunks`: no full-size decoded copy): a chunk's out-edges are one
    contiguous range of the out-edge CSR (:class:`~.edge_chunks.ChunkCSR`), their products written to their
    edge ids. The same per-edge dot products as over the whole, in any chunking."""
    indptr, indices, eids = st.csr
    ptr = indptr.detach().cpu().long()
    out = g.new_empty((st.num_edges, heads))
    for r0, r1, x in row_chunks(x_s):
        ch = ChunkCSR(indptr, indices, eids, st.num_dst, r0, r1, int(ptr[r0]), int(ptr[r1]))
        if ch.num_edges:
            out[ch.eids] = ch.edge_dot(g, _heads_first(x, heads, dim, heads_last).to(g.dtype))
        del x, ch  # before the next chunk is decoded (see row_chunks)
    return out


@fresh_outputs
def u_mul_e_sum(g, x: torch.Tensor, y: torch.Tensor, *, config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``out[v] = sum_{(u, e, v)} x[u] * y[e]`` (DGL's ``u_mul_e_sum``, its broadcasting: feature shapes
    right-aligned as numpy does); keeps compressed ``x`` (for the edge gradient) and the edge values (for
    the feature gradient: by reference where they are data, else compressed at 8 bits or more, unbiased).
    Heads last (``x [N, D, H]``, ``y [E, H]``) runs heads first on
    node-sized copies, so that no backward forms an ``[E, D, H]`` product (the edge gradient is a per-edge,
    per-head dot product). Shapes the fused kernel does not take (``y`` broadcasting against a middle
    feature dim, ``x`` broadcast by ``y``) run :mod:`.spmm_broadcast`, which keeps the same and forms
    nothing larger than the inputs and output in its backward either."""
    st = structure_of(g, x.device)
    check_nodes(st, x)
    if y.shape[0] != st.num_edges:
        raise ValueError(f"edge values have {y.shape[0]} rows but the graph has {st.num_edges} edges")
    layout = mul_layout(tuple(x.shape[1:]), tuple(y.shape[1:]))
    if layout is None:
        return gspmm_broadcast(g, "mul", "sum", x, y, config)
    out_shape, heads, dim, heads_last = layout
    if not needs_saving(x, y):
        out = st.aggregate(_heads_first(x, heads, dim, heads_last), y.reshape(y.shape[0], heads).to(x.dtype))
        return _node_output(_heads_back(out, heads_last), (st.num_dst,) + out_shape)
    return captured.apply("UMulESum", x, y, st, out_shape, heads, dim, resolve_config(config), heads_last)


# --- copy_u max / min -------------------------------------------------------------------------------
@captured.capturable
class CopyUMinMax(Function):
    """``apply(x, st, reduce)``: the max or min (``reduce``) over each node's in-edges of ``x``'s source rows
    (0 without in-edges), on a structure ``st``; keeps the winning source per element, narrowest int type."""

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
    check_nodes(st, x)
    return captured.apply("CopyUMinMax", x, st, "max")


@fresh_outputs
def copy_u_min(g, x: torch.Tensor) -> torch.Tensor:
    st = structure_of(g, x.device)
    check_nodes(st, x)
    return captured.apply("CopyUMinMax", x, st, "min")


# --- u_add_v -----------------------------------------------------------------------------------------
@captured.capturable
class _UAddV(Function):
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
    check_nodes(st, x, "src")
    check_nodes(st, y, "dst")
    xp, yp = pad_feature_shapes(tuple(x.shape[1:]), tuple(y.shape[1:]))
    if xp != yp:  # broadcast between the operands: DGL's kernel (nothing kept either)
        return originals().gsddmm(readable(g), "add", x, y, "u", "v")
    return captured.apply("_UAddV", x.reshape((x.shape[0],) + xp), y.reshape((y.shape[0],) + yp), st)


# --- edge softmax ------------------------------------------------------------------------------------
def softmax_backward(st: GraphStructure, s: torch.Tensor, gs: torch.Tensor, by: str = "dst",
                     s_sum: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Gradient of a per-destination (``by='src'``: per-source) softmax with output ``s`` given output
    gradient ``gs``: ``s * (gs - sum(gs * s))``. ``s_sum``: the copy of ``s`` the sum reads (a second,
    independent decode: the gradient is then unbiased, see :class:`_EdgeSoftmax`)."""
    s_sum = s if s_sum is None else s_sum
    return s * (gs - st.edge_sum_to(gs * s_sum, by)[st.dst if by == "dst" else st.src])


def _softmax_forward(st: GraphStructure, e: torch.Tensor, by: str) -> torch.Tensor:
    if by == "dst":
        return edge_softmax_forward(st, e)
    return kernel_reference.edge_softmax_by_dst(st.src, st.num_src, e)


@captured.capturable
class _EdgeSoftmax(Function):
    """Keeps its output ``s``; compressed, two independent copies. The backward ``s * (g - sum(g * s))`` is
    quadratic in ``s``: from one copy ``s_hat`` its expectation misses ``Var(s_hat_i) g_i`` per edge (the sum's
    own term, O(step**2)); with the outer factor and the sum decoded from independent draws it is unbiased."""

    @staticmethod
    def forward(ctx, e, st: GraphStructure, cfg: CompressionConfig, by: str = "dst"):
        s = _softmax_forward(st, e, by)
        ctx.st, ctx.by = st, by
        if cfg.enabled:
            save_kept(ctx, as_kept(s, cfg, force=True), as_kept(s, cfg, force=True, independent=True))
        else:
            save_kept(ctx, s, None)
        return s

    @staticmethod
    def backward(ctx, grad):
        s, s_sum = load_kept(ctx)
        double_backward("edge_softmax", s, s_sum)  # raises unless s is the output itself: the ops below are exact
        s = restore(s).to(grad.dtype)
        s_sum = None if s_sum is None else restore(s_sum).to(grad.dtype)
        return softmax_backward(ctx.st, s, grad, ctx.by, s_sum), None, None, None


def _edge_config(cfg: CompressionConfig, heads: int) -> CompressionConfig:
    """Per-edge tensors have few columns (heads): group ~256 values so metadata stays negligible."""
    return cfg.replace(kept_frac=1.0, block_rows=max(cfg.block_rows, -(-256 // max(heads, 1))))


def _edge_weight_config(cfg: CompressionConfig, heads: int) -> CompressionConfig:
    """How an aggregation keeps edge weights that have autograd history (attention weights) for its feature
    gradient: :func:`_edge_config` at 8 bits or more. The feature gradient ``A_w^T g`` is linear in them, so
    any unbiased copy keeps it unbiased; 8 bits keep its added variance small at a quarter of fp32's bytes
    (``[E, heads]`` values: edge-sized, the largest kept tensor of an attention layer left in fp32)."""
    return _edge_config(cfg, heads).replace(bits=max(cfg.bits, 8))


ALL = "__ALL__"  # dgl.base.ALL


@fresh_outputs
def edge_softmax(graph, logits, eids=ALL, norm_by: str = "dst", *,
                 config: Optional[CompressionConfig] = None):
    """DGL's ``edge_softmax``: softmax of edge scores over each destination's in-edges (``norm_by='src'``:
    each source's out-edges); keeps its output compressed, in two independent copies (its backward is quadratic
    in it, see :class:`_EdgeSoftmax`). ``eids`` (a subset of edges) and a heterograph's
    per-type dict of scores run DGL's own op (its output kept exactly)."""
    if norm_by not in ("dst", "src"):
        raise ValueError(f"norm_by must be 'dst' or 'src', got {norm_by!r}")
    if isinstance(logits, dict) or not (isinstance(eids, str) and eids == ALL) \
            or len(getattr(graph, "canonical_etypes", ())) > 1:
        from .dgl_originals import originals

        return originals().edge_softmax(graph, logits, eids, norm_by)
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
