"""Datasets in PyTorch Geometric's on-disk layout (what an EXACT user has), read by dgl_exact itself.

EXACT's ``data.py`` loads its datasets with PyG from ``<root>/Flickr``, ``<root>/YELP``, ``<root>/Reddit``,
``<root>/Reddit2`` and ogb from ``<root>/OGB``. PyG keeps the downloaded files in ``raw/`` and its own
``processed/data.pt`` (a pickle) beside them. dgl_exact reads only the raw files, with readers that
never execute code from disk (``numpy.load(allow_pickle=False)``, ``json``), and builds the same numbers
PyG's ``process()`` builds:

* **GraphSAINT format** (Flickr, Yelp, Reddit2): ``adj_full.npz`` (a scipy CSR matrix: ``data``,
  ``indices``, ``indptr``, ``shape``), ``feats.npy`` (``[N, F]``), ``class_map.json`` (``{"node id":
  class}``; a list of 0/1 per node for Yelp), ``role.json`` (``{"tr": [...], "va": [...], "te": [...]}``).
  Edges are the CSR entries in storage order, row -> column (PyG's ``edge_index = [row, col]`` of
  ``tocoo()``; no sorting, no deduplication); features float32 in file order; a node missing from
  ``class_map`` gets label -1; node ``i`` is in a split when ``i`` is listed under its role key.
* **Reddit** (DGL's ``reddit.zip``, which PyG's ``Reddit`` downloads too): ``reddit_data.npz``
  (``feature``, ``label``, ``node_types``: 1 train, 2 val, 3 test) and ``reddit_graph.npz`` (a scipy
  COO matrix). PyG **coalesces** the edges: sorted by (row, col), duplicates dropped. (DGL's
  ``RedditDataset`` keeps the COO order; the edge sets are equal.)

Nothing is cached: the raw files are the only state, so a changed raw file is always what is loaded.
"""
from __future__ import annotations

import json
import os
import zipfile
from typing import Any

import numpy as np

from .base import DatasetFileError

__all__ = ["GRAPHSAINT_FILES", "REDDIT_FILES", "read_graphsaint", "read_reddit"]

GRAPHSAINT_FILES = ("adj_full.npz", "feats.npy", "class_map.json", "role.json")
REDDIT_FILES = ("reddit_data.npz", "reddit_graph.npz")


def _fix(folder: str) -> str:
    return f"replace it with a fresh copy of the original file (or get the dataset again into {folder})"


