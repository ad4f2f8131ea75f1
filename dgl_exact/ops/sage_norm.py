"""A first GraphSAGE-mean layer with its batch norm, ReLU and dropout as one op: one layer-sized buffer.

A neighbour-sampled step's largest tensors are the first layer's ``[N_1, D]`` outputs (``N_1``: the first
block's destination nodes, the most numerous hidden rows). Composed from :func:`~dgl_exact.ops.sage_mean`
and :func:`~dgl_exact.ops.batch_norm_relu_dropout`, the forward holds two of them (the layer's output and
batch norm's) and so does the backward (the incoming gradient and batch norm's input gradient, which the
layer's weight gradients read). Where the layer's input needs no gradient (input features), this op holds
one:

* forward: the layer's output ``z`` is formed in a fresh buffer (:func:`~dgl_exact.ops.sage.
  aggregate_then_project`, then ``+= x_dst W_self^T + b``), kept compressed for batch norm's backward,
  and batch norm (batch statistics), ReLU and dropout are written into it (it allocated ``z`` and nobody
  else has seen it: :mod:`.keep`, rule 2).
* backward: from the incoming gradient ``G``, in row chunks (:func:`~dgl_exact.ops.chunks.rows_together`),
  ``g = G * mask / (1 - p)`` and batch norm's sums ``sum(g)``, ``sum(g * xhat)`` (first pass), then batch
  norm's input gradient ``dz`` chunk by chunk, multiplied straight into the weight gradients ``dW_self +=
  dz^T x_dst``, ``dW_neigh += dz^T s``, ``db += sum(dz)`` (second pass): no ``[N_1, D]`` buffer beside ``G``.

Kept: what the composed ops keep (``s`` and ``z`` compressed, ``x_dst`` by reference where it is alive
anyway, batch norm's per-channel statistics, one bit per element for ReLU and dropout). The random
numbers are drawn in the composed ops' order (``s``'s compression, ``z``'s, the dropout seed), so the
output equals the composed ops' up to float rounding of batch norm's statistics (``var_mean`` here, ATen's
batch-norm kernel there); the gradients are the composed ops' formulas from the same kept items. Only
for the aggregate-first order (``D_out >= D_in``), fp32, no autocast, training with batch statistics;
:meth:`dgl_exact.SAGEConv.forward_bn_relu_dropout` decides where it applies. Double backward raises.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import kernels
from .._compat import compiling
from ..compression import CompressedTensor, compress, draw_seed
from ..compression_config import CompressionConfig, resolve_config
from .keep import alive_anyway, fresh_outputs, offer_compressed, as_kept, keep_hook_active
from .chunks import rows_together
from .double_backward import refuse_double_backward
from .saved import load_kept, save_kept
from .graph import check_nodes
from .sage import aggregate_then_project
from .structure import structure_of
from .function import Function

__all__ = ["sage_mean_bn_relu_dropout"]


class _SAGEMeanBNReLUDropout(Function):
    @staticmethod
    def forward(ctx, x, w_self, b_self, w_neigh, bn_weight, bn_bias, running_mean, running_var, momentum, eps,
                p, st, cfg: CompressionConfig, compress_for: Optional[CompressionConfig]):
        n = st.num_dst
        x_dst = x[:n] if st.is_block else x
        z, kept_s = aggregate_then_project(x, w_neigh, st, cfg, keep_s=True)
        z.addmm_(x_dst, w_self.t())
        if b_self is not None:
            z.add_(b_self)
        # as sage_mean keeps x_dst (a view made here has no history: compressed unless x is alive anyway)
        kept_x = as_kept(x_dst, cfg, force=x_dst is not x and not alive_anyway(x))
        # batch norm's input, kept before it is overwritten (rule 3: a copy where it would be kept exactly)
        kept_z = as_kept(z, cfg.replace(kept_frac=1.0), force=True, overwritten=True)
        var, mean = torch.var_mean(z, 0, correction=0)
        invstd = 1.0 / torch.sqrt(var + eps)
        if running_mean is not None:  # as F.batch_norm updates them: unbiased variance, in place
            with torch.no_grad():
                running_mean.mul_(1.0 - momentum).add_(mean, alpha=momentum)
                running_var.mul_(1.0 - momentum).add_(var * (n / max(n - 1, 1)), alpha=momentum)
        alpha = invstd if bn_weight is None else invstd * bn_weight
        beta = -mean * alpha if bn_bias is None else bn_bias - mean * alpha
        z.mul_(alpha).add_(beta)  # ATen's CPU transform: x * alpha + beta
        seed = draw_seed() if p > 0 else 0  # after the compressions' seeds, as the composed ops draw it
        packed = kernels.get("relu_dropout_inplace", z.device)(z, p, seed)
        if compress_for is not None:  # the next op's kept copy, drawn here as ops.relu_dropout draws it (rule 6)
            offer_compressed(z, compress_for, compress(z, compress_for))
        ctx.st, ctx.n, ctx.scale = st, n, (1.0 / (1.0 - p) if p > 0 else 1.0)
        ctx.has_bias, ctx.has_bn = b_self is not None, bn_weight is not None
        save_kept(ctx, kept_x, kept_s, kept_z, mean, invstd, bn_weight, packed)
        return z

    @staticmethod
    def backward(ctx, grad):
        x_s, s_s, z_s, mean, invstd, bn_weight, packed = load_kept(ctx)
        refuse_double_backward("sage_mean_bn_relu_dropout")
        grad = grad.contiguous()
        n, width = grad.shape
        masked_scale = kernels.get("masked_scale", grad.device)

        def g_rows(r0, r1):
            # chunks start at multiples of 8 rows (rows_together): whole bytes of the one-bit mask
            return masked_scale(grad[r0:r1], packed[r0 * width // 8:-(-(r1 * width) // 8)], ctx.scale, 0.0)

        # a decoded chunk of the compressed z is this backward's own buffer (rule 2): centred in place; rows
        # of an exact copy are views of a kept tensor and get a temporary
        fresh = isinstance(z_s, CompressedTensor) and (z_s.raw is None or z_s.proj_seed is not None)

        def centred(z):
            return z.sub_(mean) if fresh else torch.sub(z, mean)

        sum_g = grad.new_zeros(width)
        sum_gxhat = grad.new_zeros(width)
        for r0, r1, (z,) in rows_together([z_s], n, grad.device):
            g = g_rows(r0, r1)
            sum_g += g.sum(0)
            sum_gxhat += centred(z).mul_(invstd).mul_(g).sum(0)
            del g, z  # before the next chunk is decoded (see row_chunks)
        w = invstd if bn_weight is None else bn_weight * invstd
        mean_g, proj = sum_g / n, sum_gxhat * invstd / n
        gws = gwn = gb = None
        for r0, r1, (z, s, xd) in rows_together([z_s, s_s, x_s], n, grad.device):
            dz = g_rows(r0, r1).sub_(mean_g).sub_(centred(z).mul_(proj)).mul_(w)
            del z
            part = dz.t().matmul(xd.to(dz.dtype))
            gws = part if gws is None else gws.add_(part)
            part = dz.t().matmul(s.to(dz.dtype))
            gwn = part if gwn is None else gwn.add_(part)
            if ctx.has_bias:
                part = dz.sum(0)
                gb = part if gb is None else gb.add_(part)
            del dz, s, xd, part
        gbw, gbb = (sum_gxhat, sum_g) if ctx.has_bn else (None, None)
        return None, gws, gb, gwn, gbw, gbb, None, None, None, None, None, None, None, None


@fresh_outputs
def sage_mean_bn_relu_dropout(g, x: torch.Tensor, w_self: torch.Tensor, b_self: Optional[torch.Tensor],
                              w_neigh: torch.Tensor, bn_weight: Optional[torch.Tensor],
                              bn_bias: Optional[torch.Tensor], running_mean: Optional[torch.Tensor],
                              running_var: Optional[torch.Tensor], momentum: float = 0.1, eps: float = 1e-5,
                              p: float = 0.0, config: Optional[CompressionConfig] = None, *,
                              compress_for: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``dropout(relu(batch_norm(sage_mean(g, x, ...))), p)`` in training (batch statistics; running
    statistics updated with ``momentum`` where given) as one op (see the module doc). ``x``: fp32 ``[N_src,
    D_in]`` features that need no gradient; ``w_neigh [D_out, D_in]`` with ``D_out >= D_in``; the
    activations kept compressed under ``config`` (compression on). ``compress_for``: how the next op keeps
    the output, as for :func:`dgl_exact.ops.relu_dropout` (its compressed copy is offered)."""
    st = structure_of(g, x.device)
    check_nodes(st, x)
    if (not st.is_block and st.num_src != st.num_dst) or x.dim() != 2 or x.shape[0] != st.num_src:
        raise ValueError(f"sage_mean_bn_relu_dropout needs a homogeneous graph or a block and [N, D] features "
                         f"with one row per (source) node; got features {tuple(x.shape)} on a graph of "
                         f"{st.num_src} source / {st.num_dst} destination nodes")
    if x.requires_grad or x.dtype != torch.float32 or w_neigh.shape[0] < x.shape[1]:
        raise ValueError("sage_mean_bn_relu_dropout: fp32 features without gradient and D_out >= D_in only "
                         f"(got {x.dtype}, requires_grad={x.requires_grad}, W_neigh {tuple(w_neigh.shape)})")
    if st.num_dst < 2:
        raise ValueError("Expected more than 1 value per channel when training (batch norm over 1 row)")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"sage_mean_bn_relu_dropout: dropout probability must be in [0, 1), got {p}")
    cfg = resolve_config(config)
    # as ops.relu_dropout offers it: quantised without projection, not while compiling or under a planner's hook
    keep_for = (compress_for if compress_for is not None and not compiling() and not keep_hook_active()
                and compress_for.enabled and compress_for.projected_width(w_neigh.shape[0]) >= w_neigh.shape[0]
                and compress_for.nonfinite == "propagate" else None)
    if not cfg.enabled:
        raise ValueError("sage_mean_bn_relu_dropout keeps its activations compressed: compression must be on")
    return _SAGEMeanBNReLUDropout.apply(x, w_self, b_self, w_neigh, bn_weight, bn_bias, running_mean, running_var,
                                        float(momentum), float(eps), float(p), st, cfg, keep_for)
