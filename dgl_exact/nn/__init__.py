"""Modules: drop-in DGL convolutions and torch layers that keep compressed activations."""
from .conv import GATConv, GCN2Conv, GraphConv, SAGEConv
from .convert import ConversionReport, compress_model, get_model_config, set_model_config
from .layers import (ELU, GELU, BatchNorm1d, Dropout, LayerNorm, LeakyReLU, Linear, LogSoftmax, PReLU, ReLU,
                     ReLUDropout, SiLU, Softmax)
from .sequential import Sequential

__all__ = ["GraphConv", "SAGEConv", "GATConv", "GCN2Conv", "Linear", "BatchNorm1d", "ReLU", "LeakyReLU", "ELU",
           "Dropout", "ReLUDropout", "LayerNorm", "GELU", "SiLU", "PReLU", "Softmax", "LogSoftmax", "Sequential",
           "compress_model", "ConversionReport", "set_model_config", "get_model_config"]
