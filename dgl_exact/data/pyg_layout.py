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
from .validate import int_array, numeric_array

__all__ = ["GRAPHSAINT_FILES", "REDDIT_FILES", "raw_sources", "read_graphsaint", "read_reddit"]

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


def _shape(dataset: str, path: str, folder: str, value: np.ndarray) -> tuple[int, int]:
    """A ``shape`` array of two non-negative integers (a 0-d or 3-entry one is refused)."""
    value = np.asarray(value)
    _check(dataset, path, value.ndim == 1 and value.size == 2,
           f"shape: {value.tolist()!r} (an array of {value.ndim} dimension(s)); expected [num_nodes, num_nodes]",
           folder)
    rows, cols = (int(v) for v in int_array(value, dataset=dataset, path=path, field="shape", what="sizes",
                                            fix=_fix(folder)))
    return rows, cols


def read_graphsaint(dataset: str, folder: str, multilabel: bool, num_classes: int | None = None) -> dict[str, Any]:
    """The GraphSAINT files in ``folder`` as PyG builds them: ``src``, ``dst`` (int64), ``feat`` (float32
    ``[N, F]``), ``label`` (int64 ``[N]``, or float32 ``[N, C]`` when ``multilabel``), ``train_mask``,
    ``val_mask``, ``test_mask`` (bool ``[N]``), ``num_nodes``.

    Every value is validated (:mod:`~dgl_exact.data.validate`) before it is cast: ids and labels must be
    integers in range (``num_classes``, when given, bounds the labels), nothing is truncated."""
    fix = _fix(folder)
    adj_path = os.path.join(folder, "adj_full.npz")
    adj = _npz(dataset, folder, "adj_full.npz", ("indptr", "indices", "shape"))
    shape = _shape(dataset, adj_path, folder, adj["shape"])
    _check(dataset, adj_path, shape[0] == shape[1], f"shape: {list(shape)}; expected a square adjacency", folder)
    n = shape[0]
    _check(dataset, adj_path, adj["indptr"].ndim == 1 and len(adj["indptr"]) == n + 1,
           f"indptr: {len(adj['indptr'])} row pointers; expected {n + 1} (shape {list(shape)})", folder)
    indptr = int_array(adj["indptr"], dataset=dataset, path=adj_path, field="indptr", what="row pointers", fix=fix)
    indices = int_array(adj["indices"].reshape(-1), dataset=dataset, path=adj_path, field="indices", high=n,
                        fix=fix)
    _check(dataset, adj_path, indptr[0] == 0 and indptr[-1] == len(indices) and bool(np.all(np.diff(indptr) >= 0)),
           f"not a CSR adjacency (indptr from {indptr[0]} to {indptr[-1]}, {len(indices)} indices; expected "
           f"non-decreasing from 0 to {len(indices)})", folder)
    src = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    dst = indices

    feats_path = os.path.join(folder, "feats.npy")
    feat = _npy(dataset, folder, "feats.npy")
    numeric_array(feat, dataset=dataset, path=feats_path, field="features", fix=fix)
    _check(dataset, feats_path, feat.ndim == 2 and feat.shape[0] == n,
           f"features of shape {feat.shape}, expected [{n}, F] (one row per node of adj_full.npz)", folder)
    feat = np.ascontiguousarray(feat, dtype=np.float32)

    class_map = _json(dataset, folder, "class_map.json")
    cm_path = os.path.join(folder, "class_map.json")
    _check(dataset, cm_path, isinstance(class_map, dict), "not a JSON object {node id: label}", folder)
    keys = list(class_map)
    bad_key = next((k for k in keys if not (k.isascii() and k.isdigit())), None)
    _check(dataset, cm_path, bad_key is None, f"node id {bad_key!r}; expected node ids: integers in [0, {n})",
           folder)
    ids = int_array([int(k) for k in keys], dataset=dataset, path=cm_path, field="node id", high=n, fix=fix)
    values = list(class_map.values())
    if multilabel:
        width = num_classes if num_classes is not None else (len(values[0]) if values and
                                                               isinstance(values[0], list) else 0)
        for k, v in zip(keys, values):
            if not isinstance(v, list) or len(v) != width:
                _check(dataset, cm_path, False, f"label of node {k}: {json.dumps(v)[:40]}; expected a list of "
                       f"{width} 0/1 entries (multi-hot)", folder)
        flat = [x for v in values for x in v]
        lab = int_array(flat, dataset=dataset, path=cm_path, field="labels", high=2, what="multi-hot entries",
                        fix=fix).reshape(len(values), width).astype(np.float32)
        label = np.full((n, width), -1.0, dtype=np.float32)  # PyG's -1 for unlisted nodes
    else:
        if any(isinstance(v, list) for v in values):
            _check(dataset, cm_path, False, "labels are lists; is this a multi-label dataset (yelp)?", folder)
        lab = int_array(values, dataset=dataset, path=cm_path, field="label", high=num_classes, what="classes",
                        fix=fix)
        label = np.full(n, -1, dtype=np.int64)
    label[ids] = lab

    role = _json(dataset, folder, "role.json")
    role_path = os.path.join(folder, "role.json")
    _check(dataset, role_path, isinstance(role, dict) and all(k in role for k in ("tr", "va", "te")),
           "expected a JSON object with keys 'tr', 'va', 'te'", folder)
    masks = {}
    for key, split in (("tr", "train"), ("va", "val"), ("te", "test")):
        idx = int_array(role[key], dataset=dataset, path=role_path, field=f"'{key}'", high=n, fix=fix)
        _check(dataset, role_path, idx.ndim == 1, f"'{key}': nested lists; expected a list of node ids", folder)
        mask = np.zeros(n, dtype=bool)
        mask[idx] = True
        masks[f"{split}_mask"] = mask
    return {"src": src, "dst": dst, "feat": feat, "label": label, **masks, "num_nodes": n}


