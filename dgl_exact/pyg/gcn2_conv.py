"""GCN2Conv with compressed activations, a drop-in for :class:`torch_geometric.nn.GCN2Conv`."""
from __future__ import annotations

from typing import Optional

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import OptTensor

from ..compression_config import CompressionConfig
from ..ops import linear
from ._base import (CompressedMixin, check_adjacency, is_sparse, shared_doc, sparse_edges, structure,
                    symmetric_norm_sum, weighted_sum)
from .gcn_conv import node_factors, normalized_graph, unit_graph

__all__ = ["GCN2Conv"]


@shared_doc
class GCN2Conv(CompressedMixin, pyg_nn.GCN2Conv):
    r"""GCNII's layer (Chen et al., ICML 2020), a drop-in for :class:`torch_geometric.nn.GCN2Conv`.

    .. math::
        \mathbf{X}^{\prime} = \left( (1 - \alpha) \mathbf{\hat{P}}\mathbf{X} + \alpha \mathbf{X^{(0)}}\right)
        \left( (1 - \beta) \mathbf{I} + \beta \mathbf{\Theta} \right)

    with :math:`\mathbf{\hat{P}}` the symmetrically normalised adjacency with self loops (PyG's ``gcn_norm``)
    and :math:`\beta = \log(\theta / \ell + 1)` (1 without ``theta`` and ``layer``); with
    ``shared_weights=False`` the initial-residual term has a weight of its own (``weight2``).

    Same constructor, forward signature, parameters (``weight1``, ``weight2``), initialisation, ``state_dict``
    and output as PyG's; during training the activations kept for backward are compressed. PyG keeps the mixed
    features ``(1 - alpha) P X + alpha X0`` exactly (and ``alpha X0`` with ``weight2``); this module keeps them
    compressed, and ``X0`` itself (alive anyway: the model's first layer's output is kept by that layer) for
    ``weight2``'s gradient. Without edge weights (and without ``cached``) the normalisation is applied as node
    factors around a sum that keeps nothing: nothing per edge is kept; with them, the ``E`` normalised weights,
    and the aggregated features compressed where the weights need a gradient. Another ``aggr`` than ``'add'``
    and ``decomposed_layers > 1`` run PyG's own code, what it saves compressed by
    :func:`dgl_exact.compress_saved`.

    Parameters
    ----------
    channels : int
        Feature size (input and output).
    alpha : float
        Strength of the initial residual.
    theta, layer : float, int, optional
        Together: :math:`\beta = \log(\theta / \ell + 1)`.
    shared_weights : bool, default True
        One weight for both terms (else ``weight2`` for the initial residual).
    cached, add_self_loops, normalize : bool
        As in :class:`~dgl_exact.pyg.GCNConv`.
    %(compression)s

    Example
    -------
    %(example_imports)s
    >>> edge_index = torch.randint(0, 100, (2, 500))
    >>> conv = GCN2Conv(16, alpha=0.1, theta=0.5, layer=1)
    >>> x0 = torch.randn(100, 16)
    >>> conv(x0, x0, edge_index).shape
    torch.Size([100, 16])
    """

    # PyG compiles each class's ``propagate`` from the types its source declares, reading sources cached by class
    # name: ours share PyG's names (and call no propagate), so PyG's declarations are repeated here, for the
    # runs that take PyG's own forward (hooks, explain, a setting of ``pyg_setting``)
    propagate_type = {"x": Tensor, "edge_weight": OptTensor}
    compressed_aggregations = ("add", "sum")

    def __init__(self, channels: int, alpha: float, theta: Optional[float] = None, layer: Optional[int] = None,
                 shared_weights: bool = True, cached: bool = False, add_self_loops: bool = True,
                 normalize: bool = True, *, compression: Optional[CompressionConfig] = None, **kwargs):
        super().__init__(channels, alpha, theta=theta, layer=layer, shared_weights=shared_weights, cached=cached,
                         add_self_loops=add_self_loops, normalize=normalize, **kwargs)
        self._init_compression(compression)

    def forward(self, x: Tensor, x_0: Tensor, edge_index, edge_weight: Optional[Tensor] = None) -> Tensor:
        """``x [N, channels]``, ``x_0 [N0 >= N, channels]`` (its first ``N`` rows are used), ``edge_index [2, E]``
        (or a ``torch.sparse`` adjacency indexed ``[target, source]``), ``edge_weight [E]``; returns
        ``[N, channels]``."""
        if self._runs_as_pyg():
            return self._pyg_forward(super().forward, x, x_0, edge_index, edge_weight)
        check_adjacency(edge_index)
        n = x.size(self.node_dim)
        cfg = self._config()
        alpha, beta = self.alpha, self.beta
        # the aggregation's output is this op's own buffer: scaled and mixed in place, as PyG does
        if node_factors(self, edge_index, edge_weight, False):
            h = symmetric_norm_sum(unit_graph(self, edge_index, n, x.device), x).mul_(1 - alpha)
        else:
            graph, weight, key, variant = normalized_graph(self, edge_index, edge_weight, n, False, x.dtype)
            st = structure(graph, variant, n, n, x.device, self.flow, key=key)
            if is_sparse(graph):
                weight = sparse_edges(graph)[2]
            h = weighted_sum(st, x, weight, cfg).mul_(1 - alpha)
        x_0 = x_0[:n]
        if self.weight2 is None:
            h = h.add_(x_0, alpha=alpha)
            return linear(h, self.weight1.t(), None, cfg).mul_(beta).add_(h, alpha=1.0 - beta)
        out = linear(h, self.weight1.t(), None, cfg).mul_(beta).add_(h, alpha=1.0 - beta)
        # (alpha X0) W2 = alpha (X0 W2): the product keeps X0 itself (alive anyway) rather than a scaled copy
        initial = linear(x_0, self.weight2.t(), None, cfg).mul_(alpha * beta).add_(x_0, alpha=alpha * (1.0 - beta))
        return out.add_(initial)
