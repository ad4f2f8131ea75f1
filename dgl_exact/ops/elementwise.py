"""Activations and dropout with (almost) nothing kept for backward.

==============  =============================================================================
op              kept for backward
==============  =============================================================================
relu            1 bit per element (``x > 0``)
leaky_relu      1 bit per element (sign)
elu             1 bit per element + the output compressed (``elu'(x) = y + alpha`` for ``x < 0``)
dropout         nothing: the mask is regenerated from the seed that produced it
relu_dropout    1 bit per element for both (``x > 0 and kept``)
==============  =============================================================================

The bits are exact, so these ops cost no accuracy. With compression on, masks use the kernels'
counter-based RNG, hence identical on every backend and reproducible under ``torch.manual_seed``, but not
the masks torch's dropout draws. ``like_torch=True`` (what the modules :class:`dgl_exact.nn.Dropout` and
``ReLUDropout``, and a user's ``nn.Dropout`` inside dgl_exact's convs, pass): with compression off (the
configuration in force disabled, on CPU or CUDA, not while compiling), ``dropout`` and an unseeded
``relu_dropout`` draw torch's own masks from torch's generator (the same outputs, gradients and generator
state as ``torch.nn.functional.dropout``) and still keep nothing: backward replays the draw from the
generator state saved in the forward. With compression on, matching torch's stream is not possible for the
fused ops (their kernels draw the mask in the same pass that writes the output and its codes), so all
masks come from the kernels' RNG then.

Double backward: the masks are exact, so relu, leaky_relu, dropout and relu_dropout support it always
(their backward is then computed with differentiable torch ops); elu needs its output, hence compression
off (else a clear error).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from .. import kernels
from ..kernels import reference as kernel_reference
from .._compat import compiling
from ..compression import draw_seed, fuses_with_activation, relu_dropout_compress
from ..compression_config import CompressionConfig, resolve_config
from . import captured
from .derived import Mask
from .keep import (fresh_outputs, offer_compressed, as_kept, keep_hook_active, record_dropout_output,
                   record_elementwise_step, restore)
from .double_backward import double_backward
from .saved import load_kept, needs_saving, save_kept
from .function import Function

__all__ = ["relu", "leaky_relu", "elu", "dropout", "relu_dropout", "pack_mask", "mask_like"]


def _kernel_for(op: str, x: torch.Tensor):
    return kernels.get(op, x.device)


def pack_mask(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (bool) packed to one bit per element by its device's kernel: how an op keeps a sign or
    dropout mask for backward (:func:`mask_like` reads it back)."""
    return _kernel_for("pack_mask", mask)(mask)


