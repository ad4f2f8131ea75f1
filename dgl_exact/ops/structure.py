"""The sparse structure of a DGL graph on the device the features live on.

PyPI's DGL is CPU-only, so a graph stays on the CPU while features may live on a GPU. A
:class:`GraphStructure` is exported once per (graph, device) and cached: CSC (in-edges grouped by
destination: forward aggregation) and CSR (out-edges grouped by source: the transposed aggregation of
backward), each with the edge ids of its stored edges, plus degrees. The cache entry dies with the
graph's structure object: DGL replaces it when the graph is mutated (``add_edges``, ...), which
invalidates the cache automatically.

Aggregation kernels are picked here: with a CPU graph and CPU features, DGL's own multithreaded C
kernels; anywhere else (GPU), dgl_exact's kernels on torch tensors (never DGL's C kernels).
"""
from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Dict, Optional, Tuple

import torch

from .. import kernels
from .._compat import import_dgl

dgl = import_dgl()
from dgl import _sparse_ops as _dgl_sparse  # noqa: E402  (raw, autograd-free DGL kernels)

__all__ = ["GraphStructure", "structure_of", "clear_cache", "device_kernels_only"]

_cache: Dict[int, Dict[str, "GraphStructure"]] = {}
_lock = threading.Lock()


class _Settings(threading.local):
    dgl_on_cpu = True


_settings = _Settings()


@contextlib.contextmanager
def device_kernels_only():
    """Within this scope CPU aggregation uses dgl_exact's torch kernels instead of DGL's C kernels: the
    exact code path that GPU features take (used by tests to exercise it on the CPU)."""
    previous = _settings.dgl_on_cpu
    _settings.dgl_on_cpu = False
    try:
        yield
    finally:
        _settings.dgl_on_cpu = previous


def _check_graph(g) -> None:
    if not isinstance(g, dgl.DGLGraph):
        raise TypeError(f"expected a dgl.DGLGraph (graph or block), got {type(g).__name__}")
    if len(g.canonical_etypes) != 1:
        raise ValueError(f"dgl_exact ops support graphs with a single edge type; this graph has "
                         f"{len(g.canonical_etypes)} ({g.canonical_etypes}). Convert with dgl.to_homogeneous "
                         "or apply the module per edge type (e.g. with dgl.nn.HeteroGraphConv).")


