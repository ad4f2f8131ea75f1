"""Dense autograd ops that keep compressed activations: linear and batch norm.

* ``linear``: ``grad_x = grad_y W`` needs no activation; only ``grad_W = grad_y^T x`` needs ``x``, so ``x`` is
  kept compressed (with random projection if configured) only when the weight needs a gradient, and
  by reference when it is alive anyway (input features).
* ``batch_norm``: backward needs the normalised input; the input is kept compressed (never projected:
  BatchNorm's backward is not linear in it), plus the per-feature mean and inverse std.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..compression_config import CompressionConfig, resolve_config
from ..compression import CompressedTensor
from . import captured
from .derived import Derived
from .keep import alive_anyway, fresh_outputs, as_kept, record_batch_norm_output, record_linear_output, restore
from .._compat import autocast_dtype, storage_ptr
from .chunks import chunk_elements_for, chunk_rows, needs_chunks, row_chunks, weight_grad
from .double_backward import double_backward, recompute_vjp
from .saved import load_kept, needs_saving, save_kept
from .function import Function

__all__ = ["linear", "linear_reusing", "batch_norm", "BatchNorm"]


@captured.capturable
class _Linear(Function):
    @staticmethod
    def forward(ctx, x, weight, bias, cfg: CompressionConfig, kept=None):
        # ``kept``: the tensor backward reads x from (``x`` before an autocast cast; backward casts it again)
        out = F.linear(x, weight, bias)
        ctx.has_bias = bias is not None
        x_s = as_kept(x if kept is None else kept, cfg, via_linear=True) if ctx.needs_input_grad[1] else None
        save_kept(ctx, x_s, weight if ctx.needs_input_grad[0] else None)
        if (kept is None or kept is x) and x_s is not None:  # out may be kept through x_s (rule 10)
            record_linear_output(out, x, x_s, weight, bias, cfg)
        return out

    @staticmethod
    def backward(ctx, grad):
        x_s, weight = load_kept(ctx)
        double_backward("linear", x_s)  # raises unless x is kept exactly: the products below are then differentiable
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = grad.matmul(weight.to(grad.dtype))
        if ctx.needs_input_grad[1] and isinstance(x_s, (CompressedTensor, Derived)):
            # row chunks: no full-size decompressed copy of x exists (one layer-sized buffer fewer at the
            # backward's peak); the sum over chunks is the same product, up to float summation order
            gw = weight_grad(grad, x_s)
        elif ctx.needs_input_grad[1]:
            x = restore(x_s).to(grad.dtype)
            gw = grad.reshape(-1, grad.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = grad.reshape(-1, grad.shape[-1]).sum(0)
        return gx, gw, gb, None, None


@fresh_outputs
def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``F.linear`` keeping only what the weight gradient needs, compressed."""
    return _linear(x, weight, bias, config)


def _linear(x, weight, bias, config, owned: bool = False):
    """:func:`linear`; ``owned``: the caller allocated ``x`` in this forward (rule 2), which the captured op
    is told while compiling (there ``x``'s provenance is unknown: see :func:`.keep.captured_alive`)."""
    dtype = autocast_dtype(x.device.type)
    # Under autocast the half-precision copy of x is a new tensor nobody else keeps (of input features too):
    # keeping it by reference would hold an uncompressed copy. Backward reads x from the original instead
    # (by reference where that is alive anyway, else compressed) and casts it again.
    kept = x
    if dtype is not None:
        x, weight = x.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    if not needs_saving(x, weight, bias):
        return F.linear(x, weight, bias)
    if captured.active():  # the captured op runs with autocast off (and dynamo cannot trace this call inside it)
        return captured.apply("_Linear", x, weight, bias, resolve_config(config), kept, owned=(kept,) if owned else ())
    with torch.autocast(x.device.type, enabled=False):
        return _Linear.apply(x, weight, bias, resolve_config(config), kept)


