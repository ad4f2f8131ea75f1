"""PyTorch Geometric models as a PyG user writes them, measured beside the DGL rows (``dgl-exact bench memory
--models pyg-gcn,pyg-sage,pyg-gat,pyg-gcn2,pyg-gatv2``): the baseline is the model as written (``PyG fp32``),
dgl_exact's settings run the same model converted by :func:`dgl_exact.compress_model` (PyG's convs, ``Linear`` and
``BatchNorm`` become :mod:`dgl_exact.pyg`'s and dgl_exact's; torch's ReLU and Dropout too, fused into one op).

The architectures are :mod:`dgl_exact.training.pyg_models`' (the trainer's on PyG's layers), called as PyG calls
them, ``model(x, edge_index)`` on the graph as loaded (PyG's convs add their own self loops), GCN's and GCNII's
normalised graph cached (PyG's transductive setting):

``pyg-gcn``: ``layers`` ``GCNConv(cached=True)`` (PyG's transductive setting), each hidden one followed by
``Sequential(BatchNorm, ReLU, Dropout)``. ``pyg-sage``: the same with ``SAGEConv`` (mean). ``pyg-gat``:
``GATConv(heads=heads)`` with the heads concatenated (``hidden`` per head), the last layer one head.
``pyg-gatv2``: the same with ``GATv2Conv``.
``pyg-gcn2``: GCNII as in PyG's ``gcn2_cora`` example: ``Linear -> ReLU``, ``layers`` ``GCN2Conv(alpha=0.1,
theta=0.5, cached=True)`` each followed by ``Sequential(BatchNorm, ReLU, Dropout)``, then ``Linear``.
"""
from __future__ import annotations

import torch.nn as nn

from ..training.pyg_models import PYG_GAT_HEADS, build_pyg_network
from ..training.workloads import PYG_MODEL_TRAITS, PYG_MODELS

__all__ = ["PYG_MODELS", "PYG_MODEL_TRAITS", "build_pyg_model"]


def build_pyg_model(name: str, in_feats: int, hidden: int, classes: int, layers: int, dropout: float,
                    batch_norm: bool, impl: str) -> nn.Module:
    """``name`` (one of :data:`PYG_MODELS`) on PyG's layers; for ``impl='exact'`` converted in place by
    :func:`dgl_exact.compress_model` (its configuration: the one in force), for ``impl='pyg'`` as written."""
    if name not in PYG_MODELS:
        raise ValueError(f"unknown PyG model {name!r}; expected one of {', '.join(PYG_MODELS)}")
    if impl not in ("pyg", "exact"):
        raise ValueError(f"{name} runs on PyG ('pyg') or converted ('exact'), not {impl!r}")
    return build_pyg_network(name.split("-", 1)[1], in_feats, hidden, classes, layers, dropout, batch_norm,
                             PYG_GAT_HEADS, cached=True, convert=impl == "exact")
