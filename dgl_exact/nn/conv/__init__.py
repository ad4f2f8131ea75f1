from .gatconv import GATConv
from .gcn2conv import GCN2Conv
from .graphconv import GraphConv
from .sageconv import SAGEConv

__all__ = ["GraphConv", "SAGEConv", "GATConv", "GCN2Conv"]
