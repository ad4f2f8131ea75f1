"""GraphConv with compressed activations."""
from __future__ import annotations

from typing import Optional

import torch

from ..._compat import import_dgl
from ... import ops
from ...compression_config import CompressionConfig
from .. import fastpaths
from .._base import (CompressedModuleMixin, check_feature_rows, check_zero_in_degree, compressed_activation, into,
                     shared_doc)

dgl = import_dgl()


@shared_doc
class GraphConv(CompressedModuleMixin, dgl.nn.GraphConv):
    r"""Graph convolution (Kipf and Welling, ICLR 2017), a drop-in for :class:`dgl.nn.GraphConv`.

    .. math::
        h_i^{(l+1)} = \sigma\Big(b^{(l)} + \sum_{j\in\mathcal{N}(i)}\frac{e_{ji}}{c_{ji}} h_j^{(l)} W^{(l)}\Big)

    with :math:`c_{ji} = \sqrt{|\mathcal{N}(j)|}\sqrt{|\mathcal{N}(i)|}` for ``norm='both'``.

    Same constructor, forward signature, parameters (``weight`` of shape ``(in_feats, out_feats)``,
    ``bias``), initialisation, ``state_dict`` and output as DGL's; during training the activations kept
    for backward are compressed. The aggregation keeps nothing at all (its backward needs no features);
    the dense product keeps its input compressed only when it is not the layer's input features.

    Parameters
    ----------
    in_feats, out_feats : int
        Input and output feature sizes.
    norm : str, default 'both'
        'none', 'both', 'right' or 'left', as in DGL.
    weight, bias : bool, default True
        Learnable weight / bias.
    activation : callable, optional
        Applied to the output. ``torch.relu``/``F.relu``/``nn.ReLU`` (and ELU, LeakyReLU) are replaced by
        dgl_exact's versions that keep one bit per element.
    allow_zero_in_degree : bool, default False
        As in DGL: raise on 0-in-degree nodes unless True.
    %(compression)s

    Example
    -------
    %(example_imports)s
    >>> g = dgl.add_self_loop(dgl.rand_graph(100, 500))
    >>> conv = dgl_exact.GraphConv(16, 8, compression=dgl_exact.CompressionConfig(bits=2))
    >>> conv(g, torch.randn(100, 16)).shape
    torch.Size([100, 8])
    """

    def __init__(self, in_feats, out_feats, norm="both", weight=True, bias=True, activation=None,
                 allow_zero_in_degree=False, *, compression: Optional[CompressionConfig] = None):
        super().__init__(in_feats, out_feats, norm=norm, weight=weight, bias=bias, activation=activation,
                         allow_zero_in_degree=allow_zero_in_degree)
        self._init_compression(compression)

    @shared_doc
    def forward(self, graph, feat, weight=None, edge_weight=None):
        r"""Compute graph convolution.

        Parameters
        ----------
        %(graph)s
        feat : torch.Tensor or pair of torch.Tensor
            :math:`(N, *, D_{in})` input features, :math:`N` the number of nodes; or, for a bipartite graph
            or a block, a pair :math:`(N_{src}, *, D_{in})`, :math:`(N_{dst}, *, D_{in})`.
        weight : torch.Tensor, optional
            :math:`(D_{in}, D_{out})` external weight, for a module created with ``weight=False``.
        edge_weight : torch.Tensor, optional
            :math:`(E,)` or :math:`(E, 1)` per-edge weights multiplied into the messages (e.g. from
            :class:`dgl.nn.EdgeWeightNorm`).

        Returns
        -------
        torch.Tensor
            :math:`(N_{dst}, *, D_{out})` output features.

        Raises
        ------
        DGLError
            If the graph has 0-in-degree nodes and ``allow_zero_in_degree`` is False, or if an external
            ``weight`` is given to a module that has its own.

        Kept for backward: the input of the dense product, compressed under this module's configuration
        (the layer's input features themselves when they are alive anyway); with ``edge_weight``, the edge
        weights exactly (and the aggregated features compressed when the edge weights need a gradient); one
        bit per element for a ReLU-like ``activation``. The normalisation and the plain aggregation keep
        nothing.
        """
        # expand_as_pair from the graph's cached structure (DGL's own calls cannot be traced by torch.compile)
        st = ops.structure_of(graph, (feat[0] if isinstance(feat, tuple) else feat).device)
        feat_src, feat_dst = feat if isinstance(feat, tuple) else (feat, feat[: st.num_dst] if st.is_block else feat)
        check_feature_rows(st, feat_src)
        check_zero_in_degree(self, st)
        cfg = self._config()
        weight = self._weight_for(weight)

        left = self._node_norm(st.out_degrees(), feat_src) if self._norm in ("left", "both") else None
        if left is not None and not feat_src.is_floating_point():
            # DGL normalises first, which turns integer features (e.g. int64 one-hot) into floats
            feat_src, left = feat_src * left, None
        # ``into``: the normalisations and the bias write into the layer-sized temporaries this module owns
        # (the linear's or the aggregation's output), and no local name keeps ``feat * norm`` alive past
        # its aggregation: one layer-sized buffer fewer at the forward's peak than out-of-place products.
        if self._in_feats > self._out_feats:
            # (diag(n) X) W == diag(n) (X W): multiplying by the norm after the product lets the product
            # keep the layer input (alive anyway) instead of a fresh normalised copy.
            h = feat_src if weight is None else ops.linear(feat_src, weight.t(), None, cfg)
            if left is not None:
                h = into(h, "mul", left.to(h.dtype)) if weight is not None else h * left.to(h.dtype)
            rst = self._aggregate(graph, st, h, None, edge_weight, cfg)
            del h
        else:
            rst = self._aggregate(graph, st, feat_src, left, edge_weight, cfg)
            if weight is not None:  # into the aggregation's own buffer where that saves one (square weight)
                rst = ops.linear_reusing(rst, weight.t(), None, cfg)
        if self._norm in ("right", "both"):
            rst = into(rst, "mul", self._node_norm(st.in_degrees(), feat_dst).to(rst.dtype))
        if self.bias is not None:
            rst = into(rst, "add", self.bias)
        if self._activation is not None:
            rst = compressed_activation(self._activation, cfg)(rst)
        return rst

    def _aggregate(self, graph, st, h, src_norm, edge_weight, cfg):
        """``sum_j e_ji src_norm_j h_j`` per destination (``src_norm``, ``edge_weight``: None for none)."""
        if edge_weight is None and src_norm is None:
            return ops.copy_u_sum(graph, h)
        if edge_weight is None and isinstance(st, ops.GraphStructure):  # (not a captured handle)
            # the source normalisation as an edge value (cached per graph): the same products as
            # aggregating ``h * norm``, without that layer-sized copy of the input
            return ops.src_norm_sum(graph, h, "sqrt" if self._norm == "both" else "inv", "out")
        if edge_weight is None:
            return ops.copy_u_sum(graph, h * src_norm)
        return ops.u_mul_e_sum(graph, h * src_norm if src_norm is not None else h, edge_weight, config=cfg)

    def _node_norm(self, degs, like):
        """``deg^-1/2`` ('both') or ``1 / deg``, clamped at 1, shaped to broadcast over ``like``'s rows."""
        degs = degs.to(like).clamp(min=1)
        norm = torch.pow(degs, -0.5) if self._norm == "both" else 1.0 / degs
        return norm.reshape(norm.shape + (1,) * (like.dim() - 1))

    def _weight_for(self, weight):
        """The weight of this call: an external ``weight`` (for a module created with ``weight=False``) or the
        module's own."""
        if weight is None:
            return self.weight
        if self.weight is not None:
            raise dgl.DGLError("External weight is provided while at the same time the module has defined "
                               "its own weight parameter. Please create the module with flag weight=False.")
        return weight


