"""A graph's structure in the narrowest index type its counts allow, in only the sparse formats it needs.

DGL stores node and edge ids as int64 by default; a graph below ``2**31`` nodes and edges fits int32
(``g.int()``), which halves every structure array (COO, CSR, CSC, edge ids). Message passing needs two
sparse formats at most (CSC for the forward aggregation over in-edges, CSR for the transposed one of
backward): once they exist, the COO the loaders built can go (``g.formats([...])``). A graph that equals
its transpose (an undirected graph stored with both directions, as every full-graph dataset here) needs
its CSC alone, without even an edge-id array (:func:`csc_graph`, :func:`training_graph`): the transposed
aggregations of backward that have no edge weights run on it (:func:`dgl_exact.ops.mark_symmetric`).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .._compat import import_dgl


__all__ = ["INT32_LIMIT", "index_dtype", "compact_graph", "structure_bytes", "describe_structure",
           "TRAINING_FORMATS", "allow_all_formats", "csc_graph", "training_graph", "held_formats",
           "keep_edges"]

#: node and edge counts strictly below this fit int32 ids
INT32_LIMIT = 2 ** 31

#: the formats full-graph message passing uses: CSC (forward, over in-edges), CSR (backward, out-edges)
TRAINING_FORMATS = ("csc", "csr")


def index_dtype(num_nodes: int, num_edges: int) -> torch.dtype:
    """``torch.int32`` when both counts are below ``2**31``, else ``torch.int64``."""
    return torch.int32 if max(int(num_nodes), int(num_edges)) < INT32_LIMIT else torch.int64


def compact_graph(g, formats: Optional[Sequence[str]] = None):
    """``g`` with int32 ids when its counts allow (:func:`index_dtype`; else as it is), and, with
    ``formats``, restricted to those sparse formats: the ones missing are created from the formats ``g``
    held (its COO first: the same edge order per node, so the same sums), on a new graph object (``g``'s
    own formats are not changed), and any other format dropped. Node and edge data are shared, not copied;
    edge ids keep their meaning. Returns ``g`` itself when nothing changes."""
    want = index_dtype(g.num_nodes(), g.num_edges())
    if g.idtype != want:
        g = g.int() if want == torch.int32 else g.long()
    if formats:
        formats = list(formats)
        have = g.formats()
        if not set(formats) <= set(have["created"]):
            # created from the graph as it is (its COO): CSC built from a CSR orders each node's in-edges
            # differently, and the sums over them would round differently
            g = g.formats(have["created"] + have["not created"])
            g.create_formats_()
        if sorted(have["created"] + have["not created"]) != sorted(formats):
            g = g.formats(formats)
    return g


def csc_graph(g):
    """``g`` rebuilt from its CSC alone, in the narrowest id type (:func:`index_dtype`), with no edge-id
    array: edges are renumbered in CSC order (grouped by destination, each node's in-edges in ``g``'s
    order), edge data is permuted to match, node data is shared. Only the CSC is allowed: code that
    needs a COO or CSR fails on it (DGL's error), so it is for ops that read the CSC only, e.g. dgl_exact's
    full-graph GCN, SAGE and GCNII on a graph marked symmetric (:func:`dgl_exact.ops.mark_symmetric`).
    Structure bytes: ``(N + 1 + E)`` ids, against ``2 (N + 1 + 2 E)`` for CSC and CSR with edge ids."""
    g = compact_graph(g)
    have = g.formats()
    created = have["created"]
    if created == ["csc"] and g._graph.adjacency_matrix_tensors(0, True, "csr")[4].numel() == 0:
        return g if not have["not created"] else g.formats(["csc"])  # the same arrays, CSC alone allowed
    # the CSC ``g`` holds, or one created on a new graph object (``g``'s own formats are not changed) from
    # its COO when it has one (the per-node edge order of the CSC a COO-built graph creates)
    src_g = g if "csc" in created else g.formats(["coo", "csr", "csc"])
    indptr, indices, eids = src_g._graph.adjacency_matrix_tensors(0, True, "csr")[2:]
    del src_g
    dgl = import_dgl()  # here, not at import: index_dtype and the byte counts serve callers without DGL
    out = dgl.graph(("csc", (indptr, indices, indices.new_empty(0))), num_nodes=g.num_nodes(), idtype=g.idtype)
    out = out.formats(["csc"])
    for k, v in g.ndata.items():
        out.ndata[k] = v
    if g.edata:
        order = eids.long() if eids is not None and eids.numel() else None
        for k, v in g.edata.items():
            out.edata[k] = v if order is None else v[order]
    return out


def training_graph(g, csc_only: bool = True):
    """The graph full-graph training holds (int32 ids when they fit): with ``csc_only`` and a symmetric
    ``g``, its CSC alone (:func:`csc_graph`), marked symmetric; else CSC and CSR
    (:data:`TRAINING_FORMATS`). The symmetry test (:func:`~dgl_exact.ops.is_symmetric`) runs once, here."""
    from ..ops.structure import mark_symmetric

    if csc_only:
        c = csc_graph(g)
        if mark_symmetric(c):
            return c
        del c
    return compact_graph(g, TRAINING_FORMATS)


def keep_edges(g, keep: torch.Tensor):
    """``g`` with only the edges ``keep`` (edge ids, ascending), as ``dgl.edge_subgraph(g, keep,
    relabel_nodes=False, store_ids=False)`` gives it: every node (node data shared), kept edge ``i`` is
    ``g``'s edge ``keep[i]`` (edge data gathered), each node's in-edges in ``g``'s order. Without making a
    format ``g`` does not hold: from ``g``'s COO when it holds one (``dgl.edge_subgraph``), else from the CSC
    (or CSR) it holds, masked: indices and edge ids of the kept edges in the same order, offsets from the kept
    counts per node. The result allows the formats ``g`` allows (a training graph restricted to CSC and CSR,
    :func:`compact_graph`, gives one restricted to them; the other one is created from the held one when
    first read, by DGL's transposition: there each node's edges run in the order of their other ends, where
    ``dgl.edge_subgraph``'s, built from a COO, run in edge-id order, so sums over them, e.g. a backward's
    transposed aggregation, may round differently), and has no edge-id array where ``g`` has none
    (:func:`csc_graph`)."""
    have = g.formats()
    created, allowed = have["created"], have["created"] + have["not created"]
    if "coo" in created or not ({"csc", "csr"} & set(created)):
        return import_dgl().edge_subgraph(g, keep.to(g.device, g.idtype), relabel_nodes=False, store_ids=False)
    fmt = "csc" if "csc" in created else "csr"
    indptr, indices, eids = g._graph.adjacency_matrix_tensors(0, fmt == "csc", "csr")[2:]
    kept = torch.zeros(g.num_edges(), dtype=torch.bool, device=indices.device)
    kept[keep.to(indices.device).long()] = True
    if eids is not None and eids.numel():
        at = kept[eids]                       # per stored position: is its edge kept (int32 ids index as they are)
        # new id of a kept edge: how many kept edges have a smaller id
        rank = kept.cumsum(0, dtype=indices.dtype).sub_(1)
        new_eids = rank[eids[at]]
        del rank
    else:  # no edge-id array: an edge's id is its position, and kept positions stay in order
        at, new_eids = kept, indices.new_empty(0)
    del kept
    # a node's new offset: the kept edges stored before its old offset
    before = torch.zeros(at.numel() + 1, dtype=indptr.dtype, device=indptr.device)
    torch.cumsum(at, 0, dtype=indptr.dtype, out=before[1:])
    new_indptr = before[indptr]
    del before
    out = import_dgl().graph((fmt, (new_indptr, indices[at], new_eids)), num_nodes=g.num_nodes(), idtype=g.idtype,
                    device=g.device)
    if sorted(allowed) != ["coo", "csc", "csr"]:
        out = out.formats(allowed)
    for k, v in g.ndata.items():
        out.ndata[k] = v
    if g.edata:
        index = keep.to(g.device).long()
        for k, v in g.edata.items():
            out.edata[k] = v[index]
    return out


def allow_all_formats(g):
    """``g`` (the same structure, shared) allowing every sparse format: one that ``g`` lacks is created
    only when some DGL code asks for it. For handing a graph restricted to the training formats (e.g.
    CSC + CSR) to code that may need a COO, without holding one."""
    have = g.formats()
    return g if len(have["created"]) + len(have["not created"]) == 3 else g.formats(["coo", "csr", "csc"])


def structure_bytes(g) -> int:
    """Bytes of the sparse formats ``g`` holds: COO ``2E`` ids, CSR / CSC ``N + 1 + 2E`` (offsets, indices,
    edge ids; ``N + 1 + E`` without an edge-id array, see :func:`csc_graph`), each id in ``g.idtype``."""
    item = 4 if g.idtype == torch.int32 else 8
    total = 0
    for fmt in g.formats()["created"]:
        if fmt == "coo":
            total += item * 2 * g.num_edges()
            continue
        arrays = g._graph.adjacency_matrix_tensors(0, fmt == "csc", "csr")[2:]
        total += item * sum(int(a.numel()) for a in arrays)
    return total


def held_formats(g) -> list:
    """The sparse formats ``g`` holds, by name: ``coo``, ``csr``, ``csc``, a CSR / CSC without an edge-id array
    named ``csc without edge ids`` (see :func:`csc_graph`; its edge ids are positions)."""
    names = []
    for fmt in g.formats()["created"]:
        if fmt != "coo" and g.num_edges() and g._graph.adjacency_matrix_tensors(0, fmt == "csc", "csr")[4].numel() == 0:
            fmt += " without edge ids"
        names.append(fmt)
    return names


def describe_structure(g) -> str:
    """One line for a run header: id type, formats held and their size, e.g.
    ``int32 ids, csc+csr, 1.9 GiB``."""
    ids = "int32" if g.idtype == torch.int32 else "int64"
    return f"{ids} ids, {'+'.join(g.formats()['created'])}, {structure_bytes(g) / 2 ** 30:.2f} GiB"
