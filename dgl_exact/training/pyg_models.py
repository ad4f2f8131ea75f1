"""The trainer's architectures on PyTorch Geometric's layers (``dgl-exact train --framework pyg``; the benchmark's
PyG rows, :mod:`dgl_exact.bench.pyg_models`), written as a PyG user writes them and converted by
:func:`dgl_exact.compress_model` alone: PyG's convs, ``Linear`` and ``BatchNorm`` and torch's ``ReLU`` and
``Dropout`` become dgl_exact's (ReLU + Dropout fused into one op).

:class:`PyGStack`: ``layers`` ``GCNConv``, ``SAGEConv`` (mean) or ``GATConv`` (``heads`` concatenated, ``hidden``
per head; the last layer one head), each hidden one followed by ``Sequential(BatchNorm, ReLU, Dropout)``.
:class:`PyGGCNII`: PyG's ``gcn2_cora`` example: ``Linear -> ReLU``, ``layers`` ``GCN2Conv(alpha=0.1, theta=0.5)``
each followed by ``Sequential(BatchNorm, ReLU, Dropout)``, then ``Linear``. :class:`PyGModel` calls one as the
trainer calls its models, ``model(graph, feat, edge_weight=None)`` with a DGL graph or subgraph (PyG's convs
read its ``edge_index``; they add their own self loops where PyG does) or the neighbour sampler's blocks (run as
PyG's ``NeighborLoader`` batches: :func:`blocks_edge_index`).
"""
from __future__ import annotations

import weakref

import torch
import torch.nn as nn

from ..nn.convert import compress_model

__all__ = ["PyGStack", "PyGGCNII", "PyGModel", "build_pyg_network", "blocks_edge_index", "PYG_GAT_HEADS"]

PYG_GAT_HEADS, PYG_GCN2_ALPHA, PYG_GCN2_THETA = 3, 0.1, 0.5


def _post(width: int, dropout: float, batch_norm: bool) -> nn.Sequential:
    import torch_geometric.nn as pyg_nn

    return nn.Sequential(*([pyg_nn.BatchNorm(width)] if batch_norm else []), nn.ReLU(), nn.Dropout(dropout))


class PyGStack(nn.Module):
    """GCN, GraphSAGE or GAT on PyG's convs: ``conv -> BatchNorm -> ReLU -> Dropout`` per hidden layer."""

    def __init__(self, kind: str, in_feats: int, hidden: int, classes: int, layers: int, dropout: float,
                 batch_norm: bool, heads: int = PYG_GAT_HEADS, cached: bool = False):
        super().__init__()
        import torch_geometric.nn as pyg_nn

        self.kind = kind
        width = hidden * heads if kind == "gat" else hidden
        dims = [in_feats] + [width] * (layers - 1) + [classes]
        self.convs = nn.ModuleList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            if kind == "gcn":
                self.convs.append(pyg_nn.GCNConv(a, b, cached=cached))
            elif kind == "sage":
                self.convs.append(pyg_nn.SAGEConv(a, b))
            elif kind == "gat":
                last = i == layers - 1
                self.convs.append(pyg_nn.GATConv(a, b if last else hidden, heads=1 if last else heads))
            else:
                raise ValueError(f"unknown kind {kind!r}")
        self.posts = nn.ModuleList(_post(width, dropout, batch_norm) for _ in range(layers - 1))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight=None) -> torch.Tensor:
        """``edge_weight``: GCN's only (PyG's SAGEConv and GATConv take none)."""
        if edge_weight is not None and self.kind != "gcn":
            raise ValueError(f"PyG's {type(self.convs[0]).__name__} takes no edge weights (GraphSAINT's "
                             "normalisation gives them): use --sampler full or cluster, or --sample-coverage 0")
        for i, conv in enumerate(self.convs):
            x = conv(x, edge_index) if edge_weight is None else conv(x, edge_index, edge_weight)
            if i < len(self.posts):
                x = self.posts[i](x)
        return x


class PyGGCNII(nn.Module):
    """GCNII on PyG's ``GCN2Conv`` (PyG's ``gcn2_cora`` example, with BatchNorm after each conv)."""

    def __init__(self, in_feats: int, hidden: int, classes: int, layers: int, dropout: float, batch_norm: bool,
                 cached: bool = False, alpha: float = PYG_GCN2_ALPHA, theta: float = PYG_GCN2_THETA):
        super().__init__()
        import torch_geometric.nn as pyg_nn

        self.lin_in = nn.Linear(in_feats, hidden)
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)
        self.convs = nn.ModuleList(pyg_nn.GCN2Conv(hidden, alpha=alpha, theta=theta, layer=i + 1,
                                                   cached=cached) for i in range(layers))
        self.posts = nn.ModuleList(_post(hidden, dropout, batch_norm) for _ in range(layers))
        self.lin_out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight=None) -> torch.Tensor:
        x = x0 = self.act(self.lin_in(x))
        x = self.drop(x)
        for conv, post in zip(self.convs, self.posts):
            x = post(conv(x, x0, edge_index, edge_weight))
        return self.lin_out(x)


