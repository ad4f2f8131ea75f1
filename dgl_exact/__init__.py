"""dgl_exact: train graph neural networks with compressed activations, on DGL.

The forward pass is exact; the activations autograd keeps for the backward pass are stored compressed
(stochastic quantization to 1/2/4/8 bits, optional random projection, block-wise groups with
variance-optimal levels), following EXACT (Liu et al., ICLR 2022) and i-EXACT (Eliassen and Selvan,
ICASSP 2024).

``import dgl_exact`` imports neither torch nor DGL: every public name (``dgl_exact.GraphConv``,
``from dgl_exact import compress``) and every subpackage (``dgl_exact.data``) is imported on first use
(PEP 562), so the ``dgl-exact`` command answers ``--help`` without them and the core works without DGL
(naming a part of the DGL front end, ``dgl_exact.nn`` and its layers, then raises the install hint).
"""
import importlib as _importlib
import sys as _sys

__version__ = "0.2.0"

# public name -> the module (relative to this package) that defines it
_PUBLIC = {
    "CompressedTensor": ".compression", "compress": ".compression", "decompress": ".compression",
    "CompressionConfig": ".compression_config", "config": ".compression_config",
    "get_config": ".compression_config", "set_config": ".compression_config",
    "backend": ".kernels",
    "GATConv": ".nn", "GCN2Conv": ".nn", "GraphConv": ".nn", "SAGEConv": ".nn", "compress_model": ".nn",
    "get_model_config": ".nn", "set_model_config": ".nn",
    "explain": ".nn.paths",
    "donate": ".ops.donation",
    "message_passing": ".ops.routing",
    "mark_symmetric": ".ops.structure",
    "compress_saved": ".saved_tensors", "keep_exact": ".saved_tensors",
}
# subpackages and modules reachable as attributes after a plain ``import dgl_exact`` (as they were when the
# package imported its core eagerly), each imported on first access
_SUBMODULES = ("memory", "nn", "ops", "compression", "compression_config", "kernels", "saved_tensors", "tracing",
               "data", "training", "planning", "bench", "cli", "errors")


def _install_dgl_finder() -> None:
    """Make a later plain ``import dgl`` (the user's, after ``import dgl_exact``) install DGL's graphbolt
    placeholder first where needed, without importing anything now (:mod:`_dgl_exact_import_hook`; dgl_exact's
    own modules import DGL through :func:`dgl_exact._compat.import_dgl`, which does the same)."""
    try:
        import _dgl_exact_import_hook as hook
    except ImportError:  # pragma: no cover (installed with the package)
        return
    if "dgl" not in _sys.modules and not any(isinstance(f, hook._FirstDGLImport) for f in _sys.meta_path):
        _sys.meta_path.insert(0, hook._FirstDGLImport())


_install_dgl_finder()


def __getattr__(name):
    module = _PUBLIC.get(name)
    if module is not None:
        value = getattr(_importlib.import_module(module, __name__), name)
        globals()[name] = value  # looked up once
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")  # the import also binds it as an attribute
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC) | set(_SUBMODULES))


__all__ = ["CompressionConfig", "config", "get_config", "set_config", "compress", "decompress",
           "CompressedTensor", "backend", "donate", "mark_symmetric", "explain", "compress_saved", "keep_exact",
           "GraphConv", "SAGEConv", "GATConv", "GCN2Conv", "compress_model", "set_model_config", "get_model_config",
           "message_passing", "ops", "nn",
           "memory",
           "__version__"]
