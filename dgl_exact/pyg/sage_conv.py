"""SAGEConv with compressed activations, a drop-in for :class:`torch_geometric.nn.SAGEConv`."""
from __future__ import annotations

from typing import Optional, Tuple, Union

import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import OptPairTensor

from ..compression_config import CompressionConfig
from ..ops import linear, relu
from .._compat import autocast_dtype
from ..ops.saved import needs_saving
from ..ops.sage import MEAN, SAGEMean
from ._base import (CompressedMixin, check_adjacency, is_sparse, materialize, maximum, mean, plain_sum, shared_doc,
                    sparse_edges, structure)

__all__ = ["SAGEConv", "AGGREGATIONS"]

#: PyG's aggregation names this module computes, and the aggregation op of each
AGGREGATIONS = {"mean": mean, "add": plain_sum, "sum": plain_sum, "max": maximum}


@shared_doc
class SAGEConv(CompressedMixin, pyg_nn.SAGEConv):
    r"""GraphSAGE (Hamilton et al., NeurIPS 2017), a drop-in for :class:`torch_geometric.nn.SAGEConv`.

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2 \cdot
        \mathrm{mean}_{j \in \mathcal{N(i)}} \mathbf{x}_j

    Same constructor, forward signature, parameters (``lin_l`` with the bias, ``lin_r`` without, ``lin`` with
    ``project``), initialisation, ``state_dict`` and output as PyG's; during training the activations kept for
    backward are compressed. Aggregations ``'mean'``, ``'sum'``/``'add'`` and ``'max'`` run on dgl_exact's ops;
    the others PyG accepts (lists, :class:`~torch_geometric.nn.aggr.Aggregation` objects, ``'lstm'``, ...), and
    ``decomposed_layers > 1``, run PyG's own code, what it saves compressed by :func:`dgl_exact.compress_saved`
    (:meth:`~dgl_exact.pyg._base.CompressedMixin.pyg_setting`).

    Kept for backward, with one feature tensor, 'mean' and ``root_weight`` (the common layer): the input (by
    reference where it is alive anyway, else compressed) and the neighbour mean compressed, through
    :func:`dgl_exact.ops.sage_mean` (one fused op); otherwise each linear's input compressed, nothing for the
    sum and mean, the winning source per element for 'max' (PyG keeps the ``[E, D]`` messages for it), one bit
    per element for ``project``'s ReLU. ``normalize``'s L2 normalisation runs as PyG runs it (its output kept
    exactly). A ``torch.sparse`` adjacency with values other than 1 (PyG weighs its sum by them) runs PyG's code
    the same way.

    Parameters
    ----------
    in_channels : int or (int, int)
        Input feature size (sources, destinations); -1 for lazy initialisation.
    out_channels : int
        Output feature size.
    aggr : str, list or Aggregation, default 'mean'
        'mean', 'sum' ('add') or 'max' on dgl_exact's ops; anything else PyG takes runs PyG's code.
    normalize : bool, default False
        L2-normalise the output.
    root_weight : bool, default True
        Add the transformed destination features (``lin_r``).
    project : bool, default False
        Transform the source features by ``lin`` and a ReLU first.
    bias : bool, default True
        ``lin_l``'s bias.
    %(compression)s

    Example
    -------
    Max aggregation from 100 source nodes into 30 destination nodes (a bipartite graph):

    %(example_imports)s
    >>> from dgl_exact import CompressionConfig
    >>> x_src, x_dst = torch.randn(100, 16), torch.randn(30, 16)
    >>> edge_index = torch.stack([torch.randint(0, 100, (500,)), torch.randint(0, 30, (500,))])
    >>> conv = SAGEConv(16, 8, aggr="max", compression=CompressionConfig(bits=2))
    >>> conv((x_src, x_dst), edge_index).shape
    torch.Size([30, 8])
    """

    # PyG compiles each class's ``propagate`` from the types its source declares, reading sources cached by class
    # name: ours share PyG's names (and call no propagate), so PyG's declarations are repeated here, for the
    # runs that take PyG's own forward (hooks, explain, a setting of ``pyg_setting``)
    propagate_type = {"x": OptPairTensor}
    compressed_aggregations = tuple(AGGREGATIONS)

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, aggr: str = "mean",
                 normalize: bool = False, root_weight: bool = True, project: bool = False, bias: bool = True, *,
                 compression: Optional[CompressionConfig] = None, **kwargs):
        super().__init__(in_channels, out_channels, aggr=aggr, normalize=normalize, root_weight=root_weight,
                         project=project, bias=bias, **kwargs)
        self._init_compression(compression)

    def forward(self, x: Union[Tensor, Tuple[Tensor, Optional[Tensor]]], edge_index,
                size: Optional[Tuple[int, int]] = None) -> Tensor:
        """``x [N, in]`` or a pair ``(x_src [N_src, in], x_dst [N_dst, in] or None)``, ``edge_index [2, E]`` (or a
        ``torch.sparse`` adjacency ``[N_dst, N_src]``), ``size`` ``(N_src, N_dst)``; returns ``[N_dst, out]``."""
        if self._runs_as_pyg():
            return self._pyg_forward(super().forward, x, edge_index, size)
        check_adjacency(edge_index)
        cfg = self._config()
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        if self.project and hasattr(self, "lin"):
            materialize(self.lin, x_src)
            x_src = relu(linear(x_src, self.lin.weight, self.lin.bias, cfg))
        n_src = x_src.size(0) if size is None or size[0] is None else size[0]
        n_dst = (x_dst.size(0) if x_dst is not None else n_src) if size is None or size[1] is None else size[1]
        if is_sparse(edge_index):
            n_dst, n_src = edge_index.shape[0], edge_index.shape[1]
            values = sparse_edges(edge_index)[2]
            if not bool((values == 1).all()):  # PyG weighs its sum by them: its code runs
                return self._pyg_forward(super().forward, x, edge_index, size,
                                         setting="a sparse adjacency with values other than 1")
        st = structure(edge_index, "as_is", n_src, n_dst, x_src.device, self.flow)
        materialize(self.lin_l, x_src)
        if self.root_weight and x_dst is not None:
            materialize(self.lin_r, x_dst)
        if self._fused(cfg, x_src, x_dst, st):
            out = SAGEMean.apply(x_src, self.lin_r.weight, self.lin_l.bias, self.lin_l.weight, st, cfg, MEAN, None)
        else:
            out = linear(AGGREGATIONS[self.aggr](st, x_src), self.lin_l.weight, self.lin_l.bias, cfg)
            if self.root_weight and x_dst is not None:
                out = out + linear(x_dst, self.lin_r.weight, None, cfg)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def _fused(self, cfg: CompressionConfig, x_src: Tensor, x_dst: Optional[Tensor], st) -> bool:
        """Whether :func:`dgl_exact.ops.sage_mean`'s op computes this call: 'mean' with ``root_weight`` over one
        ``[N, D]`` feature tensor (a graph, not a bipartite pair), compression on, one dtype, no autocast."""
        return (self.aggr == "mean" and self.root_weight and cfg.enabled and x_dst is x_src and x_src.dim() == 2
                and st.num_src == st.num_dst == x_src.shape[0]
                and x_src.dtype == self.lin_l.weight.dtype == self.lin_r.weight.dtype
                and autocast_dtype(x_src.device.type) is None
                and needs_saving(x_src, self.lin_l.weight, self.lin_l.bias, self.lin_r.weight))
