"""Modules: drop-in DGL convolutions and torch layers that keep compressed activations.

The DGL convs (``GraphConv``, ``SAGEConv``, ``GATConv``, ``GCN2Conv``, in :mod:`.conv`) are imported on first use
(PEP 562): the layers, ``Sequential`` and :func:`compress_model` (which converts torch's and PyG's modules, and
DGL's where DGL is loaded) work where DGL is not installed; naming a DGL conv there raises the install hint."""
import importlib as _importlib

from .convert import ConversionReport, compress_model, get_model_config, set_model_config
from .layers import (ELU, GELU, BatchNorm1d, Dropout, LayerNorm, LeakyReLU, Linear, LogSoftmax, PReLU, ReLU,
                     ReLUDropout, SiLU, Softmax)
from .sequential import Sequential

_CONVS = ("GraphConv", "SAGEConv", "GATConv", "GCN2Conv", "conv_plus_linear")


def __getattr__(name):
    if name in _CONVS:
        value = getattr(_importlib.import_module(".conv", __name__), name)
        globals()[name] = value  # looked up once
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_CONVS))


__all__ = ["GraphConv", "SAGEConv", "GATConv", "GCN2Conv", "conv_plus_linear", "Linear", "BatchNorm1d", "ReLU",
           "LeakyReLU", "ELU",
           "Dropout", "ReLUDropout", "LayerNorm", "GELU", "SiLU", "PReLU", "Softmax", "LogSoftmax", "Sequential",
           "compress_model", "ConversionReport", "set_model_config", "get_model_config"]
