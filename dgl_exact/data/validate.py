"""One validation pass for every loader (ogb, DGL and PyG layouts): what a dataset file holds is checked before it is
used, and a violation is one :class:`~dgl_exact.data.base.DatasetFileError` line naming the file, the field, the
first bad value and what was expected. Nothing is truncated or coerced silently:

* node ids, edge ids, split ids and labels must be stored as integers (floats, even ``3.0``, booleans, ``null``
  and strings are refused: DGL's and ogb's readers would truncate or misread them) inside ``[0, num_nodes)``;
* labels must be integers in ``[0, num_classes)`` (multi-hot rows: 0/1 of width ``num_classes``); the only
  exception is the explicit unlabelled marker ``-1`` (PyG's label of a node missing from ``class_map.json``),
  and only for a node in no split;
* splits are disjoint, and every array describes the same number of nodes.

Readers call :func:`int_array` / :func:`numeric_array` on what they read (before any cast), and every loader
calls :func:`check_dataset` on the finished :class:`~dgl_exact.data.base.GraphDataset`.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from .base import DatasetFileError

__all__ = ["UNLABELLED", "int_array", "numeric_array", "check_dataset", "fail"]

UNLABELLED = -1     # PyG's label of a node missing from class_map.json (allowed only outside the splits)


def fail(dataset: str, path: str | os.PathLike, problem: str, fix: str | None = None) -> None:
    raise DatasetFileError(dataset, path, problem, fix or "replace it with a fresh copy of the original file")


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= 40 else text[:37] + "..."


def _list_to_array(values: list) -> tuple[np.ndarray | None, int, Any]:
    """An int64 array of a JSON list of integers, or ``(None, position, value)`` of its first non-integer."""
    if all(type(v) is int for v in values):
        return np.asarray(values, dtype=np.int64).reshape(len(values)), -1, None
    pos = next(i for i, v in enumerate(values) if type(v) is not int)
    return None, pos, values[pos]


def int_array(values: Any, *, dataset: str, path: str | os.PathLike, field: str, low: int = 0,
              high: int | None = None, allow: tuple[int, ...] = (), what: str = "node ids",
              fix: str | None = None) -> np.ndarray:
    """``values`` (a JSON list or a numpy array) as int64, after checking that every entry is stored as an
    integer (floats, booleans, strings and ``null`` are not) in ``[low, high)`` or in ``allow``. Raises
    DatasetFileError naming ``path``, ``field`` and the first bad value."""
    span = f"[{low}, {high})" if high is not None else f">= {low}"
    expected = f"expected {what}: integers in {span}" + (f" (or {', '.join(map(str, allow))})" if allow else "")
    if isinstance(values, list):
        arr, pos, bad = _list_to_array(values)
        if arr is None:
            fail(dataset, path, f"{field}: {_show(bad)} at position {pos}; {expected}", fix)
    elif isinstance(values, np.ndarray):
        flat = values.reshape(-1)
        kind = values.dtype.kind
        if kind in "iu":
            arr = values.astype(np.int64, copy=False)
        elif kind == "f" and flat.size:
            odd = ~np.isfinite(flat)
            odd[~odd] = flat[~odd] != np.trunc(flat[~odd])
            pos = int(np.argmax(odd))  # the first fraction/NaN, else the first value
            fail(dataset, path, f"{field}: {values.dtype} values ({_show(flat[pos])} at position {pos}); {expected}",
                 fix)
        else:
            first = _show(flat[0]) if flat.size else "nothing"
            fail(dataset, path, f"{field}: {values.dtype} values (first {first}); {expected}", fix)
    else:
        fail(dataset, path, f"{field}: {_show(values)} ({type(values).__name__}); expected a list of {what}", fix)
    flat = arr.reshape(-1)
    if flat.size:
        bad = flat < low
        if high is not None:
            bad |= flat >= high
        for a in allow:
            bad &= flat != a
        if bad.any():
            pos = int(np.argmax(bad))
            fail(dataset, path, f"{field}: {int(flat[pos])} at position {pos}; {expected}", fix)
    return arr


def numeric_array(values: np.ndarray, *, dataset: str, path: str | os.PathLike, field: str,
                  fix: str | None = None) -> np.ndarray:
    """``values`` unchanged if it holds numbers (not strings, objects or booleans)."""
    if not isinstance(values, np.ndarray) or values.dtype.kind not in "iuf":
        flat = np.asarray(values).reshape(-1)
        first = _show(flat[0]) if flat.size else "nothing"
        fail(dataset, path, f"{field}: {getattr(values, 'dtype', type(values).__name__)} values (first {first}); "
             "expected numbers", fix)
    return values


def check_dataset(ds, sources: Mapping[str, str | os.PathLike], fix: str | None = None) -> None:
    """The finished dataset's consistency: feature rows, label shape/values, masks, disjoint splits.

    ``sources`` names the file each part came from: keys ``feat``, ``label``, ``train``, ``val``, ``test``
    (a missing key falls back to ``label``'s, then to ``"?"``)."""
    import torch

    g = ds.graph
    n = int(g.num_nodes())
    name = ds.name

    def src(key: str) -> str:
        return os.fspath(sources.get(key) or sources.get("label") or "?")

    feat = g.ndata["feat"]
    if feat.dim() != 2 or feat.shape[0] != n:
        fail(name, src("feat"), f"features of shape {list(feat.shape)}, expected [{n}, F] (one row per node)", fix)
    masks = {}
    for split in ("train", "val", "test"):
        m = g.ndata[f"{split}_mask"]
        if m.shape != (n,):
            fail(name, src(split), f"{split} mask of shape {list(m.shape)}, expected [{n}]", fix)
        masks[split] = m.bool()
    in_split = masks["train"] | masks["val"] | masks["test"]
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        both = masks[a] & masks[b]
        if bool(both.any()):
            node = int(torch.nonzero(both)[0, 0])
            fail(name, src(b), f"node {node} is in both the {a} and the {b} split ({int(both.sum())} nodes are); "
                 "expected disjoint splits", fix)
    label = g.ndata["label"]
    c = int(ds.num_classes)
    if ds.multilabel:
        if label.dim() != 2 or label.shape != (n, c):
            fail(name, src("label"), f"labels of shape {list(label.shape)}, expected [{n}, {c}] (multi-hot)", fix)
        rows = label[in_split]
        bad = ~((rows == 0) | (rows == 1))
        if bool(bad.any()):
            r, col = (int(v) for v in torch.nonzero(bad)[0])
            node = int(torch.nonzero(in_split)[r, 0])
            fail(name, src("label"), f"label of node {node}, class {col}: {_show(float(rows[r, col]))}; expected 0 "
                 "or 1 for a node in a split", fix)
        return
    if label.shape != (n,):
        fail(name, src("label"), f"labels of shape {list(label.shape)}, expected [{n}] (one class per node)", fix)
    if label.is_floating_point():
        ok = torch.isfinite(label) & (label == torch.trunc(label))
        if not bool(ok.all()):
            node = int(torch.nonzero(~ok)[0, 0])
            fail(name, src("label"), f"label of node {node}: {_show(float(label[node]))}; expected an integer class",
                 fix)
    lab = label.long()
    bad = (lab < 0) | (lab >= c)
    bad &= in_split | (lab != UNLABELLED)
    if bool(bad.any()):
        node = int(torch.nonzero(bad)[0, 0])
        where = next((s for s in ("train", "val", "test") if bool(masks[s][node])), None)
        if where and int(lab[node]) == UNLABELLED:
            fail(name, src("label"), f"node {node} is in the {where} split but has no label ({UNLABELLED}: "
                 f"missing from the file); expected a class in [0, {c}) for every node in a split", fix)
        detail = f" (a {where} node)" if where else ""
        extra = f", or {UNLABELLED} (unlabelled) for a node in no split" if not where else ""
        fail(name, src("label"), f"label of node {node}{detail}: {int(lab[node])}; expected a class in [0, {c})"
             + extra, fix)