def read_reddit(dataset: str, folder: str, num_classes: int | None = None) -> dict[str, Any]:
    """DGL's Reddit files in ``folder`` as PyG's ``Reddit`` builds them (edges coalesced); same keys as
    :func:`read_graphsaint`, validated the same way."""
    fix = _fix(folder)
    data = _npz(dataset, folder, "reddit_data.npz", ("feature", "label", "node_types"))
    data_path = os.path.join(folder, "reddit_data.npz")
    numeric_array(data["feature"], dataset=dataset, path=data_path, field="feature", fix=fix)
    feat = np.ascontiguousarray(data["feature"], dtype=np.float32)
    n = feat.shape[0] if feat.ndim == 2 else -1
    _check(dataset, data_path, feat.ndim == 2 and data["label"].shape == (n,) and data["node_types"].shape == (n,),
           f"feature {data['feature'].shape}, label {data['label'].shape}, node_types "
           f"{data['node_types'].shape} do not describe one graph", folder)
    label = int_array(data["label"], dataset=dataset, path=data_path, field="label", high=num_classes,
                      what="classes", fix=fix)
    node_types = int_array(data["node_types"], dataset=dataset, path=data_path, field="node_types",
                           what="node types (1 train, 2 val, 3 test)", fix=fix)
    graph_path = os.path.join(folder, "reddit_graph.npz")
    g = _npz(dataset, folder, "reddit_graph.npz", ("row", "col", "shape"))
    shape = _shape(dataset, graph_path, folder, g["shape"])
    _check(dataset, graph_path, shape == (n, n), f"shape: {list(shape)}; expected [{n}, {n}] (the nodes of "
           "reddit_data.npz)", folder)
    _check(dataset, graph_path, g["row"].shape == g["col"].shape and g["row"].ndim == 1,
           f"row {g['row'].shape} and col {g['col'].shape}; expected two arrays of one length", folder)
    row = int_array(g["row"], dataset=dataset, path=graph_path, field="row", high=n, fix=fix)
    col = int_array(g["col"], dataset=dataset, path=graph_path, field="col", high=n, fix=fix)
    key = np.unique(row * n + col)        # coalesce: sorted by (row, col), no duplicates
    return {"src": key // n, "dst": key % n, "feat": feat, "label": label,
            "train_mask": node_types == 1, "val_mask": node_types == 2, "test_mask": node_types == 3,
            "num_nodes": n}


def raw_sources(dataset: str, folder: str) -> dict[str, str]:
    """The file each part of a dataset comes from (for :func:`~dgl_exact.data.validate.check_dataset`)."""
    if dataset == "reddit":
        data = os.path.join(folder, "reddit_data.npz")
        return {"feat": data, "label": data, "train": data, "val": data, "test": data}
    role = os.path.join(folder, "role.json")
    return {"feat": os.path.join(folder, "feats.npy"), "label": os.path.join(folder, "class_map.json"),
            "train": role, "val": role, "test": role}
