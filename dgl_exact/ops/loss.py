"""Losses that keep no activation: the gradient of softmax cross entropy is ``softmax(z) - onehot(y)``
(of multi-label BCE, ``sigmoid(z) - y``), recomputed in backward from the logits ``z`` (the model's
output, alive anyway) instead of keeping the ``[N, C]`` log-softmax that ``F.cross_entropy`` saves (often
larger than a compressed hidden layer).

Double backward (``create_graph=True``) recomputes the loss with torch's differentiable ops from the kept
logits (exact). Soft targets or row weights that require a gradient take torch's own path.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .double_backward import double_backward, recompute_vjp
from .saved import load_kept, needs_saving, save_kept
from .function import Function

__all__ = ["cross_entropy", "binary_cross_entropy_with_logits"]


def _rows(logits, index):
    z = logits if index is None else logits[index]
    return z.to(torch.promote_types(z.dtype, torch.float32))  # fp16/bf16 in fp32, fp64 stays fp64


def _row_losses(kind: str, z, target):
    if kind == "ce":
        return F.cross_entropy(z, target, reduction="none")
    return F.binary_cross_entropy_with_logits(z, target.to(z.dtype), reduction="none").mean(-1)


def _reduce(loss, weight):
    """Weighted sum (GraphSAINT's normalised loss) or mean over rows; no rows: 0."""
    if weight is not None:
        return (loss * weight).sum()
    return loss.sum() / max(loss.numel(), 1)


class _RowLoss(Function):
    @staticmethod
    def forward(ctx, logits, target, index, weight, kind):
        z = _rows(logits, index)
        ctx.kind = kind
        save_kept(ctx, logits, target, index, weight)
        return _reduce(_row_losses(kind, z, target), weight).to(z.dtype)

    @staticmethod
    def backward(ctx, grad):
        logits, target, index, weight = load_kept(ctx)
        if double_backward(ctx.kind):  # the logits are kept exactly (the loss's input)
            kind = ctx.kind

            def loss_of(lg):
                return _reduce(_row_losses(kind, _rows(lg, index), target), weight).to(grad.dtype)

            (gl,) = recompute_vjp(loss_of, [logits], [True], [grad])
            return gl, None, None, None, None
        z = _rows(logits, index)
        if ctx.kind == "ce":
            g = torch.softmax(z, dim=-1)
            g[torch.arange(g.shape[0], device=g.device), target] -= 1.0
        else:
            g = (torch.sigmoid(z) - target.to(z.dtype)) / z.shape[-1]
        g = g * (grad * weight.unsqueeze(-1) if weight is not None else grad / max(z.shape[0], 1))
        g = g.to(logits.dtype)
        if index is None:
            return g, None, None, None, None
        full = torch.zeros_like(logits)
        full[index] = g
        return full, None, None, None, None


def _loss(kind, logits, target, index, weight):
    if not needs_saving(logits) or target.requires_grad or (weight is not None and weight.requires_grad):
        return _reduce(_row_losses(kind, _rows(logits, index), target), weight)
    return _RowLoss.apply(logits, target, index, weight, kind)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, index: Optional[torch.Tensor] = None,
                  weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean softmax cross entropy of ``logits[index]`` against ``target`` (already indexed), or, with
    per-row ``weight``, the weighted sum (GraphSAINT's normalised loss). Keeps no activation."""
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"cross_entropy expects integer class targets, got {target.dtype}")
    return _loss("ce", logits, target.long(), index, weight)


def binary_cross_entropy_with_logits(logits: torch.Tensor, target: torch.Tensor, index: Optional[torch.Tensor] = None,
                                     weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Multi-label BCE (mean over labels, then mean over rows, or ``weight``-ed sum over rows), keeping no
    activation."""
    return _loss("bce", logits, target, index, weight)
