"""Linear with its input kept compressed, a drop-in for :class:`torch_geometric.nn.Linear`."""
from __future__ import annotations

from typing import Optional

import torch_geometric.nn as pyg_nn
from torch import Tensor

from ..compression_config import CompressionConfig
from ..ops import linear
from ._base import CompressedMixin

__all__ = ["Linear"]


class Linear(CompressedMixin, pyg_nn.Linear):
    r""":class:`torch_geometric.nn.Linear` keeping its input compressed (only the weight gradient needs it).

    .. math::
        \mathbf{x}^{\prime} = \mathbf{x} \mathbf{W}^{\top} + \mathbf{b}

    Same constructor (``in_channels=-1``: lazy, initialised on the first call as in PyG), parameters,
    initialisers, ``state_dict`` (``weight [out_channels, in_channels]``, ``bias``) and output as PyG's; PyG keeps
    the input as it is, this module keeps it compressed under its ``compression`` (by reference where it is
    alive anyway: input features, parameters).

    Parameters
    ----------
    in_channels, out_channels : int
        Input and output sizes.
    bias : bool, default True
        Learnable bias.
    weight_initializer, bias_initializer : str, optional
        PyG's initialisers (``'glorot'``, ``'uniform'``, ``'kaiming_uniform'``, ``'zeros'``, None: torch's).
    compression : CompressionConfig, optional
        As every drop-in takes it (:mod:`dgl_exact.pyg`).

    Example
    -------
    >>> import torch, dgl_exact.pyg
    >>> lin = dgl_exact.pyg.Linear(-1, 8, compression=dgl_exact.CompressionConfig(bits=2))
    >>> lin(torch.randn(100, 16)).shape
    torch.Size([100, 8])
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True,
                 weight_initializer: Optional[str] = None, bias_initializer: Optional[str] = None, *,
                 compression: Optional[CompressionConfig] = None, **kwargs):
        super().__init__(in_channels, out_channels, bias=bias, weight_initializer=weight_initializer,
                         bias_initializer=bias_initializer, **kwargs)
        self._init_compression(compression)

    def forward(self, x: Tensor) -> Tensor:
        """``x [*, in_channels]``; returns ``[*, out_channels]``."""
        return linear(x, self.weight, self.bias, self._config())
