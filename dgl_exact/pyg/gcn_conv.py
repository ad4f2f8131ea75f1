"""GCNConv with compressed activations, a drop-in for :class:`torch_geometric.nn.GCNConv`."""
from __future__ import annotations

from typing import Optional

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import OptTensor
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import add_remaining_self_loops

from ..compression_config import CompressionConfig
from ..ops import linear
from ._base import (CompressedMixin, check_adjacency, is_sparse, materialize, shared_doc, sparse_edges, structure,
                    symmetric_norm_sum, weighted_sum)

__all__ = ["GCNConv"]


@shared_doc
class GCNConv(CompressedMixin, pyg_nn.GCNConv):
    r"""Graph convolution (Kipf and Welling, ICLR 2017), a drop-in for :class:`torch_geometric.nn.GCNConv`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{\Theta}^{\top} \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \frac{e_{j,i}}{\sqrt{\hat{d}_j \hat{d}_i}} \mathbf{x}_j + \mathbf{b}

    with :math:`\hat{d}_i = 1 + \sum_{j \in \mathcal{N}(i)} e_{j,i}` (self loops of weight 1, or 2 with
    ``improved``, added where missing).

    Same constructor, forward signature, parameters (``lin.weight`` of shape ``(out_channels, in_channels)``,
    ``bias``), initialisation, ``state_dict`` and output as PyG's (its ``gcn_norm``: normalisation and self
    loops); during training the activations kept for backward are compressed. PyG keeps the layer input, the
    self-looped ``edge_index`` and the ``E`` normalised edge weights (and the ``[E, out_channels]`` messages when
    the weights need a gradient); this module keeps the input of the linear compressed (by reference where it
    is alive anyway: input features). Without edge weights (and without ``cached``, improved or a sparse
    adjacency) the normalisation is applied as node factors around a sum that keeps nothing, so nothing per
    edge is kept either; otherwise the normalised weights, and the aggregated features compressed where the
    weights need a gradient.

    Parameters
    ----------
    in_channels, out_channels : int
        Input and output feature sizes (``in_channels=-1``: lazy, as in PyG).
    improved : bool, default False
        Self loops of weight 2.
    cached : bool, default False
        Keep the normalised graph of the first call (transductive learning), as PyG does.
    add_self_loops : bool, optional
        Add self loops (default: ``normalize``).
    normalize : bool, default True
        Symmetric normalisation (with self loops) on the fly.
    bias : bool, default True
        Learnable bias.
    compression, **kwargs
        As every drop-in takes them (:mod:`dgl_exact.pyg`); another ``aggr`` than ``'add'`` and
        ``decomposed_layers > 1`` run PyG's own code, what it saves compressed by :func:`dgl_exact.compress_saved`.

    Example
    -------
    %(example_imports)s
    >>> from dgl_exact import CompressionConfig
    >>> edge_index = torch.randint(0, 100, (2, 500))
    >>> conv = GCNConv(16, 8, compression=CompressionConfig(bits=2))
    >>> conv(torch.randn(100, 16), edge_index).shape
    torch.Size([100, 8])
    """

    # PyG compiles each class's ``propagate`` from the types its source declares, reading sources cached by class
    # name: ours share PyG's names (and call no propagate), so PyG's declarations are repeated here, for the
    # runs that take PyG's own forward (hooks, explain, a setting of ``pyg_setting``)
    propagate_type = {"x": Tensor, "edge_weight": OptTensor}
    compressed_aggregations = ("add", "sum")

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False, cached: bool = False,
                 add_self_loops: Optional[bool] = None, normalize: bool = True, bias: bool = True, *,
                 compression: Optional[CompressionConfig] = None, **kwargs):
        super().__init__(in_channels, out_channels, improved=improved, cached=cached, add_self_loops=add_self_loops,
                         normalize=normalize, bias=bias, **kwargs)
        self._init_compression(compression)

    def forward(self, x: Tensor, edge_index, edge_weight: Optional[Tensor] = None) -> Tensor:
        """``x [N, in_channels]`` (or ``[*, N, in_channels]``, one graph for every leading index, along PyG's
        ``node_dim``), ``edge_index [2, E]`` (or a ``torch.sparse`` adjacency ``[N, N]`` indexed
        ``[target, source]``), ``edge_weight [E]``; returns ``[N, out_channels]`` (``[*, N, out_channels]``)."""
        if isinstance(x, (tuple, list)):
            raise ValueError(f"'{self.__class__.__name__}' received a tuple of node features as input while this "
                             f"layer does not support bipartite message passing. Please try other layers such as "
                             f"'SAGEConv' or 'GraphConv' instead")
        if self._runs_as_pyg():
            return self._pyg_forward(super().forward, x, edge_index, edge_weight)
        check_adjacency(edge_index)
        n = x.size(self.node_dim)
        # nodes along another dimension (a static graph's [B, N, F]): aggregated as [N, B * F]
        node_dim = self.node_dim % x.dim()
        cfg = self._config()
        materialize(self.lin, x)
        batch = None

        def projected():
            nonlocal batch
            h = linear(x, self.lin.weight, self.lin.bias, cfg)
            if node_dim == 0:
                return h
            h = h.movedim(node_dim, 0)
            batch = h.shape[1:]
            return h.reshape(n, -1)

        if node_factors(self, edge_index, edge_weight, self.improved):
            st = unit_graph(self, edge_index, n, x.device)
            out = symmetric_norm_sum(st, projected(), owned=True)
        else:
            graph, weight, key, variant = normalized_graph(self, edge_index, edge_weight, n, self.improved, x.dtype)
            st = structure(graph, variant, n, n, x.device, self.flow, key=key)
            if is_sparse(graph):
                weight = sparse_edges(graph)[2]
            out = weighted_sum(st, projected(), weight, cfg)
        if batch is not None:
            out = out.view(n, *batch).movedim(0, node_dim)
        if self.bias is not None:
            out = out + self.bias
        return out


