"""GATConv with compressed activations, a drop-in for :class:`torch_geometric.nn.GATConv`."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import OptPairTensor, OptTensor
from torch_geometric.utils import add_self_loops, remove_self_loops

from .. import kernels
from ..compression import draw_seed
from ..compression_config import CompressionConfig
from ..ops import linear
from ..ops.gat import edge_attention, attention_chunk_budget, GATAttention, GATAttentionChunked
from ..ops.saved import needs_saving
from ._base import (CompressedMixin, attention_result, check_adjacency, finish_heads, is_sparse, materialize,
                    shared_doc, structure)

__all__ = ["GATConv"]


def _without_dgl_kernels(function):
    """``function`` (a dgl_exact autograd Function) whose forward and backward run with the ``dgl`` kernel
    backend excluded: the edge softmax asks the registry directly, and an :class:`~.structure.EdgeStructure`
    has no DGL graph index to give DGL's kernel."""

    class WithoutDGL(function):
        @staticmethod
        def forward(ctx, *args):
            with kernels.exclude("dgl"):
                return function.forward(ctx, *args)

        @staticmethod
        def backward(ctx, *grads):
            with kernels.exclude("dgl"):
                return function.backward(ctx, *grads)

    WithoutDGL.__name__ = WithoutDGL.__qualname__ = f"{function.__name__}WithoutDGL"
    return WithoutDGL


_Attention = _without_dgl_kernels(GATAttention)
_AttentionChunked = _without_dgl_kernels(GATAttentionChunked)


