"""Datasets: one entry point, :func:`load_dataset`, returning a uniform :class:`GraphDataset`.

Known names (``DATASETS``): ``cora`` (bundled), ``ogbn-arxiv``, ``ogbn-products`` (ogb),
``flickr``, ``reddit``, ``yelp`` (DGL's classes, or PyG's layout), ``reddit2`` (GraphSAINT files in PyG's
layout: the "Reddit" of EXACT's tables), ``synthetic``/``synthetic-small``/``synthetic-arxiv``/
``synthetic-products`` (generated). Nothing prompts and nothing is downloaded unless asked
(``download=True``): a dataset that is not on disk raises :class:`DatasetNotFoundError` explaining where
its files go and how to get them, an unusable file raises :class:`DatasetFileError` (one line: the file,
the problem, the fix); :func:`dataset_status` answers the first question without raising.
"""
from .base import DatasetFileError, DatasetNotFoundError, GraphDataset, compute_metric, standardize_features
from .registry import DATASETS, DatasetSpec, dataset_status, default_root, load_dataset
from .synthetic import SYNTHETIC_PRESETS, SyntheticConfig, generate_synthetic

__all__ = ["load_dataset", "dataset_status", "DATASETS", "DatasetSpec", "GraphDataset",
           "DatasetNotFoundError", "DatasetFileError", "standardize_features", "compute_metric", "default_root",
           "SyntheticConfig", "SYNTHETIC_PRESETS", "generate_synthetic"]
