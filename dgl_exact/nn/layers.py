"""Compressed building blocks: drop-in subclasses of the torch layers GNNs are made of.

Each keeps the torch class's constructor, parameters and ``state_dict``; only what is kept for backward
changes. Each takes an optional ``compression=`` (default: the configuration in force).
"""
from __future__ import annotations

import inspect
from typing import Optional

import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from ..compression_config import CompressionConfig
from ._base import CompressedModuleMixin, Dropout, forward_doc, register_linear_forward

__all__ = ["Linear", "BatchNorm1d", "ReLU", "LeakyReLU", "ELU", "Dropout", "ReLUDropout", "LayerNorm", "GELU", "SiLU",
           "PReLU", "Softmax", "LogSoftmax"]


class _TorchLayer(CompressedModuleMixin):
    """The constructor every building block shares: the torch class's own arguments, unchanged, plus
    ``compression`` (keyword only; see :class:`~dgl_exact.nn._base.CompressedModuleMixin`), less those a subclass
    names in ``unsupported`` (newer torch arguments its op does not implement). Its signature reads as the torch
    class's plus ``compression``."""

    _unsupported: tuple = ()

    def __init__(self, *args, compression: Optional[CompressionConfig] = None, **kwargs):
        refused = sorted(set(kwargs) & set(self._unsupported))
        if refused:
            raise TypeError(f"dgl_exact.nn.{type(self).__name__} does not take {', '.join(refused)}; leave it at its "
                            f"default or use torch's {type(self).__name__}")
        super().__init__(*args, **kwargs)
        self._init_compression(compression)

    def __init_subclass__(cls, unsupported: tuple = (), **kwargs):
        super().__init_subclass__(**kwargs)
        cls._unsupported = tuple(unsupported)
        base = next(k for k in cls.__mro__ if k.__module__.startswith("torch.nn."))
        sig = inspect.signature(base.__init__)
        params = [p for p in list(sig.parameters.values())[1:]
                  if p.kind is not p.VAR_KEYWORD and p.name not in cls._unsupported]
        params.append(inspect.Parameter("compression", inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Optional[CompressionConfig]))
        cls.__signature__ = sig.replace(parameters=params)


class Linear(_TorchLayer, nn.Linear):
    """:class:`torch.nn.Linear` keeping its input compressed (only the weight gradient needs it)."""

    @forward_doc(
        "Apply the linear map :math:`y = x W^T + b`.",
        "``x``, compressed under this module's configuration (only the weight gradient needs it); an ``x`` alive "
        "anyway (a leaf such as the input data) is kept by reference.",
        x=r":math:`(N, *, \text{in_features})` input.",
        out=r":math:`(N, *, \text{out_features})` output.")
    def forward(self, x):
        return ops.linear(x, self.weight, self.bias, self._config())


register_linear_forward(Linear.forward)  # a converted fc_self/fc_neigh may then be fused by its conv


class BatchNorm1d(_TorchLayer, nn.BatchNorm1d, unsupported=("bias",)):
    """:class:`torch.nn.BatchNorm1d` over ``[N, C]`` keeping its input compressed (never projected)."""

    @forward_doc(
        "Normalise each channel over the batch (training) or with the running statistics (eval).",
        "``x`` compressed (never projected) and the per-channel mean and 1/std.",
        x=":math:`(N, C)` input; any other shape runs :class:`torch.nn.BatchNorm1d` unchanged.",
        out=":math:`(N, C)` output, the shape of ``x``.")
    def forward(self, x):
        if x.dim() != 2:
            return super().forward(x)
        self._check_input_dim(x)
        track, track_var, use_batch_stats, factor = self.batch_norm_args()
        return ops.batch_norm(x, track, track_var, self.weight, self.bias, use_batch_stats, factor, self.eps,
                              self._config())

    def batch_norm_args(self):
        """``(running_mean, running_var, use_batch_stats, momentum)`` for one forward, as
        :class:`torch.nn.BatchNorm1d` derives them (counting the batch in ``num_batches_tracked``)."""
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        track = self.running_mean if not self.training or self.track_running_stats else None
        track_var = self.running_var if not self.training or self.track_running_stats else None
        return track, track_var, use_batch_stats, factor


class ReLU(nn.ReLU):
    """ReLU keeping one bit per element."""

    @forward_doc(r"Apply :math:`\max(x, 0)`.", "one bit per element (the sign of ``x``).")
    def forward(self, x):
        return ops.relu(x)


