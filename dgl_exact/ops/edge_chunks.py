"""Edge chunks for GAT's attention: destination-node ranges of the in-edge CSR (CSC) and source-node ranges of
the out-edge CSR, each bounded by an edge budget, so that per-edge tensors are formed one chunk at a time.

A destination chunk holds every in-edge of its destinations (a destination whose in-degree exceeds the budget
gets a chunk of its own), so a per-destination softmax computed on a chunk is the whole graph's. A source
chunk holds every out-edge of its sources, so a per-source sum formed on it (the feature gradient of the
aggregation) is complete and is written straight into its rows of the result.

The chunks are sub-CSRs (``indptr`` rebased to 0, a slice of the graph's index array) run by the registry's
graph kernels (:mod:`dgl_exact.kernels`): DGL's C kernels on CPU tensors (on a graph index made from the
chunk's arrays, without copying them), dgl_exact's kernels on the CSR triple elsewhere.

:func:`chunk_budget_for` decides per graph (the budget set by :func:`edge_chunks`, else the default where
the per-edge tensors dominate); :func:`edge_chunks` sets it
within a scope (tests, planners).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, List, Optional, Tuple

import torch

from .. import kernels
from ..kernels import reference as kernel_reference
from .chunks import chunk_scale

__all__ = ["DEFAULT_EDGE_CHUNK", "EDGE_DOMINANCE", "edge_chunk_budget", "chunk_budget_for", "edge_chunks",
           "chunk_bounds", "ChunkCSR", "csc_chunks",
           "csr_chunks"]

#: Default most edges per chunk: about seven ``[chunk, heads]`` fp32 tensors are alive at once while a chunk
#: is processed (13 MiB at 3 heads), and per-chunk overheads stay small beside the kernels' work.
DEFAULT_EDGE_CHUNK = 1 << 17

#: Without an explicit budget, chunks are used only where the per-edge tensors outweigh the node-sized ones:
#: more than ``EDGE_DOMINANCE`` edges per feature column of a source row (``E > N_src * D / 4``: then the
#: seven-odd ``[E, H]`` fp32 tensors of an unchunked attention are about two of the layer's ``[N, H, D]``
#: tensors or more). Chunked attention costs time on the CPU (per-chunk softmax by scatter instead of DGL's
#: one kernel, the weights recomputed in a second backward pass: about 1.5x a GAT layer's forward + backward),
#: so where edges are few (ogbn-arxiv: 14 per node, 128-wide heads) it would cost time and save little.
EDGE_DOMINANCE = 0.25

_AUTO = "auto"
_budget: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_edge_chunk", default=_AUTO)


def edge_chunk_budget() -> Optional[int]:
    """The most edges per chunk set by :func:`edge_chunks` (``None``: attention runs over all edges at once),
    or :data:`DEFAULT_EDGE_CHUNK` where nothing was set (then :func:`chunk_budget_for` decides per graph)."""
    value = _budget.get()
    return DEFAULT_EDGE_CHUNK if value == _AUTO else value


def chunk_budget_for(num_edges: int, num_src: int, width: int) -> Optional[int]:
    """The edge budget for a graph of ``num_edges`` edges whose source features are ``[num_src, H, width]``:
    the one set by :func:`edge_chunks` (chunks wherever the graph has more edges than it), else the default
    where the per-edge tensors dominate (:data:`EDGE_DOMINANCE`); None: no chunks.

    In a planner's sample run (:mod:`dgl_exact.planning.predict`: a graph ``s`` times the full one) the
    decision is taken for the full graph (``num_edges / s`` edges, ``num_src / s`` sources) and the budget is
    ``s`` times the full one, so that the sample runs as many chunks as the full graph, each ``s`` times as
    large, and every point of its memory timeline extrapolates linearly."""
    scale = chunk_scale()
    full_edges, full_src = num_edges / scale, num_src / scale
    value = _budget.get()
    if value == _AUTO:
        if not (full_edges > DEFAULT_EDGE_CHUNK and full_edges > EDGE_DOMINANCE * full_src * width):
            return None
        value = DEFAULT_EDGE_CHUNK
    elif value is None or full_edges <= value:
        return None
    return value if scale == 1.0 else max(1, round(value * scale))


@contextlib.contextmanager
def edge_chunks(max_edges: Optional[int]):
    """Within this scope GAT's attention runs in chunks of at most ``max_edges`` edges (a destination with
    more in-edges gets a chunk of its own) on every graph with more edges than that; ``None`` runs it over
    all edges at once. Outside any scope the default budget applies where the per-edge tensors dominate."""
    if max_edges is not None and int(max_edges) < 1:
        raise ValueError(f"max_edges must be positive or None, got {max_edges}")
    token = _budget.set(None if max_edges is None else int(max_edges))
    try:
        yield
    finally:
        _budget.reset(token)


def chunk_bounds(indptr: torch.Tensor, budget: int) -> List[Tuple[int, int]]:
    """Contiguous node ranges ``[(n0, n1), ...]`` covering every row of ``indptr`` (a CSR's row pointer), each
    with at most ``budget`` edges, or a single row whose degree exceeds it."""
    ptr = indptr.detach().cpu().long()
    n = ptr.numel() - 1
    bounds = []
    n0 = 0
    while n0 < n:
        # the last row end within the budget: indptr[n1] <= indptr[n0] + budget
        n1 = int(torch.searchsorted(ptr, ptr[n0] + budget, right=True)) - 1
        n1 = min(max(n1, n0 + 1), n)
        bounds.append((n0, n1))
        n0 = n1
    return bounds


class ChunkCSR:
    """One chunk: rows ``[r0, r1)`` of a CSR whose columns number ``num_cols``; its rebased ``indptr``, its
    column indices (a view of the graph's), the position of its edges in the graph's edge ids (``eids``: a
    slice where the CSR stores edges in edge-id order, else an index tensor), and each edge's row within the
    chunk (``rows``, int64)."""

    __slots__ = ("r0", "r1", "num_rows", "num_cols", "num_edges", "indptr", "indices", "eids", "rows", "_gidx")

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, eids: Optional[torch.Tensor], num_cols: int,
                 r0: int, r1: int, e0: int, e1: int):
        self.r0, self.r1, self.num_rows, self.num_cols, self.num_edges = r0, r1, r1 - r0, num_cols, e1 - e0
        self.indptr = indptr[r0:r1 + 1] - indptr[r0]
        self.indices = indices[e0:e1]
        self.eids = slice(e0, e1) if eids is None else eids[e0:e1].long()
        self.rows = kernel_reference.csr_rows(self.indptr, self.num_edges).long()
        self._gidx = None

    def _graph(self, op: str, device):
        """``(kernel, graph arguments)`` for ``op``: DGL's graph index of the chunk (columns as sources, rows
        as destinations) for the ``dgl`` backend, else the CSR triple."""
        fn = kernels.get(op, device)
        if kernels.chosen(op, device) == "dgl":
            if self._gidx is None:
                from ..kernels.dgl_graph import csc_graph_index

                # explicit edge ids (chunk order): DGL's libxsmm SpMM refuses a CSR without them
                self._gidx = csc_graph_index(self.indptr, self.indices,
                                             torch.arange(self.num_edges, dtype=self.indices.dtype),
                                             self.num_cols, self.num_rows)
            return fn, (self._gidx,)
        return fn, (self.indptr, self.indices, None)

    def aggregate(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``out[r] = sum_{e in row r} w[e] * x[col(e)]``: ``x [num_cols, H, D]``, ``w [edges, H]`` in chunk
        order; returns ``[num_rows, H, D]``."""
        fn, graph = self._graph("spmm_weighted_sum", x.device)
        with torch.autocast(x.device.type, enabled=False):
            return fn(*graph, x, w, self.num_rows)

    def edge_dot(self, cols: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """``out[e] = <cols[col(e)], rows[row(e)]>`` over the last dim (``rows`` holds the chunk's rows only):
        ``[edges, H]`` in chunk order."""
        fn, graph = self._graph("sddmm_dot", cols.device)
        return fn(*graph, cols, rows)


def _chunks(st, kind: str, budget: int) -> Iterator[ChunkCSR]:
    """One chunk at a time (a chunk's per-edge row index dies with it)."""
    indptr, indices, eids = st.csc if kind == "csc" else st.csr
    num_cols = st.num_src if kind == "csc" else st.num_dst
    ptr = indptr.detach().cpu().long()
    for r0, r1 in chunk_bounds(ptr, budget):
        yield ChunkCSR(indptr, indices, eids, num_cols, r0, r1, int(ptr[r0]), int(ptr[r1]))


def csc_chunks(st, budget: int) -> Iterator[ChunkCSR]:
    """Destination chunks of ``st`` (a :class:`~dgl_exact.ops.structure.GraphStructure`), one at a time: rows
    are destinations, columns sources."""
    return _chunks(st, "csc", budget)


def csr_chunks(st, budget: int) -> Iterator[ChunkCSR]:
    """Source chunks of ``st``, one at a time: rows are sources, columns destinations."""
    return _chunks(st, "csr", budget)
