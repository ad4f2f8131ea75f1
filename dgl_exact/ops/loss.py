"""Losses that keep no activation: the gradient of softmax cross entropy is ``softmax(z) - onehot(y)``,
recomputed in backward from the logits ``z`` (the model's output, alive anyway) instead of keeping
the ``[N, C]`` log-softmax that ``F.cross_entropy`` saves (often larger than a compressed hidden layer).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ._saving import load, needs_saving, save

__all__ = ["cross_entropy", "binary_cross_entropy_with_logits"]


def _select(x, index):
    return x if index is None else x[index]


def _compute(z):
    """Losses run in fp32 at least: half-precision logits are upcast, fp64 stays fp64."""
    return z.to(torch.promote_types(z.dtype, torch.float32))


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, index, weight):
        z = _select(logits, index)
        loss = F.cross_entropy(_compute(z), target, reduction="none")
        denom = max(z.shape[0], 1) if weight is None else None  # no rows: loss 0, gradient 0
        if weight is not None:
            loss = loss * weight
        ctx.denom = denom
        save(ctx, logits, target, index, weight)
        return loss.sum() / denom if denom is not None else loss.sum()

    @staticmethod
    def backward(ctx, grad):
        logits, target, index, weight = load(ctx)
        z = _compute(_select(logits, index))
        g = torch.softmax(z, dim=-1)
        g[torch.arange(g.shape[0], device=g.device), target] -= 1.0
        g = g * (grad / ctx.denom if ctx.denom is not None else grad)
        if weight is not None:
            g = g * weight.unsqueeze(-1)
        g = g.to(logits.dtype)
        if index is None:
            return g, None, None, None
        full = torch.zeros_like(logits)
        full[index] = g
        return full, None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, index: Optional[torch.Tensor] = None,
                  weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean softmax cross entropy of ``logits[index]`` against ``target`` (already indexed), or, with
    per-row ``weight``, the weighted sum (GraphSAINT's normalised loss). Keeps no activation."""
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"cross_entropy expects integer class targets, got {target.dtype}")
    if not needs_saving(logits):
        z = _compute(_select(logits, index))
        loss = F.cross_entropy(z, target.long(), reduction="none")
        return (loss * weight).sum() if weight is not None else loss.sum() / max(loss.numel(), 1)
    return _CrossEntropy.apply(logits, target.long(), index, weight)


class _BCEWithLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, index, weight):
        z = _compute(_select(logits, index))
        loss = F.binary_cross_entropy_with_logits(z, target.to(z.dtype), reduction="none").mean(-1)
        denom = max(z.shape[0], 1) if weight is None else None  # no rows: loss 0, gradient 0
        if weight is not None:
            loss = loss * weight
        ctx.denom = denom
        save(ctx, logits, target, index, weight)
        return loss.sum() / denom if denom is not None else loss.sum()

    @staticmethod
    def backward(ctx, grad):
        logits, target, index, weight = load(ctx)
        z = _compute(_select(logits, index))
        g = (torch.sigmoid(z) - target.to(z.dtype)) / z.shape[-1]
        g = g * (grad / ctx.denom if ctx.denom is not None else grad)
        if weight is not None:
            g = g * weight.unsqueeze(-1)
        g = g.to(logits.dtype)
        if index is None:
            return g, None, None, None
        full = torch.zeros_like(logits)
        full[index] = g
        return full, None, None, None


def binary_cross_entropy_with_logits(logits: torch.Tensor, target: torch.Tensor, index: Optional[torch.Tensor] = None,
                                     weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Multi-label BCE (mean over labels, then mean over rows, or ``weight``-ed sum over rows), keeping no
    activation."""
    if not needs_saving(logits):
        z = _compute(_select(logits, index))
        loss = F.binary_cross_entropy_with_logits(z, target.to(z.dtype), reduction="none").mean(-1)
        return (loss * weight).sum() if weight is not None else loss.sum() / max(loss.numel(), 1)
    return _BCEWithLogits.apply(logits, target, index, weight)
