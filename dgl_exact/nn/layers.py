"""Compressed building blocks: drop-in subclasses of the torch layers GNNs are made of.

Each keeps the torch class's constructor, parameters and ``state_dict``; only what is kept for backward
changes. Each takes an optional ``compression=`` (default: the configuration in force).
"""
from __future__ import annotations

from typing import Optional

import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from ..compression_config import CompressionConfig
from ._base import CompressedModuleMixin, Dropout, register_linear_forward

__all__ = ["Linear", "BatchNorm1d", "ReLU", "LeakyReLU", "ELU", "Dropout", "ReLUDropout", "LayerNorm", "GELU", "SiLU",
           "PReLU", "Softmax", "LogSoftmax"]


class Linear(CompressedModuleMixin, nn.Linear):
    """:class:`torch.nn.Linear` keeping its input compressed (only the weight gradient needs it)."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *,
                 compression: Optional[CompressionConfig] = None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self._init_compression(compression)

    def forward(self, x):
        r"""Apply the linear map :math:`y = x W^T + b`.

        Parameters
        ----------
        x : torch.Tensor
            :math:`(N, *, \text{in_features})` input.

        Returns
        -------
        torch.Tensor
            :math:`(N, *, \text{out_features})` output.

        Kept for backward: ``x``, compressed under this module's configuration (only the weight gradient
        needs it); an ``x`` alive anyway (a leaf such as the input data) is kept by reference.
        """
        return ops.linear(x, self.weight, self.bias, self._config())


register_linear_forward(Linear.forward)  # a converted fc_self/fc_neigh may then be fused by its conv


class BatchNorm1d(CompressedModuleMixin, nn.BatchNorm1d):
    """:class:`torch.nn.BatchNorm1d` over ``[N, C]`` keeping its input compressed (never projected)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=None, *, compression: Optional[CompressionConfig] = None):
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats, device=device, dtype=dtype)
        self._init_compression(compression)

    def forward(self, x):
        r"""Normalise each channel over the batch (training) or with the running statistics (eval).

        Parameters
        ----------
        x : torch.Tensor
            :math:`(N, C)` input; any other shape runs :class:`torch.nn.BatchNorm1d` unchanged.

        Returns
        -------
        torch.Tensor
            :math:`(N, C)` output, the shape of ``x``.

        Kept for backward: ``x`` compressed (never projected) and the per-channel mean and 1/std.
        """
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

    def forward(self, x):
        r"""Apply :math:`\max(x, 0)`.

        Parameters
        ----------
        x : torch.Tensor
            Input of any shape.

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x``.

        Kept for backward: one bit per element (the sign of ``x``).
        """
        return ops.relu(x)


class LeakyReLU(nn.LeakyReLU):
    """LeakyReLU keeping one bit per element."""

    def forward(self, x):
        r"""Apply :math:`\max(x, 0) + \text{negative_slope} \min(x, 0)`.

        Parameters
        ----------
        x : torch.Tensor
            Input of any shape.

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x``.

        Kept for backward: one bit per element (the sign of ``x``).
        """
        return ops.leaky_relu(x, self.negative_slope)


class ELU(CompressedModuleMixin, nn.ELU):
    """ELU keeping one bit per element and its output compressed."""

    def __init__(self, alpha=1.0, inplace=False, *, compression: Optional[CompressionConfig] = None):
        super().__init__(alpha=alpha, inplace=inplace)
        self._init_compression(compression)

    def forward(self, x):
        r"""Apply :math:`x` for :math:`x > 0`, else :math:`\alpha (e^x - 1)`.

        Parameters
        ----------
        x : torch.Tensor
            Input of any shape.

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x``.

        Kept for backward: one bit per element (the sign of ``x``) and the output, compressed.
        """
        return ops.elu(x, self.alpha, self._config())


class ReLUDropout(nn.Module):
    """``Dropout(p)(ReLU()(x))`` keeping one bit per element for both."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p

    def forward(self, x):
        r"""Apply ``Dropout(p)(ReLU()(x))`` as one op (dropout only in training mode).

        Parameters
        ----------
        x : torch.Tensor
            Input of any shape.

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x``.

        Kept for backward: one bit per element for the ReLU and the dropout together. With compression off,
        the dropout mask is torch's own (as ``nn.ReLU`` then ``nn.Dropout`` draw it under the same seed).
        """
        return ops.relu_dropout(x, self.p, self.training, like_torch=True)

    def extra_repr(self):
        return f"p={self.p}"


class LayerNorm(CompressedModuleMixin, nn.LayerNorm):
    """:class:`torch.nn.LayerNorm` keeping its input compressed plus the per-row mean and 1/std (weight and
    bias gradients unbiased; the input gradient is nonlinear in the kept input, see :mod:`dgl_exact.ops.blocks`)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None, *,
                 compression: Optional[CompressionConfig] = None):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias, device=device,
                         dtype=dtype)
        self._init_compression(compression)

    def forward(self, x):
        r"""Normalise over the last ``len(normalized_shape)`` dimensions.

        Parameters
        ----------
        x : torch.Tensor
            :math:`(N, *, \text{normalized_shape})` input.

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x``.

        Kept for backward: ``x`` compressed, plus the per-row mean and 1/std.
        """
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, self._config())


