"""GATv2Conv with compressed activations, a drop-in for :class:`torch_geometric.nn.GATv2Conv`."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import OptTensor, PairTensor
from torch_geometric.utils import add_self_loops, remove_self_loops

from ..compression_config import CompressionConfig
from ..ops import dropout, linear, u_mul_e_sum
from ..ops.gatv2 import gatv2_attention
from ._base import CompressedMixin, attention_result, check_adjacency, finish_heads, materialize, shared_doc, structure

__all__ = ["GATv2Conv"]


@shared_doc
class GATv2Conv(CompressedMixin, pyg_nn.GATv2Conv):
    r"""Dynamic graph attention (Brody et al., ICLR 2022), a drop-in for :class:`torch_geometric.nn.GATv2Conv`.

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}} \alpha_{i,j}\mathbf{\Theta}_{s}\mathbf{x}_{j},
        \qquad \alpha_{i,j} = \mathrm{softmax}_j\big(\mathbf{a}^{\top}\mathrm{LeakyReLU}(\mathbf{\Theta}_{s}
        \mathbf{x}_j + \mathbf{\Theta}_{t}\mathbf{x}_i)\big)

    Same constructor, forward signature, parameters (``lin_l``, ``lin_r``, ``att``, ``res``, ``bias``),
    initialisation, ``state_dict`` and output as PyG's (self loops removed and added again; heads concatenated
    or averaged; ``share_weights``); during training the activations kept for backward are compressed: the
    linears' inputs, the projected features (twice for the sources: the aggregation's copy and the attention's,
    independent, so that the attention vector's gradient is unbiased) and, per edge, one bit per feature element
    (the LeakyReLU's side) and the attention ``[E, H]`` (:func:`dgl_exact.ops.gatv2.gatv2_attention`); PyG keeps
    several ``[E, H, C]`` fp32 tensors. Attention dropout draws dgl_exact's masks when compression is on.
    ``edge_dim`` (edge features in the attention), another ``aggr`` and ``decomposed_layers > 1`` run PyG's own
    code, what it saves compressed by :func:`dgl_exact.compress_saved`
    (:meth:`~dgl_exact.pyg._base.CompressedMixin.pyg_setting`).

    Parameters
    ----------
    in_channels : int or (int, int)
        Input feature size (-1: inferred on the first call), or the sources' and destinations' sizes.
    %(attention)s
    bias, share_weights, residual : bool
        As in PyG.
    compression : CompressionConfig, optional
        This module's compression; default: the configuration in force.
    **kwargs
        :class:`torch_geometric.nn.MessagePassing`'s arguments (``flow``).

    %(attention_example)s
    """

    # PyG compiles each class's ``propagate`` from the types its source declares, reading sources cached by class
    # name: ours share PyG's names (and call no propagate), so PyG's declarations are repeated here, for the
    # runs that take PyG's own forward (hooks, explain, a setting of ``pyg_setting``)
    propagate_type = {"x": PairTensor, "alpha": Tensor}
    edge_updater_type = {"x": PairTensor, "edge_attr": OptTensor}

    compressed_aggregations = ("add", "sum")

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim: Optional[int] = None, fill_value="mean", bias: bool = True, share_weights: bool = False,
                 residual: bool = False, *, compression: Optional[CompressionConfig] = None, **kwargs):
        super().__init__(in_channels, out_channels, heads=heads, concat=concat, negative_slope=negative_slope,
                         dropout=dropout, add_self_loops=add_self_loops, edge_dim=edge_dim, fill_value=fill_value,
                         bias=bias, share_weights=share_weights, residual=residual, **kwargs)
        self._init_compression(compression)

    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]], edge_index, edge_attr: Optional[Tensor] = None,
                return_attention_weights: Optional[bool] = None):
        """``x [N, in]`` or a pair ``(x_src [N_src, in], x_dst [N_dst, in])``, ``edge_index [2, E]`` (or a
        ``torch.sparse`` adjacency ``[N_dst, N_src]`` indexed ``[target, source]``); returns
        ``[N_dst, heads * out_channels]`` (``concat``) or ``[N_dst, out_channels]``; with
        ``return_attention_weights``, also ``(edge_index with self loops, attention [E', heads])``.
        ``edge_attr`` is ignored, as PyG ignores it without ``edge_dim``."""
        if self._runs_as_pyg():
            return self._pyg_forward(super().forward, x, edge_index, edge_attr, return_attention_weights)
        check_adjacency(edge_index)
        H, C = self.heads, self.out_channels
        cfg = self._config()
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        if x_dst is None:
            raise ValueError("GATv2Conv needs destination features: pass (x_src, x_dst), not (x_src, None)")
        res = None
        if self.res is not None:
            materialize(self.res, x_dst)
            res = linear(x_dst, self.res.weight, None, cfg)
        materialize(self.lin_l, x_src)
        x_l = linear(x_src, self.lin_l.weight, self.lin_l.bias, cfg).view(-1, H, C)
        if self.share_weights and x_dst is x_src:
            x_r = x_l
        else:
            materialize(self.lin_r, x_dst)
            x_r = linear(x_dst, self.lin_r.weight, self.lin_r.bias, cfg).view(-1, H, C)
        n_src, n_dst = x_l.size(0), x_r.size(0)
        graph, variant = edge_index, "as_is"
        if self.add_self_loops:  # (PyG's utilities read a torch.sparse adjacency as well)
            graph = add_self_loops(remove_self_loops(edge_index)[0], num_nodes=min(n_src, n_dst))[0]
            variant = "gat_self_loops"
        st = structure(graph, variant, n_src, n_dst, x_l.device, self.flow, key=edge_index)
        alpha = gatv2_attention(st, x_l, x_r, self.att, float(self.negative_slope), config=cfg)
        alpha = dropout(alpha, float(self.dropout), self.training, like_torch=True)
        out = u_mul_e_sum(st, x_l, alpha.unsqueeze(-1), config=cfg)
        out = finish_heads(out, H, C, self.concat, res, self.bias)
        if return_attention_weights:
            return out, attention_result(graph, alpha, n_src, n_dst)
        return out
