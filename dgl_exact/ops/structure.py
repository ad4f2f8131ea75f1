"""The sparse structure of a DGL graph on the device the features live on (DGL itself is not imported here).

PyPI's DGL is CPU-only, so a graph stays on the CPU while features may live on a GPU. A
:class:`GraphStructure` is exported once per (graph, device) and cached: CSC (in-edges grouped by
destination: forward aggregation) and CSR (out-edges grouped by source: the transposed aggregation of
backward), each with the edge ids of its stored edges, plus degrees.

The cache is keyed on the graph's structure object (``g._graph``, shared by every wrapper of one graph,
e.g. ``local_scope``) and holds it only weakly: an entry dies with its graph (refcount, no GC cycle), and
DGL replaces the structure object when the graph is mutated (``add_edges``, ...), which invalidates the
entry automatically. Nothing in an entry refers to the key: a :class:`GraphStructure` reads the graph
through its own handle on the same C++ graph (``copy_to`` its own device returns the same graph under a
new Python object), so a structure kept by autograd for backward stays usable after the user dropped the
graph, while the cache lets go. As a backstop, at most :data:`MAX_CACHED_GRAPHS` graphs are cached (least
recently used evicted first: an evicted entry is simply rebuilt on its next use).

Aggregation kernels are picked by the kernel registry (:mod:`dgl_exact.kernels`), like every other op: on
CPU tensors its ``dgl`` backend (DGL's own multithreaded C kernels, which take the graph index), on CUDA
tensors dgl_exact's kernels on the CSR tensors exported here.
"""
from __future__ import annotations

import collections
import sys
import threading
import weakref
from typing import Dict, List, Optional, Tuple

import torch

from .. import kernels
from ..kernels import reference
from ..tracing import active as tracing_active, assume_constant
from .traced_graph import CapturedStructure, handle_of
# No ``import dgl`` here: this module (and the ops on it) work without DGL installed, on structures built
# from index tensors (:mod:`.index_structure`); only a DGL graph's export reads DGL.
__all__ = ["GraphStructure", "structure_of", "clear_cache", "cache_size", "device_kernels_only",
           "MAX_CACHED_GRAPHS", "mark_symmetric", "is_symmetric"]

#: Most graphs whose structure is cached at once (least recently used evicted first). Entries of deleted
#: graphs go at once anyway; this bounds what graphs kept alive by the caller can pin (device copies).
MAX_CACHED_GRAPHS = 1024


class _Record:
    """The cache entry of one graph: its structure per device, and the finalizer that drops the entry
    when the graph's structure object dies (holds the key only weakly)."""

    __slots__ = ("per_device", "finalizer", "symmetric")

    def __init__(self):
        self.per_device: Dict[str, "GraphStructure"] = {}
        self.finalizer = None
        self.symmetric = False  # checked and recorded by mark_symmetric


_cache: "collections.OrderedDict[int, _Record]" = collections.OrderedDict()
_lock = threading.Lock()
# keys of dead graphs whose finalizer found the lock taken (by another thread, or by this one when the
# collector ran inside a locked region): removed by the next holder of the lock
_pending: List[Tuple[int, _Record]] = []


def device_kernels_only():
    """A scope in which CPU graph ops use dgl_exact's kernels instead of DGL's C kernels: the code path
    CUDA features take (used by tests and the step counter to exercise it on the CPU). It is the kernel
    registry's ``kernels.exclude("dgl")``."""
    return kernels.exclude("dgl")


def _check_graph(g) -> None:
    # a DGLGraph exists only once dgl is imported: nothing to import here
    graph_type = getattr(sys.modules.get("dgl"), "DGLGraph", None)
    if graph_type is None or not isinstance(g, graph_type):
        raise TypeError(f"expected a dgl.DGLGraph (graph or block), got {type(g).__name__}")
    if len(g.canonical_etypes) != 1:
        raise ValueError(f"dgl_exact ops support graphs with a single edge type; this graph has "
                         f"{len(g.canonical_etypes)} ({g.canonical_etypes}). Convert with dgl.to_homogeneous "
                         "or apply the module per edge type (e.g. with dgl.nn.HeteroGraphConv).")