def node_factors(conv, edge_index, edge_weight, improved: bool) -> bool:
    """Whether PyG's normalisation of this call is :func:`._base.symmetric_norm_sum`'s (node factors, nothing per
    edge kept): ``normalize`` on an ``edge_index`` without edge weights, self loops of weight 1, no ``cached``
    normalised graph (whose weights are alive anyway)."""
    return (conv.normalize and not conv.cached and edge_weight is None and not improved
            and not is_sparse(edge_index))


def unit_graph(conv, edge_index, num_nodes: int, device):
    """The structure ``gcn_norm`` normalises (``edge_index`` with its remaining self loops added, where the conv
    adds them): the same cache entry :func:`normalized_graph`'s variant names."""
    if not conv.add_self_loops:
        return structure(edge_index, "as_is", num_nodes, num_nodes, device, conv.flow)
    return structure(edge_index, "gcn_norm", num_nodes, num_nodes, device, conv.flow,
                     transform=lambda ei: add_remaining_self_loops(ei, None, 1.0, num_nodes)[0])


def normalized_graph(conv, edge_index, edge_weight, num_nodes: int, improved: bool, dtype):
    """PyG's ``gcn_norm`` as GCNConv and GCN2Conv call it (their ``cached``, ``normalize`` and
    ``add_self_loops``): ``(graph, edge weights, structure key, variant)``, where the graph's structure is the
    function ``variant`` of ``key`` (see :func:`._base.structure`)."""
    if not conv.normalize:
        return edge_index, edge_weight, edge_index, "as_is"
    if is_sparse(edge_index):
        cache = conv._cached_adj_t
        if cache is not None:
            return cache, None, cache, "as_is"
        adj, _ = gcn_norm(edge_index, edge_weight, num_nodes, improved, conv.add_self_loops, conv.flow, dtype)
        if conv.cached:
            conv._cached_adj_t = adj
            return adj, None, adj, "as_is"
        return adj, None, edge_index, "gcn_norm" if conv.add_self_loops else "as_is"
    cache = conv._cached_edge_index
    if cache is not None:
        return cache[0], cache[1], cache[0], "as_is"
    ei, ew = gcn_norm(edge_index, edge_weight, num_nodes, improved, conv.add_self_loops, conv.flow, dtype)
    if conv.cached:
        conv._cached_edge_index = (ei, ew)
        return ei, ew, ei, "as_is"
    return ei, ew, edge_index, "gcn_norm" if conv.add_self_loops else "as_is"
