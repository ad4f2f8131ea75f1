"""Which PyG modules have a drop-in here, for a converter that swaps classes in place (as
:func:`dgl_exact.compress_model` converts DGL's convs): a drop-in adds nothing to PyG's instance but its
``compression`` attribute, so ``module.__class__ = CONVERSIONS[type(module)]`` followed by
``module.compression = None`` turns a PyG conv (weights, buffers, caches, hooks and all) into the drop-in,
wherever :func:`refusal` finds nothing against it."""
from __future__ import annotations

from typing import Optional

import torch
import torch_geometric.nn as pyg_nn

from .gat_conv import GATConv
from .gatv2_conv import GATv2Conv
from .gcn2_conv import GCN2Conv
from .gcn_conv import GCNConv
from .linear import Linear
from .sage_conv import AGGREGATIONS, SAGEConv

__all__ = ["CONVERSIONS", "refusal", "convert"]

#: PyG's module type (exactly that type: a subclass's forward may differ) -> its drop-in
CONVERSIONS = {pyg_nn.GCNConv: GCNConv, pyg_nn.SAGEConv: SAGEConv, pyg_nn.GATConv: GATConv,
               pyg_nn.GATv2Conv: GATv2Conv, pyg_nn.GCN2Conv: GCN2Conv, pyg_nn.Linear: Linear}


def refusal(module: torch.nn.Module) -> Optional[str]:
    """Why ``module`` cannot become its drop-in (a setting the drop-in does not support; not a type in
    :data:`CONVERSIONS`), or None: the same conditions the drop-ins' constructors check."""
    kind = type(module)
    if kind not in CONVERSIONS:
        return f"{kind.__module__}.{kind.__name__} has no dgl_exact.pyg drop-in"
    if not isinstance(module, pyg_nn.MessagePassing):
        return None
    if module.decomposed_layers != 1:
        return "decomposed_layers > 1"
    if kind is pyg_nn.SAGEConv:
        if not isinstance(module.aggr, str) or module.aggr not in AGGREGATIONS:
            return f"aggr {module.aggr!r} (supported: {', '.join(map(repr, AGGREGATIONS))})"
    elif module.aggr not in ("add", "sum"):  # (the same in PyG)
        return f"aggr {module.aggr!r} (supported: 'sum')"
    if kind in (pyg_nn.GATConv, pyg_nn.GATv2Conv) and module.lin_edge is not None:
        return "edge_dim (edge features in the attention)"
    return None


def convert(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` turned into its drop-in in place (compression: the configuration in force), or a
    ``ValueError`` saying why it cannot be. Returns ``module``."""
    why = refusal(module)
    if why is not None:
        raise ValueError(f"cannot convert {type(module).__name__}: {why}; keep PyG's module for it")
    module.__class__ = CONVERSIONS[type(module)]
    module.compression = None
    return module
