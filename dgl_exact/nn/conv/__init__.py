"""Drop-in graph convolutions for :mod:`dgl.nn` (GraphConv, SAGEConv, GATConv, GCN2Conv) that keep their
activations compressed for the backward pass."""
from .gatconv import GATConv
from .gcn2conv import GCN2Conv
from .graphconv import GraphConv, conv_plus_linear
from .sageconv import SAGEConv

__all__ = ["GraphConv", "SAGEConv", "GATConv", "GCN2Conv", "conv_plus_linear"]
