"""DGL's own graph kernels, bound once: the one place dgl_exact reaches DGL's ``dgl.ops`` functions.

Users route DGL through dgl_exact by replacing names in DGL's namespaces (``dgl.ops.u_mul_e_sum =
dgl_exact.ops.u_mul_e_sum``), and :func:`dgl_exact.ops.message_passing` makes ``update_all``/``apply_edges``
call dgl_exact's ops. dgl_exact's ops in turn run DGL's kernels; were they looked up as ``dgl.ops.<name>`` at
call time, they would find dgl_exact's own functions and recurse. So each is taken once, on first use, from
the DGL module that defines it (``dgl.ops.spmm.gspmm``, not the ``dgl.ops.gspmm`` a user may have replaced),
checked to be DGL's own, and kept here.
"""
from __future__ import annotations

import importlib
import threading
from types import SimpleNamespace

__all__ = ["originals", "named", "ORIGINS"]

#: name -> the DGL module that defines it (``dgl.ops`` re-exports them all with ``import *``)
ORIGINS = {
    "gspmm": "dgl.ops.spmm",
    "gsddmm": "dgl.ops.sddmm",
    "copy_u": "dgl.ops.sddmm",
    "copy_v": "dgl.ops.sddmm",
    "copy_e": "dgl.ops.sddmm",
    "edge_softmax": "dgl.ops.edge_softmax",
    "segment_reduce": "dgl.ops.segment",
    "segment_softmax": "dgl.ops.segment",
    "segment_mm": "dgl.ops.segment",
    "gather_mm": "dgl.ops.gather_mm",
}

_lock = threading.Lock()
_bound = None


def _bind() -> SimpleNamespace:
    from .._compat import import_dgl

    import_dgl()
    found = {}
    for name, module_name in ORIGINS.items():
        # importlib, not attribute access: ``dgl.ops.edge_softmax`` and ``dgl.ops.gather_mm`` name the
        # functions, which shadow their modules of the same name
        fn = getattr(importlib.import_module(module_name), name)
        if getattr(fn, "__module__", None) != module_name:
            raise RuntimeError(
                f"{module_name}.{name} is not DGL's own function (it is {fn!r}): dgl_exact binds DGL's kernels on "
                f"first use; replace names in dgl.ops (dgl.ops.{name} = dgl_exact.ops.{name}), not in DGL's "
                f"submodules, or import dgl_exact and call one of its ops before replacing them")
        found[name] = fn
    return SimpleNamespace(**found)


def originals() -> SimpleNamespace:
    """DGL's own ``gspmm``, ``gsddmm``, ``copy_u``/``copy_v``/``copy_e``, ``edge_softmax``, ``segment_reduce``,
    ``segment_softmax``, ``segment_mm`` and ``gather_mm``, as attributes; bound on the first call."""
    global _bound
    if _bound is None:
        with _lock:
            if _bound is None:
                _bound = _bind()
    return _bound


_named: dict = {}


def named(name: str):
    """DGL's own named graph op ``name`` (``u_mul_e_sum``, ``copy_u_max``, ``u_dot_v``, ``copy_e``, ...), from the
    DGL module that generates it (``dgl.ops.spmm`` or ``dgl.ops.sddmm``); bound on first use, checked like
    :func:`originals`. ``AttributeError`` if DGL has no such op."""
    fn = _named.get(name)
    if fn is None:
        for module_name in ("dgl.ops.spmm", "dgl.ops.sddmm"):
            fn = getattr(importlib.import_module(module_name), name, None)
            if fn is not None:
                break
        else:
            raise AttributeError(f"DGL has no graph op named {name!r}")
        if getattr(fn, "__module__", None) != module_name:
            raise RuntimeError(f"{module_name}.{name} is not DGL's own function (it is {fn!r}): replace names in "
                               f"dgl.ops, not in DGL's submodules")
        _named[name] = fn
    return fn
