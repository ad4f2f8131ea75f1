"""Cora (planetoid split), bundled with the package as plain arrays (``bundled/cora.npz``).

The file is written once by ``scripts/convert_cora.py`` from the planetoid pickles and is identical to
DGL's ``CoraGraphDataset``: same 10,556 directed edges in the same order (symmetric, no self loops),
same row-normalised features, labels and 140/500/1,000 split. Features are stored binary (CSR indices);
``normalize_features=False`` returns the raw 0/1 bag of words.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from .._compat import import_dgl
from .base import GraphDataset, index_to_mask

__all__ = ["CORA_PATH", "load_cora", "load_cora_arrays"]

CORA_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bundled", "cora.npz")


def load_cora_arrays(path: str = CORA_PATH, normalize_features: bool = True) -> dict[str, np.ndarray]:
    """The bundled arrays, decoded: ``src``, ``dst`` (int64), ``feat`` (float32 dense), ``label`` (int64),
    ``train_idx``/``val_idx``/``test_idx`` (int64), ``num_nodes``, ``num_classes``."""
    with np.load(path, allow_pickle=False) as z:
        n, f = (int(v) for v in z["feat_shape"])
        indptr = z["feat_indptr"].astype(np.int64)
        indices = z["feat_indices"].astype(np.int64)
        feat = np.zeros((n, f), dtype=np.float32)
        rows = np.repeat(np.arange(n), np.diff(indptr))
        feat[rows, indices] = 1.0
        if normalize_features:  # DGL's _normalize: divide each row by its sum (rows summing to 0 stay 0)
            rowsum = feat.sum(1, keepdims=True)
            np.divide(feat, rowsum, out=feat, where=rowsum > 0)
        return {
            "src": z["edge_src"].astype(np.int64),
            "dst": z["edge_dst"].astype(np.int64),
            "feat": feat,
            "label": z["label"].astype(np.int64),
            "train_idx": z["train_idx"].astype(np.int64),
            "val_idx": z["val_idx"].astype(np.int64),
            "test_idx": z["test_idx"].astype(np.int64),
            "num_nodes": int(z["num_nodes"]),
            "num_classes": int(z["num_classes"]),
        }


def load_cora(normalize_features: bool = True, path: str = CORA_PATH) -> GraphDataset:
    dgl = import_dgl()
    a = load_cora_arrays(path, normalize_features)
    n = a["num_nodes"]
    g = dgl.graph((torch.from_numpy(a["src"]), torch.from_numpy(a["dst"])), num_nodes=n)
    g.ndata["feat"] = torch.from_numpy(a["feat"])
    g.ndata["label"] = torch.from_numpy(a["label"])
    for split in ("train", "val", "test"):
        g.ndata[f"{split}_mask"] = index_to_mask(a[f"{split}_idx"], n)
    return GraphDataset("cora", g, a["num_classes"], multilabel=False, metric="acc",
                        source="bundled (planetoid, converted by scripts/convert_cora.py)",
                        info={"path": path, "normalize_features": normalize_features},
                        key="cora" if normalize_features else "cora-rawfeat")