class LeakyReLU(nn.LeakyReLU):
    """LeakyReLU keeping one bit per element."""

    @forward_doc(
        r"Apply :math:`\max(x, 0) + \text{negative_slope} \min(x, 0)`.",
        "one bit per element (the sign of ``x``).")
    def forward(self, x):
        return ops.leaky_relu(x, self.negative_slope)


class ELU(_TorchLayer, nn.ELU):
    """ELU keeping one bit per element and its output compressed."""

    @forward_doc(
        r"Apply :math:`x` for :math:`x > 0`, else :math:`\alpha (e^x - 1)`.",
        "one bit per element (the sign of ``x``) and the output, compressed.")
    def forward(self, x):
        return ops.elu(x, self.alpha, self._config())


class ReLUDropout(nn.Module):
    """``Dropout(p)(ReLU()(x))`` keeping one bit per element for both."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    @forward_doc(
        "Apply ``Dropout(p)(ReLU()(x))`` as one op (dropout only in training mode).",
        "one bit per element for the ReLU and the dropout together. With compression off, the dropout mask is "
        "torch's own (as ``nn.ReLU`` then ``nn.Dropout`` draw it under the same seed).")
    def forward(self, x):
        return ops.relu_dropout(x, self.p, self.training, like_torch=True)

    def extra_repr(self):
        return f"p={self.p}"


class LayerNorm(_TorchLayer, nn.LayerNorm):
    """:class:`torch.nn.LayerNorm` keeping its input compressed plus the per-row mean and 1/std (weight and
    bias gradients unbiased; the input gradient is nonlinear in the kept input, see :mod:`dgl_exact.ops.blocks`)."""

    @forward_doc(
        "Normalise over the last ``len(normalized_shape)`` dimensions.",
        "``x`` compressed, plus the per-row mean and 1/std.",
        x=r":math:`(N, *, \text{normalized_shape})` input.")
    def forward(self, x):
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, self._config())


class GELU(_TorchLayer, nn.GELU):
    """:class:`torch.nn.GELU` keeping its derivative ``gelu'(x)`` compressed (the backward is linear in it:
    unbiased)."""

    @forward_doc(
        "Apply the Gaussian error linear unit.",
        "``gelu'(x)`` compressed (``x`` itself with compression off).")
    def forward(self, x):
        return ops.gelu(x, self.approximate, self._config())


class SiLU(_TorchLayer, nn.SiLU):
    """:class:`torch.nn.SiLU` keeping its derivative ``silu'(x)`` compressed (the backward is linear in it:
    unbiased). ``inplace`` is accepted for compatibility; the output is a new tensor."""

    @forward_doc(
        r"Apply :math:`x \sigma(x)`.",
        "``silu'(x)`` compressed (``x`` itself with compression off).",
        out="Output of the shape of ``x`` (a new tensor).")
    def forward(self, x):
        return ops.silu(x, self._config())


class PReLU(_TorchLayer, nn.PReLU):
    """:class:`torch.nn.PReLU` keeping one sign bit per element plus its input compressed (both gradients
    unbiased)."""

    @forward_doc(
        r"Apply :math:`\max(x, 0) + a \min(x, 0)` with the learned slope :math:`a` (one, or one per channel).",
        "one sign bit per element and ``x`` compressed.",
        x=":math:`(N, C, *)` input (or any shape with one slope).")
    def forward(self, x):
        return ops.prelu(x, self.weight, self._config())


def _softmax_dim(module, x) -> int:
    return module.dim if module.dim is not None else F._get_softmax_dim(type(module).__name__.lower(), x.dim(), 5)


class Softmax(_TorchLayer, nn.Softmax):
    """:class:`torch.nn.Softmax` keeping its output compressed, in two independent copies (its backward is
    quadratic in it: unbiased from two draws)."""

    @forward_doc("Apply softmax along ``dim``.", "the output compressed.")
    def forward(self, x):
        return ops.softmax(x, _softmax_dim(self, x), self._config())


class LogSoftmax(_TorchLayer, nn.LogSoftmax):
    """:class:`torch.nn.LogSoftmax` keeping the probabilities compressed (backward linear in them: unbiased)."""

    @forward_doc("Apply log-softmax along ``dim``.", "the probabilities (the exponentiated output) compressed.")
    def forward(self, x):
        return ops.log_softmax(x, _softmax_dim(self, x), self._config())