class GELU(CompressedModuleMixin, nn.GELU):
    """:class:`torch.nn.GELU` keeping its derivative ``gelu'(x)`` compressed (the backward is linear in it:
    unbiased)."""

    def __init__(self, approximate: str = "none", *, compression: Optional[CompressionConfig] = None):
        super().__init__(approximate=approximate)
        self._init_compression(compression)

    def forward(self, x):
        r"""Apply the Gaussian error linear unit.

        Parameters
        ----------
        x : torch.Tensor
            Input of any shape.

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x``.

        Kept for backward: ``gelu'(x)`` compressed (``x`` itself with compression off).
        """
        return ops.gelu(x, self.approximate, self._config())


class SiLU(CompressedModuleMixin, nn.SiLU):
    """:class:`torch.nn.SiLU` keeping its derivative ``silu'(x)`` compressed (the backward is linear in it:
    unbiased). ``inplace`` is accepted for compatibility; the output is a new tensor."""

    def __init__(self, inplace: bool = False, *, compression: Optional[CompressionConfig] = None):
        super().__init__(inplace=inplace)
        self._init_compression(compression)

    def forward(self, x):
        r"""Apply :math:`x \sigma(x)`.

        Parameters
        ----------
        x : torch.Tensor
            Input of any shape.

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x`` (a new tensor).

        Kept for backward: ``silu'(x)`` compressed (``x`` itself with compression off).
        """
        return ops.silu(x, self._config())


class PReLU(CompressedModuleMixin, nn.PReLU):
    """:class:`torch.nn.PReLU` keeping one sign bit per element plus its input compressed (both gradients
    unbiased)."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device=None, dtype=None, *,
                 compression: Optional[CompressionConfig] = None):
        super().__init__(num_parameters=num_parameters, init=init, device=device, dtype=dtype)
        self._init_compression(compression)

    def forward(self, x):
        r"""Apply :math:`\max(x, 0) + a \min(x, 0)` with the learned slope :math:`a` (one, or one per channel).

        Parameters
        ----------
        x : torch.Tensor
            :math:`(N, C, *)` input (or any shape with one slope).

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x``.

        Kept for backward: one sign bit per element and ``x`` compressed.
        """
        return ops.prelu(x, self.weight, self._config())


def _softmax_dim(module, x) -> int:
    return module.dim if module.dim is not None else F._get_softmax_dim(type(module).__name__.lower(), x.dim(), 5)


class Softmax(CompressedModuleMixin, nn.Softmax):
    """:class:`torch.nn.Softmax` keeping its output compressed (backward quadratic in it: O(step**2) bias)."""

    def __init__(self, dim: Optional[int] = None, *, compression: Optional[CompressionConfig] = None):
        super().__init__(dim=dim)
        self._init_compression(compression)

    def forward(self, x):
        r"""Apply softmax along ``dim``.

        Parameters
        ----------
        x : torch.Tensor
            Input of any shape.

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x``.

        Kept for backward: the output compressed.
        """
        return ops.softmax(x, _softmax_dim(self, x), self._config())


class LogSoftmax(CompressedModuleMixin, nn.LogSoftmax):
    """:class:`torch.nn.LogSoftmax` keeping the probabilities compressed (backward linear in them: unbiased)."""

    def __init__(self, dim: Optional[int] = None, *, compression: Optional[CompressionConfig] = None):
        super().__init__(dim=dim)
        self._init_compression(compression)

    def forward(self, x):
        r"""Apply log-softmax along ``dim``.

        Parameters
        ----------
        x : torch.Tensor
            Input of any shape.

        Returns
        -------
        torch.Tensor
            Output of the shape of ``x``.

        Kept for backward: the probabilities (the exponentiated output) compressed.
        """
        return ops.log_softmax(x, _softmax_dim(self, x), self._config())
