"""The trainer's architectures on PyTorch Geometric's layers (``dgl-exact train --framework pyg``; the benchmark's
PyG rows, :mod:`dgl_exact.bench.pyg_models`), written as a PyG user writes them and converted by
:func:`dgl_exact.compress_model` alone: PyG's convs, ``Linear`` and ``BatchNorm`` and torch's ``ReLU`` and
``Dropout`` become dgl_exact's (ReLU + Dropout fused into one op).

:class:`PyGStack`: ``layers`` ``GCNConv``, ``SAGEConv`` (mean), ``GATConv`` or ``GATv2Conv`` (``heads``
concatenated, ``hidden`` per head; the last layer one head), each hidden one followed by
``Sequential(BatchNorm, ReLU, Dropout)``.
:class:`PyGGCNII`: PyG's ``gcn2_cora`` example: ``Linear -> ReLU``, ``layers`` ``GCN2Conv(alpha=0.1, theta=0.5)``
each followed by ``Sequential(BatchNorm, ReLU, Dropout)``, then ``Linear``. :class:`PyGModel` calls one as the
trainer calls its models, ``model(graph, feat, edge_weight=None)`` with a DGL graph or subgraph (PyG's convs
read its ``edge_index``; they add their own self loops where PyG does) or the neighbour sampler's blocks (run as
PyG's ``NeighborLoader`` batches: :func:`blocks_edge_index`).
"""
from __future__ import annotations

import threading
import weakref

import torch
import torch.nn as nn

from ..nn.convert import compress_model

__all__ = ["PyGStack", "PyGGCNII", "PyGModel", "build_pyg_network", "blocks_edge_index", "PYG_GAT_HEADS",
           "PYG_NETWORKS", "PYG_ONLY_NETWORKS"]

PYG_GAT_HEADS, PYG_GCN2_ALPHA, PYG_GCN2_THETA = 3, 0.1, 0.5
#: the networks :func:`build_pyg_network` builds (``dgl-exact train --framework pyg --model ...``)
PYG_NETWORKS = ("gcn", "sage", "gat", "gcn2", "gatv2")
#: those with no DGL-built counterpart in :mod:`~dgl_exact.training.models` (``--framework pyg`` only)
PYG_ONLY_NETWORKS = ("gatv2",)
#: the attention networks of :class:`PyGStack` (``heads`` per hidden layer)
ATTENTION_KINDS = ("gat", "gatv2")


def _post(width: int, dropout: float, batch_norm: bool) -> nn.Sequential:
    import torch_geometric.nn as pyg_nn

    return nn.Sequential(*([pyg_nn.BatchNorm(width)] if batch_norm else []), nn.ReLU(), nn.Dropout(dropout))


class PyGStack(nn.Module):
    """GCN, GraphSAGE, GAT or GATv2 on PyG's convs: ``conv -> BatchNorm -> ReLU -> Dropout`` per hidden layer."""

    def __init__(self, kind: str, in_feats: int, hidden: int, classes: int, layers: int, dropout: float,
                 batch_norm: bool, heads: int = PYG_GAT_HEADS, cached: bool = False):
        super().__init__()
        import torch_geometric.nn as pyg_nn

        self.kind = kind
        width = hidden * heads if kind in ATTENTION_KINDS else hidden
        dims = [in_feats] + [width] * (layers - 1) + [classes]
        self.convs = nn.ModuleList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            if kind == "gcn":
                self.convs.append(pyg_nn.GCNConv(a, b, cached=cached))
            elif kind == "sage":
                self.convs.append(pyg_nn.SAGEConv(a, b))
            elif kind in ATTENTION_KINDS:
                last = i == layers - 1
                conv = pyg_nn.GATConv if kind == "gat" else pyg_nn.GATv2Conv
                self.convs.append(conv(a, b if last else hidden, heads=1 if last else heads))
            else:
                raise ValueError(f"unknown kind {kind!r}")
        self.posts = nn.ModuleList(_post(width, dropout, batch_norm) for _ in range(layers - 1))

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight=None) -> torch.Tensor:
        """``edge_weight``: GCN's only (PyG's SAGEConv, GATConv and GATv2Conv take none)."""
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
    """``model`` (one of :data:`PYG_NETWORKS`) on PyG's layers, called ``net(x, edge_index)``; converted in
    place by :func:`dgl_exact.compress_model` (its configuration: the one in force) unless ``convert`` is False.
    ``cached``: GCN's and GCNII's normalised graph kept from the first call (one fixed graph only). ``alpha``,
    ``theta``: GCNII's (``theta`` is DGL's ``lambda_``)."""
    if model == "gcn2":
        net = PyGGCNII(in_feats, hidden, classes, layers, dropout, batch_norm, cached=cached, alpha=alpha,
                       theta=theta)
    elif model in PYG_NETWORKS:
        net = PyGStack(model, in_feats, hidden, classes, layers, dropout, batch_norm, heads=heads, cached=cached)
    else:
        raise ValueError(f"unknown model {model!r}; expected one of {', '.join(PYG_NETWORKS)}")
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


