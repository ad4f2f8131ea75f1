"""SAGEConv with compressed activations."""
from __future__ import annotations

import warnings
from typing import Optional

import torch

from ..._compat import import_dgl
from ... import ops
from ...config import CompressionConfig
from .._base import CompressedModuleMixin, compressed_activation

dgl = import_dgl()
from dgl.utils import check_eq_shape  # noqa: E402

_lstm_warned = False


class SAGEConv(CompressedModuleMixin, dgl.nn.SAGEConv):
    r"""GraphSAGE layer (Hamilton et al., NeurIPS 2017), a drop-in for :class:`dgl.nn.SAGEConv`.

    .. math::
        h_{\mathcal{N}(i)} = \mathrm{aggregate}(\{h_j, j\in\mathcal{N}(i)\}),\qquad
        h_i^{(l+1)} = \sigma\big(W_{self} h_i + W_{neigh} h_{\mathcal{N}(i)}\big)

    Same constructor, forward signature, parameters (``fc_self``, ``fc_neigh``, ``fc_pool``, ``bias``),
    initialisation, ``state_dict`` and output as DGL's. ``aggregator_type`` 'mean', 'gcn' and 'pool' keep
    compressed activations ('mean'/'gcn' aggregation keeps nothing; 'pool' keeps one bit for its ReLU and
    the arg-max indices); 'lstm' runs DGL's uncompressed implementation (one-time warning).

    Parameters
    ----------
    in_feats : int or (int, int)
        Input feature size (source, destination for bipartite graphs/blocks).
    out_feats : int
        Output feature size.
    aggregator_type : str
        'mean', 'gcn', 'pool' or 'lstm'.
    feat_drop : float, default 0
        Dropout on the input features (its mask is regenerated in backward, not kept).
    bias : bool, default True
    norm, activation : callable, optional
        Applied to the output, as in DGL (ReLU/ELU/LeakyReLU activations keep one bit per element).
    compression : CompressionConfig, optional
        This module's compression; default: the configuration in force.

    Example
    -------
    >>> import torch, dgl_exact, dgl  # dgl_exact first: it makes DGL importable on new torch
    >>> g = dgl.rand_graph(100, 500)
    >>> dgl_exact.SAGEConv(16, 8, "mean")(g, torch.randn(100, 16)).shape
    torch.Size([100, 8])
    """

    def __init__(self, in_feats, out_feats, aggregator_type, feat_drop=0.0, bias=True, norm=None, activation=None,
                 *, compression: Optional[CompressionConfig] = None):
        super().__init__(in_feats, out_feats, aggregator_type, feat_drop=feat_drop, bias=bias, norm=norm,
                         activation=activation)
        self._init_compression(compression)

    def forward(self, graph, feat, edge_weight=None):
        global _lstm_warned
        if self._aggre_type == "lstm":
            if not _lstm_warned:
                warnings.warn("dgl_exact.SAGEConv: the 'lstm' aggregator runs uncompressed (DGL's implementation)",
                              stacklevel=2)
                _lstm_warned = True
            return super().forward(graph, feat, edge_weight)
        cfg = self._config()
        p = self.feat_drop.p
        if isinstance(feat, tuple):
            feat_src = ops.dropout(feat[0], p, self.training)
            feat_dst = ops.dropout(feat[1], p, self.training)
        else:
            feat_src = feat_dst = ops.dropout(feat, p, self.training)
            if graph.is_block:
                feat_dst = feat_src[: graph.number_of_dst_nodes()]
        st = ops.structure_of(graph, feat_src.device)
        if edge_weight is not None and edge_weight.shape[0] != graph.num_edges():
            raise ValueError(f"edge_weight has {edge_weight.shape[0]} rows but the graph has {graph.num_edges()} edges")

        def fc(layer, x):
            return ops.linear(x, layer.weight, layer.bias, cfg)

        def aggregate_sum(h):
            return ops.copy_u_sum(graph, h) if edge_weight is None else ops.u_mul_e_sum(graph, h, edge_weight, cfg)

        lin_before_mp = self._in_src_feats > self._out_feats
        if self._aggre_type == "mean":
            h = fc(self.fc_neigh, feat_src) if lin_before_mp else feat_src
            if edge_weight is None:
                h_neigh = ops.copy_u_mean(graph, h)
            else:
                degs = st.in_degrees().clamp(min=1).to(h.dtype).view(-1, *([1] * (h.dim() - 1)))
                h_neigh = aggregate_sum(h) / degs
            if not lin_before_mp:
                h_neigh = fc(self.fc_neigh, h_neigh)
        elif self._aggre_type == "gcn":
            check_eq_shape(feat)
            h_src = fc(self.fc_neigh, feat_src) if lin_before_mp else feat_src
            if isinstance(feat, tuple):
                h_dst = fc(self.fc_neigh, feat_dst) if lin_before_mp else feat_dst
            else:
                h_dst = h_src[: graph.num_dst_nodes()] if graph.is_block else h_src
            degs = st.in_degrees().to(h_dst.dtype)
            h_neigh = (aggregate_sum(h_src) + h_dst) / (degs.unsqueeze(-1) + 1)
            if not lin_before_mp:
                h_neigh = fc(self.fc_neigh, h_neigh)
        elif self._aggre_type == "pool":
            h = ops.relu(fc(self.fc_pool, feat_src))
            if edge_weight is not None:
                raise dgl.DGLError("dgl_exact.SAGEConv: edge_weight with the 'pool' aggregator is not supported "
                                   "(DGL multiplies messages before the max; use 'mean' or 'gcn')")
            h_neigh = fc(self.fc_neigh, ops.copy_u_max(graph, h))
        else:
            raise KeyError(f"Aggregator type {self._aggre_type} not recognized.")

        if graph.num_edges() == 0 and self._aggre_type == "pool":
            h_neigh = torch.zeros_like(h_neigh)
        if self._aggre_type == "gcn":
            rst = h_neigh
            if self.bias is not None:
                rst = rst + self.bias
        else:
            rst = fc(self.fc_self, feat_dst) + h_neigh
        if self.activation is not None:
            rst = compressed_activation(self.activation, cfg)(rst)
        if self.norm is not None:
            rst = self.norm(rst)
        return rst