def _npz(dataset: str, folder: str, fname: str, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    path = os.path.join(folder, fname)
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise DatasetFileError(dataset, path, f"arrays {missing} missing (has {sorted(z.files)})",
                                       _fix(folder))
            return {k: z[k] for k in z.files if k in keys}
    except DatasetFileError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as err:
        raise DatasetFileError(dataset, path, f"unreadable ({type(err).__name__}: {err})", _fix(folder)) from None


def _npy(dataset: str, folder: str, fname: str) -> np.ndarray:
    path = os.path.join(folder, fname)
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise DatasetFileError(dataset, path, f"unreadable ({type(err).__name__}: {err})", _fix(folder)) from None


def _json(dataset: str, folder: str, fname: str) -> Any:
    path = os.path.join(folder, fname)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise DatasetFileError(dataset, path, f"unreadable ({type(err).__name__}: {err})", _fix(folder)) from None


def _check(dataset: str, path: str, ok: bool, problem: str, folder: str) -> None:
    if not ok:
        raise DatasetFileError(dataset, path, problem, _fix(folder))


def read_graphsaint(dataset: str, folder: str, multilabel: bool) -> dict[str, np.ndarray]:
    """The GraphSAINT files in ``folder`` as PyG builds them: ``src``, ``dst`` (int64), ``feat`` (float32
    ``[N, F]``), ``label`` (int64 ``[N]``, or float32 ``[N, C]`` when ``multilabel``), ``train_mask``,
    ``val_mask``, ``test_mask`` (bool ``[N]``), ``num_nodes``."""
    adj_path = os.path.join(folder, "adj_full.npz")
    adj = _npz(dataset, folder, "adj_full.npz", ("indptr", "indices", "shape"))
    indptr = adj["indptr"].astype(np.int64)
    indices = adj["indices"].astype(np.int64)
    shape = tuple(int(v) for v in adj["shape"])
    _check(dataset, adj_path, len(shape) == 2 and shape[0] == shape[1] and len(indptr) == shape[0] + 1
           and indptr[0] == 0 and indptr[-1] == len(indices) and bool(np.all(np.diff(indptr) >= 0))
           and (len(indices) == 0 or (indices.min() >= 0 and indices.max() < shape[1])),
           f"not a square CSR adjacency (shape {shape}, {len(indptr)} row pointers, {len(indices)} indices)",
           folder)
    n = shape[0]
    src = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    dst = indices

    feats_path = os.path.join(folder, "feats.npy")
    feat = _npy(dataset, folder, "feats.npy")
    _check(dataset, feats_path, feat.ndim == 2 and feat.shape[0] == n,
           f"features of shape {feat.shape}, expected [{n}, F] (one row per node of adj_full.npz)", folder)
    feat = np.ascontiguousarray(feat, dtype=np.float32)

    class_map = _json(dataset, folder, "class_map.json")
    cm_path = os.path.join(folder, "class_map.json")
    _check(dataset, cm_path, isinstance(class_map, dict), "not a JSON object {node id: label}", folder)
    try:
        ids = np.fromiter((int(k) for k in class_map), dtype=np.int64, count=len(class_map))
        values = list(class_map.values())
        if multilabel:
            lab = np.asarray(values, dtype=np.float32).reshape(len(values), -1)
            label = np.full((n, lab.shape[1]), -1.0, dtype=np.float32)  # PyG's -1 for unlisted nodes
        else:
            lab = np.asarray(values, dtype=np.int64)
            _check(dataset, cm_path, lab.ndim == 1, "labels are lists; is this a multi-label dataset (yelp)?",
                   folder)
            label = np.full(n, -1, dtype=np.int64)
    except (TypeError, ValueError) as err:
        raise DatasetFileError(dataset, cm_path, f"bad labels ({err})", _fix(folder)) from None
    _check(dataset, cm_path, len(ids) == 0 or (ids.min() >= 0 and ids.max() < n),
           f"node ids outside [0, {n})", folder)
    label[ids] = lab

    role = _json(dataset, folder, "role.json")
    role_path = os.path.join(folder, "role.json")
    _check(dataset, role_path, isinstance(role, dict) and all(k in role for k in ("tr", "va", "te")),
           "expected a JSON object with keys 'tr', 'va', 'te'", folder)
    masks = {}
    for key, split in (("tr", "train"), ("va", "val"), ("te", "test")):
        idx = np.asarray(role[key], dtype=np.int64)
        _check(dataset, role_path, idx.ndim == 1 and (len(idx) == 0 or (idx.min() >= 0 and idx.max() < n)),
               f"'{key}' holds node ids outside [0, {n})", folder)
        mask = np.zeros(n, dtype=bool)
        mask[idx] = True
        masks[f"{split}_mask"] = mask
    return {"src": src, "dst": dst, "feat": feat, "label": label, **masks, "num_nodes": n}


def read_reddit(dataset: str, folder: str) -> dict[str, np.ndarray]:
    """DGL's Reddit files in ``folder`` as PyG's ``Reddit`` builds them (edges coalesced); same keys as
    :func:`read_graphsaint`."""
    data = _npz(dataset, folder, "reddit_data.npz", ("feature", "label", "node_types"))
    data_path = os.path.join(folder, "reddit_data.npz")
    feat = np.ascontiguousarray(data["feature"], dtype=np.float32)
    n = feat.shape[0] if feat.ndim == 2 else -1
    _check(dataset, data_path, feat.ndim == 2 and data["label"].shape == (n,) and data["node_types"].shape == (n,),
           f"feature {data['feature'].shape}, label {data['label'].shape}, node_types "
           f"{data['node_types'].shape} do not describe one graph", folder)
    graph_path = os.path.join(folder, "reddit_graph.npz")
    g = _npz(dataset, folder, "reddit_graph.npz", ("row", "col", "shape"))
    row, col = g["row"].astype(np.int64), g["col"].astype(np.int64)
    _check(dataset, graph_path, tuple(int(v) for v in g["shape"]) == (n, n) and row.shape == col.shape
           and (len(row) == 0 or (min(row.min(), col.min()) >= 0 and max(row.max(), col.max()) < n)),
           f"not an {n} x {n} COO adjacency (shape {tuple(g['shape'])})", folder)
    key = np.unique(row * n + col)        # coalesce: sorted by (row, col), no duplicates
    node_types = data["node_types"]
    return {"src": key // n, "dst": key % n, "feat": feat, "label": data["label"].astype(np.int64),
            "train_mask": node_types == 1, "val_mask": node_types == 2, "test_mask": node_types == 3,
            "num_nodes": n}