class GraphStructure:
    """CSC/CSR index tensors of one single-edge-type graph (or block) on one device."""

    def __init__(self, g, device: torch.device, symmetric: bool = False):
        self.device = torch.device(device)
        #: the graph equals its transpose (checked by :func:`mark_symmetric`): transposed aggregations without
        #: edge weights run on the forward's format (CSC), so a graph may hold that format alone
        self.symmetric = symmetric
        self.num_src = g.num_src_nodes()
        self.num_dst = g.num_dst_nodes()
        self.num_edges = g.num_edges()
        self.is_block = g.is_block
        # our own Python handle on the same C++ graph (copy_to its own context returns the graph itself):
        # never the cache key ``g._graph``, which the cache must not keep alive
        self._gidx = g._graph.copy_to(g._graph.ctx)
        self._rev = None
        self._csc = self._csr = None
        self._src = self._dst = None
        self._in_deg = self._out_deg = None
        self._has_zero = None

    def _kernel(self, op: str, transpose: bool = False, side: str = "csc"):
        """``(function, graph arguments)`` for ``op`` as the registry chose it for this device: DGL's graph
        index for the ``dgl`` backend (a CPU graph: structure_of refuses a GPU graph with CPU features),
        else the CSR triple (``csr`` when ``transpose``)."""
        fn = kernels.get(op, self.device)
        if kernels.chosen(op, self.device) == "dgl":
            return fn, (self.reverse_gidx if transpose else self._gidx,)
        return fn, (self.csr if transpose else self.csc)

    # --- index tensors, exported lazily -------------------------------------------------------
    @property
    def csc(self) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(indptr over dst, src of each in-edge, edge ids) on the device."""
        if self._csc is None:
            self._csc = _to_device(*_adj_tensors(self._gidx, "csc"), self.device)
        return self._csc

    @property
    def csr(self) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """(indptr over src, dst of each out-edge, edge ids) on the device; for a graph restricted to CSC
        (:func:`~dgl_exact.data.compact.compact_graph`) regrouped from its CSC (the transposed weighted sum
        of GAT's backward needs it)."""
        if self._csr is None:
            if _allows(self._gidx, "csr"):
                self._csr = _to_device(*_adj_tensors(self._gidx, "csr"), self.device)
            else:
                indptr, indices, eids = self.csc
                ptr, dst, perm = grouped(indices.long(), reference.csr_rows(indptr, indices.numel()), self.num_src)
                self._csr = (ptr, dst, eids if perm is None else (perm if eids is None else eids[perm]))
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
        src, dst = _endpoints(self._gidx, "src"), _endpoints(self._gidx, "dst")
        self._src = src.to(self.device, non_blocking=True)
        self._dst = dst.to(self.device, non_blocking=True)

    def _graph_degrees(self, side: str) -> torch.Tensor:
        """Degrees on the graph's device: in-degrees of the destination nodes or out-degrees of the sources."""
        if side == "in":
            return self._gidx.in_degrees(0, self._node_ids(self.num_dst))
        if _allows(self._gidx, "coo", "csr"):
            return self._gidx.out_degrees(0, self._node_ids(self.num_src))
        # a graph holding its CSC alone (DGL computes out-degrees from a COO or CSR only): count each source
        # among the CSC's indices
        indices = _adj_tensors(self._gidx, "csc")[1]
        return torch.bincount(indices, minlength=self.num_src).to(indices.dtype)

    def _node_ids(self, n: int) -> torch.Tensor:
        dtype = torch.int32 if self._gidx.dtype == "int32" else torch.int64
        return torch.arange(n, dtype=dtype, device=_torch_device(self._gidx.ctx))

    @property
    def has_zero_in_degree(self) -> bool:
        """Whether some destination node has no in-edge (computed once, on the CPU graph)."""
        if self._has_zero is None:
            self._has_zero = bool((self._graph_degrees("in") == 0).any())
        return self._has_zero

    def in_degrees(self) -> torch.Tensor:
        if self._in_deg is None:
            self._in_deg = self._graph_degrees("in").to(self.device)
        return self._in_deg

    def out_degrees(self) -> torch.Tensor:
        if self._out_deg is None:
            self._out_deg = self._graph_degrees("out").to(self.device)
        return self._out_deg

    def node_norm(self, degrees: str, kind: str, dtype: torch.dtype) -> torch.Tensor:
        """Per node, ``deg^-1/2`` (``kind`` 'sqrt') or ``1 / deg`` ('inv'), ``deg`` its out-degree (``degrees``
        'out') or in-degree ('in'), clamped at 1: the factors :meth:`src_edge_norm` spreads over the edges.
        Not cached (one value per node)."""
        deg = (self.out_degrees() if degrees == "out" else self.in_degrees()).to(dtype).clamp(min=1)
        return torch.pow(deg, -0.5) if kind == "sqrt" else 1.0 / deg

    def src_edge_norm(self, degrees: str, kind: str, dtype: torch.dtype) -> torch.Tensor:
        """Per edge (edge-id order), its source node's factor :meth:`node_norm`: GCN's source normalisation
        as an edge value, so that the forward aggregates ``x`` itself (no layer-sized ``x * norm``). Not
        cached: built for the call (one value per edge, ``E`` x 4 bytes while the aggregation runs) from the
        sources DGL holds: a structure cache kept for the whole run would hold it through every step's
        peak, where backward needs no per-edge value (:func:`~dgl_exact.ops.src_norm_sum`)."""
        norm = self.node_norm(degrees, kind, dtype)
        if self._src is not None:
            src = self._src
        elif self._csc is not None and self._csc[2] is None:  # edge ids are CSC positions: its indices
            src = self._csc[1]
        else:
            src = _endpoints(self._gidx, "src").to(self.device)
        return norm[src]

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

    def nbytes(self) -> int:
        """Bytes of the tensors this cache holds (:meth:`static_tensors`, each storage once)."""
        seen, total = set(), 0
        for t in self.static_tensors():
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total

    # --- kernels --------------------------------------------------------------------------------
    def aggregate(self, x: torch.Tensor, w: Optional[torch.Tensor] = None, transpose: bool = False) -> torch.Tensor:
        """``out[v] = sum_{(u, v)} w[e] * x[u]`` (``transpose``: from destinations back to sources).
        ``x [n, H, D]``; ``w [E, H]`` or None. Returns ``[n_out, H, D]``."""
        if transpose and w is None and self.symmetric:
            transpose = False  # A^T == A: the forward's format (CSC) serves; sums in another order only
        n_out = self.num_src if transpose else self.num_dst
        fn, graph = self._kernel("spmm_sum" if w is None else "spmm_weighted_sum", transpose)
        # kernels compute in the dtype they are given: autocast must not recast their internal products
        # (on the CPU it turns the sparse product into a bf16 one torch does not implement)
        with torch.autocast(x.device.type, enabled=False):
            return fn(*graph, x, w, n_out)

    def aggregate_minmax(self, x: torch.Tensor, reduce: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """Max/min over in-edges and the source node attaining it (``-1`` without in-edges)."""
        fn, graph = self._kernel("spmm_minmax")
        return fn(*graph, x, reduce, self.num_dst)

    def edge_dot(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``out[e] = <a[src(e)], b[dst(e)]>`` over the last dim: ``[n_src, H, D] x [n_dst, H, D] -> [E, H]``."""
        fn, graph = self._kernel("sddmm_dot")
        return fn(*graph, a, b)

    def edge_sum_to(self, e: torch.Tensor, side: str) -> torch.Tensor:
        """Sum per-edge values ``[E, ...]`` onto destination (``side='dst'``) or source nodes."""
        n = self.num_dst if side == "dst" else self.num_src
        index = self.dst if side == "dst" else self.src
        out = e.new_zeros((n,) + tuple(e.shape[1:]))
        return out.index_add_(0, index, e)


def format_arrays(gidx, fmt: str, etype: int = 0):
    """DGL's arrays of format ``fmt`` ('csr', 'csc', 'coo') of edge type ``etype`` of the graph index ``gidx``, as
    torch tensors: ``(indptr, indices, eids)`` (the CSC is read as the CSR of the transposed adjacency, as DGL's
    ``adj_tensors`` reads it). A format DGL has created is exported without a copy; one it has not, DGL creates."""
    if fmt == "csc":
        return tuple(gidx.adjacency_matrix_tensors(etype, True, "csr")[2:])
    return tuple(gidx.adjacency_matrix_tensors(etype, False, fmt)[2:])


def _adj_tensors(gidx, fmt):
    """``DGLGraph.adj_tensors(fmt)`` of the single edge type, read from the structure object."""
    indptr, indices, eids = format_arrays(gidx, fmt)
    if eids is not None and (eids.numel() == 0 or bool((eids == torch.arange(eids.numel())).all())):
        eids = None  # no edge-id array (ids are positions, see csc_graph) or the identity: no gather in kernels
    return indptr, indices, eids


def _endpoints(gidx, side: str) -> torch.Tensor:
    """Source (``side`` 'src') or destination node of every edge, in edge-id order, in the graph's id type:
    read from the COO when the graph holds or may create one, else from its CSR ('src') or CSC ('dst'),
    whose rows are those nodes (a graph restricted to CSC and CSR, see
    :func:`~dgl_exact.data.compact.compact_graph`)."""
    if _allows(gidx, "coo"):
        src, dst, _ = gidx.edges(0, "eid")
        return src if side == "src" else dst
    rows_fmt = "csr" if side == "src" else "csc"  # the format whose rows are those nodes
    if _allows(gidx, rows_fmt):
        indptr, _, eids = _adj_tensors(gidx, rows_fmt)
        values = reference.csr_rows(indptr, gidx.num_edges(0))
    else:  # the other one (a graph holding its CSC alone): those nodes are its indices
        _, values, eids = _adj_tensors(gidx, "csc" if side == "src" else "csr")
    if eids is None:
        return values
    return torch.empty_like(values).index_put_((eids.long() if eids.dtype != torch.int64 else eids,), values)


def grouped(rows: torch.Tensor, cols: torch.Tensor, n_rows: int):
    """``(indptr, indices, eids)`` grouping the edges by ``rows`` (stable: edge order within a row); ``eids`` is
    None where the edges are already grouped (their ids are their positions)."""
    counts = torch.bincount(rows, minlength=n_rows)
    indptr = torch.zeros(n_rows + 1, dtype=torch.int64, device=rows.device)
    torch.cumsum(counts, 0, out=indptr[1:])
    if rows.numel() < 2 or bool((rows[1:] >= rows[:-1]).all()):
        return indptr, cols, None
    perm = torch.sort(rows, stable=True).indices
    return indptr, cols[perm], perm


def _allows(gidx, *fmts: str) -> bool:
    """Whether ``gidx`` holds or may create one of the sparse formats ``fmts``."""
    have = gidx.formats()
    return any(f in have["created"] or f in have["not created"] for f in fmts)


def _torch_device(ctx) -> torch.device:
    """The torch device of a DGL context (``DGLContext``: device_type 1 is the CPU, 2 CUDA)."""
    return torch.device("cpu") if ctx.device_type == 1 else torch.device("cuda", ctx.device_id)


def _to_device(indptr, indices, eids, device):
    return (indptr.to(device), indices.to(device), None if eids is None else eids.to(device))


@assume_constant
def _graph_handle(g, device) -> str:
    """Register ``g``'s cached structure on ``device`` under a handle (dynamo runs this at trace time, eagerly,
    and guards on the identity of ``g``)."""
    return handle_of(structure_of(g, device))


def structure_of(g, device) -> GraphStructure:
    """The cached :class:`GraphStructure` of ``g`` on ``device`` (created on first use). While dynamo traces:
    a :class:`~dgl_exact.ops.traced_graph.CapturedStructure` on it (DGL's graph calls cannot be traced)."""
    if isinstance(g, GraphStructure):  # built without DGL (IndexStructure): it is its own structure
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if g.device != device:
            raise ValueError(f"the graph structure is on {g.device} but the features are on {device}; build it on "
                             "the features' device (IndexStructure.from_edges(..., device=feat.device))")
        return g
    if tracing_active():
        return CapturedStructure(_graph_handle(g, torch.device(device)))
    _check_graph(g)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if g.device.type != "cpu" and g.device != device:
        raise ValueError(f"the graph is on {g.device} but the features are on {device}; move one of them "
                         f"(g = g.to('{device}') or feat = feat.to('{g.device}')); a CPU graph works with "
                         "features on any device")
    gidx = g._graph
    key = id(gidx)  # unique while gidx lives; the finalizer drops the entry before the id can be reused
    dev_key = str(device)
    evicted = []
    with _lock:
        _drop_pending()
        record = _cache.get(key)
        if record is None:
            record = _Record()
            record.finalizer = weakref.finalize(gidx, _forget, key, record)
            record.finalizer.atexit = False
            _cache[key] = record
            # least recently used first; a graph marked symmetric is not evicted (the mark is a checked
            # statement that cannot be rebuilt from the graph cheaply); its entry still dies with the graph
            excess = max(0, len(_cache) - max(1, MAX_CACHED_GRAPHS))
            for old_key in [k for k, r in _cache.items() if not r.symmetric][:excess]:
                evicted.append(_cache.pop(old_key))
        else:
            _cache.move_to_end(key)
        entry = record.per_device.get(dev_key)
        if entry is None:
            entry = GraphStructure(g, device, record.symmetric)
            record.per_device[dev_key] = entry
    for old in evicted:  # outside the lock: detach runs no callback, but dropping entries may run the GC
        old.finalizer.detach()
    return entry


def _forget(key: int, record: _Record) -> None:
    """Finalizer of a graph's structure object: drop its entry (not a newer entry under a reused id)."""
    if _lock.acquire(blocking=False):
        try:
            _drop(key, record)
            _drop_pending()
        finally:
            _lock.release()
    else:  # another thread holds the lock, or the collector ran this inside a locked region of ours
        _pending.append((key, record))


def _drop(key: int, record: _Record) -> None:
    if _cache.get(key) is record:
        del _cache[key]


def _drop_pending() -> None:
    """With the lock held: remove entries whose graphs died while the lock was taken."""
    while _pending:
        _drop(*_pending.pop())


def _edge_pairs(gidx) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` of every edge, in some order, read from a format ``gidx`` has created (none is created)."""
    created = gidx.formats()["created"]
    if "coo" in created or not created:
        src, dst, _ = gidx.edges(0, "eid")
        return src, dst
    fmt = "csc" if "csc" in created else "csr"
    indptr, indices, _ = _adj_tensors(gidx, fmt)
    rows = reference.csr_rows(indptr, gidx.num_edges(0))
    return (indices, rows) if fmt == "csc" else (rows, indices)


#: :func:`is_symmetric` compares the edge keys of node ranges holding about this many edges at a time
SYMMETRY_CHUNK_EDGES = 1 << 24


def is_symmetric(g) -> bool:
    """Whether the graph equals its transpose: its edges, as a multiset of ``(src, dst)`` pairs, are their own
    reverses (an undirected graph stored with both directions; self loops allowed). An exact test, read from
    a format the graph has created (none is created): in- against out-degrees first, then, node range by
    node range (about :data:`SYMMETRY_CHUNK_EDGES` edges each), the sorted keys ``dst * N + src`` of the edges
    into the range against the sorted keys ``src * N + dst`` of the edges out of it. Memory beyond the edge
    lists: a byte per edge and two int64 key arrays of one range. Blocks and bipartite graphs are not
    symmetric."""
    _check_graph(g)
    if g.is_block or g.num_src_nodes() != g.num_dst_nodes():
        return False
    n = g.num_nodes()
    src, dst = _edge_pairs(g._graph)
    in_deg = torch.bincount(dst, minlength=n)
    if not torch.equal(in_deg, torch.bincount(src, minlength=n)):
        return False
    # node ranges of about SYMMETRY_CHUNK_EDGES in-edges each (a node of higher degree is a range of its own)
    cum = torch.cumsum(in_deg, 0)
    del in_deg
    total = int(cum[-1]) if n else 0
    marks = torch.arange(SYMMETRY_CHUNK_EDGES, max(total, SYMMETRY_CHUNK_EDGES), SYMMETRY_CHUNK_EDGES,
                         dtype=cum.dtype)
    cuts = [0] + sorted(set((torch.searchsorted(cum, marks, right=True) + 1).clamp(max=n).tolist())) + [n]
    del cum, marks

    def keys(hi, lo, a, b):
        pick = (hi >= a) & (hi < b)
        k = hi[pick].numpy().astype(np.int64)
        k *= n
        k += lo[pick].numpy()
        k.sort()  # in place: no index array
        return k

    import numpy as np

    for a, b in zip(cuts[:-1], cuts[1:]):
        if b > a and not np.array_equal(keys(dst, src, a, b), keys(src, dst, a, b)):
            return False
    return True


def mark_symmetric(g) -> bool:
    """Check that ``g`` equals its transpose (:func:`is_symmetric`) and, if it does, record it for ``g``'s
    structure: from then on the transposed aggregations of backward that have no edge weights (or only
    node factors, as GraphConv's and GCN2Conv's normalisation) run on the forward's CSC, so a graph holding
    its CSC alone (:func:`dgl_exact.data.compact.csc_graph`) trains without a CSR. Returns whether ``g`` is
    symmetric (nothing is recorded when not). The record lives as long as ``g``'s structure object (shared
    by ``local_scope`` views; a format or id-type conversion makes a new one, to be marked again)."""
    if not is_symmetric(g):
        return False
    gidx = g._graph
    with _lock:
        record = _cache.get(id(gidx))
        if record is None:
            record = _Record()
            record.finalizer = weakref.finalize(gidx, _forget, id(gidx), record)
            record.finalizer.atexit = False
            _cache[id(gidx)] = record
        record.symmetric = True
        for entry in record.per_device.values():
            entry.symmetric = True
    return True


def clear_cache() -> None:
    with _lock:
        records = list(_cache.values())
        _cache.clear()
        _pending.clear()
    for record in records:
        record.finalizer.detach()


def cache_size() -> int:
    """Number of graphs whose structure is cached (entries of deleted graphs are gone)."""
    with _lock:
        _drop_pending()
        return len(_cache)


def cached_static_tensors(graph=None):
    """All tensors held by structure caches (for memory meters); with ``graph``, only those of its entry."""
    with _lock:
        _drop_pending()
        records = _cache.values() if graph is None else [r for r in [_cache.get(id(graph._graph))] if r]
        entries = [e for record in records for e in record.per_device.values()]
    return [t for e in entries for t in e.static_tensors()]


def edge_softmax_forward(st: GraphStructure, e: torch.Tensor) -> torch.Tensor:
    """Softmax of per-edge scores ``[E, H]`` over the in-edges of each destination node."""
    if st._gidx is not None and kernels.chosen("edge_softmax", st.device) == "dgl":
        return kernels.get("edge_softmax", st.device)(st._gidx, e)
    # the reference's body on the cached edge-id-ordered destinations, inline: no backend has a kernel for
    # it, so on a GPU it is these torch calls (and the step counter sees each of them)
    return reference.edge_softmax_by_dst(st.dst, st.num_dst, e)
