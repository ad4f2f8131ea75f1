"""The remaining layers of a GNN block, keeping a compressed tensor for backward.

==============  ====================================================================================
op              kept for backward (compression on)
==============  ====================================================================================
layer_norm      the input compressed + per-row mean and 1/std (fp32, one pair per normalised row)
gelu, silu      the derivative ``act'(x)`` compressed (the input itself where it is kept exactly)
prelu           1 bit per element (sign) + the input compressed (only the weight gradient reads it)
softmax         the output compressed
log_softmax     the probabilities ``exp(output)`` compressed
==============  ====================================================================================

Forwards are torch's own functions (outputs identical to ``F.layer_norm``, ``F.gelu``, ...). With
compression off (or in ``eval()``), what is kept is the tensor itself and gradients equal torch's exactly.
With compression on (stochastic rounding, :mod:`dgl_exact.compression`):

* **unbiased** where the backward is linear in the kept tensor: prelu (both gradients: the input
  gradient reads only the exact sign bits, the weight gradient is linear in the input), log_softmax
  (``g - p * sum(g)`` is linear in ``p``), layer_norm's weight gradient (``sum(g * (x - mean) * rstd)``
  with the exact mean and rstd), gelu and silu (``g * act'(x)`` with ``act'(x)`` computed exactly in the
  forward and kept compressed: linear in what is kept; keeping the input instead and evaluating
  ``act'`` at its decoded copy was biased by 10-25 % of the gradient's norm at INT2, see
  ``tests/nn/test_layers.py``);
* **unbiased from two independent copies**: softmax (``y * (g - sum(g * y))`` is quadratic in ``y``: from one
  copy ``y_hat`` its mean misses ``Var(y_hat) * g``; the outer factor and the sum are decoded from two
  independent draws, at twice the kept bytes);
* **biased, by O(quantization step squared)**, where the backward is nonlinear in the kept tensor:
  layer_norm's input gradient (a product of two terms in the normalised input; the quadratic term is one of
  ``D`` in a row's sum). The error per element is bounded by the local curvature times the quantization step
  of the row (``range / (2**bits - 1)``); at INT8 it is negligible.

None of these ops projects (``kept_frac`` is ignored: a projection is only unbiased for a linear use).
Under autocast and while ``torch.compile`` traces, they run torch's functions unchanged (keeping what torch
keeps). layer_norm, gelu and silu decode a large compressed input in row chunks in their backward (no
full-size decoded copy at the step peak); prelu, softmax and log_softmax decode it whole. Double backward is exact
with compression off (recomputed with torch ops) and raises the documented error with compression on.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from .._compat import autocast_dtype, compiling
from ..compression_config import CompressionConfig, resolve_config
from ..compression import CompressedTensor
from .keep import alive_anyway, fresh_outputs, as_kept, restore
from .chunks import needs_chunks, row_chunks
from .double_backward import double_backward, recompute_vjp, refuse_double_backward
from .saved import load_kept, needs_saving, save_kept
from .function import Function

__all__ = ["layer_norm", "gelu", "silu", "prelu", "softmax", "log_softmax"]


def _plain(x: torch.Tensor, *tensors: Optional[torch.Tensor]) -> bool:
    """Run torch's function unchanged: nothing to keep, or a path these ops do not cover."""
    return not needs_saving(x, *tensors) or compiling() or autocast_dtype(x.device.type) is not None


def _kept_cfg(cfg: CompressionConfig) -> CompressionConfig:
    return cfg.replace(kept_frac=1.0)


def _chunked(item) -> bool:
    """Whether a backward decodes ``item`` in row chunks (compressed and large): no full-size decoded copy.
    A tensor kept exactly is used as is (gradients then equal torch's bit for bit)."""
    return isinstance(item, CompressedTensor) and needs_chunks(item)


def _pointwise_backward(fn, grad, x_s):
    """``fn(grad, x)`` for an elementwise backward, decoding ``x`` chunk by chunk where it is large."""
    if not _chunked(x_s):
        return fn(grad, restore(x_s).to(grad.dtype))
    out = torch.empty_like(grad)
    for r0, r1, x in row_chunks(x_s):
        out[r0:r1] = fn(grad[r0:r1], x.to(grad.dtype))
        del x  # before the next chunk is decoded (see row_chunks)
    return out