class _LinearInPlace(Function):
    """``x <- x W^T (+ b)`` written into ``x``'s own buffer, row chunk by row chunk (square ``W``): each
    output row depends only on the same input row, so a chunk is computed into a small temporary and copied
    back. ``x`` is kept compressed first (its exact values are overwritten). Backward is :class:`_Linear`'s."""

    @staticmethod
    def forward(ctx, x, weight, bias, cfg: CompressionConfig):
        kept = as_kept(x, cfg, force=True, overwritten=True) if ctx.needs_input_grad[1] else None
        rows = chunk_rows(x.shape[0], x.shape[1], x.device)
        for r0 in range(0, x.shape[0], rows):
            part = x[r0:r0 + rows]
            part.copy_(F.linear(part, weight, bias))
        ctx.mark_dirty(x)
        ctx.has_bias = bias is not None
        save_kept(ctx, kept, weight if ctx.needs_input_grad[0] else None)
        return x

    backward = _Linear.backward


def linear_reusing(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
                   config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """:func:`linear` that may write its result into ``x``'s own buffer, where that saves a layer-sized buffer.

    ``x`` must be a tensor the caller allocated in this forward (an aggregation's output, say) that nothing
    reads afterwards (:mod:`dgl_exact.ops.keep`, rule 2): the caller states it by calling this function
    (data, which rule 1 calls alive anyway, is never written: the product then goes out of place). In place
    when ``W`` is square and ``x`` a contiguous ``[N, D]`` tensor of ``W``'s dtype that is not a view
    (torch refuses in-place ops on views of a Function's output), compression is on (with it off the exact
    ``x`` is kept, and a copy would cost what the reuse saves), no autocast or capture is active, and ``x``
    spans more than one row chunk on its device (on a GPU today's chunk is larger than a layer, so the GPU
    keeps the single product); otherwise :func:`linear`. Same values as :func:`linear` row by row, up to
    the matrix product's summation order; gradients from the same compressed copy. While compiling, where
    provenance is not tracked, the caller's statement is taken as it stands: ``x`` is kept compressed even
    without autograd history (an aggregation of input features), as eager execution keeps it."""
    cfg = resolve_config(config)
    if (cfg.enabled and x.dim() == 2 and weight.dim() == 2 and weight.shape[0] == weight.shape[1] == x.shape[1]
            and x.is_contiguous() and x._base is None and not alive_anyway(x) and x.dtype == weight.dtype
            and (bias is None or bias.dtype == x.dtype) and not captured.active()
            and autocast_dtype(x.device.type) is None and x.numel() > chunk_elements_for(x.device)
            and needs_saving(x, weight, bias)):
        return _LinearInPlace.apply(x, weight, bias, cfg)
    if captured.active():  # the caller's statement stands in for the provenance dynamo cannot see (rule 1)
        return _linear(x, weight, bias, cfg, owned=True)
    return linear(x, weight, bias, cfg)


def _param_dtype(weight: Optional[torch.Tensor], like: torch.Tensor) -> torch.dtype:
    """The dtype of batch norm's bias gradient: the weight's (the parameters share one), ``like``'s without one
    (autograd casts a gradient to its input's dtype)."""
    return like.dtype if weight is None else weight.dtype


class BatchNorm(Function):
    """ATen's batch-norm kernels (fused, multithreaded / cuDNN-free) on both passes; only what backward
    reads changes: the input comes from its compressed copy."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps, cfg):
        cdt = torch.promote_types(x.dtype, torch.float32)  # fp16/bf16 in fp32, fp64 stays fp64
        w = None if weight is None else weight.to(cdt)
        b = None if bias is None else bias.to(cdt)
        # running statistics are updated in place (unbiased variance), as F.batch_norm does
        y, save_mean, save_invstd = torch.native_batch_norm(x.to(cdt), w, b, running_mean, running_var, training,
                                                            momentum, eps)
        ctx.training, ctx.eps = training, eps
        stats = (save_mean, save_invstd) if training else (running_mean.to(cdt), running_var.to(cdt))
        kept_cfg = cfg.replace(kept_frac=1.0)
        x_s = as_kept(x, kept_cfg)
        save_kept(ctx, x_s, *stats, weight)
        y = y.to(x.dtype)
        if isinstance(x_s, CompressedTensor) or x_s is x:  # y, and what activations make of it: rule 12
            invstd = save_invstd if training else (running_var.to(cdt) + eps).rsqrt()
            scale = invstd if w is None else invstd * w
            shift = -stats[0] * scale if b is None else b - stats[0] * scale
            record_batch_norm_output(y, x, x_s, scale, shift, kept_cfg)
        return y

    @staticmethod
    def backward(ctx, grad):
        x_s, stat_a, stat_b, weight = load_kept(ctx)
        if double_backward("batch_norm", x_s):
            return BatchNorm.differentiable_backward(ctx, grad, x_s, stat_a, stat_b, weight)
        return BatchNorm.gradients(ctx, grad, x_s, stat_a, stat_b, weight)

    @staticmethod
    def gradients(ctx, grad, x_s, stat_a, stat_b, weight, grad_owned: bool = False):
        """The backward from the kept items (``ctx``: ``training``, ``eps``, ``needs_input_grad``).
        ``grad_owned``: the caller allocated ``grad`` in its own backward and nothing else reads it (rule 2),
        so a chunked backward forms the input gradient in ``grad``'s own rows."""
        cdt = stat_a.dtype
        if isinstance(x_s, CompressedTensor) and needs_chunks(x_s):
            return BatchNorm._chunked_backward(ctx, grad, x_s, stat_a, stat_b, weight, grad_owned)
        x = restore(x_s).to(cdt)
        w = None if weight is None else weight.to(cdt)
        if ctx.training:
            save_mean, save_invstd, run_mean, run_var = stat_a, stat_b, None, None
        else:
            save_mean, save_invstd, run_mean, run_var = None, None, stat_a, stat_b
        needs = ctx.needs_input_grad  # weight and bias: False where they are None (affine=False, bias=None)
        gx, gw, gb = torch.ops.aten.native_batch_norm_backward(
            grad.to(cdt).contiguous(), x, w, run_mean, run_var, save_mean, save_invstd, ctx.training, ctx.eps,
            [needs[0], needs[1], needs[2]])
        gx = None if gx is None else gx.to(grad.dtype)
        gw = None if gw is None else gw.to(weight.dtype)
        gb = None if gb is None else gb.to(_param_dtype(weight, gb))
        return gx, gw, gb, None, None, None, None, None, None

    @staticmethod
    def _chunked_backward(ctx, grad, x_s, stat_a, stat_b, weight, grad_owned: bool = False):
        """Backward from the compressed input in row chunks (no full-size decompressed copy): with
        ``xhat = (x - mean) * invstd``, ``gb = sum(g)``, ``gw = sum(g * xhat)`` and, in training,
        ``gx = w * invstd * (g - gb / N - xhat * gw / N)`` (eval: ``gx = w * invstd * g``). Two passes over
        the chunks in training (the sums first); the same formulas as ATen's kernel. ``grad_owned`` (see
        :meth:`gradients`): ``gx`` is written into ``grad`` (each row read before it is written)."""
        cdt = stat_a.dtype
        g = grad.to(cdt)
        if ctx.training:
            mean, invstd = stat_a, stat_b
        else:
            mean, invstd = stat_a, (stat_b + ctx.eps).rsqrt()
        sum_g = g.sum(0)
        sum_gxhat = torch.zeros_like(sum_g)
        # the first pass: per chunk at most one temporary beside the decoded rows (x - mean, scaled in place):
        # none where the decoded rows are this backward's own fresh buffer (rule 2), which then takes the
        # arithmetic; never where a chunk is a view of a kept tensor (an exact one, or a compressed copy's rows)
        kept = {storage_ptr(t) for t in x_s.split()[1]}

        def centred(x):
            if x.dtype == cdt and storage_ptr(x) not in kept:
                return x.sub_(mean)
            return torch.sub(x.to(cdt), mean)

        for r0, r1, x in row_chunks(x_s):
            t = centred(x)
            sum_gxhat += t.mul_(g[r0:r1]).sum(0)
            del t, x  # before the next chunk is decoded (see row_chunks)
        sum_gxhat.mul_(invstd)  # invstd is per column: once on the sum, not on every element
        w = invstd if weight is None else weight.to(cdt) * invstd
        gx = None
        if ctx.needs_input_grad[0]:
            own = grad_owned and g is grad and grad.is_contiguous()
            gx = grad if own else torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
            if ctx.training:
                n = grad.shape[0]
                mean_g, proj = sum_g / n, sum_gxhat * invstd / n  # (x - mean) * invstd^2 * sum(g xhat) / N
                # w (g - mean_g - (x - mean) proj) = x (-proj w) + g w + (mean proj - mean_g) w: per column
                # vectors, so three passes per chunk, formed in gx's own rows (no temporary; was five and one)
                x_scale, shift = -proj * w, (mean * proj - mean_g) * w
                for r0, r1, x in row_chunks(x_s):
                    if gx.dtype == cdt:  # (where gx is grad, out is g's own rows: read as written)
                        out = gx[r0:r1]
                        torch.mul(g[r0:r1], w, out=out).addcmul_(x.to(cdt), x_scale).add_(shift)
                    else:  # half-precision gradient: the arithmetic in cdt, as ATen does, then rounded once
                        gx[r0:r1] = centred(x).mul_(proj).neg_().add_(g[r0:r1]).sub_(mean_g).mul_(w)
                    del x
            elif gx.dtype == cdt:
                torch.mul(g, w, out=gx)
            else:
                gx.copy_(g * w)
        gw = sum_gxhat.to(weight.dtype) if ctx.needs_input_grad[1] else None
        gb = sum_g.to(_param_dtype(weight, sum_g)) if ctx.needs_input_grad[2] else None
        return gx, gw, gb, None, None, None, None, None, None

    @staticmethod
    def differentiable_backward(ctx, grad, x, stat_a, stat_b, weight):
        """Double backward: ``F.batch_norm`` (no running-statistics update) re-run on the exact input."""
        cdt = stat_a.dtype

        def forward(x, w):
            w = None if w is None else w.to(cdt)
            if ctx.training:
                return F.batch_norm(x.to(cdt), None, None, w, None, True, 0.0, ctx.eps)
            return F.batch_norm(x.to(cdt), stat_a, stat_b, w, None, False, 0.0, ctx.eps)

        needs = ctx.needs_input_grad
        gx, gw = recompute_vjp(forward, [x, weight], [needs[0], weight is not None and needs[1]], [grad.to(cdt)])
        gx = None if gx is None else gx.to(grad.dtype)
        gw = None if gw is None else gw.to(weight.dtype)
        gb = grad.sum(0).to(_param_dtype(weight, grad)) if needs[2] else None
        return gx, gw, gb, None, None, None, None, None, None


@fresh_outputs
def batch_norm(x: torch.Tensor, running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor],
               weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5, config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``F.batch_norm`` over ``[N, C]`` keeping its input compressed for backward."""
    if x.dim() != 2:
        raise ValueError(f"dgl_exact batch_norm expects [N, C] input, got shape {tuple(x.shape)}")
    if training and x.shape[0] < 2:
        raise ValueError("Expected more than 1 value per channel when training (batch norm over 1 row)")
    if captured.active() or not needs_saving(x, weight, bias):  # compiled: ATen's op, uncompressed (it
        # updates the running statistics in place, which one generic captured op cannot declare)
        return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    return BatchNorm.apply(x, weight, bias, running_mean, running_var, training, momentum, eps,
                            resolve_config(config))
