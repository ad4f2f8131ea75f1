"""The GNN architectures of the EXACT benchmarks, buildable from DGL's layers (``impl='dgl'``, the baseline
users have today) or from dgl_exact's (``impl='exact'``) with identical parameters and ``state_dict``.

Every hidden layer is ``conv -> BatchNorm (optional) -> ReLU -> Dropout``; dgl_exact fuses the last two
into one op keeping a single bit per element.
"""
from __future__ import annotations


import torch.nn as nn
import torch.nn.functional as F

from .. import nn as enn
from .. import ops
from .._compat import import_dgl

dgl = import_dgl()

MODELS = ("gcn", "sage", "gat", "gcn2")
IMPLS = ("exact", "dgl")


class _Layers:
    """Layer constructors for one implementation."""

    def __init__(self, impl: str):
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        self.impl = impl
        exact = impl == "exact"
        self.GraphConv = enn.GraphConv if exact else dgl.nn.GraphConv
        self.SAGEConv = enn.SAGEConv if exact else dgl.nn.SAGEConv
        self.GATConv = enn.GATConv if exact else dgl.nn.GATConv
        self.GCN2Conv = enn.GCN2Conv if exact else dgl.nn.GCN2Conv
        self.Linear = enn.Linear if exact else nn.Linear
        self.BatchNorm1d = enn.BatchNorm1d if exact else nn.BatchNorm1d

    def relu_dropout(self, x, p, training):
        if self.impl == "exact":
            return ops.relu_dropout(x, p, training)
        return F.dropout(F.relu(x), p, training)

    def dropout(self, x, p, training):
        return ops.dropout(x, p, training) if self.impl == "exact" else F.dropout(x, p, training)


class StackedGNN(nn.Module):
    """``layers`` convolutions with BN/ReLU/Dropout between them (GCN, GraphSAGE, GAT).

    Works on a whole graph or on a list of DGL blocks (one per layer) from a neighbour sampler.
    """

    def __init__(self, model: str, in_feats: int, hidden: int, num_classes: int, layers: int = 3,
                 dropout: float = 0.5, batch_norm: bool = True, heads: int = 3, input_dropout: float = 0.0,
                 impl: str = "exact"):
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        self._lib = _Layers(impl)
        self.model, self.dropout, self.input_dropout = model, dropout, input_dropout
        # GAT concatenates its hidden heads (``hidden`` is the size per head, as in DGL's ogbn-arxiv example)
        width = hidden * heads if model == "gat" else hidden
        dims = [in_feats] + [width] * (layers - 1) + [num_classes]
        self.convs = nn.ModuleList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            last = i == layers - 1
            if model == "gcn":
                conv = self._lib.GraphConv(a, b, allow_zero_in_degree=True)
            elif model == "sage":
                conv = self._lib.SAGEConv(a, b, "mean")
            elif model == "gat":
                conv = self._lib.GATConv(a, b if last else hidden, num_heads=1 if last else heads,
                                         allow_zero_in_degree=True)
            else:
                raise ValueError(f"unknown model {model!r}; expected one of {MODELS}")
            self.convs.append(conv)
        self.norms = nn.ModuleList([self._lib.BatchNorm1d(width) for _ in range(layers - 1)]) if batch_norm else None

    def reset_parameters(self):
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def forward(self, graph, x, edge_weight=None):
        """``graph``: a graph or one block per layer; ``edge_weight``: per-edge message weights (e.g.
        GraphSAINT's aggregation normalisation), one tensor or one per block."""
        blocks = graph if isinstance(graph, (list, tuple)) else [graph] * len(self.convs)
        weights = edge_weight if isinstance(edge_weight, (list, tuple)) else [edge_weight] * len(self.convs)
        h = self._lib.dropout(x, self.input_dropout, self.training) if self.input_dropout > 0 else x
        for i, (conv, g, w) in enumerate(zip(self.convs, blocks, weights)):
            h = conv(g, h, edge_weight=w)
            if h.dim() == 3:  # GAT: concatenate hidden heads, average output heads
                h = h.flatten(1) if i < len(self.convs) - 1 else h.mean(1)
            if i < len(self.convs) - 1:
                if self.norms is not None:
                    h = self.norms[i](h)
                h = self._lib.relu_dropout(h, self.dropout, self.training)
        return h


class GCNII(nn.Module):
    """GCNII (Chen et al., 2020): ``Linear -> L x GCN2Conv (residual to the initial representation) -> Linear``."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, layers: int = 8, dropout: float = 0.5,
                 alpha: float = 0.1, lambda_: float = 0.5, batch_norm: bool = False, impl: str = "exact"):
        super().__init__()
        self._lib = _Layers(impl)
        self.dropout = dropout
        self.lin_in = self._lib.Linear(in_feats, hidden)
        self.convs = nn.ModuleList([self._lib.GCN2Conv(hidden, layer=i + 1, alpha=alpha, lambda_=lambda_,
                                                       allow_zero_in_degree=True) for i in range(layers)])
        self.norms = nn.ModuleList([self._lib.BatchNorm1d(hidden) for _ in range(layers)]) if batch_norm else None
        self.lin_out = self._lib.Linear(hidden, num_classes)

    def reset_parameters(self):
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def forward(self, graph, x, edge_weight=None):
        if isinstance(graph, (list, tuple)):
            raise ValueError("GCNII runs on whole (sub)graphs, not on blocks from a neighbour sampler")
        h = self._lib.dropout(x, self.dropout, self.training)
        h = h0 = self._lib.relu_dropout(self.lin_in(h), self.dropout, self.training)
        for i, conv in enumerate(self.convs):
            h = conv(graph, h, h0, edge_weight=edge_weight)
            if self.norms is not None:
                h = self.norms[i](h)
            h = self._lib.relu_dropout(h, self.dropout, self.training)
        return self.lin_out(h)


def build_model(model: str, in_feats: int, num_classes: int, hidden: int = 128, layers: int = 3,
                dropout: float = 0.5, batch_norm: bool = True, heads: int = 3, alpha: float = 0.1,
                lambda_: float = 0.5, input_dropout: float = 0.0, impl: str = "exact") -> nn.Module:
    """Build one of :data:`MODELS` with DGL's (``impl='dgl'``) or dgl_exact's (``impl='exact'``) layers."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")
    if model == "gcn2":
        return GCNII(in_feats, hidden, num_classes, layers=layers, dropout=dropout, alpha=alpha, lambda_=lambda_,
                     batch_norm=batch_norm, impl=impl)
    return StackedGNN(model, in_feats, hidden, num_classes, layers=layers, dropout=dropout, batch_norm=batch_norm,
                      heads=heads, input_dropout=input_dropout, impl=impl)
