"""The sparse structure of a PyG graph (``edge_index`` or a ``torch.sparse`` adjacency), without a DGL graph.

:class:`EdgeStructure` is a :class:`~dgl_exact.ops.structure.GraphStructure` built from the two endpoint
vectors of the edges: CSC (in-edges grouped by destination: forward aggregation), CSR (out-edges grouped by
source: backward) and degrees, exported lazily, exactly what dgl_exact's autograd graph ops read. Its
aggregations run on dgl_exact's own kernels (the registry's chain without the ``dgl`` backend, whose
kernels take a DGL graph index): the reference kernels on the CPU, the extension's on a GPU.

PyG's convention (``flow='source_to_target'``): ``edge_index[0]`` holds the source and ``edge_index[1]`` the
target of each edge, and messages flow from source to target; a sparse adjacency ``adj_t`` is indexed
``[target, source]``. Edge order is kept (edge ``e`` of the structure is column ``e`` of ``edge_index``), so
per-edge values in PyG's order (edge weights, attention) are the structure's edge values.

:func:`edge_structure` caches one structure per ``(edge_index object, variant, sizes, device)``, holding the
``edge_index`` only weakly: repeated layers (and epochs) over the same ``edge_index`` tensor build it once,
and an entry dies with its tensor. ``variant`` names a deterministic function of ``edge_index`` (PyG's
self-loop edits, say) whose result the structure is built from: the result is computed by the caller on
every call, as PyG does, but the structure only on the first.
"""
from __future__ import annotations

import threading
from typing import Callable, Dict, Optional, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from .. import kernels
from ..ops.chunks import chunk_elements_for
from ..ops.index_structure import IndexStructure

__all__ = ["EdgeStructure", "edge_structure", "clear_cache", "cache_size", "cached_static_tensors"]


class EdgeStructure(IndexStructure):
    """CSC/CSR index tensors of a graph given by its edges' endpoints (no DGL graph), on one device: an
    :class:`~dgl_exact.ops.index_structure.IndexStructure` whose reference-kernel sums and dot products over several
    heads run in pieces (never an ``[E, H, D]`` product at once). Built as an ``IndexStructure`` is (same
    constructor and ``from_*`` class methods).
    """

    outside_hint = "pass as many feature rows as nodes (or `size`)"

    def _reference(self, op: str) -> bool:
        """Whether ``op`` runs on the reference kernel here (the CPU: DGL's kernels are out,
        Numba's CPU graph kernel is the weighted sum's), whose multi-head sum and edge dot products
        form an ``[E, H, D]`` product at once."""
        with kernels.exclude("dgl"):
            return kernels.chosen(op, self.device) == "torch"

    def aggregate(self, x: torch.Tensor, w: Optional[torch.Tensor] = None, transpose: bool = False) -> torch.Tensor:
        """:meth:`GraphStructure.aggregate`; on the reference kernel a weighted sum over several heads runs head
        by head (each one sparse product), never forming the ``[E, H, D]`` messages (GAT's attention-weighted
        sum: those are the size of what PyG keeps)."""
        heads = x.shape[1]
        if w is None or heads == 1 or not self._reference("spmm_weighted_sum"):
            return super().aggregate(x, w, transpose)
        out = x.new_empty((self.num_src if transpose else self.num_dst, heads, x.shape[2]))
        for h in range(heads):
            out[:, h:h + 1] = super().aggregate(x[:, h:h + 1], w[:, h:h + 1], transpose)
        return out

    def edge_dot(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """:meth:`GraphStructure.edge_dot`; on the reference kernel in ranges of edges whose gathered rows hold
        about :func:`~dgl_exact.ops.chunks.chunk_elements_for` elements (not the ``[E, H, D]`` product at once)."""
        step = max(1, chunk_elements_for(a.device) // max(1, a.shape[1] * a.shape[2]))
        if self.num_edges <= step or not self._reference("sddmm_dot"):
            return super().edge_dot(a, b)
        out = a.new_empty((self.num_edges, a.shape[1]), dtype=torch.promote_types(a.dtype, b.dtype))
        for e0 in range(0, self.num_edges, step):
            src, dst = self._src[e0:e0 + step], self._dst[e0:e0 + step]
            out[e0:e0 + step] = (a[src] * b[dst]).sum(-1)
        return out


_cache: "WeakIdKeyDictionary" = WeakIdKeyDictionary()
_lock = threading.Lock()


def edge_structure(key: torch.Tensor, variant: str, num_src: int, num_dst: int, device,
                   endpoints: Callable[[], Tuple[torch.Tensor, torch.Tensor]]) -> EdgeStructure:
    """The cached :class:`EdgeStructure` of the graph ``endpoints()`` returns (``(src, dst)``), a deterministic
    function of the tensor ``key`` named by ``variant``; ``endpoints`` is called only when no structure for
    ``(key, variant, num_src, num_dst, device)`` is cached, or ``key`` was written in place since. ``key`` is
    held weakly."""
    sub = (variant, int(num_src), int(num_dst), str(torch.device(device)))
    # ``_version`` counts in-place writes: an edge_index edited in place is a new graph
    version = key._version
    with _lock:
        per_key: Optional[Dict[tuple, Tuple[int, EdgeStructure]]] = _cache.get(key)
        hit = None if per_key is None else per_key.get(sub)
    if hit is not None and hit[0] == version:
        return hit[1]
    src, dst = endpoints()
    entry = EdgeStructure(src, dst, num_src, num_dst, device)
    with _lock:
        per_key = _cache.get(key)
        if per_key is None:
            per_key = _cache[key] = {}
        per_key[sub] = (version, entry)
    return entry


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def cache_size() -> int:
    """Number of ``edge_index`` tensors whose structures are cached (entries of deleted tensors are gone)."""
    with _lock:
        return len(_cache)


def cached_static_tensors(key: Optional[torch.Tensor] = None) -> list:
    """Every tensor the cached structures hold (each structure's
    :meth:`~dgl_exact.ops.structure.GraphStructure.static_tensors`); with ``key``, only those of the structures
    cached for that ``edge_index`` tensor (every variant, size and device). A memory meter counts them as static:
    they live as long as ``key``, across training steps."""
    with _lock:
        per_keys = list(_cache.values()) if key is None else [p for p in [_cache.get(key)] if p is not None]
        entries = [entry for per_key in per_keys for _, entry in per_key.values()]
    return [t for entry in entries for t in entry.static_tensors()]
