"""dgl_exact: train graph neural networks with compressed activations, on DGL.

The forward pass is exact; the activations autograd keeps for the backward pass are stored compressed
(stochastic quantization to 1/2/4/8 bits, optional random projection, block-wise groups with
variance-optimal levels), following EXACT (Liu et al., ICLR 2022) and i-EXACT (Eliassen and Selvan,
ICASSP 2024).
"""
from ._compat import import_dgl as _import_dgl

_import_dgl()  # makes ``import dgl`` work on torch versions DGL 2.1.0 ships no graphbolt for

from .compression import CompressedTensor, compress, decompress  # noqa: E402
from .compression_config import CompressionConfig, config, get_config, set_config  # noqa: E402
from .kernels import backend  # noqa: E402
from . import memory, nn, ops  # noqa: E402
from .nn import GATConv, GCN2Conv, GraphConv, SAGEConv, compress_model, get_model_config, set_model_config  # noqa: E402
from .nn.paths import explain  # noqa: E402
from .ops.keep import donate  # noqa: E402
from .ops.routing import message_passing  # noqa: E402
from .ops.structure import mark_symmetric  # noqa: E402
from .saved_tensors import compress_saved, keep_exact  # noqa: E402

__version__ = "0.2.0"

# Subpackages loaded on first attribute access (``dgl_exact.data.load_dataset(...)`` after a plain
# ``import dgl_exact``): they pull in dataset, training and CLI dependencies that most scripts never use.
_LAZY_SUBMODULES = ("data", "training", "planning", "bench", "cli", "errors")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")  # the import also binds it as an attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY_SUBMODULES))

__all__ = ["CompressionConfig", "config", "get_config", "set_config", "compress", "decompress",
           "CompressedTensor", "backend", "donate", "mark_symmetric", "explain", "compress_saved", "keep_exact",
           "GraphConv", "SAGEConv", "GATConv", "GCN2Conv", "compress_model", "set_model_config", "get_model_config",
           "message_passing", "ops", "nn",
           "memory",
           "__version__"]