# --- layer norm ------------------------------------------------------------------------------------------
class _LayerNorm(Function):
    @staticmethod
    def forward(ctx, x, normalized_shape, weight, bias, eps, cfg):
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, list(normalized_shape), weight, bias, eps)
        ctx.shape, ctx.eps = tuple(normalized_shape), eps
        save_kept(ctx, as_kept(x, _kept_cfg(cfg)), mean, rstd, weight, bias)
        return y

    @staticmethod
    def backward(ctx, grad):
        x_s, mean, rstd, weight, bias = load_kept(ctx)
        needs = ctx.needs_input_grad
        if double_backward("layer_norm", x_s):
            gx, gw, gb = recompute_vjp(lambda x, w, b: F.layer_norm(x, ctx.shape, w, b, ctx.eps),
                                       [x_s, weight, bias], [needs[0], needs[2], needs[3]], [grad])
            return gx, None, gw, gb, None, None
        mask = [needs[0], weight is not None and needs[2], bias is not None and needs[3]]
        shape = list(ctx.shape)
        if not _chunked(x_s):
            x = restore(x_s).to(grad.dtype)
            gx, gw, gb = torch.ops.aten.native_layer_norm_backward(grad, x, shape, mean, rstd, weight, bias, mask)
            return gx, None, gw, gb, None, None
        # row chunks of the compressed input: no full-size decoded copy; weight and bias gradients summed
        gx = torch.empty_like(grad) if mask[0] else None
        gw = torch.zeros_like(weight) if mask[1] else None
        gb = torch.zeros_like(bias) if mask[2] else None
        for r0, r1, x in row_chunks(x_s):
            a, b, c = torch.ops.aten.native_layer_norm_backward(grad[r0:r1], x.to(grad.dtype), shape, mean[r0:r1],
                                                                rstd[r0:r1], weight, bias, mask)
            if gx is not None:
                gx[r0:r1] = a
            if gw is not None:
                gw += b
            if gb is not None:
                gb += c
            del x, a, b, c  # before the next chunk is decoded (see row_chunks)
        return gx, None, gw, gb, None, None


