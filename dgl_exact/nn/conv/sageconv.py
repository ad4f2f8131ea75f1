"""SAGEConv with compressed activations."""
from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn as nn

from ..._compat import import_dgl
from ... import ops
from ...ops.sage import divide_by_in_degrees
from ...compression_config import CompressionConfig
from .. import fastpaths
from .._base import CompressedModuleMixin, apply_dropout, apply_linear, compressed_activation, into, shared_doc

dgl = import_dgl()
from dgl.utils import check_eq_shape  # noqa: E402

_fallback_warned = set()


def _warn_fallback_once(reason: str) -> None:
    if reason not in _fallback_warned:
        warnings.warn(f"dgl_exact.SAGEConv: {reason} runs uncompressed (DGL's implementation)", stacklevel=3)
        _fallback_warned.add(reason)


@shared_doc
class SAGEConv(CompressedModuleMixin, dgl.nn.SAGEConv):
    r"""GraphSAGE layer (Hamilton et al., NeurIPS 2017), a drop-in for :class:`dgl.nn.SAGEConv`.

    .. math::
        h_{\mathcal{N}(i)} = \mathrm{aggregate}(\{h_j, j\in\mathcal{N}(i)\}),\qquad
        h_i^{(l+1)} = \sigma\big(W_{self} h_i + W_{neigh} h_{\mathcal{N}(i)}\big)

    Same constructor, forward signature, parameters (``fc_self``, ``fc_neigh``, ``fc_pool``, ``bias``),
    initialisation, ``state_dict`` and output as DGL's. ``aggregator_type`` 'mean', 'gcn' and 'pool' keep
    compressed activations ('mean'/'gcn' aggregation keeps nothing; 'pool' keeps one bit for its ReLU and
    the arg-max indices); 'lstm', and 'pool' with ``edge_weight`` (the max of weighted messages), run
    DGL's uncompressed implementation (one-time warning). ``feat_drop`` or the linear layers replaced by
    other modules (``nn.Identity()``, ``nn.Sequential``, ...) are applied as DGL applies them.

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
    %(compression)s

    Example
    -------
    %(example_imports)s
    >>> g = dgl.rand_graph(100, 500)
    >>> dgl_exact.SAGEConv(16, 8, "mean")(g, torch.randn(100, 16)).shape
    torch.Size([100, 8])
    """

    def __init__(self, in_feats, out_feats, aggregator_type, feat_drop=0.0, bias=True, norm=None, activation=None,
                 *, compression: Optional[CompressionConfig] = None):
        super().__init__(in_feats, out_feats, aggregator_type, feat_drop=feat_drop, bias=bias, norm=norm,
                         activation=activation)
        self._init_compression(compression)

    def input_compression(self, graph, feat) -> Optional[CompressionConfig]:
        """``fc_self`` keeps ``feat`` itself compressed: compression on, mean and pool aggregators, one tensor
        on a whole graph (a block's destination rows are a slice of it), no feature dropout, plain ``fc_self``
        (:data:`dgl_exact.nn.fastpaths.SAGE_INPUT_COMPRESSED_AHEAD`)."""
        call = fastpaths.SAGE_INPUT_COMPRESSED_AHEAD.decide(self, graph, feat)
        return None if call is None else call.cfg

    def forward_bn_relu_dropout(self, graph, feat, bn: nn.Module, p: float, *,
                                compress_for: Optional[CompressionConfig] = None) -> Optional[torch.Tensor]:
        """``dropout(relu(bn(self(graph, feat))), p)`` as one op (:func:`dgl_exact.ops.sage_mean_bn_relu_dropout`:
        one layer-sized buffer at the forward's and the backward's peak instead of two) where that computes
        what the modules compute: a training forward with grad of this module's fused mean path on input
        features that need no gradient, ``D_out >= D_in``, no feature dropout, activation or norm of its own,
        ``bn`` a dgl_exact :class:`~dgl_exact.nn.BatchNorm1d` over the output in training mode with this
        module's compression, no hooks on either, neither subclassed; ``p``: the dropout probability in force,
        ``compress_for``: how the next module keeps the output (see :func:`dgl_exact.ops.relu_dropout`).
        Else None, before anything is computed or counted: the caller runs the modules. The conditions:
        :data:`dgl_exact.nn.fastpaths.SAGE_MEAN_BN_RELU_DROPOUT`."""
        if not fastpaths.SAGE_MEAN_BN_RELU_DROPOUT.runs(self, graph, feat, bn, p):
            return None
        bn._check_input_dim(feat.new_empty(0, bn.num_features))
        track, track_var, _, momentum = bn.batch_norm_args()  # counts the batch, as the module does
        return ops.sage_mean_bn_relu_dropout(graph, feat, self.fc_self.weight, self.fc_self.bias,
                                             self.fc_neigh.weight, bn.weight, bn.bias, track, track_var,
                                             momentum, bn.eps, p, config=self._config(), compress_for=compress_for)

    @shared_doc
    def forward(self, graph, feat, edge_weight=None):
        r"""Compute GraphSAGE layer.

        Parameters
        ----------
        %(graph)s
        feat : torch.Tensor or pair of torch.Tensor
            :math:`(N, D_{in})` input features, :math:`N` the number of nodes; or, for a bipartite graph or a
            block, a pair :math:`(N_{src}, D_{in_{src}})`, :math:`(N_{dst}, D_{in_{dst}})`.
        edge_weight : torch.Tensor, optional
            :math:`(E,)` or :math:`(E, 1)` per-edge weights multiplied into the messages.

        Returns
        -------
        torch.Tensor
            :math:`(N_{dst}, D_{out})` output features.

        Kept for backward: the inputs of ``fc_self`` and ``fc_neigh`` (and ``fc_pool``), compressed under
        this module's configuration (the input features themselves when they are alive anyway); nothing
        for the 'mean'/'gcn' aggregation (with ``edge_weight``: the edge weights exactly, and the
        aggregated features compressed when the edge weights need a gradient); for 'pool', one bit per
        element for its ReLU and the arg-max indices; nothing for ``feat_drop`` (its mask is regenerated
        from a seed). 'lstm', and 'pool' with ``edge_weight``, run DGL's uncompressed implementation.
        """
        if self._aggre_type == "lstm" or (self._aggre_type == "pool" and edge_weight is not None):
            _warn_fallback_once("the 'lstm' aggregator" if self._aggre_type == "lstm"
                                else "the 'pool' aggregator with edge_weight")
            return super().forward(graph, feat, edge_weight)
        cfg = self._config()
        feat_src, feat_dst, st = self._inputs(graph, feat, edge_weight)
        if fastpaths.SAGE_MEAN.runs(self, feat, feat_src, edge_weight, cfg):
            # one fused op: two layer-sized buffers at the forward's and the backward's peak, not three
            rst = ops.sage_mean(graph, feat_src, self.fc_self.weight, self.fc_self.bias, self.fc_neigh.weight, cfg)
        else:
            rst = self._composed(graph, feat, feat_src, feat_dst, st, edge_weight, cfg)
        if self.activation is not None:
            rst = compressed_activation(self.activation, cfg)(rst)
        if self.norm is not None:
            rst = self.norm(rst)
        return rst

    def _inputs(self, graph, feat, edge_weight):
        """``(feat_src, feat_dst, structure)`` after feature dropout; on a block given one tensor, its
        destination rows are the first ``num_dst`` source rows."""
        if isinstance(feat, tuple):
            feat_src = apply_dropout(self.feat_drop, feat[0])
            feat_dst = apply_dropout(self.feat_drop, feat[1])
        else:
            feat_src = feat_dst = apply_dropout(self.feat_drop, feat)
        # the graph's counts from its cached structure (DGL's own calls cannot be traced by torch.compile)
        st = ops.structure_of(graph, feat_src.device)
        if not isinstance(feat, tuple) and st.is_block:
            feat_dst = feat_src[: st.num_dst]
        if edge_weight is not None and edge_weight.shape[0] != st.num_edges:
            raise ValueError(f"edge_weight has {edge_weight.shape[0]} rows but the graph has {st.num_edges} edges")
        return feat_src, feat_dst, st

    def _composed(self, graph, feat, feat_src, feat_dst, st, edge_weight, cfg):
        """The layer (before activation and norm) as separate ops, as DGL composes it."""
        h_neigh = self._neighbours(graph, feat, feat_src, feat_dst, st, edge_weight, cfg)
        if st.num_edges == 0 and self._aggre_type == "pool":
            h_neigh = torch.zeros_like(h_neigh)
        if self._aggre_type == "gcn":
            return h_neigh + self.bias if self.bias is not None else h_neigh
        rst = apply_linear(self.fc_self, feat_dst, cfg)
        # fc_neigh's output is added into fc_self's (a fresh buffer this module owns when fc_self is a
        # plain Linear): one layer-sized buffer fewer at the forward's peak than ``a + b``
        return into(rst, "add", h_neigh) if fastpaths.SAGE_ADD_IN_PLACE.runs(self, cfg) else rst + h_neigh

    def _neighbours(self, graph, feat, feat_src, feat_dst, st, edge_weight, cfg):
        """The neighbour term ``fc_neigh(aggregate(...))`` (or its 'gcn' form) of the composed layer."""

        def fc(layer, x):
            return apply_linear(layer, x, cfg)

        def aggregate_sum(h):
            if edge_weight is None:
                return ops.copy_u_sum(graph, h)
            return ops.u_mul_e_sum(graph, h, edge_weight, config=cfg)

        lin_before_mp = self._in_src_feats > self._out_feats
        if self._aggre_type == "mean":
            h = fc(self.fc_neigh, feat_src) if lin_before_mp else feat_src
            # the sum, then the division (copy_u_mean's values): in backward the division's output
            # gradient dies before the aggregation allocates, one layer-sized buffer fewer at the peak
            h_neigh = divide_by_in_degrees(aggregate_sum(h), st)
            del h
            return h_neigh if lin_before_mp else fc(self.fc_neigh, h_neigh)
        if self._aggre_type == "gcn":
            check_eq_shape(feat)
            h_src = fc(self.fc_neigh, feat_src) if lin_before_mp else feat_src
            if isinstance(feat, tuple):
                h_dst = fc(self.fc_neigh, feat_dst) if lin_before_mp else feat_dst
            else:
                h_dst = h_src[: st.num_dst] if st.is_block else h_src
            degs = st.in_degrees().to(h_dst.dtype)
            h_neigh = (aggregate_sum(h_src) + h_dst) / (degs.unsqueeze(-1) + 1)
            return h_neigh if lin_before_mp else fc(self.fc_neigh, h_neigh)
        if self._aggre_type == "pool":
            h = ops.relu(fc(self.fc_pool, feat_src))
            return fc(self.fc_neigh, ops.graph.copy_u_max(graph, h))
        raise KeyError(f"Aggregator type {self._aggre_type} not recognized.")
