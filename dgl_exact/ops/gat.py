"""GAT's attention and aggregation as one op (:func:`gat_attention`) that keeps no per-edge tensor.

``el = <feat_src, attn_l>`` and ``er = <feat_dst, attn_r>`` (``[N, H]``) are kept with the features
(compressed, twice with independent noise where the attention vectors need gradients: the second is the kept
input of the dgl_exact linear that made the features, where one did, ownership rule 10); the attention is
recomputed from them in the backward. On graphs where the per-edge tensors outweigh the node features the
forward and backward run in edge chunks (:mod:`dgl_exact.ops.edge_chunks`): no edge-sized fp32 tensor
beyond one chunk is alive. Double backward runs the reference recompute from exactly kept tensors, and
refuses compressed ones (see :mod:`dgl_exact.ops.graph`).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .._compat import compiling
from ..compression import draw_seed
from ..compression_config import CompressionConfig, resolve_config
from .. import kernels
from ..kernels import reference as kernel_reference
from .keep import fresh_outputs, as_kept, restore
from .chunks import row_chunks
from .double_backward import double_backward, recompute_vjp
from .saved import load_kept, needs_saving, save_kept
from .structure import GraphStructure, edge_softmax_forward, structure_of
from . import captured
from .graph import check_nodes, edge_softmax_ref, softmax_backward, spmm_ref
from .function import Function

__all__ = ["gat_attention", "GATAttention", "GATAttentionChunked", "edge_attention", "attention_chunk_budget"]


def _is_prefix_view(dst: torch.Tensor, src: torch.Tensor) -> bool:
    return (dst.data_ptr() == src.data_ptr() and dst.shape[1:] == src.shape[1:]
            and dst.stride() == src.stride() and dst.shape[0] <= src.shape[0])


def edge_attention(st, el, er, slope, p, seed, ew):
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
    a = edge_softmax_ref(st, e)
    if p > 0:
        a = kernel_reference.dropout(a, p, seed)
    if ew is not None:
        a = a * ew
    return spmm_ref(st, feat_src, a), a


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
        del x, part  # before the next chunk is decoded (see row_chunks)
    if out is None:  # no rows
        out = torch.zeros((grad.shape[1], item.shape[-1]), dtype=dtype, device=grad.device)
    return out


def _second_copy(feat_src, cfg, attn_l, attn_r):
    """The source features' second copy, for the attention vectors' gradients only: a draw independent of the
    first (fresh noise, never shared), or, where the vectors are parameters and a dgl_exact linear made the
    features, that linear's kept input (rule 10: its draw is independent of the first copy, and it serves only
    gradients of tensors without autograd history)."""
    leaves = attn_l.grad_fn is None and attn_r.grad_fn is None
    return as_kept(feat_src, cfg, independent=True, via_linear=True, leaf_grads=leaves)


def _score_gradients(ctx, grad_fs, grad_el, grad_er, kept, attn_l, attn_r, ct):
    """``(grad_fs, grad_fd, grad_attn_l, grad_attn_r)`` from the scores' per-node gradients ``grad_el``,
    ``grad_er``: the attention vectors' from the second kept copy of the source features (``kept = (fs_s,
    fs2_s, fd_s)``; the destination features: its first rows unless kept on their own), the features' added
    to ``grad_fs`` (the aggregation's)."""
    fs_s, fs2_s, fd_s = kept
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
    return grad_fs, grad_fd, grad_attn_l, grad_attn_r


@captured.capturable
class GATAttention(Function):
    """``apply(feat_src, feat_dst, attn_l, attn_r, ew, st, slope, p, seed, cfg)``: :func:`gat_attention`'s op
    on a structure ``st``: ``(out [N_dst, H, D], attention [E, H])``; keeps ``feat_src`` compressed (twice,
    independently, where the attention vectors need gradients), ``el``/``er`` and no per-edge tensor."""

    @staticmethod
    def forward(ctx, feat_src, feat_dst, attn_l, attn_r, ew, st: GraphStructure, slope: float, p: float,
                seed: int, cfg: CompressionConfig):
        el = (feat_src * attn_l).sum(dim=-1)
        er = (feat_dst * attn_r).sum(dim=-1)
        _, _, a = edge_attention(st, el, er, slope, p, seed, ew)
        out = st.aggregate(feat_src, a.to(feat_src.dtype))
        prefix = _is_prefix_view(feat_dst, feat_src)
        ctx.st, ctx.slope, ctx.p, ctx.seed, ctx.prefix, ctx.n_dst = st, slope, p, seed, prefix, feat_dst.shape[0]
        # one tensor for both ends (GATConv on a graph, not a block): its two gradients are summed here, in
        # place, rather than returned as two [N, H, D] tensors for autograd to add into a third
        ctx.same = feat_dst is feat_src
        fs_kept = as_kept(feat_src, cfg)
        # The attention-vector gradients multiply the features by a gradient that is itself linear in the
        # (decompressed) source features: with a single compressed copy the product is biased
        # (E[x_hat x_hat^T] != x x^T; about 10% at INT2, ~100% with projection). A second, independently
        # compressed copy of the source features serves those products and keeps them unbiased.
        # Decided by the configuration, not by what the first keep returned, so that a forward makes the same
        # keep calls whatever a per-tensor plan keeps exactly (its slots are numbered by call); a copy of a
        # tensor alive anyway is kept by reference, at no cost.
        second = cfg.enabled and (ctx.needs_input_grad[2] or (prefix and ctx.needs_input_grad[3]))
        # feat_dst is kept by reference (a view, no memory) when feat_src is exact: double backward needs it
        fd_kept = (feat_dst if isinstance(fs_kept, torch.Tensor) else None) if prefix else as_kept(feat_dst, cfg)
        fs_second = _second_copy(feat_src, cfg, attn_l, attn_r) if second else None
        save_kept(ctx, fs_kept, fs_second, fd_kept, el, er, attn_l, attn_r, ew)
        return out, a

    @staticmethod
    def backward(ctx, g_out, g_a):
        fs_s, fs2_s, fd_s, el, er, attn_l, attn_r, ew = load_kept(ctx)
        st = ctx.st
        if double_backward("gat_attention", fs_s, fs2_s, fd_s):
            slope, p, seed = ctx.slope, ctx.p, ctx.seed
            grads = recompute_vjp(lambda *t: _gat_reference(st, *t, slope, p, seed),
                                  [fs_s, fd_s, attn_l, attn_r, ew], ctx.needs_input_grad[:5], [g_out, g_a])
            return (*grads, None, None, None, None, None)
        dtype = g_out.dtype
        raw, s, a = edge_attention(st, el, er, ctx.slope, ctx.p, ctx.seed, ew)
        g_out = g_out.contiguous()
        fs = restore(fs_s)  # whole (edges read any source row), and dropped before the feature gradient exists
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
        grad_e = softmax_backward(st, s, grad_s)
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
        grad_fs, grad_fd, grad_attn_l, grad_attn_r = _score_gradients(
            ctx, grad_fs, grad_el, grad_er, (fs_s, fs2_s, fd_s), attn_l, attn_r, ct)
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


class GATAttentionChunked(Function):
    """:class:`GATAttention` without attention dropout, its per-edge tensors formed one edge chunk at a time
    (:mod:`.edge_chunks`) in forward and backward. Keeps exactly what :class:`GATAttention` keeps."""

    @staticmethod
    def forward(ctx, feat_src, feat_dst, attn_l, attn_r, ew, st: GraphStructure, slope: float,
                cfg: CompressionConfig, budget: int, need_attention: bool):
        el = (feat_src * attn_l).sum(dim=-1)
        er = (feat_dst * attn_r).sum(dim=-1)
        out, att = _gat_chunked_forward(st, feat_src, el, er, slope, ew, budget, need_attention)
        prefix = _is_prefix_view(feat_dst, feat_src)
        ctx.st, ctx.slope, ctx.prefix, ctx.n_dst, ctx.budget = st, slope, prefix, feat_dst.shape[0], budget
        ctx.same = feat_dst is feat_src
        fs_kept = as_kept(feat_src, cfg)
        # the same keep calls as GATAttention (see there: a second, independent copy for the attention
        # vectors' gradients; feat_dst by reference when it is a prefix of an exactly kept feat_src)
        second = cfg.enabled and (ctx.needs_input_grad[2] or (prefix and ctx.needs_input_grad[3]))
        fd_kept = (feat_dst if isinstance(fs_kept, torch.Tensor) else None) if prefix else as_kept(feat_dst, cfg)
        fs_second = _second_copy(feat_src, cfg, attn_l, attn_r) if second else None
        save_kept(ctx, fs_kept, fs_second, fd_kept, el, er, attn_l, attn_r, ew)
        if att is None:
            return out
        return out, att

    @staticmethod
    def backward(ctx, g_out, g_a=None):
        from .edge_chunks import csc_chunks, csr_chunks

        fs_s, fs2_s, fd_s, el, er, attn_l, attn_r, ew = load_kept(ctx)
        st, slope = ctx.st, ctx.slope
        if double_backward("gat_attention", fs_s, fs2_s, fd_s):
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
        fs = restore(fs_s).to(dtype)  # whole (edges read any source row), dropped before the feature gradient
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
        grad_fs, grad_fd, grad_attn_l, grad_attn_r = _score_gradients(
            ctx, grad_fs, grad_el, grad_er, (fs_s, fs2_s, fd_s), attn_l, attn_r, ct)
        if grad_ew is not None:
            grad_ew = grad_ew.view(ew.shape)
        return grad_fs, grad_fd, grad_attn_l, grad_attn_r, grad_ew, None, None, None, None, None


def attention_chunk_budget(st: GraphStructure, p: float, feat_src: Optional[torch.Tensor] = None) -> Optional[int]:
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
    check_nodes(st, feat_src, "src")
    check_nodes(st, feat_dst, "dst")
    if feat_src.dim() > 3:
        return _gat_attention_folded(g, feat_src, feat_dst, attn_l, attn_r, negative_slope, attn_drop, edge_weight,
                                     training, config, need_attention)
    p = float(attn_drop) if training else 0.0
    ew = None
    if edge_weight is not None:
        if edge_weight.shape[0] != st.num_edges:
            raise ValueError(f"edge_weight has {edge_weight.shape[0]} rows but the graph has {st.num_edges} edges")
        ew = edge_weight.reshape(st.num_edges, -1)
    budget = attention_chunk_budget(st, p, feat_src)
    if budget is not None:
        if not needs_saving(feat_src, feat_dst, attn_l, attn_r, ew):
            el = (feat_src * attn_l).sum(dim=-1)
            er = (feat_dst * attn_r).sum(dim=-1)
            out, att = _gat_chunked_forward(st, feat_src, el, er, float(negative_slope), ew, budget, need_attention)
        else:
            res = GATAttentionChunked.apply(feat_src, feat_dst, attn_l, attn_r, ew, st, float(negative_slope),
                                             resolve_config(config), budget, need_attention)
            out, att = res if need_attention else (res, None)
        return out, (None if att is None else att.unsqueeze(-1))
    if not needs_saving(feat_src, feat_dst, attn_l, attn_r, ew):
        el = (feat_src * attn_l).sum(dim=-1)
        er = (feat_dst * attn_r).sum(dim=-1)
        _, _, a = edge_attention(st, el, er, negative_slope, p, draw_seed() if p > 0 else 0, ew)
        return st.aggregate(feat_src, a.to(feat_src.dtype)), a.unsqueeze(-1)
    seed = draw_seed() if p > 0 else 0
    out, a = captured.apply("GATAttention", feat_src, feat_dst, attn_l, attn_r, ew, st, float(negative_slope), p, seed,
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
