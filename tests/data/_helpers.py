"""Fake on-disk dataset layouts (ogb, GraphSAINT, Reddit) shared by the data tests: tiny files in the real
formats, read by the real loading code; checks every loaded dataset must pass."""
import json
import os

import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from dgl_exact.data import GraphDataset
from dgl_exact.data.ogbn import OGB_SPECS


def _csv_gz(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pd.DataFrame(np.asarray(rows)).to_csv(path, header=False, index=False, compression="gzip")


def _random_graph(n, e, seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e)
    dst = (src + rng.integers(1, n, e)) % n  # no self loops
    return src, dst


def make_ogb(root, name, n=60, e=150, f=8, seed=0, release=True, drop=()):
    spec = OGB_SPECS[name]
    folder = os.path.join(root, spec.dir_name)
    rng = np.random.default_rng(seed)
    src, dst = _random_graph(n, e, seed)
    raw = os.path.join(folder, "raw")
    _csv_gz(os.path.join(raw, "edge.csv.gz"), np.stack([src, dst], 1))
    _csv_gz(os.path.join(raw, "num-node-list.csv.gz"), [[n]])
    _csv_gz(os.path.join(raw, "num-edge-list.csv.gz"), [[e]])
    _csv_gz(os.path.join(raw, "node-feat.csv.gz"), rng.standard_normal((n, f)).round(4))
    _csv_gz(os.path.join(raw, "node-label.csv.gz"), rng.integers(0, spec.num_classes, (n, 1)))
    for extra in spec.extra_node_files:
        _csv_gz(os.path.join(raw, f"{extra}.csv.gz"), rng.integers(2000, 2020, (n, 1)))
    perm = rng.permutation(n)
    parts = {"train": perm[: n // 2], "valid": perm[n // 2: 3 * n // 4], "test": perm[3 * n // 4:]}
    for part, idx in parts.items():
        _csv_gz(os.path.join(folder, "split", spec.split, f"{part}.csv.gz"), idx[:, None])
    if release:
        open(os.path.join(folder, f"RELEASE_v{spec.version}.txt"), "w").close()
    for rel in drop:
        os.remove(os.path.join(folder, rel))
    return folder, src, dst, parts


def make_graphsaint(folder, n=50, e=120, f=6, num_classes=7, multilabel=False, seed=0):
    """Flickr/Yelp raw format: adj_full.npz, feats.npy, class_map.json, role.json."""
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    src, dst = _random_graph(n, e, seed)
    adj = sp.coo_matrix((np.ones(e), (src, dst)), shape=(n, n)).tocsr()
    adj.data[:] = 1.0
    sp.save_npz(os.path.join(folder, "adj_full.npz"), adj)
    np.save(os.path.join(folder, "feats.npy"), rng.standard_normal((n, f)))
    if multilabel:
        labels = (rng.random((n, num_classes)) < 0.2).astype(int)
        class_map = {str(i): labels[i].tolist() for i in range(n)}
    else:
        labels = rng.integers(0, num_classes, n)
        class_map = {str(i): int(labels[i]) for i in range(n)}
    with open(os.path.join(folder, "class_map.json"), "w") as fh:
        json.dump(class_map, fh)
    perm = rng.permutation(n).tolist()
    role = {"tr": perm[:30], "va": perm[30:40], "te": perm[40:]}
    with open(os.path.join(folder, "role.json"), "w") as fh:
        json.dump(role, fh)
    return adj, labels, role


def make_reddit(folder, n=40, e=100, f=5, seed=0):
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(seed)
    src, dst = _random_graph(n, e, seed)
    adj = sp.coo_matrix((np.ones(e), (src, dst)), shape=(n, n)).tocsr()
    sp.save_npz(os.path.join(folder, "reddit_graph.npz"), adj.tocoo())
    node_types = rng.integers(1, 4, n)
    labels = rng.integers(0, 41, n)
    np.savez(os.path.join(folder, "reddit_data.npz"), feature=rng.standard_normal((n, f)), label=labels,
             node_types=node_types)
    return adj, labels, node_types


def _check_common(ds: GraphDataset, n, f):
    g = ds.graph
    assert ds.num_nodes == n and ds.num_features == f
    assert g.ndata["feat"].dtype == torch.float32 and g.ndata["feat"].shape == (n, f)
    for split in ("train", "val", "test"):
        assert g.ndata[f"{split}_mask"].dtype == torch.bool
    masks = torch.stack([ds.mask(s) for s in ("train", "val", "test")]).int()
    assert int(masks.sum(0).max()) <= 1  # disjoint


def _edge_set(src, dst):
    return set(zip(np.asarray(src).tolist(), np.asarray(dst).tolist()))
