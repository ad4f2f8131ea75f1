"""GCN2Conv (GCNII) with compressed activations."""
from __future__ import annotations

from typing import Optional

from ..._compat import import_dgl
from ... import ops
from ...config import CompressionConfig
from .._base import CompressedModuleMixin, check_feature_rows, check_zero_in_degree, compressed_activation

dgl = import_dgl()


class GCN2Conv(CompressedModuleMixin, dgl.nn.GCN2Conv):
    r"""GCNII layer (Chen et al., ICML 2020), a drop-in for :class:`dgl.nn.GCN2Conv`.

    .. math::
        h^{(l+1)} = \sigma\Big(\big((1-\alpha)\tilde{P} h^{(l)} + \alpha h^{(0)}\big)
        \big((1-\beta_l) I + \beta_l W^{(l)}\big)\Big),\qquad \beta_l = \log(\lambda / l + 1)

    Same constructor, forward signature ``(graph, feat, feat_0, edge_weight=None)``, parameters
    (``weight1``, ``weight2``, ``bias``), initialisation, ``state_dict`` and output as DGL's. The
    propagation keeps nothing; the products keep their inputs compressed.

    Parameters
    ----------
    in_feats : int
    layer : int
        Index of this layer (from 1), sets :math:`\beta_l`.
    alpha : float, default 0.1
    lambda_ : float, default 1
    project_initial_features : bool, default True
    allow_zero_in_degree : bool, default False
    bias : bool, default True
    activation : callable, optional
    compression : CompressionConfig, optional

    Example
    -------
    >>> import torch, dgl_exact, dgl  # dgl_exact first: it makes DGL importable on new torch
    >>> g = dgl.add_self_loop(dgl.rand_graph(100, 500))
    >>> h0 = torch.randn(100, 16)
    >>> dgl_exact.GCN2Conv(16, layer=1)(g, h0, h0).shape
    torch.Size([100, 16])
    """

    def __init__(self, in_feats, layer, alpha=0.1, lambda_=1, project_initial_features=True,
                 allow_zero_in_degree=False, bias=True, activation=None,
                 *, compression: Optional[CompressionConfig] = None):
        super().__init__(in_feats, layer, alpha=alpha, lambda_=lambda_,
                         project_initial_features=project_initial_features,
                         allow_zero_in_degree=allow_zero_in_degree, bias=bias, activation=activation)
        self._init_compression(compression)

    def forward(self, graph, feat, feat_0, edge_weight=None):
        st = ops.structure_of(graph, feat.device)
        check_feature_rows(st, feat)
        check_zero_in_degree(self, st)
        cfg = self._config()
        if edge_weight is None:
            norm = st.in_degrees().to(feat).clamp(min=1).pow(-0.5).unsqueeze(1)
            h = ops.copy_u_sum(graph, feat * norm) * norm
        else:
            edge_weight = ops.normalize_edge_weight(graph, edge_weight, "both")
            h = ops.u_mul_e_sum(graph, feat, edge_weight, cfg)
        h = h * (1 - self.alpha)
        feat_0 = feat_0[: h.size(0)] * self.alpha
        feat_sum = h + feat_0
        if self._project_initial_features:
            proj = ops.linear(feat_sum, self.weight1.t(), None, cfg)
        else:
            proj = ops.linear(h, self.weight1.t(), None, cfg) + ops.linear(feat_0, self.weight2.t(), None, cfg)
        rst = (1 - self.beta) * feat_sum + self.beta * proj
        if self._bias:
            rst = rst + self.bias
        if self._activation is not None:
            rst = compressed_activation(self._activation, cfg)(rst)
        return rst
