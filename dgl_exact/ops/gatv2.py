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
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import kernels
from ..compression_config import CompressionConfig, resolve_config
from ..kernels import reference as kernel_reference
from .double_backward import check_double_backward, create_graph_requested, recompute_vjp
from .keep import fresh_outputs, as_kept, restore
from .saved import load_kept, needs_saving, save_kept
from .structure import GraphStructure, edge_softmax_forward, structure_of

__all__ = ["gatv2_attention"]


def _scores(st: GraphStructure, x_l: torch.Tensor, x_r: torch.Tensor, att: torch.Tensor, slope: float):
    """``(scores [E, H], z > 0 [E, H, C])``; the one ``[E, H, C]`` temporary is activated in place."""
    z = x_l.index_select(0, st.src)
    z += x_r.index_select(0, st.dst)
    positive = z > 0
    F.leaky_relu(z, slope, inplace=True)
    return torch.einsum("ehc,hc->eh", z, att.reshape(att.shape[-2:]).to(z.dtype)), positive


def _reference(st: GraphStructure, x_l, x_r, att, slope: float):
    """The attention in differentiable torch ops (double backward)."""
    z = F.leaky_relu(x_l.index_select(0, st.src) + x_r.index_select(0, st.dst), slope)
    return kernel_reference.edge_softmax_by_dst(st.dst, st.num_dst, (z * att).sum(dim=-1))


class _GATv2Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_l, x_r, att, st: GraphStructure, slope: float, cfg: CompressionConfig):
        scores, positive = _scores(st, x_l, x_r, att, slope)
        alpha = edge_softmax_forward(st, scores)
        del scores
        packed = kernels.get("pack_mask", positive.device)(positive)
        del positive
        ctx.st, ctx.slope, ctx.same, ctx.shape = st, slope, x_r is x_l, tuple(x_l.shape[1:])
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
        grad_att = None
        if ctx.needs_input_grad[2]:
            x_l = restore(xl_s).to(dtype)
            x_r = x_l if ctx.same else restore(xr_s).to(dtype)
            z = x_l.index_select(0, st.src)
            z += x_r.index_select(0, st.dst)
            del x_l, x_r
            z = kernels.get("masked_scale", z.device)(z, packed, 1.0, slope)  # LeakyReLU at the kept signs
            grad_att = torch.einsum("eh,ehc->hc", g, z).view(att.shape).to(att.dtype)
            del z
        grad_xl = grad_xr = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            gz = g.unsqueeze(-1) * att.reshape(att.shape[-2:]).to(dtype)
            gz = kernels.get("masked_scale", gz.device)(gz, packed, 1.0, slope)
            grad_xl = st.edge_sum_to(gz, "src") if ctx.needs_input_grad[0] else None
            grad_xr = st.edge_sum_to(gz, "dst") if ctx.needs_input_grad[1] else None
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
        return edge_softmax_forward(st, _scores(st, x_l, x_r, att, float(negative_slope))[0])
    return _GATv2Attention.apply(x_l, x_r, att, st, float(negative_slope), resolve_config(config))
