"""Shared plumbing of dgl_exact's modules: per-module compression config and activation mapping."""
from __future__ import annotations

import functools
from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import ops
from ..config import CompressionConfig, resolve_config

_DISABLED = CompressionConfig(enabled=False)


class CompressedModuleMixin:
    """``compression``: a :class:`CompressionConfig` for this module, or None to follow the configuration
    in force (``dgl_exact.config(...)`` scopes, then ``dgl_exact.set_config``). Modules in ``eval()``
    mode compress nothing."""

    compression: Optional[CompressionConfig] = None

    def _init_compression(self, compression: Optional[CompressionConfig]) -> None:
        if compression is not None and not isinstance(compression, CompressionConfig):
            raise TypeError(f"compression must be a dgl_exact.CompressionConfig or None, got {type(compression).__name__}")
        self.compression = compression

    def _config(self) -> CompressionConfig:
        if not self.training:
            return _DISABLED
        return resolve_config(self.compression)


def compressed_activation(act: Optional[Callable], config: Optional[CompressionConfig] = None) -> Optional[Callable]:
    """Map standard activations to their dgl_exact versions (1 bit kept instead of a full tensor).
    ``config``: the calling module's compression (ELU keeps its output compressed with it)."""
    if act is None:
        return None
    if act in (F.relu, torch.relu) or isinstance(act, nn.ReLU):
        return ops.relu
    if act is F.elu or isinstance(act, nn.ELU):
        alpha = act.alpha if isinstance(act, nn.ELU) else 1.0
        return functools.partial(ops.elu, alpha=alpha, config=config)
    if act is F.leaky_relu or isinstance(act, nn.LeakyReLU):
        slope = act.negative_slope if isinstance(act, nn.LeakyReLU) else 0.01
        return functools.partial(ops.leaky_relu, negative_slope=slope)
    return act


def check_feature_rows(st, feat_src) -> None:
    """ValueError naming the node count when the features do not have one row per source node (before an
    elementwise degree normalisation would fail with a bare broadcasting error)."""
    from ..ops.graph import _check_nodes

    _check_nodes(st, feat_src, "src")


def check_zero_in_degree(module, st) -> None:
    if not module._allow_zero_in_degree and st.has_zero_in_degree:
        from dgl import DGLError

        raise DGLError(
            "There are 0-in-degree nodes in the graph, "
            "output for those nodes will be invalid. "
            "This is harmful for some applications, "
            "causing silent performance regression. "
            "Adding self-loop on the input graph by "
            "calling `g = dgl.add_self_loop(g)` will resolve "
            "the issue. Setting ``allow_zero_in_degree`` "
            "to be `True` when constructing this module will "
            "suppress the check and let the code run."
        )