def build_pyg_network(model: str, in_feats: int, hidden: int, classes: int, layers: int, dropout: float,
                      batch_norm: bool, heads: int = PYG_GAT_HEADS, cached: bool = False, convert: bool = True,
                      alpha: float = PYG_GCN2_ALPHA, theta: float = PYG_GCN2_THETA) -> nn.Module:
    """``model`` (``gcn``, ``sage``, ``gat``, ``gcn2``) on PyG's layers, called ``net(x, edge_index)``; converted in
    place by :func:`dgl_exact.compress_model` (its configuration: the one in force) unless ``convert`` is False.
    ``cached``: GCN's and GCNII's normalised graph kept from the first call (one fixed graph only). ``alpha``,
    ``theta``: GCNII's (``theta`` is DGL's ``lambda_``)."""
    if model == "gcn2":
        net = PyGGCNII(in_feats, hidden, classes, layers, dropout, batch_norm, cached=cached, alpha=alpha,
                       theta=theta)
    elif model in ("gcn", "sage", "gat"):
        net = PyGStack(model, in_feats, hidden, classes, layers, dropout, batch_norm, heads=heads, cached=cached)
    else:
        raise ValueError(f"unknown model {model!r}; expected one of gcn, sage, gat, gcn2")
    return compress_model(net) if convert else net


def blocks_edge_index(blocks) -> torch.Tensor:
    """The ``edge_index [2, E]`` of the subgraph the neighbour sampler's ``blocks`` (first layer first) sampled, over
    the first block's input nodes (every block's nodes are a prefix of them, in DGL's numbering): each node's
    in-edges from the one block that expanded it, the last block for the seeds and, for the nodes the next block
    does not hold as destinations, the block where they first are. As PyG's ``NeighborLoader`` samples: every
    node expanded once (hop ``k`` with ``fanouts[L - k]``: PyG's ``num_neighbors`` reversed), so a PyG model runs
    on it as on PyG's batches (every layer over all the sampled nodes; the seeds' rows are the output)."""
    parts = []
    for i, block in enumerate(blocks):
        src, dst = block.edges(order="srcdst")
        if i + 1 < len(blocks):  # the destinations the next block holds are expanded there
            new = dst >= blocks[i + 1].num_dst_nodes()
            src, dst = src[new], dst[new]
        parts.append(torch.stack([src, dst]).to(torch.int64))
    return torch.cat(parts, 1)


class PyGModel(nn.Module):
    """A PyG network (``net(x, edge_index[, edge_weight])``) called as the trainer calls its models:
    ``model(graph, feat, edge_weight=None)``, ``graph`` a DGL graph (whole or a sampled subgraph) or a list of
    blocks. The ``edge_index`` of each graph is made once (kept while the graph lives)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net
        self._edge_index = weakref.WeakKeyDictionary()

    def edge_index(self, graph):
        """``(edge_index [2, E], edge ids)`` of ``graph``, its edges in source-destination order (the one order a
        graph kept as CSR/CSC alone lists them in); the ids order the edge weights alike."""
        hit = self._edge_index.get(graph)
        if hit is None:
            src, dst, eid = graph.edges(form="all", order="srcdst")
            hit = self._edge_index[graph] = (torch.stack([src, dst]).to(torch.int64), eid.to(torch.int64))
        return hit

    def forward(self, graph, feat: torch.Tensor, edge_weight=None) -> torch.Tensor:
        """``graph``: a DGL graph (``feat`` one row per node; returns one row per node) or the neighbour sampler's
        blocks (``feat`` one row per input node of the first block; returns the rows of the last block's
        destinations, the seeds), run as PyG's ``NeighborLoader`` batches run: on the subgraph of the sampled
        nodes and edges (:func:`blocks_edge_index`)."""
        if isinstance(graph, (list, tuple)):
            if edge_weight is not None:
                raise ValueError("--framework pyg on the neighbour sampler's blocks takes no edge weights")
            out = self.net(feat, blocks_edge_index(graph).to(feat.device))
            return out[:graph[-1].num_dst_nodes()]
        edge_index, eid = self.edge_index(graph)
        if edge_weight is not None:
            edge_weight = edge_weight[eid.to(edge_weight.device)]
        return self.net(feat, edge_index.to(feat.device), edge_weight)

    def __getstate__(self):  # (deepcopy, pickling) the edge_index cache is rebuilt
        state = self.__dict__.copy()
        state["_edge_index"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._edge_index = weakref.WeakKeyDictionary()