def conv_plus_linear(conv: torch.nn.Module, linear: torch.nn.Module, graph, feat: torch.Tensor) -> torch.Tensor:
    """``conv(graph, feat) + linear(feat)``: a graph convolution with a linear residual, as DGL's ogbn-arxiv GCN
    example writes each layer, with one layer-sized buffer fewer in each pass where the two run as one op.

    Written as separate calls, the layer holds three ``[N, D]`` buffers at once in the forward (the input, the
    conv's output, the linear's) and three in the backward (their gradients), whatever is compressed. Where
    ``conv`` is dgl_exact's :class:`GraphConv` (what :func:`dgl_exact.compress_model` makes of DGL's) and
    ``linear`` a plain :class:`torch.nn.Linear` (or dgl_exact's) of the transposed shape, in a training forward
    with compression on, on a homogeneous graph, this runs :func:`dgl_exact.ops.graph_conv_plus_linear`: the
    linear's output is added into the conv's own buffer, the backward forms the input gradient in one buffer,
    and ``feat`` is kept once, compressed, for both weight gradients. Same values up to float summation order.
    Anywhere else (DGL's own modules, a conv with an activation, eval, compression off, a block, hooks) it
    calls the two modules and adds their outputs; :func:`dgl_exact.explain` says which ran and why
    (:data:`dgl_exact.nn.fastpaths.GCN_PLUS_LINEAR`).

    Example
    -------
    >>> import dgl, torch, dgl_exact
    >>> g = dgl.add_self_loop(dgl.rand_graph(100, 500))
    >>> conv, res = dgl_exact.GraphConv(16, 16, bias=False), torch.nn.Linear(16, 16, bias=False)
    >>> # was: h = conv(g, h) + res(h)
    >>> dgl_exact.nn.conv_plus_linear(conv, res, g, torch.randn(100, 16)).shape
    torch.Size([100, 16])
    """
    if not fastpaths.GCN_PLUS_LINEAR.runs(conv, linear, graph, feat):
        return conv(graph, feat) + linear(feat)
    st = ops.structure_of(graph, feat.device)
    check_feature_rows(st, feat)
    check_zero_in_degree(conv, st)
    return ops.graph_conv_plus_linear(graph, feat, conv.weight, conv.bias, linear.weight, linear.bias, conv._norm,
                                      conv._config())