@fresh_outputs
def layer_norm(x: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5,
               config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``F.layer_norm`` keeping its input compressed plus the per-row mean and 1/std (exact).

    The weight and bias gradients are unbiased (linear in the kept input); the input gradient is a
    nonlinear function of the kept input (biased by O(step**2), see the module doc)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if _plain(x, weight, bias):
        return F.layer_norm(x, tuple(normalized_shape), weight, bias, eps)
    return _LayerNorm.apply(x, tuple(normalized_shape), weight, bias, float(eps), resolve_config(config))


# --- pointwise activations -------------------------------------------------------------------------------
def _keep_pointwise(ctx, x, cfg, derivative) -> None:
    """What a pointwise activation ``act`` keeps: ``x`` itself where it would be kept exactly (compression
    off, or ``x`` alive anyway: rule 1; gradients then equal torch's and double backward works), else its
    derivative ``act'(x)`` (``derivative(x)``, exact) compressed: the backward ``g * act'(x)`` is linear in
    it, so the gradient is unbiased; same bytes as a compressed ``x``. ``ctx.kept_derivative`` says which."""
    cfg = _kept_cfg(cfg)
    ctx.kept_derivative = cfg.enabled and not alive_anyway(x)
    save_kept(ctx, as_kept(derivative(x), cfg, force=True) if ctx.kept_derivative else as_kept(x, cfg))


def _pointwise_grad(ctx, grad, op, fn, act_backward):
    """The input gradient of a pointwise activation kept by :func:`_keep_pointwise`."""
    (kept,) = load_kept(ctx)
    if ctx.kept_derivative:
        refuse_double_backward(op)
        return _pointwise_backward(lambda g, d: g * d, grad, kept)
    if double_backward(op, kept):
        (gx,) = recompute_vjp(fn, [kept], [True], [grad])
        return gx
    return _pointwise_backward(act_backward, grad, kept)


class _GELU(Function):
    @staticmethod
    def forward(ctx, x, approximate, cfg):
        ctx.approximate = approximate
        _keep_pointwise(ctx, x, cfg, lambda t: torch.ops.aten.gelu_backward(torch.ones_like(t), t,
                                                                            approximate=approximate))
        return F.gelu(x, approximate=approximate)

    @staticmethod
    def backward(ctx, grad):
        approximate = ctx.approximate
        return _pointwise_grad(ctx, grad, "gelu", lambda x: F.gelu(x, approximate=approximate),
                               lambda g, x: torch.ops.aten.gelu_backward(g, x, approximate=approximate)), None, None


@fresh_outputs
def gelu(x: torch.Tensor, approximate: str = "none", config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``F.gelu`` keeping its derivative ``gelu'(x)`` compressed (the backward ``g * gelu'(x)`` is linear in
    it: unbiased with compression on; the input itself, exact, with it off)."""
    if _plain(x):
        return F.gelu(x, approximate=approximate)
    return _GELU.apply(x, approximate, resolve_config(config))


class _SiLU(Function):
    @staticmethod
    def forward(ctx, x, cfg):
        _keep_pointwise(ctx, x, cfg, lambda t: torch.ops.aten.silu_backward(torch.ones_like(t), t))
        return F.silu(x)

    @staticmethod
    def backward(ctx, grad):
        return _pointwise_grad(ctx, grad, "silu", F.silu, torch.ops.aten.silu_backward), None


@fresh_outputs
def silu(x: torch.Tensor, config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``F.silu`` keeping its derivative compressed (unbiased backward: see :func:`gelu`)."""
    if _plain(x):
        return F.silu(x)
    return _SiLU.apply(x, resolve_config(config))


def _prelu_weight_view(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if weight.numel() == 1 or x.dim() < 2:
        return weight.reshape(())
    return weight.reshape((1, -1) + (1,) * (x.dim() - 2))


class _PReLU(Function):
    @staticmethod
    def forward(ctx, x, weight, cfg):
        from .elementwise import pack_mask

        y = F.prelu(x, weight)
        pos = x > 0
        ctx.weight_shape = weight.shape
        # the weight gradient reads x only where x <= 0; the input gradient only the sign
        keep_x = as_kept(x, _kept_cfg(cfg)) if ctx.needs_input_grad[1] else None
        save_kept(ctx, pack_mask(pos), keep_x, weight)
        return y

    @staticmethod
    def backward(ctx, grad):
        from .elementwise import mask_like

        packed, x_s, weight = load_kept(ctx)
        needs = ctx.needs_input_grad
        if double_backward("prelu", x_s):
            gx, gw = recompute_vjp(F.prelu, [x_s, weight], [needs[0], needs[1]], [grad])
            return gx, gw, None
        pos = mask_like(packed, grad)
        w = _prelu_weight_view(weight, grad).to(grad.dtype)
        gx = torch.where(pos, grad, grad * w) if needs[0] else None
        gw = None
        if needs[1]:
            neg = torch.where(pos, torch.zeros((), dtype=grad.dtype, device=grad.device),
                              grad * restore(x_s).to(grad.dtype))
            if weight.numel() == 1 or grad.dim() < 2:
                gw = neg.sum().reshape(ctx.weight_shape)
            else:
                dims = [d for d in range(grad.dim()) if d != 1]
                gw = neg.sum(dim=dims).reshape(ctx.weight_shape)
        return gx, gw, None


@fresh_outputs
def prelu(x: torch.Tensor, weight: torch.Tensor, config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``F.prelu`` keeping one sign bit per element plus the input compressed (read only by the weight
    gradient, linearly: both gradients are unbiased)."""
    if _plain(x, weight) or (x.dim() < 2 and weight.numel() != 1):
        return F.prelu(x, weight)
    return _PReLU.apply(x, weight, resolve_config(config))


# --- softmax ---------------------------------------------------------------------------------------------
class _Softmax(Function):
    @staticmethod
    def forward(ctx, x, dim, cfg):
        y = F.softmax(x, dim)
        ctx.dim = dim
        kept_cfg = _kept_cfg(cfg)
        # a fresh output: compressed, twice (independent draws: the backward is quadratic in y, see the
        # module doc); with compression off, the output itself
        second = as_kept(y, kept_cfg, force=True, independent=True) if kept_cfg.enabled else None
        save_kept(ctx, as_kept(y, kept_cfg, force=True), second)
        return y

    @staticmethod
    def backward(ctx, grad):
        y_s, y2_s = load_kept(ctx)
        if double_backward("softmax", y_s, y2_s):
            gy = grad * y_s  # the output itself: differentiable
            return gy - y_s * gy.sum(dim=ctx.dim, keepdim=True), None, None
        y = restore(y_s).to(grad.dtype)
        if y2_s is None:
            return torch.ops.aten._softmax_backward_data(grad, y, ctx.dim, y.dtype), None, None
        # y * (g - sum(g * y2)): the outer factor and the sum from independent draws, unbiased
        s = (grad * restore(y2_s).to(grad.dtype)).sum(dim=ctx.dim, keepdim=True)
        return y * (grad - s), None, None


@fresh_outputs
def softmax(x: torch.Tensor, dim: int, config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``F.softmax`` keeping its output compressed, in two independent copies (its backward is quadratic in it:
    unbiased from two draws, see the module doc); exact with compression off."""
    if _plain(x):
        return F.softmax(x, dim)
    return _Softmax.apply(x, int(dim), resolve_config(config))


class _LogSoftmax(Function):
    @staticmethod
    def forward(ctx, x, dim, cfg):
        y = F.log_softmax(x, dim)
        ctx.dim = dim
        if cfg.enabled:
            kept = as_kept(y.exp(), _kept_cfg(cfg), force=True)  # probabilities: the backward is linear in them
        else:
            kept = y
        ctx.kept_output = not cfg.enabled
        save_kept(ctx, kept)
        return y

    @staticmethod
    def backward(ctx, grad):
        (k_s,) = load_kept(ctx)
        if double_backward("log_softmax", k_s):
            p = k_s.exp()  # the output itself: differentiable
        elif ctx.kept_output:  # torch's own backward on the output: identical gradients
            return torch.ops.aten._log_softmax_backward_data(grad, k_s, ctx.dim, k_s.dtype), None, None
        else:
            p = restore(k_s).to(grad.dtype)
        return grad - p * grad.sum(dim=ctx.dim, keepdim=True), None, None


@fresh_outputs
def log_softmax(x: torch.Tensor, dim: int, config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """``F.log_softmax`` keeping the probabilities ``exp(output)`` compressed: the backward
    ``g - p * sum(g)`` is linear in them, so the gradient is unbiased."""
    if _plain(x):
        return F.log_softmax(x, dim)
    return _LogSoftmax.apply(x, int(dim), resolve_config(config))
