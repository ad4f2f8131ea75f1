"""Batch norm, ReLU and dropout as one op: two layer-sized buffers at its peak instead of three.

Composed, ``dropout(relu(batch_norm(x)))`` holds the layer's input ``x`` (alive in the caller's frame while
the op runs), batch norm's output and ReLU+dropout's output at once. :func:`batch_norm_relu_dropout` runs
batch norm into a new buffer and writes ReLU and dropout into that buffer (it allocated it in the same
forward and nobody else has seen it: :mod:`.keep`, rule 2), so only ``x`` and the output exist.

Kept for backward: what batch norm keeps (its input compressed, never projected, plus the per-channel
statistics) and one bit per element for ReLU and dropout together (exact). The backward scales the incoming
gradient by the mask into a new buffer and runs batch norm's backward in that buffer (row chunks from the
compressed input where it is large: no full-size decoded copy).

The output equals ``ops.relu_dropout(ops.batch_norm(x, ...), p)`` bit for bit for the same random state
(the same kernels, the same seed, drawn at the same point) and the gradients are the composed ops'
gradients (the same formulas from the same kept items). Double backward is exact with compression off
(batch norm re-run on the exact input, the mask is exact) and raises the documented error with it on.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import kernels
from ..compression import draw_seed
from ..compression_config import CompressionConfig, resolve_config
from .dense import BatchNorm
from .keep import as_kept
from .double_backward import double_backward
from .saved import load_kept, save_kept
from .function import Function

__all__ = ["batch_norm_relu_dropout"]


class _BatchNormReLUDropout(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps, p, seed, cfg):
        # kept first: the compression's temporaries are gone before the output is allocated
        x_s = as_kept(x, cfg.replace(kept_frac=1.0))
        # running statistics are updated in place (unbiased variance), as F.batch_norm does
        y, save_mean, save_invstd = torch.native_batch_norm(x, weight, bias, running_mean, running_var, training,
                                                            momentum, eps)
        # the dropout seed after the compression's: the random numbers are drawn in the composed ops' order
        seed = (draw_seed() if seed is None else seed) if p > 0 else 0
        if not y.is_contiguous():
            y = y.contiguous()
        # y was allocated just now and nothing else has seen it: ReLU and dropout are written into it (rule 2)
        packed = kernels.get("relu_dropout_inplace", y.device)(y, p, seed)
        ctx.training, ctx.eps, ctx.scale = training, eps, (1.0 / (1.0 - p) if p > 0 else 1.0)
        stats = (save_mean, save_invstd) if training else (running_mean, running_var)
        save_kept(ctx, x_s, *stats, weight, packed)
        return y

    @staticmethod
    def backward(ctx, grad):
        x_s, stat_a, stat_b, weight, packed = load_kept(ctx)
        none = (None,) * 8
        if double_backward("batch_norm_relu_dropout", x_s):
            mask = kernels.get("unpack_mask", grad.device)(packed, grad.numel()).view(grad.shape)
            g = grad * (mask.to(grad.dtype) * ctx.scale)  # differentiable in grad (relu'' = 0)
            return BatchNorm.differentiable_backward(ctx, g, x_s, stat_a, stat_b, weight)[:3] + none
        # a new buffer (the incoming gradient is never written: rule 2); batch norm's backward may reuse it
        g = kernels.get("masked_scale", grad.device)(grad.contiguous(), packed, ctx.scale, 0.0)
        return BatchNorm.gradients(ctx, g, x_s, stat_a, stat_b, weight, grad_owned=True)[:3] + none


def batch_norm_relu_dropout(x: torch.Tensor, running_mean: Optional[torch.Tensor],
                            running_var: Optional[torch.Tensor], weight: Optional[torch.Tensor] = None,
                            bias: Optional[torch.Tensor] = None, training: bool = True, momentum: float = 0.1,
                            eps: float = 1e-5, p: float = 0.0, config: Optional[CompressionConfig] = None,
                            seed: Optional[int] = None) -> torch.Tensor:
    """``dropout(relu(batch_norm(x)), p)`` over an fp32 ``[N, C]`` tensor as one op (see the module doc):
    ``training`` is batch norm's (batch statistics, running statistics updated), ``p`` the dropout
    probability in force (0: ReLU only). ``seed``: the dropout mask's seed (None: drawn as
    :func:`dgl_exact.ops.relu_dropout` draws it, after the compression of ``x`` draws its own, as composed).
    For a forward that autograd records; callers check that it computes what their modules compute
    (:class:`dgl_exact.nn.Sequential`)."""
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"batch_norm_relu_dropout expects an fp32 [N, C] input, got {x.dtype} "
                         f"{tuple(x.shape)}")
    if training and x.shape[0] < 2:
        raise ValueError("Expected more than 1 value per channel when training (batch norm over 1 row)")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"batch_norm_relu_dropout: dropout probability must be in [0, 1), got {p}")
    p, seed = float(p), None if seed is None else int(seed)
    return _BatchNormReLUDropout.apply(x, weight, bias, running_mean, running_var, training, momentum, eps, p, seed,
                                       resolve_config(config))
