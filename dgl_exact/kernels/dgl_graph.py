"""The ``dgl`` backend: DGL's own multithreaded C kernels for the graph ops, on CPU tensors.

Same results as the reference (:mod:`.reference`) up to summation order, but the functions take DGL's
graph index (``HeteroGraphIndex`` of a single-edge-type graph, on the CPU) in place of the CSR triple
``(indptr, indices, eids)``: DGL's kernels read the graph in its own formats, so no CSR is exported for
them. :class:`dgl_exact.ops.structure.GraphStructure` passes the graph index when the registry chose this
backend (:func:`dgl_exact.kernels.chosen`). DGL's CPU kernels compute fp32/fp64; fp16/bf16 go through fp32.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.utils.dlpack

from . import register

__all__ = ["load"]

_sparse = None  # dgl._sparse_ops: raw, autograd-free DGL kernels


def _dgl_dtype(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def spmm_sum(gidx, x, w, n_dst):
    """``out[v] = sum_{(u, v)} w[e] * x[u]`` over ``gidx``'s edges: ``x [n_src, H, D]``, ``w [E, H]`` or None.

    DGL's kernel called as ``dgl._sparse_ops._gspmm`` calls it, but with the output handed over without that
    wrapper's view check, which creates the output's Python storage object (see
    :func:`dgl_exact._compat.storage_ptr`): a gradient formed here could then not be summed into in place."""
    u = _dgl_dtype(x)
    win = None if w is None else _dgl_dtype(w)[..., None]
    out = torch.zeros((n_dst,) + tuple(u.shape[1:]), dtype=u.dtype, device=u.device)
    if gidx.num_edges(0) > 0 and out.numel():
        null = _sparse.nd.NULL["int64"]
        _sparse._CAPI_DGLKernelSpMM(gidx, "copy_lhs" if w is None else "mul", "sum", _sparse.to_dgl_nd(u),
                                     _sparse.to_dgl_nd(win), _sparse.nd.from_dlpack(torch.utils.dlpack.to_dlpack(out)),
                                     null, null)
    return out.to(x.dtype)


def csc_graph_index(indptr, indices, eids, num_src: int, num_dst: int):
    """DGL's graph index of a CSC (rows: destinations; ``eids`` the edge id of each stored edge), every
    format allowed: what DGL's kernels take in place of the CSR triple."""
    from dgl import heterograph_index

    return heterograph_index.create_unitgraph_from_csr(2, num_src, num_dst, indptr, indices, eids,
                                                       ["coo", "csr", "csc"], True)


def spmm_minmax(gidx, x, reduce, n_dst):
    """Max/min over in-edges and the source attaining it; ``-1`` and output 0 without in-edges."""
    out, (arg_u, _) = _sparse._gspmm(gidx, "copy_lhs", reduce, _dgl_dtype(x), None)
    n_src = x.shape[0]
    arg_u = arg_u.long()
    arg_u = torch.where(arg_u >= n_src, torch.full_like(arg_u, -1), arg_u)
    # DGL's raw kernel leaves -inf/+inf where a destination has no in-edge (its message passing replaces
    # them with 0 afterwards), and an arbitrary arg: output 0, no source
    dtype = torch.int32 if gidx.dtype == "int32" else torch.int64
    deg = gidx.in_degrees(0, torch.arange(n_dst, dtype=dtype))
    no_edge = (deg == 0).view(-1, *([1] * (out.dim() - 1)))
    out = out.masked_fill(no_edge, 0.0)
    arg_u = arg_u.masked_fill(no_edge, -1)
    return out.to(x.dtype), arg_u


def _sddmm_graph(gidx):
    """``gidx`` as DGL's SDDMM can read it: that kernel takes a COO or a CSR, and picks the CSC of a graph
    whose COO is not allowed (one restricted to CSC and CSR): such a graph is given as its CSR alone (the
    same arrays, no copy)."""
    formats = gidx.formats()
    if "coo" in formats["created"] or "coo" in formats["not created"]:
        return gidx
    return gidx.formats(["csr"])


def sddmm_dot(gidx, a, b):
    """Per-edge ``<a[src], b[dst]>`` over the last dim, ``[E, H]`` in edge-id order."""
    return _sparse._gsddmm(_sddmm_graph(gidx), "dot", _dgl_dtype(a), _dgl_dtype(b), "u", "v")[..., 0].to(a.dtype)


def edge_softmax(gidx, e):
    """Softmax of per-edge scores ``[E, H]`` over each destination's in-edges."""
    return _sparse._edge_softmax_forward(gidx, _dgl_dtype(e), "copy_rhs").to(e.dtype)


def load() -> Optional[str]:
    """Register DGL's CPU graph kernels; None, or why DGL's kernels are not usable."""
    global _sparse
    try:
        from .._compat import import_dgl

        import_dgl()
        from dgl import _sparse_ops
    except Exception as exc:
        return f"DGL's kernels are not importable ({type(exc).__name__}: {exc})"
    _sparse = _sparse_ops
    for fn in (spmm_sum, spmm_minmax, sddmm_dot, edge_softmax):
        register(fn.__name__, "dgl", devices=("cpu",))(fn)
    return None
