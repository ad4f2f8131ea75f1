"""PyTorch Geometric drop-ins with compressed saved activations (``pip install "dgl-exact[pyg]"``).

Each conv subclasses PyG's (same constructor, ``forward`` signature, parameters and ``state_dict``, so a PyG
checkpoint loads into it and back) and computes the same output; in training the activations it keeps for
backward are compressed under its ``compression`` (or the configuration in force), on dgl_exact's own
aggregation kernels over the graph read from ``edge_index`` (:mod:`.structure`), without a DGL graph.
A conv on which a PyG hook is registered (``register_propagate_forward_hook`` and the like) or ``explain`` is
set runs PyG's own forward instead (uncompressed): those hooks see per-edge tensors the fused ops never form.
Every constructor argument PyG's class takes is accepted: a setting no compressed path here computes
(``decomposed_layers > 1``, SAGE's ``lstm``, learnable or several aggregations, GAT's and GATv2's ``edge_dim``:
:func:`pyg_code`) runs PyG's own code, what it saves for backward compressed by :func:`dgl_exact.compress_saved`
at the conv's configuration. ``torch.jit.script`` compiles PyG's class over the drop-in's weights (uncompressed).

Besides PyG's arguments, every drop-in takes ``compression``: this module's
:class:`~dgl_exact.CompressionConfig` (default None: the configuration in force); the convs pass their other
keyword arguments (``**kwargs``) to :class:`torch_geometric.nn.MessagePassing` (``flow``).
"""
try:
    import torch_geometric  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("dgl_exact.pyg needs PyTorch Geometric: pip install 'dgl-exact[pyg]' "
                      "(torch_geometric>=2.8)") from exc

from .gat_conv import GATConv
from .gatv2_conv import GATv2Conv
from .gcn2_conv import GCN2Conv
from .gcn_conv import GCNConv
from .linear import Linear
from .sage_conv import SAGEConv
from .structure import EdgeStructure
from .conversions import CONVERSIONS, convert, pyg_code, refusal

__all__ = ["GCNConv", "SAGEConv", "GATConv", "GATv2Conv", "GCN2Conv", "Linear", "EdgeStructure", "CONVERSIONS",
           "convert", "pyg_code", "refusal"]
