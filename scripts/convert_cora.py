#!/usr/bin/env python
"""Convert the planetoid Cora pickles (``ind.cora.*``) once into ``dgl_exact/data/bundled/cora.npz``.

The pickles are a trusted copy (``/work/shared/data/planetoid``); the package never unpickles anything:
it ships plain arrays, loaded with ``numpy.load(..., allow_pickle=False)``.

Processing is DGL's ``CitationGraphDataset`` (itself tkipf/gcn's ``load_data``), reproduced exactly:

* features ``vstack(allx, tx)`` and one-hot labels ``vstack(ally, ty)``, then the test rows are moved to
  the positions listed in ``ind.cora.test.index`` (``x[test_idx_reorder] = x[sorted(test_idx_reorder)]``);
* the graph is ``nx.DiGraph(nx.from_dict_of_lists(graph))``: the dict of lists made undirected and simple
  (302 duplicate entries dropped; Cora has no self loops), then both directions of every edge: 10,556
  directed edges. Edges are stored in the order DGL's ``from_networkx`` produces (by source node, and per
  source in networkx's adjacency insertion order), so edge ids match DGL's graph;
* splits: train = the first 140 nodes, val = the next 500, test = the 1,000 test-index nodes;
* features are stored *binary* (the raw bag of words, CSR indices); DGL row-normalises them (each row
  divided by its sum) and the loader does the same by default.

With ``--check`` (default when DGL imports) the result is compared with DGL's own ``CoraGraphDataset``
reading the same files (copied into a temporary ``<raw_dir>/cora_v2_d697a464/ind.cora_v2.*``; DGL finds
the folder and downloads nothing).

Usage: python scripts/convert_cora.py [--src /work/shared/data/planetoid] [--out PATH] [--no-check]
"""
from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
import warnings

import numpy as np
import scipy.sparse as sp

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SRC = "/work/shared/data/planetoid"
DEFAULT_OUT = os.path.join(HERE, "..", "dgl_exact", "data", "bundled", "cora.npz")
OBJNAMES = ["x", "y", "tx", "ty", "allx", "ally", "graph"]


def _load_pickle(path):
    with open(path, "rb") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pickle.load(f, encoding="latin1")  # trusted local copy only


def _networkx_order_edges(adj_lists: dict) -> tuple[np.ndarray, np.ndarray]:
    """Edges of ``nx.DiGraph(nx.from_dict_of_lists(adj_lists))`` in networkx's iteration order, without networkx.

    ``from_dict_of_lists`` adds the keys as nodes (in dict order), then every (node, nbr) pair as an
    undirected edge; an undirected edge (u, v) enters ``adj[u]`` and ``adj[v]`` the first time it is seen.
    ``DiGraph(G)`` copies ``G.adj`` as is, so its edges are: for u in node order, for v in adj[u].
    """
    adj: dict[int, dict[int, None]] = {}
    for node in adj_lists:
        adj.setdefault(int(node), {})
    for node, nbrs in adj_lists.items():
        u = int(node)
        for nbr in nbrs:
            v = int(nbr)
            adj.setdefault(v, {})
            adj[u].setdefault(v, None)
            adj[v].setdefault(u, None)
    # dgl.from_networkx relabels with ordering="sorted"; here the labels are already 0..N-1 in order
    nodes = list(adj)
    assert nodes == list(range(len(nodes))), "expected nodes 0..N-1 in order"
    src = [u for u in nodes for _ in adj[u]]
    dst = [v for u in nodes for v in adj[u]]
    return np.asarray(src, dtype=np.int32), np.asarray(dst, dtype=np.int32)


