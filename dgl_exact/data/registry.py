"""``DATASETS``, ``load_dataset`` and ``dataset_status``: one entry point for every dataset dgl_exact knows."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .base import DatasetNotFoundError, GraphDataset
from .dgl_builtin import DGL_SPECS, check_dgl_dataset, dgl_raw_folder_name, load_dgl_dataset
from .ogbn import OGB_SPECS, check_ogb, load_ogbn
from .synthetic import SYNTHETIC_PRESETS, load_synthetic

__all__ = ["DatasetSpec", "DATASETS", "load_dataset", "dataset_status", "default_root"]


@dataclass(frozen=True)
class DatasetSpec:
    """What dgl_exact knows about a dataset. ``layout`` is relative to the ``root`` passed to
    :func:`load_dataset`; ``instructions`` says how to put the files there."""

    name: str
    source: str
    description: str
    layout: str
    instructions: str
    num_classes: int | None
    multilabel: bool = False
    metric: str = "acc"
    url: str | None = None
    needs_root: bool = True


def default_root() -> str:
    """``$DGL_EXACT_DATA`` if set, else ``data`` (relative to the working directory, as the CLI)."""
    return os.path.expanduser(os.environ.get("DGL_EXACT_DATA", "data"))


def _ogb_spec(name: str, description: str) -> DatasetSpec:
    s = OGB_SPECS[name]
    files = ", ".join(f"{s.dir_name}/{f}" for f in s.raw_files + s.split_files)
    return DatasetSpec(
        name, "ogb DglNodePropPredDataset", description,
        layout=(f"{s.dir_name}/RELEASE_v{s.version}.txt; {files} (or {s.dir_name}/processed/dgl_data_processed "
                f"instead of raw/, split/{s.split}/split_dict.pt instead of the split csv files)"),
        instructions=s.instructions("<root>"), num_classes=s.num_classes, url=s.url)


def _dgl_spec(name: str, description: str) -> DatasetSpec:
    s = DGL_SPECS[name]
    folder = dgl_raw_folder_name(s)
    return DatasetSpec(
        name, f"dgl.data.{s.dgl_class}", description,
        layout=(f"{folder}/{{{','.join(s.files)}}} (or the same files in {s.name}/; DGL's cache "
                f"dgl_graph.bin in that folder also suffices)"),
        instructions=s.instructions("<root>"), num_classes=s.num_classes, multilabel=s.multilabel,
        metric="micro_f1" if s.multilabel else "acc", url=s.url() + s.zip_path)


def _synthetic_spec(name: str) -> DatasetSpec:
    c = SYNTHETIC_PRESETS[name]
    return DatasetSpec(
        name, "generated", f"planted-partition graph: {c.num_nodes:,} nodes, about "
        f"{c.num_nodes * c.avg_degree:,.0f} directed edges, {c.num_features} features, {c.num_classes} classes, "
        f"homophily {c.homophily}; any SyntheticConfig field can be overridden by keyword or "
        f"'{name}:key=value,...'", layout="(nothing on disk)", instructions="generated from the seed",
        num_classes=c.num_classes, needs_root=False)


DATASETS: dict[str, DatasetSpec] = {
    "cora": DatasetSpec(
        "cora", "bundled", "Cora citation graph, planetoid split (as dgl.data.CoraGraphDataset): 2,708 nodes, "
        "10,556 directed edges, 1,433 features (row-normalised), 7 classes, 140/500/1,000",
        layout="(bundled with the package: dgl_exact/data/bundled/cora.npz)", instructions="always available",
        num_classes=7, needs_root=False),
    "ogbn-arxiv": _ogb_spec("ogbn-arxiv", "arxiv citations: 169,343 nodes, 1,166,243 edges made symmetric "
                            "(2,315,598), 128 features, 40 classes, time split"),
    "ogbn-products": _ogb_spec("ogbn-products", "Amazon co-purchases: 2,449,029 nodes, 123,718,280 directed "
                               "edges (symmetric), 100 features, 47 classes, sales-rank split"),
    "flickr": _dgl_spec("flickr", "GraphSAINT Flickr: 89,250 nodes, 899,756 edges, 500 features, 7 classes"),
    "reddit": _dgl_spec("reddit", "Reddit posts: 232,965 nodes, 114,615,892 edges, 602 features, 41 classes"),
    "yelp": _dgl_spec("yelp", "GraphSAINT Yelp: 716,847 nodes, 13,954,819 edges, 300 features, "
                      "100 labels (multi-label)"),
}
for _name in ("synthetic", "synthetic-small", "synthetic-arxiv", "synthetic-products"):
    DATASETS[_name] = _synthetic_spec(_name)
del _name


def _canonical(name: str) -> str:
    key = name.strip().lower()
    if key.startswith("synthetic"):
        return key.partition(":")[0]
    if key in ("arxiv", "products"):
        key = "ogbn-" + key
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return key


def load_dataset(name: str, root: str | os.PathLike | None = None, *, seed: int = 0,
                 self_loop: bool = False, **kwargs) -> GraphDataset:
    """Load dataset ``name`` (see ``DATASETS``) from ``root`` (default :func:`default_root`).

    Never downloads and never reads stdin: missing files raise :class:`DatasetNotFoundError` (a
    ``FileNotFoundError``) saying what is expected where and how to get it.

    * ``seed`` seeds synthetic graphs (real datasets have fixed splits and ignore it).
    * ``self_loop=True`` removes existing self loops and adds one per node (any dataset).
    * other keyword arguments go to the loader: ``cora``: ``normalize_features`` (default True, as DGL);
      ``flickr``/``reddit``/``yelp``: ``force_reload``; ``synthetic*``: any :class:`SyntheticConfig`
      field (``num_nodes``, ``avg_degree``, ``num_features``, ``num_classes``, ``homophily``,
      ``feature_noise``, ``train_frac``, ``val_frac``, ``test_frac``).
    """
    key = _canonical(name)
    root = default_root() if root is None else os.fspath(root)
    if key == "cora":
        from .cora import load_cora

        ds = load_cora(**kwargs)
    elif key.startswith("synthetic"):
        ds = load_synthetic(name.strip().lower(), seed=seed, **kwargs)
    elif key in OGB_SPECS:
        _no_kwargs(key, kwargs)
        ds = load_ogbn(key, root)
    elif key in DGL_SPECS:
        ds = load_dgl_dataset(key, root, **kwargs)
    else:  # pragma: no cover - DATASETS and the loaders are kept in sync
        raise ValueError(f"no loader for {name!r}")
    if self_loop:
        from .._compat import import_dgl

        dgl = import_dgl()
        ds.graph = dgl.add_self_loop(dgl.remove_self_loop(ds.graph))
        ds.info["self_loop"] = True
        ds.key += "-selfloop"
    return ds


def dataset_status(name: str, root: str | os.PathLike | None = None) -> tuple[bool, str]:
    """``(present, message)``: whether :func:`load_dataset` can load ``name`` from ``root`` offline.

    Checks files only (fast; nothing is loaded). The message names the folder found, or what is
    missing and how to get it.
    """
    key = _canonical(name)
    spec = DATASETS[key]
    root = default_root() if root is None else os.fspath(root)
    if not spec.needs_root:
        return True, f"{key}: {spec.instructions}"
    try:
        if key in OGB_SPECS:
            folder = check_ogb(key, root)
        else:
            folder, _ = check_dgl_dataset(key, root)
    except DatasetNotFoundError as err:
        return False, str(err)
    return True, f"{key}: found in {folder}"


def _no_kwargs(name: str, kwargs: dict) -> None:
    if kwargs:
        raise TypeError(f"{name} takes no loader options, got {sorted(kwargs)}")

