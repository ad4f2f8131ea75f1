"""Which PyG modules have a drop-in here, for a converter that swaps classes in place (as
:func:`dgl_exact.compress_model` converts DGL's convs): a drop-in adds nothing to PyG's instance but its
``compression`` attribute, so ``module.__class__ = CONVERSIONS[type(module)]`` followed by
``module.compression = None`` turns a PyG conv (weights, buffers, caches, hooks and all) into the drop-in,
whatever its settings (:func:`pyg_code` names one that runs PyG's code)."""
from __future__ import annotations

from typing import Optional

import torch
import torch_geometric.nn as pyg_nn

from .gat_conv import GATConv
from .gatv2_conv import GATv2Conv
from .gcn2_conv import GCN2Conv
from .gcn_conv import GCNConv
from .linear import Linear
from .sage_conv import SAGEConv

__all__ = ["CONVERSIONS", "refusal", "pyg_code", "convert"]

#: PyG's module type (exactly that type: a subclass's forward may differ) -> its drop-in
CONVERSIONS = {pyg_nn.GCNConv: GCNConv, pyg_nn.SAGEConv: SAGEConv, pyg_nn.GATConv: GATConv,
               pyg_nn.GATv2Conv: GATv2Conv, pyg_nn.GCN2Conv: GCN2Conv, pyg_nn.Linear: Linear}


def refusal(module: torch.nn.Module) -> Optional[str]:
    """Why ``module`` cannot become a drop-in (its type is not one of :data:`CONVERSIONS`: a subclass's forward
    may differ), or None. Every setting of a known type converts: those without a compressed path run PyG's
    code (:func:`pyg_code`)."""
    kind = type(module)
    if kind not in CONVERSIONS:
        return f"{kind.__module__}.{kind.__name__} has no dgl_exact.pyg drop-in"
    return None


def pyg_code(module: torch.nn.Module) -> Optional[str]:
    """The setting of ``module`` (one of :data:`CONVERSIONS`' PyG types, or its drop-in) for which its drop-in
    runs PyG's own code, what it saves compressed by :func:`dgl_exact.compress_saved`
    (:meth:`~._base.CompressedMixin.pyg_setting`: ``decomposed_layers > 1``, an aggregation the drop-in does not
    compute, GAT's and GATv2's ``edge_dim``), or None."""
    target = CONVERSIONS.get(type(module), type(module))
    setting = getattr(target, "pyg_setting", None)
    return setting(module) if setting is not None else None


def convert(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` turned into its drop-in in place (compression: the configuration in force), or a
    ``ValueError`` saying why it cannot be. Returns ``module``."""
    why = refusal(module)
    if why is not None:
        raise ValueError(f"cannot convert {type(module).__name__}: {why}; keep PyG's module for it")
    module.__class__ = CONVERSIONS[type(module)]
    module.compression = None
    return module
