"""Graph structures built from index tensors, without DGL: :class:`IndexStructure`, a
:class:`~dgl_exact.ops.structure.GraphStructure` made from the endpoints of the edges, a CSC or a CSR.

dgl_exact's graph ops take one in place of a DGL graph (:func:`~dgl_exact.ops.structure.structure_of` returns it
as it is); the PyG drop-ins build theirs (:class:`dgl_exact.pyg.structure.EdgeStructure`) from ``edge_index``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .. import kernels
from ..kernels import reference
from .structure import GraphStructure, grouped as _grouped

__all__ = ["IndexStructure"]


class IndexStructure(GraphStructure):
    """A :class:`GraphStructure` built from index tensors, without DGL: the endpoints of the edges
    (:meth:`from_edges`, :meth:`from_edge_index`), a CSC (:meth:`from_csc`) or a CSR (:meth:`from_csr`).
    dgl_exact's graph ops (``copy_u_sum``, ``u_mul_e_sum``, ``gat_attention``, ...) take it in place of a DGL
    graph, and their kernels come from the registry without the ``dgl`` backend (whose kernels read a DGL graph
    index): the reference kernels on the CPU, the extension's on a GPU. Edge ``e`` of the structure is edge
    ``e`` of what it was built from (for a CSC or CSR without ``eids``: its position there), so per-edge values
    (weights, attention scores) are given in that order.

    Parameters
    ----------
    src, dst : torch.Tensor
        ``[E]`` integer source and destination node of every edge, in edge-id order.
    num_src, num_dst : int
        Numbers of source and destination nodes (equal for a graph, different for a bipartite one).
    device : torch.device
        Where the index tensors live (the features' device).
    """

    #: the end of the error for an endpoint outside the graph (what to do about it)
    outside_hint = "give the node counts of the graph the edges belong to"

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int, device):
        # no GraphStructure.__init__: it reads a DGL graph index
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # as structure_of compares it
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.symmetric = False
        self.num_src, self.num_dst = int(num_src), int(num_dst)
        if src.dim() != 1 or dst.shape != src.shape or src.is_floating_point() or dst.is_floating_point():
            raise ValueError(f"src and dst are two integer vectors of the same length (one entry per edge), got "
                             f"{src.dtype} {tuple(src.shape)} and {dst.dtype} {tuple(dst.shape)}")
        self.num_edges = int(src.numel())
        self.is_block = False
        self._gidx = self._rev = None
        # own copies: a cache keyed on the caller's tensor may hold it weakly, and a view keeps it alive
        self._src = src.to(self.device, torch.int64, copy=True)
        self._dst = dst.to(self.device, torch.int64, copy=True)
        if self.num_edges and (int(self._src.min()) < 0 or int(self._dst.min()) < 0
                               or int(self._src.max()) >= self.num_src or int(self._dst.max()) >= self.num_dst):
            raise ValueError(f"edges refer to nodes outside the graph: sources must be in [0, {self.num_src}) and "
                             f"destinations in [0, {self.num_dst}); {self.outside_hint}")
        self._csc = self._csr = None
        self._in_deg = self._out_deg = None
        self._has_zero = None

    # --- constructors -------------------------------------------------------------------------------
    @classmethod
    def from_edges(cls, src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: Optional[int] = None,
                   device=None) -> "IndexStructure":
        """From the source and destination of every edge (``num_dst`` defaults to ``num_src``: a graph; the
        device to that of ``src``)."""
        return cls(src, dst, num_src, num_src if num_dst is None else num_dst,
                   src.device if device is None else device)

    @classmethod
    def from_edge_index(cls, edge_index: torch.Tensor, num_nodes: int, device=None) -> "IndexStructure":
        """From PyG's ``[2, E]`` ``edge_index`` (row 0 the sources, row 1 the destinations) of a graph of
        ``num_nodes`` nodes."""
        if edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError(f"edge_index has shape [2, E] (sources, destinations), got {tuple(edge_index.shape)}")
        return cls.from_edges(edge_index[0], edge_index[1], num_nodes, num_nodes, device)

    @classmethod
    def from_csc(cls, indptr: torch.Tensor, indices: torch.Tensor, num_src: Optional[int] = None,
                 eids: Optional[torch.Tensor] = None, device=None) -> "IndexStructure":
        """From a CSC: ``indptr [num_dst + 1]`` over the destinations, ``indices`` the source of each in-edge;
        ``eids`` the id of each stored edge (default: its position). ``num_src`` defaults to ``num_dst``."""
        num_dst = indptr.numel() - 1
        return cls._from_compressed(indptr, indices, eids, num_dst if num_src is None else num_src, num_dst,
                                    device, "csc")

    @classmethod
    def from_csr(cls, indptr: torch.Tensor, indices: torch.Tensor, num_dst: Optional[int] = None,
                 eids: Optional[torch.Tensor] = None, device=None) -> "IndexStructure":
        """From a CSR: ``indptr [num_src + 1]`` over the sources, ``indices`` the destination of each out-edge;
        ``eids`` the id of each stored edge (default: its position). ``num_dst`` defaults to ``num_src``."""
        num_src = indptr.numel() - 1
        return cls._from_compressed(indptr, indices, eids, num_src, num_src if num_dst is None else num_dst,
                                    device, "csr")

    @classmethod
    def _from_compressed(cls, indptr, indices, eids, num_src, num_dst, device, fmt):
        if indptr.dim() != 1 or indptr.numel() < 1 or indices.dim() != 1:
            raise ValueError(f"{fmt}: indptr and indices are vectors (indptr one longer than the nodes it groups), "
                             f"got shapes {tuple(indptr.shape)} and {tuple(indices.shape)}")
        if int(indptr[0]) != 0 or int(indptr[-1]) != indices.numel() or bool((indptr[1:] < indptr[:-1]).any()):
            raise ValueError(f"{fmt}: indptr rises from 0 to the number of edges ({indices.numel()}), got "
                             f"{int(indptr[0])} to {int(indptr[-1])}")
        if eids is not None and (eids.shape != indices.shape or not torch.equal(
                torch.sort(eids.long()).values, torch.arange(indices.numel(), device=eids.device))):
            raise ValueError(f"{fmt}: eids holds each edge id 0..{indices.numel() - 1} once, one per stored edge")
        rows = reference.csr_rows(indptr, indices.numel())  # the node each stored edge is grouped under
        grouped, other = (rows, indices) if fmt == "csr" else (indices, rows)  # (src, dst) in stored order
        if eids is not None:  # into edge-id order
            at = eids.long()
            grouped = torch.empty_like(grouped).index_put_((at,), grouped)
            other = torch.empty_like(other).index_put_((at,), other)
        st = cls(grouped, other, num_src, num_dst, indptr.device if device is None else device)
        own = (indptr.to(st.device, torch.int64), indices.to(st.device, torch.int64),
               None if eids is None else eids.to(st.device, torch.int64))
        if fmt == "csc":
            st._csc = own
        else:
            st._csr = own
        return st

    # --- what differs from a DGL graph's structure --------------------------------------------------
    def _kernel(self, op: str, transpose: bool = False, side: str = "csc"):
        """``(function, CSR triple)``: dgl_exact's kernels (no DGL graph index to hand to the ``dgl`` backend)."""
        with kernels.exclude("dgl"):
            fn = kernels.get(op, self.device)
        return fn, (self.csr if transpose else self.csc)

    @property
    def csc(self) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        if self._csc is None:
            self._csc = _grouped(self._dst, self._src, self.num_dst)
        return self._csc

    @property
    def csr(self) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        if self._csr is None:
            self._csr = _grouped(self._src, self._dst, self.num_src)
        return self._csr

    def _graph_degrees(self, side: str) -> torch.Tensor:
        if side == "in":
            return torch.bincount(self._dst, minlength=self.num_dst)
        return torch.bincount(self._src, minlength=self.num_src)

    def src_edge_norm(self, degrees: str, kind: str, dtype: torch.dtype) -> torch.Tensor:
        return self.node_norm(degrees, kind, dtype)[self._src]

    @property
    def reverse_gidx(self):
        raise TypeError("an IndexStructure has no DGL graph index; its kernels take the CSR tensors")