@shared_doc
class GATConv(CompressedMixin, pyg_nn.GATConv):
    r"""Graph attention (Veličković et al., ICLR 2018), a drop-in for :class:`torch_geometric.nn.GATConv`.

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}} \alpha_{i,j}\mathbf{\Theta}\mathbf{x}_{j},
        \qquad \alpha_{i,j} = \mathrm{softmax}_j\big(\mathrm{LeakyReLU}(\mathbf{a}_s^{\top}\mathbf{\Theta}\mathbf{x}_j
        + \mathbf{a}_t^{\top}\mathbf{\Theta}\mathbf{x}_i)\big)

    Same constructor, forward signature, parameters (``lin`` or ``lin_src``/``lin_dst``, ``att_src``,
    ``att_dst``, ``res``, ``bias``), initialisation, ``state_dict`` and output as PyG's (self loops removed and
    added again; heads concatenated or averaged); during training the activations kept for backward are
    compressed: the input of the linear, and the projected features (twice, independently, for unbiased
    attention-vector gradients) through :func:`dgl_exact.ops.gat_attention`'s op, which keeps no per-edge
    tensor (PyG keeps the ``[E, heads, out_channels]`` messages and several ``[E, heads]`` attention tensors).
    Attention dropout draws its mask from dgl_exact's seeded generator, so with ``dropout > 0`` a training
    forward equals PyG's in distribution, not draw for draw.

    ``edge_dim`` (edge features in the attention), another ``aggr`` and ``decomposed_layers > 1`` run PyG's own
    code, what it saves compressed by :func:`dgl_exact.compress_saved`
    (:meth:`~dgl_exact.pyg._base.CompressedMixin.pyg_setting`).

    Parameters
    ----------
    in_channels : int or (int, int)
        Input feature size (sources, destinations); -1 for lazy initialisation.
    %(attention)s
    bias, residual : bool
        As in PyG.
    %(compression)s

    %(attention_example)s
    """

    # PyG compiles each class's ``propagate`` from the types its source declares, reading sources cached by class
    # name: ours share PyG's names (and call no propagate), so PyG's declarations are repeated here, for the
    # runs that take PyG's own forward (hooks, explain, a setting of ``pyg_setting``)
    propagate_type = {"x": OptPairTensor, "alpha": Tensor}
    edge_updater_type = {"alpha": OptPairTensor, "edge_attr": OptTensor}

    compressed_aggregations = ("add", "sum")

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0, add_self_loops: bool = True,
                 edge_dim: Optional[int] = None, fill_value="mean", bias: bool = True, residual: bool = False, *,
                 compression: Optional[CompressionConfig] = None, **kwargs):
        super().__init__(in_channels, out_channels, heads=heads, concat=concat, negative_slope=negative_slope,
                         dropout=dropout, add_self_loops=add_self_loops, edge_dim=edge_dim, fill_value=fill_value,
                         bias=bias, residual=residual, **kwargs)
        self._init_compression(compression)

    def forward(self, x: Union[Tensor, Tuple[Tensor, Tensor]], edge_index, edge_attr: Optional[Tensor] = None,
                size: Optional[Tuple[int, int]] = None, return_attention_weights: Optional[bool] = None):
        """``x [N, in]`` or a pair ``(x_src [N_src, in], x_dst [N_dst, in])``, ``edge_index [2, E]`` (or a
        ``torch.sparse`` adjacency ``[N_dst, N_src]`` indexed ``[target, source]``);
        returns ``[N_dst, heads * out_channels]`` (``concat``) or ``[N_dst, out_channels]``; with
        ``return_attention_weights``, also ``(edge_index with self loops, attention [E', heads])``.
        ``edge_attr`` is ignored, as PyG ignores it without ``edge_dim``."""
        if self._runs_as_pyg():
            return self._pyg_forward(super().forward, x, edge_index, edge_attr, size, return_attention_weights)
        check_adjacency(edge_index)
        H, C = self.heads, self.out_channels
        cfg = self._config()
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        if x_dst is None:  # no destination term in the attention (PyG's alpha_dst None): h_dst 0, no residual
            return self._forward_sources_only(x_src, edge_index, size, return_attention_weights)
        same = x_dst is x_src
        res = None
        if self.res is not None:
            materialize(self.res, x_dst)
            res = linear(x_dst, self.res.weight, None, cfg)
        if self.lin is not None:
            materialize(self.lin, x_src)
            h_src = linear(x_src, self.lin.weight, None, cfg).view(-1, H, C)
            h_dst = h_src if same else linear(x_dst, self.lin.weight, None, cfg).view(-1, H, C)
        else:
            materialize(self.lin_src, x_src)
            materialize(self.lin_dst, x_dst)
            h_src = linear(x_src, self.lin_src.weight, None, cfg).view(-1, H, C)
            h_dst = linear(x_dst, self.lin_dst.weight, None, cfg).view(-1, H, C)
        return self._propagate(h_src, h_dst, res, edge_index, size, return_attention_weights, cfg)

    def _forward_sources_only(self, x_src: Tensor, edge_index, size, return_attention_weights):
        """``forward((x_src, None), ...)``: attention from the sources' term alone, over ``size[1]`` destinations
        (else the adjacency's rows; else, as PyG's aggregation sizes it, as many as the sources)."""
        cfg = self._config()
        lin = self.lin if self.lin is not None else self.lin_src
        materialize(lin, x_src)
        h_src = linear(x_src, lin.weight, None, cfg).view(-1, self.heads, self.out_channels)
        if size is not None:
            n_dst = size[1]
        elif is_sparse(edge_index):
            n_dst = edge_index.shape[0]
        else:  # PyG's size_i where size[1] is unknown: size[0]
            n_dst = h_src.size(0)
        h_dst = h_src.new_zeros((n_dst,) + tuple(h_src.shape[1:]))
        return self._propagate(h_src, h_dst, None, edge_index, size, return_attention_weights, cfg)

    def _propagate(self, h_src: Tensor, h_dst: Tensor, res: Optional[Tensor], edge_index, size,
                   return_attention_weights, cfg: CompressionConfig):
        """Self loops, attention and the weighted sum of the projected features ``h_src [N_src, H, C]``,
        ``h_dst [N_dst, H, C]``; then :meth:`_finish`."""
        n_src = h_src.size(0) if size is None else size[0]
        n_dst = h_dst.size(0) if size is None else size[1]
        graph, variant = edge_index, "as_is"
        if self.add_self_loops:  # (PyG's utilities read a torch.sparse adjacency as well)
            graph = add_self_loops(remove_self_loops(edge_index)[0], num_nodes=min(n_src, n_dst))[0]
            variant = "gat_self_loops"
        st = structure(graph, variant, n_src, n_dst, h_src.device, self.flow, key=edge_index)
        out, alpha = self._attend(st, h_src, h_dst, cfg, need_attention=bool(return_attention_weights))
        if return_attention_weights:
            return self._finish(out, res), attention_result(graph, alpha, n_src, n_dst)
        return self._finish(out, res)

    def _finish(self, out: Tensor, res: Optional[Tensor]) -> Tensor:
        return finish_heads(out, self.heads, self.out_channels, self.concat, res, self.bias)

    def _attend(self, st, h_src: Tensor, h_dst: Tensor, cfg: CompressionConfig, need_attention: bool):
        """``(out [N_dst, H, C], attention [E, H] or None)``: :func:`dgl_exact.ops.gat_attention`'s dispatch on an
        :class:`~.structure.EdgeStructure` (edge chunks on graphs whose per-edge tensors outweigh the features)."""
        slope = float(self.negative_slope)
        p = float(self.dropout) if self.training else 0.0
        att_src, att_dst = self.att_src, self.att_dst
        with kernels.exclude("dgl"):
            if not needs_saving(h_src, h_dst, att_src, att_dst):
                el = (h_src * att_src).sum(dim=-1)
                er = (h_dst * att_dst).sum(dim=-1)
                _, _, a = edge_attention(st, el, er, slope, p, draw_seed() if p > 0 else 0, None)
                return st.aggregate(h_src, a.to(h_src.dtype)), a
        budget = attention_chunk_budget(st, p, h_src)
        if budget is not None:
            res = _AttentionChunked.apply(h_src, h_dst, att_src, att_dst, None, st, slope, cfg, budget, need_attention)
            return res if need_attention else (res, None)
        return _Attention.apply(h_src, h_dst, att_src, att_dst, None, st, slope, p, draw_seed() if p > 0 else 0, cfg)
