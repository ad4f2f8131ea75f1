"""DGL's general kernels, run with compressed operands: the paths :mod:`.dgl_ops` (DGL's API) and the fused
ops of :mod:`.graph` (their general fallbacks) share. A bilinear kernel (``u_mul_e``, ``*_dot_*``,
``segment_mm``, ...) keeps compressed the operand the other's gradient needs (:func:`bilinear`)."""
from __future__ import annotations

from typing import Optional

import torch

from ..compression_config import CompressionConfig, resolve_config
from .double_backward import double_backward
from .keep import as_kept, restore
from .saved import load_kept, needs_saving, save_kept
from .function import Function

__all__ = ["readable", "Bilinear", "bilinear"]


def readable(g):
    """``g`` as DGL's own ops can read it: a graph restricted to CSC and CSR (as the trainer keeps a full
    graph, :func:`~dgl_exact.data.compact.compact_graph`) is viewed with every format allowed (DGL's SDDMM,
    also in the backward of its SpMM, needs a COO or a CSR it selects only among allowed COO); the view
    shares the graph's arrays and data, and builds a COO only if a DGL kernel asks for one."""
    formats = g.formats()
    if "coo" in formats["created"] or "coo" in formats["not created"]:
        return g
    return g.formats(["coo", "csr", "csc"])


class Bilinear(Function):
    """``fn(a, b)``, bilinear in ``(a, b)``, run without autograd; keeps compressed the operand the other's
    gradient needs. Backward re-runs ``fn`` with autograd on the decoded operands (zeros for one not kept:
    its own gradient does not read it) and returns its vector-Jacobian product."""

    @staticmethod
    def forward(ctx, fn, name: str, a, b, cfg: CompressionConfig, exact_b: bool):
        with torch.no_grad():
            out = fn(a, b)
        ctx.fn, ctx.name = fn, name
        ctx.meta = [(t.shape, t.dtype, t.device) for t in (a, b)]
        need_a, need_b = ctx.needs_input_grad[2], ctx.needs_input_grad[3]
        save_kept(ctx, as_kept(a, cfg) if need_b else None, (b if exact_b else as_kept(b, cfg)) if need_a else None)
        return out

    @staticmethod
    def backward(ctx, grad):
        kept = load_kept(ctx)
        needs = ctx.needs_input_grad[2:4]
        create = double_backward(ctx.name, *kept)
        inputs = []
        for item, (shape, dtype, device), need in zip(kept, ctx.meta, needs):
            t = restore(item)
            if t is None:
                t = torch.zeros(shape, dtype=dtype, device=device)
            elif not create:
                t = t.detach()
            if need and not t.requires_grad:
                t = t.detach().requires_grad_()
            inputs.append(t)
        with torch.enable_grad():
            out = ctx.fn(*inputs)
            wanted = [t for t, n in zip(inputs, needs) if n]
            got = iter(torch.autograd.grad(out, wanted, grad, create_graph=create, allow_unused=True))
        grads = []
        for t, n in zip(inputs, needs):
            g = next(got) if n else None
            grads.append(torch.zeros_like(t) if n and g is None else g)
        return None, None, grads[0], grads[1], None, None


def bilinear(fn, name: str, a, b, config: Optional[CompressionConfig], exact_b: bool = False):
    """``fn(a, b)``, through :class:`Bilinear` when autograd records it (``exact_b``: ``b`` kept exactly)."""
    if not needs_saving(a, b):
        return fn(a, b)
    return Bilinear.apply(fn, name, a, b, resolve_config(config), exact_b)
