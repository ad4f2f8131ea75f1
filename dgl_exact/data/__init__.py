"""Datasets: one entry point, :func:`load_dataset`, returning a uniform :class:`GraphDataset`.

Known names (``DATASETS``): ``cora`` (bundled), ``ogbn-arxiv``, ``ogbn-products`` (ogb),
``flickr``, ``reddit``, ``yelp`` (DGL's classes), ``synthetic``/``synthetic-small``/``synthetic-arxiv``/
``synthetic-products`` (generated). Nothing is ever downloaded and nothing prompts: a dataset that is not
on disk raises :class:`DatasetNotFoundError` explaining where its files go and how to get them;
:func:`dataset_status` answers the same question without raising.
"""
from .base import DatasetNotFoundError, GraphDataset, compute_metric
from .registry import DATASETS, DatasetSpec, dataset_status, default_root, load_dataset
from .synthetic import SYNTHETIC_PRESETS, SyntheticConfig, generate_synthetic

__all__ = ["load_dataset", "dataset_status", "DATASETS", "DatasetSpec", "GraphDataset",
           "DatasetNotFoundError", "compute_metric", "default_root", "SyntheticConfig",
           "SYNTHETIC_PRESETS", "generate_synthetic"]
