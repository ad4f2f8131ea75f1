"""Modules: drop-in DGL convolutions and torch layers that keep compressed activations."""
from .conv import GATConv, GCN2Conv, GraphConv, SAGEConv
from .convert import ConversionReport, compress_model
from .layers import ELU, BatchNorm1d, Dropout, LeakyReLU, Linear, ReLU, ReLUDropout

__all__ = ["GraphConv", "SAGEConv", "GATConv", "GCN2Conv", "Linear", "BatchNorm1d", "ReLU", "LeakyReLU", "ELU",
           "Dropout", "ReLUDropout", "compress_model", "ConversionReport"]
