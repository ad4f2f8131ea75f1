"""GATConv with compressed activations."""
from __future__ import annotations

import warnings
from typing import Optional

from ..._compat import import_dgl
from ... import ops
from ...compression_config import CompressionConfig
from ...ops.donation import Donated, release
from .. import fastpaths
from .._base import (CompressedModuleMixin, apply_dropout, apply_linear, check_zero_in_degree, compressed_activation,
                     into, shared_doc)

dgl = import_dgl()

_fallback_warned = False


@shared_doc
class GATConv(CompressedModuleMixin, dgl.nn.GATConv):
    r"""Graph attention layer (Velickovic et al., ICLR 2018), a drop-in for :class:`dgl.nn.GATConv`.

    .. math::
        h_i^{(l+1)} = \sum_{j\in\mathcal{N}(i)} \alpha_{ij} W h_j,\qquad
        \alpha_{ij} = \mathrm{softmax}_j\big(\mathrm{LeakyReLU}(a_l^\top W h_j + a_r^\top W h_i)\big)

    Same constructor, forward signature (including ``edge_weight`` and ``get_attention``), parameters
    (``fc`` or ``fc_src``/``fc_dst``, ``attn_l``, ``attn_r``, ``res_fc``, ``bias``), initialisation,
    ``state_dict`` and output as DGL's. Attention, its dropout and aggregation run as one op that keeps no
    per-edge tensor for backward (they are recomputed from two ``[N, heads]`` score vectors and the
    dropout seed); the projected features are kept compressed. Output shape ``(N_dst, num_heads, out_feats)``.
    ``feat_drop``, ``fc``/``fc_src``/``fc_dst`` or ``res_fc`` replaced by other modules (``nn.Identity()``,
    ``nn.Sequential``, ...) are applied as DGL applies them; an ``attn_drop`` other than a dropout or
    ``nn.Identity``, or a ``leaky_relu`` other than :class:`torch.nn.LeakyReLU`, cannot be fused: the layer
    then runs DGL's uncompressed implementation (one-time warning).

    Parameters
    ----------
    in_feats : int or (int, int)
    out_feats : int
        Output size per head.
    num_heads : int
    feat_drop, attn_drop : float, default 0
    negative_slope : float, default 0.2
    residual : bool, default False
    activation : callable, optional
    allow_zero_in_degree : bool, default False
    bias : bool, default True
    %(compression)s

    Example
    -------
    %(example_imports)s
    >>> g = dgl.add_self_loop(dgl.rand_graph(100, 500))
    >>> dgl_exact.GATConv(16, 8, num_heads=3)(g, torch.randn(100, 16)).shape
    torch.Size([100, 3, 8])
    """

    def __init__(self, in_feats, out_feats, num_heads, feat_drop=0.0, attn_drop=0.0, negative_slope=0.2,
                 residual=False, activation=None, allow_zero_in_degree=False, bias=True,
                 *, compression: Optional[CompressionConfig] = None):
        super().__init__(in_feats, out_feats, num_heads, feat_drop=feat_drop, attn_drop=attn_drop,
                         negative_slope=negative_slope, residual=residual, activation=activation,
                         allow_zero_in_degree=allow_zero_in_degree, bias=bias)
        self._init_compression(compression)

    @shared_doc
    def forward(self, graph, feat, edge_weight=None, get_attention=False):
        r"""Compute graph attention network layer.

        Parameters
        ----------
        %(graph)s
        feat : torch.Tensor or pair of torch.Tensor
            :math:`(N, *, D_{in})` input features, or a pair :math:`(N_{src}, *, D_{in_{src}})`,
            :math:`(N_{dst}, *, D_{in_{dst}})`. A tensor given with :func:`dgl_exact.donate` is released
            (its memory freed) once projected and kept compressed, where that cannot change what is
            computed (training with grad, compression on, plain ``fc`` and ``feat_drop``, no residual, no
            hooks).
        edge_weight : torch.Tensor, optional
            :math:`(E, 1)` or :math:`(E,)` per-edge weights multiplied into the attention.
        get_attention : bool, default False
            Also return the attention values.

        Returns
        -------
        torch.Tensor
            :math:`(N_{dst}, *, H, D_{out})` output (``H``: heads).
        torch.Tensor, optional
            :math:`(E, *, H, 1)` attention values, with ``get_attention``.

        Kept for backward: the projected features (compressed under this module's configuration), the
        input of ``fc`` (compressed), nothing per edge.
        """
        global _fallback_warned
        attention_op = fastpaths.GAT_ATTENTION.decide(self)
        if attention_op is None:
            if not _fallback_warned:
                warnings.warn("dgl_exact.GATConv: a replaced attn_drop or leaky_relu module cannot be fused into "
                              "the attention op; this layer runs uncompressed (DGL's implementation)", stacklevel=2)
                _fallback_warned = True
            return super().forward(graph, feat, edge_weight, get_attention)
        cfg = self._config()
        feat_src, feat_dst, h_dst, dst_prefix = self._project(graph, feat, cfg)
        if self.res_fc is None:
            del h_dst  # no local name keeps the (dropped-out) input past its product
            if type(feat) is Donated and fastpaths.GAT_DONATED_INPUT.runs(self, feat, cfg):
                release(feat)  # donated: its memory goes before the attention op allocates (rule 5)
        rst, attention = ops.gat_attention(graph, feat_src, feat_dst, self.attn_l, self.attn_r,
                                           negative_slope=self.leaky_relu.negative_slope, attn_drop=attention_op.attn_p,
                                           edge_weight=edge_weight, training=self.training, config=cfg,
                                           need_attention=get_attention)
        # the attention op kept what its backward needs: the projected features die here, not after the
        # bias and the activation; the residual and the bias are added into the op's own output
        del feat_src, feat_dst
        if self.res_fc is not None:
            rst = into(rst, "add", apply_linear(self.res_fc, h_dst, cfg).view(*dst_prefix, -1, self._out_feats))
        if self.has_explicit_bias:
            rst = into(rst, "add", self.bias.view(*((1,) * len(dst_prefix)), self._num_heads, self._out_feats))
        if self.activation:
            rst = compressed_activation(self.activation, cfg)(rst)
        if get_attention:
            return rst, attention
        return rst

    def _project(self, graph, feat, cfg):
        """``(feat_src, feat_dst, h_dst, dst_prefix)``: the projected features ``[*, heads, out]`` of the
        sources and destinations, the destinations' (dropped-out) input features and their leading shape."""
        heads, out = self._num_heads, self._out_feats
        if isinstance(feat, tuple):
            src_prefix, dst_prefix = feat[0].shape[:-1], feat[1].shape[:-1]
            h_src = apply_dropout(self.feat_drop, feat[0])
            h_dst = apply_dropout(self.feat_drop, feat[1])
            check_zero_in_degree(self, ops.structure_of(graph, h_src.device))
            src_layer = self.fc if not hasattr(self, "fc_src") else self.fc_src
            dst_layer = self.fc if not hasattr(self, "fc_src") else self.fc_dst
            feat_src = apply_linear(src_layer, h_src, cfg).view(*src_prefix, heads, out)
            del h_src
            return feat_src, apply_linear(dst_layer, h_dst, cfg).view(*dst_prefix, heads, out), h_dst, dst_prefix
        src_prefix = dst_prefix = feat.shape[:-1]
        h_src = h_dst = apply_dropout(self.feat_drop, feat)
        st = ops.structure_of(graph, h_src.device)
        check_zero_in_degree(self, st)
        feat_src = feat_dst = apply_linear(self.fc, h_src, cfg).view(*src_prefix, heads, out)
        del h_src
        if st.is_block:
            n_dst = st.num_dst
            feat_dst, h_dst = feat_src[:n_dst], h_dst[:n_dst]
            dst_prefix = (n_dst,) + tuple(dst_prefix[1:])
        return feat_src, feat_dst, h_dst, dst_prefix