def mask_like(packed: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The bool mask :func:`pack_mask` packed into ``packed``, in the shape (and on the device) of ``grad``."""
    return _kernel_for("unpack_mask", grad)(packed, grad.numel()).view(grad.shape)


@captured.capturable
class _ReLUDropout(Function):
    @staticmethod
    def forward(ctx, x, p: float, seed: int, compress_for: Optional[CompressionConfig] = None, chain: bool = True):
        # ``chain``: y may be kept through x's recipe (rule 12); not where the caller asked for a copy of y for the
        # next op (``compress_for``), whether or not it is made here: the next op's keep then does not depend on
        # a keep hook's presence (under one, no copy is offered), so a plan numbers its slots alike
        if compress_for is None:
            y, packed = _kernel_for("relu_dropout", x)(x.contiguous(), p, seed)
            if chain:
                record_elementwise_step(y, x, Mask(packed, 0.0, 1.0 / (1.0 - p) if p > 0 else 1.0))
        else:  # one pass: the output, its mask and the output's compressed copy for the next op
            y, packed, kept = relu_dropout_compress(x.contiguous(), p, seed, compress_for)
            offer_compressed(y, compress_for, kept)
        ctx.scale = 1.0 / (1.0 - p) if p > 0 else 1.0
        save_kept(ctx, packed)
        return y

    @staticmethod
    def backward(ctx, grad):
        (packed,) = load_kept(ctx)
        if double_backward("relu_dropout"):  # differentiable in grad (relu'' = 0)
            return grad * (mask_like(packed, grad).to(grad.dtype) * ctx.scale), None, None, None, None
        return _kernel_for("masked_scale", grad)(grad.contiguous(), packed, ctx.scale, 0.0), None, None, None, None


def _drop_all(x):
    return x * 0.0


@fresh_outputs
def relu_dropout(x: torch.Tensor, p: float = 0.0, training: bool = True, *,
                 compress_for: Optional[CompressionConfig] = None, seed: Optional[int] = None,
                 like_torch: bool = False) -> torch.Tensor:
    """``dropout(relu(x), p)`` keeping a single bit per element.

    ``seed``: the dropout mask's seed (drawn from torch's CPU generator when None). Given, the mask is the
    kernels' counter-based one for that seed with and without grad (without, and unseeded, torch's own
    dropout runs): a recomputed segment (:mod:`dgl_exact.ops.recompute`) replays its forward's masks.

    ``compress_for``: the configuration under which the next op keeps this output for backward (a module's
    ``input_compression(x)``, e.g. SAGEConv's ``fc_self``). Where it quantises without projection, the
    output's compressed copy comes from the same pass over ``x`` (kernel ``relu_dropout_compress``) and the
    next op's keep takes it instead of reading the output again (``keeping.offer_compressed``): the same
    values and the same compression, drawn here instead of there. Ignored while compiling and under a
    planner's keep hook (which chooses the kept compression itself).

    ``like_torch``: unseeded and with compression off, torch's own dropout mask (see the module doc)."""
    _check_p(p)
    p = float(p) if training else 0.0
    if p >= 1.0:
        return _drop_all(x)
    if like_torch and seed is None and p > 0 and _torch_stream(x, compress_for):  # torch's masks (module doc)
        return _torch_dropout(relu(x), p, x)  # 1 bit (relu) + nothing (dropout), as fused
    if not needs_saving(x):
        if seed is not None and p > 0:
            return _kernel_for("relu_dropout", x)(x.contiguous(), p, int(seed))[0]
        return F.dropout(F.relu(x), p, training=p > 0)
    seed = (draw_seed() if seed is None else int(seed)) if p > 0 else 0
    if (compress_for is not None and not compiling() and not keep_hook_active()
            and fuses_with_activation(x, compress_for)):
        return _ReLUDropout.apply(x, p, seed, compress_for, False)
    return captured.apply("_ReLUDropout", x, p, seed, None, compress_for is None)


@fresh_outputs
def relu(x: torch.Tensor) -> torch.Tensor:
    """ReLU keeping one bit per element."""
    return relu_dropout(x, 0.0)


@captured.capturable
class _LeakyReLU(Function):
    @staticmethod
    def forward(ctx, x, slope: float):
        mask = x > 0
        ctx.slope = slope
        packed = pack_mask(mask)
        save_kept(ctx, packed)
        y = torch.where(mask, x, x * slope)
        record_elementwise_step(y, x, Mask(packed, slope, 1.0))  # rule 12
        return y

    @staticmethod
    def backward(ctx, grad):
        (packed,) = load_kept(ctx)
        if double_backward("leaky_relu"):
            return torch.where(mask_like(packed, grad), grad, grad * ctx.slope), None
        return _kernel_for("masked_scale", grad)(grad.contiguous(), packed, 1.0, ctx.slope), None


@fresh_outputs
def leaky_relu(x: torch.Tensor, negative_slope: float = 0.01) -> torch.Tensor:
    """LeakyReLU keeping one bit per element (valid for ``negative_slope >= 0``)."""
    if negative_slope < 0 or not needs_saving(x):
        return F.leaky_relu(x, negative_slope)
    return captured.apply("_LeakyReLU", x, float(negative_slope))


@captured.capturable
class _ELU(Function):
    @staticmethod
    def forward(ctx, x, alpha: float, cfg: CompressionConfig):
        y = F.elu(x, alpha)
        mask = x > 0
        ctx.alpha = alpha
        # the output is a fresh tensor nobody else keeps: compress it (no projection: not linear)
        save_kept(ctx, pack_mask(mask), as_kept(y, cfg.replace(kept_frac=1.0), force=True))
        return y

    @staticmethod
    def backward(ctx, grad):
        packed, y_s = load_kept(ctx)
        double_backward("elu", y_s)  # raises unless y is the output itself (kept uncompressed): then exact
        y = restore(y_s).to(grad.dtype)
        mask = _kernel_for("unpack_mask", grad)(packed, grad.numel()).view(grad.shape)
        return torch.where(mask, grad, grad * (y + ctx.alpha)), None, None


@fresh_outputs
def elu(x: torch.Tensor, alpha: float = 1.0, config: Optional[CompressionConfig] = None) -> torch.Tensor:
    """ELU keeping one bit per element plus its output compressed."""
    if not needs_saving(x):
        return F.elu(x, alpha)
    return captured.apply("_ELU", x, float(alpha), resolve_config(config))


@captured.capturable
class _Dropout(Function):
    @staticmethod
    def forward(ctx, x, p: float, seed: int):
        ctx.p, ctx.seed = p, seed
        y = _kernel_for("dropout", x)(x.contiguous(), p, seed)
        record_dropout_output(y, x, p, seed)  # of a recorded output: rule 12
        return y

    @staticmethod
    def backward(ctx, grad):
        if double_backward("dropout"):  # the reference kernel is plain torch: differentiable in grad
            return kernel_reference.dropout(grad, ctx.p, ctx.seed), None, None
        return _kernel_for("dropout", grad)(grad.contiguous(), ctx.p, ctx.seed), None, None


def _torch_stream(x: torch.Tensor, compress_for: Optional[CompressionConfig] = None) -> bool:
    """Whether dropout draws torch's own mask (see the module doc): compression off, a device whose generator
    state can be saved and restored, not while compiling."""
    return (not resolve_config(None).enabled and (compress_for is None or not compress_for.enabled)
            and x.device.type in ("cpu", "cuda") and not compiling())


def _rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


class _TorchDropout(Function):
    """``torch.nn.functional.dropout`` itself (its mask, from torch's generator), keeping only the generator's
    state and a layout (``like``, a meta tensor: the mask follows the strides torch's dropout would give it
    on a tensor of that layout): backward draws the same mask again on a tensor of ones of that layout (as
    ``torch.utils.checkpoint`` replays a forward's randomness) and restores the generator."""

    @staticmethod
    def forward(ctx, x, p: float, like: torch.Tensor):
        ctx.p, ctx.like, ctx.state = p, like, _rng_state(x.device)
        if x.stride() == like.stride():
            return F.dropout(x, p, training=True)
        # x * (1 * noise) is x * noise bit for bit (noise: 0 or 1 / (1 - p)), the mask laid out as on ``like``
        return x * F.dropout(torch.ones_like(like, device=x.device), p, training=True)

    @staticmethod
    def backward(ctx, grad):
        now = _rng_state(grad.device)
        _set_rng_state(grad.device, ctx.state)
        try:
            scale = F.dropout(torch.ones_like(ctx.like, device=grad.device), ctx.p, training=True)
        finally:
            _set_rng_state(grad.device, now)
        return grad * scale, None, None


def _torch_dropout(x: torch.Tensor, p: float, layout: torch.Tensor) -> torch.Tensor:
    """torch's dropout of ``x`` with the mask torch would draw for a tensor laid out as ``layout`` (torch's
    dropout of ``relu(h)`` lays its mask out as ``h``: ``relu`` preserves strides, :func:`relu` does not)."""
    like = torch.empty_like(layout, device="meta")
    if needs_saving(x):
        return _TorchDropout.apply(x, p, like)
    if x.stride() == like.stride():
        return F.dropout(x, p, training=True)
    return x * F.dropout(torch.ones_like(like, device=x.device), p, training=True)


def _check_p(p):
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


@fresh_outputs
def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, *, like_torch: bool = False) -> torch.Tensor:
    """Dropout that keeps no mask: backward regenerates it from the seed (``like_torch`` and compression off:
    torch's own mask, replayed from torch's generator state; see the module doc)."""
    _check_p(p)
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return _drop_all(x)
    if like_torch and _torch_stream(x):
        return _torch_dropout(x, float(p), x)
    if not needs_saving(x):
        seed = draw_seed()
        y = _kernel_for("dropout", x)(x.contiguous(), float(p), seed)
        record_dropout_output(y, x, p, seed)  # of data: kept as the data and the seed (rule 11)
        return y
    return captured.apply("_Dropout", x, float(p), draw_seed())
