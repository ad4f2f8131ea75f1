"""A graph's structure in the narrowest index type its counts allow, in only the sparse formats it needs.

DGL stores node and edge ids as int64 by default; a graph below ``2**31`` nodes and edges fits int32
(``g.int()``), which halves every structure array (COO, CSR, CSC, edge ids). Message passing needs two
sparse formats at most (CSC for the forward aggregation over in-edges, CSR for the transposed one of
backward): once they exist, the COO the loaders built can go (``g.formats([...])``).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

__all__ = ["INT32_LIMIT", "index_dtype", "compact_graph", "structure_bytes", "describe_structure",
           "TRAINING_FORMATS", "allow_all_formats"]

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


def allow_all_formats(g):
    """``g`` (the same structure, shared) allowing every sparse format: one that ``g`` lacks is created
    only when some DGL code asks for it. For handing a graph restricted to the training formats (e.g.
    CSC + CSR) to code that may need a COO, without holding one."""
    have = g.formats()
    return g if len(have["created"]) + len(have["not created"]) == 3 else g.formats(["coo", "csr", "csc"])


def structure_bytes(g) -> int:
    """Bytes of the sparse formats ``g`` holds: COO ``2E`` ids, CSR / CSC ``N + 1 + 2E`` (offsets, indices,
    edge ids), each id in ``g.idtype``."""
    item = 4 if g.idtype == torch.int32 else 8
    total = 0
    for fmt in g.formats()["created"]:
        total += item * (2 * g.num_edges() if fmt == "coo" else g.num_nodes() + 1 + 2 * g.num_edges())
    return total


def describe_structure(g) -> str:
    """One line for a run header: id type, formats held and their size, e.g.
    ``int32 ids, csc+csr, 1.9 GiB``."""
    ids = "int32" if g.idtype == torch.int32 else "int64"
    return f"{ids} ids, {'+'.join(g.formats()['created'])}, {structure_bytes(g) / 2 ** 30:.2f} GiB"