def convert(src_dir: str) -> dict[str, np.ndarray]:
    objs = {k: _load_pickle(os.path.join(src_dir, f"ind.cora.{k}")) for k in OBJNAMES}
    with open(os.path.join(src_dir, "ind.cora.test.index")) as f:
        test_idx_reorder = np.array([int(line.strip()) for line in f], dtype=np.int64)
    test_idx_range = np.sort(test_idx_reorder)

    feats = sp.vstack((objs["allx"], objs["tx"])).tocsr()
    feats = feats[_reorder_rows(test_idx_reorder, test_idx_range, feats.shape[0])]
    onehot = np.vstack((objs["ally"], objs["ty"]))
    onehot = onehot[_reorder_rows(test_idx_reorder, test_idx_range, onehot.shape[0])]
    labels = np.argmax(onehot, 1)
    n = feats.shape[0]

    feats = feats.tocsr()
    feats.sort_indices()
    assert np.all(feats.data == 1.0), "Cora features are expected to be binary"
    src, dst = _networkx_order_edges(objs["graph"])

    num_train = objs["y"].shape[0]
    train = np.arange(num_train)
    val = np.arange(num_train, num_train + 500)
    test = test_idx_range
    return {
        "num_nodes": np.array(n, dtype=np.int64),
        "num_classes": np.array(onehot.shape[1], dtype=np.int64),
        "edge_src": src,
        "edge_dst": dst,
        "feat_shape": np.array(feats.shape, dtype=np.int64),
        "feat_indptr": feats.indptr.astype(np.int32),
        "feat_indices": feats.indices.astype(np.int16),
        "label": labels.astype(np.int8),
        "train_idx": train.astype(np.int16),
        "val_idx": val.astype(np.int16),
        "test_idx": test.astype(np.int16),
    }


def _reorder_rows(test_idx_reorder: np.ndarray, test_idx_range: np.ndarray, n: int) -> np.ndarray:
    """Row gather equivalent to DGL's in-place ``a[test_idx_reorder] = a[test_idx_range]``: ``new = old[rows]``."""
    rows = np.arange(n)
    rows[test_idx_reorder] = test_idx_range
    assert np.array_equal(np.sort(rows), np.arange(n)), "test index is not a permutation of the test rows"
    return rows


def check_against_dgl(src_dir: str, arrays: dict[str, np.ndarray]) -> None:
    sys.path.insert(0, os.path.join(HERE, ".."))
    from dgl_exact._compat import import_dgl

    dgl = import_dgl()
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "cora_v2_d697a464")  # DGL's raw_path: name + sha1(url)[:8]
        os.makedirs(raw)
        for k in OBJNAMES + ["test.index"]:
            shutil.copy(os.path.join(src_dir, f"ind.cora.{k}"), os.path.join(raw, f"ind.cora_v2.{k}"))
        ds = dgl.data.CoraGraphDataset(raw_dir=tmp, verbose=False)
        assert ds.raw_path == raw, f"DGL looks in {ds.raw_path}, not {raw} (DGL_REPO set?)"
        g = ds[0]
    s, d = g.edges()
    assert np.array_equal(s.numpy(), arrays["edge_src"]) and np.array_equal(d.numpy(), arrays["edge_dst"])
    shape = tuple(arrays["feat_shape"])
    binary = sp.csr_matrix((np.ones(len(arrays["feat_indices"]), np.float32), arrays["feat_indices"],
                            arrays["feat_indptr"]), shape=shape).toarray()
    rows = binary.sum(1, keepdims=True)
    normed = np.divide(binary, rows, out=np.zeros_like(binary), where=rows > 0)
    assert np.array_equal(g.ndata["feat"].numpy(), normed), "features differ from DGL's"
    assert np.array_equal(g.ndata["label"].numpy(), arrays["label"].astype(np.int64))
    for split in ("train", "val", "test"):
        assert np.array_equal(np.flatnonzero(g.ndata[f"{split}_mask"].numpy()), arrays[f"{split}_idx"])
    assert ds.num_classes == int(arrays["num_classes"])
    print("identical to dgl.data.CoraGraphDataset (edges in the same order, row-normalised features, "
          "labels, masks)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=DEFAULT_SRC)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with DGL")
    args = ap.parse_args(argv)

    arrays = convert(args.src)
    if not args.no_check:
        check_against_dgl(args.src, arrays)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {os.path.abspath(args.out)}: {os.path.getsize(args.out):,} bytes; "
          f"{int(arrays['num_nodes'])} nodes, {len(arrays['edge_src'])} directed edges, "
          f"{int(arrays['feat_shape'][1])} features ({len(arrays['feat_indices'])} nonzeros), "
          f"{int(arrays['num_classes'])} classes")


if __name__ == "__main__":
    main()
