"""The uniform dataset object every loader returns, the not-found error, and small shared helpers."""
from __future__ import annotations

import builtins
import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch

__all__ = ["GraphDataset", "DatasetNotFoundError", "DatasetFileError", "compute_metric", "standardize_features",
           "SPLITS"]

SPLITS = ("train", "val", "test")
_SPLIT_ALIASES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are not (completely) on disk, and dgl_exact will not download or prompt for them.

    Attributes: ``dataset`` (name), ``folder`` (where the files were expected), ``missing`` (paths,
    relative to ``folder``, that were looked for and not found) and ``instructions`` (how to get them).
    The message says all of it.
    """

    def __init__(self, dataset: str, folder: str | os.PathLike, missing: Sequence[str] = (),
                 instructions: str = "", detail: str = ""):
        self.dataset = dataset
        self.folder = os.fspath(folder)
        self.missing = list(missing)
        self.instructions = instructions
        self.detail = detail
        lines = [f"dataset {dataset!r} not found in {self.folder}" + (f": {detail}" if detail else "")]
        if self.missing:
            lines.append("missing: " + ", ".join(self.missing))
        if instructions:
            lines.append(instructions)
        super().__init__("\n".join(lines))

    def __reduce__(self):  # picklable (e.g. across DataLoader workers / multiprocessing)
        return (type(self), (self.dataset, self.folder, self.missing, self.instructions, self.detail))


class DatasetFileError(ValueError):
    """A dataset file exists but cannot be used (truncated, corrupt, wrong format, or a cache that no longer
    matches its raw files and cannot be rebuilt). The message is one line: the file, what is wrong, the fix.

    Attributes: ``dataset``, ``path`` (the file), ``problem`` and ``fix``.
    """

    def __init__(self, dataset: str, path: str | os.PathLike, problem: str, fix: str):
        self.dataset, self.path, self.problem, self.fix = dataset, os.fspath(path), problem, fix
        super().__init__(f"dataset {dataset!r}: {self.path}: {problem}; {fix}")

    def __reduce__(self):
        return (type(self), (self.dataset, self.path, self.problem, self.fix))


@dataclass
class GraphDataset:
    """One node-classification graph with everything a training loop needs.

    ``graph`` is a ``DGLGraph`` whose ``ndata`` holds ``feat`` (float32 ``[N, F]``), ``label``
    (int64 ``[N]``; float32 ``[N, C]`` multi-hot when ``multilabel``) and bool ``train_mask``,
    ``val_mask``, ``test_mask``. ``metric`` is ``"acc"`` (single-label: cross-entropy, accuracy) or
    ``"micro_f1"`` (multi-label: BCE-with-logits, micro-averaged F1 of ``logits > 0``).

    ``key`` identifies the exact graph (file-name safe): the name for fixed datasets, plus a hash of
    the parameters and seed for generated ones, plus ``-selfloop``/``-rawfeat`` for variants. Use it,
    not ``name``, to key on-disk caches (partitions, sampler statistics).
    """

    name: str
    graph: Any
    num_classes: int
    multilabel: bool = False
    metric: str = "acc"
    source: str = ""
    info: dict = field(default_factory=dict)
    key: str = ""

    def __post_init__(self):
        if not self.key:
            self.key = self.name

    # ---- shapes -------------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return int(self.graph.num_nodes())

    @property
    def num_edges(self) -> int:
        return int(self.graph.num_edges())

    @property
    def num_features(self) -> int:
        return int(self.graph.ndata["feat"].shape[1])

    @property
    def features(self) -> torch.Tensor:
        return self.graph.ndata["feat"]

    @property
    def labels(self) -> torch.Tensor:
        return self.graph.ndata["label"]

    # ---- splits -------------------------------------------------------------------------------------
    def mask(self, split: str) -> torch.Tensor:
        """Boolean node mask of ``split`` ("train", "val"/"valid", "test")."""
        return self.graph.ndata[f"{_split_name(split)}_mask"]

    def idx(self, split: str) -> torch.Tensor:
        """Node ids (int64, ascending) of ``split``."""
        return torch.nonzero(self.mask(split), as_tuple=True)[0]

    @property
    def train_idx(self) -> torch.Tensor:
        return self.idx("train")

    @property
    def val_idx(self) -> torch.Tensor:
        return self.idx("val")

    @property
    def test_idx(self) -> torch.Tensor:
        return self.idx("test")

    def split_idx(self) -> dict[str, torch.Tensor]:
        return {s: self.idx(s) for s in SPLITS}

    # ---- loss and metric ----------------------------------------------------------------------------
    def loss(self, logits: torch.Tensor, nodes: torch.Tensor | str | None = None) -> torch.Tensor:
        """Cross-entropy (single-label) or BCE-with-logits (multi-label) of ``logits`` on ``nodes``.

        ``logits`` has one row per graph node; ``nodes`` is a split name, an index/mask tensor, or None
        (all rows).
        """
        rows, labels = self._select(logits, nodes)
        if self.multilabel:
            return torch.nn.functional.binary_cross_entropy_with_logits(rows, labels.to(rows.dtype))
        return torch.nn.functional.cross_entropy(rows, labels)

    def evaluate(self, logits: torch.Tensor, nodes: torch.Tensor | str | None = "test") -> float:
        """``metric`` of ``logits`` (one row per graph node) on ``nodes`` (split name, index/mask, None)."""
        rows, labels = self._select(logits, nodes)
        return compute_metric(self.metric, rows, labels)

    def _select(self, logits, nodes):
        labels = self.labels.to(logits.device)
        if logits.shape[0] != labels.shape[0]:
            raise ValueError(f"logits have {logits.shape[0]} rows, the graph has {labels.shape[0]} nodes")
        if nodes is None:
            return logits, labels
        if isinstance(nodes, str):
            nodes = self.mask(nodes)
        nodes = nodes.to(logits.device)
        return logits[nodes], labels[nodes]

    def summary(self) -> str:
        sizes = ", ".join(f"{s} {int(self.mask(s).sum())}" for s in SPLITS)
        kind = "multi-label" if self.multilabel else "classes"
        return (f"{self.name}: {self.num_nodes:,} nodes, {self.num_edges:,} edges, {self.num_features} "
                f"features, {self.num_classes} {kind}, metric {self.metric}; {sizes}")

    def __repr__(self) -> str:
        return f"GraphDataset({self.summary()})"


def compute_metric(metric: str, logits: torch.Tensor, labels: torch.Tensor) -> float:
    """``"acc"``: argmax accuracy; ``"micro_f1"``: micro-F1 of ``logits > 0`` against multi-hot labels.

    Micro-F1 is ``2 TP / (2 TP + FP + FN)`` over all (node, label) pairs, and 0 when that is 0/0 (no
    positive prediction and no positive label), as ``sklearn.metrics.f1_score(average="micro")`` and EXACT.
    """
    if logits.shape[0] == 0:
        return float("nan")
    if metric == "acc":
        return (logits.argmax(-1) == labels).float().mean().item()
    if metric == "micro_f1":
        pred = logits > 0
        true = labels > 0.5
        tp = (pred & true).sum().item()
        fp = (pred & ~true).sum().item()
        fn = (~pred & true).sum().item()
        denom = 2 * tp + fp + fn
        return 2 * tp / denom if denom else 0.0
    raise ValueError(f"unknown metric {metric!r} (expected 'acc' or 'micro_f1')")


def _split_name(split: str) -> str:
    try:
        return _SPLIT_ALIASES[split]
    except KeyError:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}") from None


def index_to_mask(idx, n: int) -> torch.Tensor:
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.as_tensor(np.asarray(idx), dtype=torch.long)] = True
    return mask


def missing_files(folder: str, files: Sequence[str]) -> list[str]:
    return [f for f in files if not os.path.isfile(os.path.join(folder, f))]


@contextlib.contextmanager
def no_prompt(dataset: str, folder: str, instructions: str) -> Iterator[None]:
    """Make ``input()`` raise instead of reading stdin while third-party loading code runs."""
    original = builtins.input

    def refuse(prompt: str = "") -> str:
        raise DatasetNotFoundError(
            dataset, folder, instructions=instructions,
            detail=f"the loader asked {str(prompt).strip()!r} on stdin; dgl_exact never answers prompts")

    builtins.input = refuse
    try:
        yield
    finally:
        builtins.input = original


def standardize_features(feat: torch.Tensor) -> torch.Tensor:
    """EXACT's Yelp/Reddit2 preprocessing: ``(x - mean) / std`` per feature column.

    As EXACT's ``data.py`` (``(x - x.mean(dim=0)) / x.std(dim=0)`` on the whole graph): statistics over
    **all** nodes (train, val and test rows alike), ``std`` with Bessel's correction (ddof 1), no epsilon.
    One deliberate difference: a constant column (std 0) becomes 0 here, where EXACT's division gives NaN.
    Computed in float64, returned as float32.
    """
    x = feat.double()
    mean = x.mean(dim=0)
    std = x.std(dim=0) if x.shape[0] > 1 else torch.zeros_like(mean)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return ((x - mean) / std).float()
