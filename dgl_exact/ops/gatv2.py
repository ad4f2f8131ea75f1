"""GATv2's attention (Brody et al., ICLR 2022) as one op, :func:`gatv2_attention`, that keeps one bit per
per-edge feature element and no fp32 per-edge feature tensor.

``alpha = softmax_dst(<LeakyReLU(x_l[src] + x_r[dst]), att>)`` ``[E, H]``. Unlike GAT's, the score does
not split into per-node terms (the LeakyReLU acts on the per-edge sum), so the per-edge features ``z`` are
formed in the forward and recomputed in the backward from the kept node features. Kept: ``x_l`` and ``x_r``
compressed (a copy of their own, so the attention vector's gradient, a product of this copy and of the
incoming gradient, stays unbiased where the caller's aggregation keeps ``x_l`` independently), the sign of
``z`` (one bit per element, exact: the LeakyReLU's slope is never guessed from decompressed values), the
attention ``alpha`` (the output, exact: the softmax's backward is quadratic in it) and ``att``.

Gradients, with ``g`` the score gradient ``[E, H]`` (softmax backward from the exact ``alpha``) and ``m`` the
kept slope per element (1 or ``negative_slope``): ``d att = sum_e g m z_hat`` (linear in the decompressed
``z_hat``: unbiased), ``d z = g m att`` onto the sources (``x_l``) and destinations (``x_r``). Double
backward recomputes the reference from exactly kept inputs and refuses compressed ones.

The ``[E, H, C]`` tensors (``z`` and its signs in the forward; ``z`` and ``d z`` in the backward) are formed
over contiguous edge ranges, one at a time (:func:`_edge_ranges`: the edge budget of GAT's chunked attention,
:mod:`dgl_exact.ops.edge_chunks`), so that at most one range's exist at once; the ``[E, H]`` scores, attention
and score gradient are whole.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from .. import kernels
from ..compression_config import CompressionConfig, resolve_config
from ..kernels import reference as kernel_reference
from .double_backward import check_double_backward, create_graph_requested, recompute_vjp
from .gat import attention_chunk_budget
from .keep import fresh_outputs, as_kept, restore
from .saved import load_kept, needs_saving, save_kept
from .structure import GraphStructure, edge_softmax_forward, structure_of
from .function import Function

__all__ = ["gatv2_attention"]


def _scores(st: GraphStructure, x_l: torch.Tensor, x_r: torch.Tensor, att: torch.Tensor, slope: float,
            e0: int = 0, e1: Optional[int] = None):
    """``(scores [e1 - e0, H], z > 0 [e1 - e0, H, C])`` of the edges ``[e0, e1)`` (default: all); the one
    ``[edges, H, C]`` temporary is activated in place."""
    e1 = st.num_edges if e1 is None else e1
    z = x_l.index_select(0, st.src[e0:e1])
    z += x_r.index_select(0, st.dst[e0:e1])
    positive = z > 0
    F.leaky_relu(z, slope, inplace=True)
    return torch.einsum("ehc,hc->eh", z, att.reshape(att.shape[-2:]).to(z.dtype)), positive


def _edge_ranges(st: GraphStructure) -> List[Tuple[int, int]]:
    """Contiguous edge ranges ``[(e0, e1), ...]`` the per-edge ``[edges, H, C]`` tensors are formed over, one at a
    time: the edge budget of GAT's chunked attention (:func:`dgl_exact.ops.gat.attention_chunk_budget`, asked
    with unit width: these per-edge tensors are as wide as the node features, so they dominate wherever edges
    outnumber a quarter of the sources), rounded down to a multiple of 8 so that each range's sign bits start
    on a byte of the packed mask; one range without a budget."""
    budget = attention_chunk_budget(st, 0.0)
    n = st.num_edges
    if budget is None or n <= budget:
        return [(0, n)]
    step = max(8, budget - budget % 8)
    return [(e0, min(e0 + step, n)) for e0 in range(0, n, step)]


def _all_scores(st: GraphStructure, x_l, x_r, att, slope: float, ranges, keep_signs: bool):
    """``(scores [E, H], packed signs of z or None)``, formed range by range (:func:`_edge_ranges`)."""
    scores, packed = [], []
    for e0, e1 in ranges:
        part, positive = _scores(st, x_l, x_r, att, slope, e0, e1)
        scores.append(part)
        if keep_signs:
            packed.append(kernels.get("pack_mask", positive.device)(positive))
        del positive
    if len(ranges) == 1:
        return scores[0], (packed[0] if keep_signs else None)
    return torch.cat(scores), (torch.cat(packed) if keep_signs else None)


def _reference(st: GraphStructure, x_l, x_r, att, slope: float):
    """The attention in differentiable torch ops (double backward)."""
    z = F.leaky_relu(x_l.index_select(0, st.src) + x_r.index_select(0, st.dst), slope)
    return kernel_reference.edge_softmax_by_dst(st.dst, st.num_dst, (z * att).sum(dim=-1))


class _GATv2Attention(Function):
    @staticmethod
    def forward(ctx, x_l, x_r, att, st: GraphStructure, slope: float, cfg: CompressionConfig):
        ranges = _edge_ranges(st)
        scores, packed = _all_scores(st, x_l, x_r, att, slope, ranges, keep_signs=True)
        alpha = edge_softmax_forward(st, scores)
        del scores
        ctx.st, ctx.slope, ctx.same, ctx.shape, ctx.ranges = st, slope, x_r is x_l, tuple(x_l.shape[1:]), ranges
        save_kept(ctx, as_kept(x_l, cfg), None if ctx.same else as_kept(x_r, cfg), packed, alpha, att)
        return alpha

    @staticmethod
    def backward(ctx, grad_alpha):
        xl_s, xr_s, packed, alpha, att = load_kept(ctx)
        st, slope = ctx.st, ctx.slope
        if create_graph_requested():
            check_double_backward("gatv2_attention", xl_s, xr_s)
            x_r = xl_s if ctx.same else xr_s
            grads = recompute_vjp(lambda a, b, c: _reference(st, a, b, c, slope), [xl_s, x_r, att],
                                  ctx.needs_input_grad[:3], [grad_alpha])
            return (*grads, None, None, None)
        dtype = grad_alpha.dtype
        # the softmax's backward, from the exact attention
        g = alpha * (grad_alpha - st.edge_sum_to(grad_alpha * alpha, "dst").index_select(0, st.dst))
        want_l, want_r, want_att = ctx.needs_input_grad[:3]
        x_l = x_r = None
        if want_att:
            x_l = restore(xl_s).to(dtype)
            x_r = x_l if ctx.same else restore(xr_s).to(dtype)
        a = att.reshape(att.shape[-2:]).to(dtype)
        width = a.numel()  # sign bits per edge
        grad_att = torch.zeros_like(a) if want_att else None
        grad_xl = g.new_zeros((st.num_src,) + ctx.shape) if want_l else None
        grad_xr = g.new_zeros((st.num_dst,) + ctx.shape) if want_r else None
        scale = kernels.get("masked_scale", g.device)
        # the per-edge [edges, H, C] tensors one edge range at a time; index_add_ in edge order, as edge_sum_to
        for e0, e1 in ctx.ranges:
            bits = packed[e0 * width // 8:]  # a range starts on a byte (_edge_ranges)
            g_part = g[e0:e1]
            if want_att:
                z = x_l.index_select(0, st.src[e0:e1])
                z += x_r.index_select(0, st.dst[e0:e1])
                z = scale(z, bits, 1.0, slope)  # LeakyReLU at the kept signs
                grad_att += torch.einsum("eh,ehc->hc", g_part, z)
                del z
            if want_l or want_r:
                gz = scale(g_part.unsqueeze(-1) * a, bits, 1.0, slope)
                if want_l:
                    grad_xl.index_add_(0, st.src[e0:e1], gz)
                if want_r:
                    grad_xr.index_add_(0, st.dst[e0:e1], gz)
                del gz
        if grad_att is not None:
            grad_att = grad_att.view(att.shape).to(att.dtype)
        return grad_xl, grad_xr, grad_att, None, None, None


@fresh_outputs
def gatv2_attention(g, x_l: torch.Tensor, x_r: torch.Tensor, att: torch.Tensor, negative_slope: float = 0.2, *,
                    config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """GATv2's attention ``softmax_dst(<LeakyReLU(x_l[src] + x_r[dst]), att>)`` ``[E, H]`` over the in-edges
    of each destination, for ``x_l [N_src, H, C]``, ``x_r [N_dst, H, C]`` (the same tensor on a graph with
    shared weights) and ``att [1, H, C]`` (or ``[H, C]``); keeps ``x_l``, ``x_r`` compressed under ``config``
    (default: the configuration in force), the signs of the per-edge features as bits and the attention
    exactly (see the module's docstring)."""
    st = structure_of(g, x_l.device)
    if x_l.dim() != 3 or x_r.shape[1:] != x_l.shape[1:] or att.shape[-2:] != x_l.shape[1:]:
        raise ValueError(f"gatv2_attention expects x_l [N_src, H, C], x_r [N_dst, H, C] and att [1, H, C]; got "
                         f"{tuple(x_l.shape)}, {tuple(x_r.shape)} and {tuple(att.shape)}")
    if x_l.shape[0] != st.num_src or x_r.shape[0] != st.num_dst:
        raise ValueError(f"x_l has {x_l.shape[0]} rows and x_r {x_r.shape[0]}, but the graph has {st.num_src} "
                         f"source and {st.num_dst} destination nodes")
    if not needs_saving(x_l, x_r, att):
        slope = float(negative_slope)
        return edge_softmax_forward(st, _all_scores(st, x_l, x_r, att, slope, _edge_ranges(st), False)[0])
    return _GATv2Attention.apply(x_l, x_r, att, st, float(negative_slope), resolve_config(config))