#: per graph object and device, ``(edge_index [2, E], edge ids)`` (:meth:`PyGModel.edge_index`), shared by every
#: model called on the graph and dying with it: a new model (the next run, the planner's recorded step) finds the
#: ``edge_index`` whose :class:`~dgl_exact.pyg.structure.EdgeStructure` a converted conv cached, as one model finds
#: it every epoch
_EDGE_INDEX: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_EDGE_INDEX_LOCK = threading.Lock()


class PyGModel(nn.Module):
    """A PyG network (``net(x, edge_index[, edge_weight])``) called as the trainer calls its models:
    ``model(graph, feat, edge_weight=None)``, ``graph`` a DGL graph (whole or a sampled subgraph) or a list of
    blocks. The ``edge_index`` of each graph is made once and kept while the graph lives, for every model called
    on it (:meth:`edge_index`)."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    @staticmethod
    def edge_index(graph, device=None):
        """``(edge_index [2, E], edge ids)`` of ``graph`` on ``device`` (default: the graph's), its edges in
        source-destination order (the one order a graph kept as CSR/CSC alone lists them in); the ids order the
        edge weights alike. Made on the first call for ``graph`` and ``device`` and kept while ``graph`` lives
        (the same tensors for every model and step: a converted conv's structure cache, keyed on the
        ``edge_index`` tensor, serves them all, where a copy made per call would build it again each time)."""
        device = torch.device(graph.device if device is None else device)
        with _EDGE_INDEX_LOCK:
            hit = _EDGE_INDEX.get(graph, {}).get(device)
        if hit is None:
            src, dst, eid = graph.edges(form="all", order="srcdst")
            hit = (torch.stack([src, dst]).to(device, torch.int64), eid.to(device, torch.int64))
            with _EDGE_INDEX_LOCK:
                hit = _EDGE_INDEX.setdefault(graph, {}).setdefault(device, hit)
        return hit

    @classmethod
    def graph_tensors(cls, graph) -> list:
        """What the PyG models hold for ``graph`` beside DGL's own formats (a memory meter counts it as static):
        its ``edge_index`` and edge ids on each device a model made them on (:meth:`edge_index`)."""
        with _EDGE_INDEX_LOCK:
            per_device = dict(_EDGE_INDEX.get(graph, {}))
        return [t for pair in per_device.values() for t in pair]

    @classmethod
    def structure_tensors(cls, graph) -> list:
        """The tensors dgl_exact's PyG convs cache for ``graph``'s ``edge_index`` (every device;
        :func:`dgl_exact.pyg.structure.cached_static_tensors`; a memory meter counts them as static)."""
        edge_indices = cls.graph_tensors(graph)[::2]
        if not edge_indices:
            return []
        from ..pyg.structure import cached_static_tensors

        return [t for ei in edge_indices for t in cached_static_tensors(ei)]

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
        edge_index, eid = self.edge_index(graph, feat.device)
        if edge_weight is not None:
            edge_weight = edge_weight[eid.to(edge_weight.device)]
        return self.net(feat, edge_index, edge_weight)