class GraphStructure:
    """CSC/CSR index tensors of one single-edge-type graph (or block) on one device."""

    def __init__(self, g, device: torch.device):
        self.device = torch.device(device)
        self.num_src = g.num_src_nodes()
        self.num_dst = g.num_dst_nodes()
        self.num_edges = g.num_edges()
        self._gidx = g._graph
        self._dgl_capable = self.device.type == "cpu" and g.device.type == "cpu"
        self._rev = None
        self._csc = self._csr = None
        self._src = self._dst = None
        self._in_deg = self._out_deg = None
        self._has_zero = None
        self._graph_ref = weakref.ref(g)

    @property
    def use_dgl(self) -> bool:
        """Whether DGL's C kernels serve this structure (CPU graph and CPU features, not disabled)."""
        return self._dgl_capable and _settings.dgl_on_cpu

    # --- index tensors, exported lazily -------------------------------------------------------
    @property
    def csc(self) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(indptr over dst, src of each in-edge, edge ids) on the device."""
        if self._csc is None:
            self._csc = _to_device(*_adj_tensors(self._graph_ref(), "csc"), self.device)
        return self._csc

    @property
    def csr(self) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(indptr over src, dst of each out-edge, edge ids) on the device."""
        if self._csr is None:
            self._csr = _to_device(*_adj_tensors(self._graph_ref(), "csr"), self.device)
        return self._csr

    @property
    def src(self) -> torch.Tensor:
        """Source node of every edge, in edge-id order."""
        if self._src is None:
            self._edge_endpoints()
        return self._src

    @property
    def dst(self) -> torch.Tensor:
        if self._dst is None:
            self._edge_endpoints()
        return self._dst

    def _edge_endpoints(self):
        g = self._graph_ref()
        src, dst = g.edges(order="eid")
        self._src = src.to(self.device, non_blocking=True)
        self._dst = dst.to(self.device, non_blocking=True)

    @property
    def has_zero_in_degree(self) -> bool:
        """Whether some destination node has no in-edge (computed once, on the CPU graph)."""
        if self._has_zero is None:
            self._has_zero = bool((self._graph_ref().in_degrees() == 0).any())
        return self._has_zero

    def in_degrees(self) -> torch.Tensor:
        if self._in_deg is None:
            self._in_deg = self._graph_ref().in_degrees().to(self.device)
        return self._in_deg

    def out_degrees(self) -> torch.Tensor:
        if self._out_deg is None:
            self._out_deg = self._graph_ref().out_degrees().to(self.device)
        return self._out_deg

    @property
    def reverse_gidx(self):
        if self._rev is None:
            self._rev = self._gidx.reverse()
        return self._rev

    def static_tensors(self):
        """Every tensor this cache holds (a memory meter counts them as static, not activation)."""
        out = []
        for group in (self._csc, self._csr):
            if group is not None:
                out.extend(t for t in group if t is not None)
        out.extend(t for t in (self._src, self._dst, self._in_deg, self._out_deg) if t is not None)
        return out

    # --- kernels --------------------------------------------------------------------------------
    def aggregate(self, x: torch.Tensor, w: Optional[torch.Tensor] = None, transpose: bool = False) -> torch.Tensor:
        """``out[v] = sum_{(u, v)} w[e] * x[u]`` (``transpose``: from destinations back to sources).
        ``x [n, H, D]``; ``w [E, H]`` or None. Returns ``[n_out, H, D]``."""
        n_out = self.num_src if transpose else self.num_dst
        if self.use_dgl:
            gidx = self.reverse_gidx if transpose else self._gidx
            xin, win = _dgl_dtype(x), None if w is None else _dgl_dtype(w)[..., None]
            op = "copy_lhs" if w is None else "mul"
            out = _dgl_sparse._gspmm(gidx, op, "sum", xin, win)[0]
            return out.to(x.dtype)
        indptr, indices, eids = self.csr if transpose else self.csc
        # kernels compute in the dtype they are given: autocast must not recast their internal products
        # (on the CPU it turns the sparse product into a bf16 one torch does not implement)
        with torch.autocast(x.device.type, enabled=False):
            return kernels.get("spmm_sum", x.device)(indptr, indices, eids, x, w, n_out)

    def aggregate_minmax(self, x: torch.Tensor, reduce: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """Max/min over in-edges and the source node attaining it (``-1`` without in-edges)."""
        if self.use_dgl:
            out, (arg_u, _) = _dgl_sparse._gspmm(self._gidx, "copy_lhs", reduce, _dgl_dtype(x), None)
            arg_u = arg_u.long()
            arg_u = torch.where(arg_u >= self.num_src, torch.full_like(arg_u, -1), arg_u)
            if self.has_zero_in_degree:
                # DGL's raw kernel leaves -inf/+inf and arg 0 where a destination has no in-edge (its
                # message passing replaces the infinities with 0 afterwards): output 0, no source
                empty = (self.in_degrees() == 0).view(-1, *([1] * (out.dim() - 1)))
                out = out.masked_fill(empty, 0.0)
                arg_u = arg_u.masked_fill(empty, -1)
            return out.to(x.dtype), arg_u
        indptr, indices, eids = self.csc
        return kernels.get("spmm_minmax", x.device)(indptr, indices, eids, x, reduce, self.num_dst)

    def edge_dot(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``out[e] = <a[src(e)], b[dst(e)]>`` over the last dim: ``[n_src, H, D] x [n_dst, H, D] -> [E, H]``."""
        if self.use_dgl:
            return _dgl_sparse._gsddmm(self._gidx, "dot", _dgl_dtype(a), _dgl_dtype(b), "u", "v")[..., 0].to(a.dtype)
        indptr, indices, eids = self.csc
        return kernels.get("sddmm_dot", a.device)(indptr, indices, eids, a, b)

    def edge_sum_to(self, e: torch.Tensor, side: str) -> torch.Tensor:
        """Sum per-edge values ``[E, ...]`` onto destination (``side='dst'``) or source nodes."""
        n = self.num_dst if side == "dst" else self.num_src
        index = self.dst if side == "dst" else self.src
        out = e.new_zeros((n,) + tuple(e.shape[1:]))
        return out.index_add_(0, index, e)


def _dgl_dtype(x: torch.Tensor) -> torch.Tensor:
    # DGL's CPU kernels handle fp32/fp64; compute low precision in fp32.
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _adj_tensors(g, fmt):
    indptr, indices, eids = g.adj_tensors(fmt)
    if eids is not None and eids.numel() and bool((eids == torch.arange(eids.numel())).all()):
        eids = None  # identity permutation: skip the gather in kernels
    return indptr, indices, eids


def _to_device(indptr, indices, eids, device):
    return (indptr.to(device), indices.to(device), None if eids is None else eids.to(device))


def structure_of(g, device) -> GraphStructure:
    """The cached :class:`GraphStructure` of ``g`` on ``device`` (created on first use)."""
    _check_graph(g)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if g.device.type != "cpu" and g.device != device:
        raise ValueError(f"the graph is on {g.device} but the features are on {device}; move one of them "
                         f"(g = g.to('{device}') or feat = feat.to('{g.device}')); a CPU graph works with "
                         "features on any device")
    gidx = g._graph
    key = id(gidx)
    dev_key = str(device)
    with _lock:
        per_graph = _cache.get(key)
        if per_graph is None:
            per_graph = {}
            _cache[key] = per_graph
            weakref.finalize(gidx, _cache.pop, key, None)
        entry = per_graph.get(dev_key)
        if entry is None or entry._graph_ref() is None:
            entry = GraphStructure(g, device)
            per_graph[dev_key] = entry
        elif entry._graph_ref() is not g:
            entry._graph_ref = weakref.ref(g)  # same structure, another DGLGraph wrapper (local_scope)
    return entry


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def cached_static_tensors():
    """All tensors held by structure caches (for memory meters)."""
    with _lock:
        entries = [e for per in _cache.values() for e in per.values()]
    return [t for e in entries for t in e.static_tensors()]


def _edge_softmax_torch(st: GraphStructure, e: torch.Tensor) -> torch.Tensor:
    dst = st.dst
    shape = (st.num_dst,) + tuple(e.shape[1:])
    emax = e.new_full(shape, float("-inf")).scatter_reduce_(
        0, dst.view(-1, *([1] * (e.dim() - 1))).expand_as(e), e, reduce="amax", include_self=True)
    ex = (e - emax[dst]).exp()
    return ex / st.edge_sum_to(ex, "dst")[dst]


def edge_softmax_forward(st: GraphStructure, e: torch.Tensor) -> torch.Tensor:
    """Softmax of per-edge scores ``[E, H]`` over the in-edges of each destination node."""
    if st.use_dgl:
        return _dgl_sparse._edge_softmax_forward(st._gidx, _dgl_dtype(e), "copy_rhs").to(e.dtype)
    return _edge_softmax_torch(st, e)
