"""PyTorch Geometric models as a PyG user writes them, measured beside the DGL rows (``dgl-exact bench memory
--models pyg-gcn,pyg-sage,pyg-gat,pyg-gcn2``): the baseline is the model as written (``PyG fp32``), dgl_exact's
settings run the same model converted by :func:`dgl_exact.compress_model` (PyG's convs, ``Linear`` and
``BatchNorm`` become :mod:`dgl_exact.pyg`'s and dgl_exact's; torch's ReLU and Dropout too, fused into one op).

The architectures are the trainer's (:mod:`dgl_exact.training.models`) on PyG's layers, called as PyG calls them,
``model(x, edge_index)`` on the graph as loaded (PyG's convs add their own self loops):

``pyg-gcn``: ``layers`` ``GCNConv(cached=True)`` (PyG's transductive setting), each hidden one followed by
``Sequential(BatchNorm, ReLU, Dropout)``. ``pyg-sage``: the same with ``SAGEConv`` (mean). ``pyg-gat``:
``GATConv(heads=heads)`` with the heads concatenated (``hidden`` per head), the last layer one head.
``pyg-gcn2``: GCNII as in PyG's ``gcn2_cora`` example: ``Linear -> ReLU``, ``layers`` ``GCN2Conv(alpha=0.1,
theta=0.5, cached=True)`` each followed by ``Sequential(BatchNorm, ReLU, Dropout)``, then ``Linear``.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..nn.convert import compress_model
from ..training.workloads import ModelTraits

PYG_MODELS = ("pyg-gcn", "pyg-sage", "pyg-gat", "pyg-gcn2")
PYG_GAT_HEADS, PYG_GCN2_ALPHA, PYG_GCN2_THETA = 3, 0.1, 0.5
#: their workload facts: no self loops added to the graph (PyG's GCNConv, GATConv and GCN2Conv add their own);
#: widths and depths those of the DGL rows (GCNII's depth: ``--layers 16`` gives the EXACT benchmark's)
PYG_MODEL_TRAITS = {t.name: t for t in (
    ModelTraits("pyg-gcn", self_loops=False, csc_only=False, hidden=256),
    ModelTraits("pyg-sage", self_loops=False, csc_only=False, hidden=128),
    ModelTraits("pyg-gat", self_loops=False, csc_only=False, hidden=128, heads=PYG_GAT_HEADS),
    ModelTraits("pyg-gcn2", self_loops=False, csc_only=False, hidden=256),
)}


def _post(width: int, dropout: float, batch_norm: bool) -> nn.Sequential:
    import torch_geometric.nn as pyg_nn

    return nn.Sequential(*([pyg_nn.BatchNorm(width)] if batch_norm else []), nn.ReLU(), nn.Dropout(dropout))


class PyGStack(nn.Module):
    """GCN, GraphSAGE or GAT on PyG's convs: ``conv -> BatchNorm -> ReLU -> Dropout`` per hidden layer."""

    def __init__(self, kind: str, in_feats: int, hidden: int, classes: int, layers: int, dropout: float,
                 batch_norm: bool, heads: int = PYG_GAT_HEADS):
        super().__init__()
        import torch_geometric.nn as pyg_nn

        width = hidden * heads if kind == "gat" else hidden
        dims = [in_feats] + [width] * (layers - 1) + [classes]
        self.convs = nn.ModuleList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            if kind == "gcn":
                self.convs.append(pyg_nn.GCNConv(a, b, cached=True))
            elif kind == "sage":
                self.convs.append(pyg_nn.SAGEConv(a, b))
            elif kind == "gat":
                last = i == layers - 1
                self.convs.append(pyg_nn.GATConv(a, b if last else hidden, heads=1 if last else heads))
            else:
                raise ValueError(f"unknown kind {kind!r}")
        self.posts = nn.ModuleList(_post(width, dropout, batch_norm) for _ in range(layers - 1))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index)
            if i < len(self.posts):
                x = self.posts[i](x)
        return x


class PyGGCNII(nn.Module):
    """GCNII on PyG's ``GCN2Conv`` (PyG's ``gcn2_cora`` example, with BatchNorm after each conv)."""

    def __init__(self, in_feats: int, hidden: int, classes: int, layers: int, dropout: float, batch_norm: bool):
        super().__init__()
        import torch_geometric.nn as pyg_nn

        self.lin_in = nn.Linear(in_feats, hidden)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.convs = nn.ModuleList(pyg_nn.GCN2Conv(hidden, alpha=PYG_GCN2_ALPHA, theta=PYG_GCN2_THETA, layer=i + 1,
                                                   cached=True) for i in range(layers))
        self.posts = nn.ModuleList(_post(hidden, dropout, batch_norm) for _ in range(layers))
        self.lin_out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = x0 = self.act(self.lin_in(x))
        x = self.drop(x)
        for conv, post in zip(self.convs, self.posts):
            x = post(conv(x, x0, edge_index))
        return self.lin_out(x)


def build_pyg_model(name: str, in_feats: int, hidden: int, classes: int, layers: int, dropout: float,
                    batch_norm: bool, impl: str) -> nn.Module:
    """``name`` (one of :data:`PYG_MODELS`) on PyG's layers; for ``impl='exact'`` converted in place by
    :func:`dgl_exact.compress_model` (its configuration: the one in force), for ``impl='pyg'`` as written."""
    if name not in PYG_MODELS:
        raise ValueError(f"unknown PyG model {name!r}; expected one of {', '.join(PYG_MODELS)}")
    if impl not in ("pyg", "exact"):
        raise ValueError(f"{name} runs on PyG ('pyg') or converted ('exact'), not {impl!r}")
    kind = name.split("-", 1)[1]
    if kind == "gcn2":
        model = PyGGCNII(in_feats, hidden, classes, layers, dropout, batch_norm)
    else:
        model = PyGStack(kind, in_feats, hidden, classes, layers, dropout, batch_norm)
    return compress_model(model) if impl == "exact" else model
