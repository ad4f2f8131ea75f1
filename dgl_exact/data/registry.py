"""``DATASETS``, ``load_dataset`` and ``dataset_status``: one entry point for every dataset dgl_exact knows."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .base import DatasetNotFoundError, GraphDataset, missing_files, standardize_features
from .compact import compact_graph
from .dgl_builtin import DGL_SPECS, check_dgl_dataset, dgl_raw_folder_name, load_dgl_dataset
from .ogbn import OGB_SPECS, check_ogb, load_ogbn
from .pyg_layout import GRAPHSAINT_FILES, REDDIT_FILES, raw_sources, read_graphsaint, read_reddit
from .synthetic import SYNTHETIC_PRESETS, load_synthetic
from .validate import check_dataset

__all__ = ["DatasetSpec", "DATASETS", "load_dataset", "dataset_status", "default_root", "PYG_FOLDERS"]

# PyG's dataset folders under EXACT's data root (``<root>/<folder>/raw/``), see ``pyg_layout``.
PYG_FOLDERS = {"flickr": "Flickr", "yelp": "YELP", "reddit": "Reddit", "reddit2": "Reddit2"}


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


def _root(root: str | os.PathLike | None) -> str:
    return default_root() if root is None else os.path.expanduser(os.fspath(root))


def _ogb_spec(name: str, description: str) -> DatasetSpec:
    s = OGB_SPECS[name]
    files = ", ".join(f"{s.dir_name}/{f}" for f in s.raw_files + s.split_files)
    return DatasetSpec(
        name, "ogb DglNodePropPredDataset", description,
        layout=(f"{s.dir_name}/RELEASE_v{s.version}.txt; {files} (or {s.dir_name}/processed/dgl_data_processed "
                f"instead of raw/, split/{s.split}/split_dict.pt instead of the split csv files); the same under "
                f"OGB/ (EXACT's and PyG's ogb root)"),
        instructions=s.instructions("<root>"), num_classes=s.num_classes, url=s.url)


def _dgl_spec(name: str, description: str) -> DatasetSpec:
    s = DGL_SPECS[name]
    folder = dgl_raw_folder_name(s)
    return DatasetSpec(
        name, f"dgl.data.{s.dgl_class}", description,
        layout=(f"{folder}/{{{','.join(s.files)}}} (or the same files in {s.name}/; DGL's cache "
                f"dgl_graph.bin in that folder also suffices) or PyG's {PYG_FOLDERS[name]}/raw/ (read as PyG "
                f"reads it)"),
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
    "reddit": _dgl_spec("reddit", "Reddit posts: 232,965 nodes, 114,615,892 edges, 602 features, 41 classes "
                        "(not the Reddit of EXACT's tables: that is reddit2)"),
    "yelp": _dgl_spec("yelp", "GraphSAINT Yelp: 716,847 nodes, 13,954,819 edges, 300 features, "
                      "100 labels (multi-label)"),
    "reddit2": DatasetSpec(
        "reddit2", "GraphSAINT files, read as torch_geometric.datasets.Reddit2",
        "GraphSAINT's Reddit (EXACT's reported 'Reddit'): 232,965 nodes, 23,213,838 edges, 602 features, "
        "41 classes", layout=f"Reddit2/raw/{{{','.join(GRAPHSAINT_FILES)}}} (PyG) or the same files in reddit2/",
        instructions=("Copy PyG's Reddit2 raw files (torch_geometric.datasets.Reddit2(root='<root>/Reddit2') "
                      "downloads them from Google Drive; GraphSAINT's 'reddit' folder holds the same four files) "
                      "into <root>/Reddit2/raw/"),
        num_classes=41),
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
        from ..errors import did_you_mean

        raise ValueError(f"unknown dataset {name!r}{did_you_mean(key, DATASETS)}")
    return key


def _pyg_folder(key: str, root: str) -> str | None:
    """The first PyG-style folder of ``key`` under ``root`` that exists (complete or not), else None."""
    candidates = [os.path.join(root, PYG_FOLDERS[key], "raw")]
    if key == "reddit2":
        candidates.append(os.path.join(root, "reddit2"))
    return next((c for c in candidates if os.path.isdir(c)), None)


def _pyg_files(key: str) -> tuple[str, ...]:
    return REDDIT_FILES if key == "reddit" else GRAPHSAINT_FILES


def _check_pyg(key: str, root: str) -> str:
    """The complete PyG-layout folder of ``key``; DatasetNotFoundError otherwise."""
    folder = _pyg_folder(key, root)
    instructions = DATASETS[key].instructions.replace("<root>", root)
    if folder is None:
        raise DatasetNotFoundError(key, os.path.join(root, PYG_FOLDERS[key], "raw"), instructions=instructions,
                                   detail="no such folder" + (f" (nor {os.path.join(root, 'reddit2')})"
                                                              if key == "reddit2" else ""))
    missing = missing_files(folder, _pyg_files(key))
    if missing:
        raise DatasetNotFoundError(key, folder, missing, instructions, detail="incomplete folder")
    return folder


def _locate_dgl_or_pyg(key: str, root: str) -> tuple[str, str]:
    """``("dgl", folder)`` for DGL's layouts (preferred), ``("pyg", folder)`` for PyG's ``raw/`` folder."""
    try:
        folder, _ = check_dgl_dataset(key, root)
        return "dgl", folder
    except DatasetNotFoundError as err:
        pyg = _pyg_folder(key, root)
        if pyg is None:
            raise DatasetNotFoundError(
                key, err.folder, err.missing, err.instructions + f" PyG's layout "
                f"{os.path.join(root, PYG_FOLDERS[key], 'raw')}/ ({', '.join(_pyg_files(key))}) is accepted too.",
                err.detail) from None
        if missing_files(pyg, _pyg_files(key)):
            raise DatasetNotFoundError(key, pyg, missing_files(pyg, _pyg_files(key)), err.instructions,
                                       detail="incomplete folder (PyG layout)") from None
        return "pyg", pyg


def _ogb_root(key: str, root: str) -> str:
    """``root``, or ``root/OGB`` (EXACT's and PyG's ogb root) when only that one holds the dataset."""
    spec = OGB_SPECS[key]
    exact = os.path.join(root, "OGB")
    here = any(os.path.exists(os.path.join(root, spec.dir_name + sfx)) for sfx in ("", "_dgl"))
    there = any(os.path.exists(os.path.join(exact, spec.dir_name + sfx)) for sfx in ("", "_dgl"))
    return exact if there and not here else root


def _load_pyg(key: str, folder: str) -> GraphDataset:
    import torch

    from .._compat import import_dgl

    dgl = import_dgl()
    multilabel = key == "yelp"
    spec = DATASETS[key]
    a = (read_reddit(key, folder, spec.num_classes) if key == "reddit"
         else read_graphsaint(key, folder, multilabel, spec.num_classes))
    n = a["num_nodes"]
    g = dgl.graph((torch.from_numpy(a["src"]), torch.from_numpy(a["dst"])), num_nodes=n)
    g.ndata["feat"] = torch.from_numpy(a["feat"])
    g.ndata["label"] = torch.from_numpy(a["label"])
    for split in ("train", "val", "test"):
        g.ndata[f"{split}_mask"] = torch.from_numpy(a[f"{split}_mask"])
    pyg_class = {"flickr": "Flickr", "yelp": "Yelp", "reddit": "Reddit", "reddit2": "Reddit2"}[key]
    ds = GraphDataset(key, g, spec.num_classes, multilabel=multilabel, metric="micro_f1" if multilabel else "acc",
                      source=f"PyG layout (raw files read as torch_geometric.datasets.{pyg_class})",
                      info={"folder": folder, "layout": "pyg"},
                      key=key if key == "reddit2" else f"{key}-pyg")
    check_dataset(ds, raw_sources(key, folder))
    return ds


def load_dataset(name: str, root: str | os.PathLike | None = None, *, seed: int = 0,
                 self_loop: bool = False, standardize: bool = False, force_reload: bool = False,
                 download: bool = False, quiet: bool = False, compact: bool = False, **kwargs) -> GraphDataset:
    """Load dataset ``name`` (see ``DATASETS``) from ``root`` (default :func:`default_root`).

    Never reads stdin, and downloads only with ``download=True``: missing files raise
    :class:`DatasetNotFoundError` (a ``FileNotFoundError``) saying what is expected where and how to get
    it; unusable files raise :class:`~dgl_exact.data.base.DatasetFileError` (one line: file, problem, fix).

    * ``download=True``: a dataset whose folder does not exist is fetched by ogb's or DGL's own
      downloader into ``root`` (ogb's size prompt answered yes; nothing existing is deleted). reddit2 has
      no downloader (PyG fetches it from Google Drive).
    * ``quiet=True``: ogb's and DGL's messages and progress bars (downloads, processing) are not printed.
    * ``force_reload=True``: rebuild ogb's / DGL's processed file from the raw files. Without it, the
      processed file is rebuilt anyway when the raw files changed or it was truncated (fingerprints in
      ``<processed file>.dgl_exact.json``, see :mod:`~dgl_exact.data.cache`).

    * ``seed`` seeds synthetic graphs (real datasets have fixed splits and ignore it).
    * ``self_loop=True`` removes existing self loops and adds one per node (any dataset).
    * ``standardize=True``: EXACT's feature standardisation for Yelp and Reddit2 (any dataset), see
      :func:`~dgl_exact.data.base.standardize_features`.
    * Layouts: flickr/yelp/reddit in DGL's folders (loaded by DGL's classes) or PyG's
      ``<root>/{Flickr,YELP,Reddit}/raw/``; reddit2 in ``<root>/Reddit2/raw/`` or ``<root>/reddit2/``
      (PyG's semantics, see :mod:`~dgl_exact.data.pyg_layout`); ogb datasets in ``<root>/ogbn_*`` or
      EXACT's ``<root>/OGB/ogbn_*``.
    * other keyword arguments go to the loader: ``cora``: ``normalize_features`` (default True, as DGL);
      ``synthetic*``: any :class:`SyntheticConfig`
      field (``num_nodes``, ``avg_degree``, ``num_features``, ``num_classes``, ``homophily``,
      ``feature_noise``, ``train_frac``, ``val_frac``, ``test_frac``).

    * ``compact=True``: the graph's ids in int32 when its node and edge counts are below ``2**31`` (int64
      beyond), see :func:`~dgl_exact.data.compact.compact_graph`: half the structure memory. The trainer
      loads this way. Off by default: the graph then has DGL's int64 ids, which DGL code expects (its
      ``DataLoader`` wants seed ids of the graph's type, and DGL's examples pass ``torch.arange``).
    """
    ds = _read(name, _root(root), seed, force_reload, download, quiet, kwargs)
    if compact:
        ds.graph = compact_graph(ds.graph)  # int32 ids when the counts allow: half the structure memory
    if self_loop:
        from .._compat import import_dgl

        dgl = import_dgl()
        ds.graph = dgl.add_self_loop(dgl.remove_self_loop(ds.graph))
        ds.info["self_loop"] = True
        ds.key += "-selfloop"
    if standardize:
        ds.graph.ndata["feat"] = standardize_features(ds.graph.ndata["feat"])
        ds.info["standardized"] = True
        ds.key += "-std"
    return ds


def _read(name: str, root: str, seed: int, force_reload: bool, download: bool, quiet: bool,
          kwargs: dict) -> GraphDataset:
    """Dataset ``name`` as its loader gives it (:func:`load_dataset`'s arguments; ``root`` resolved)."""
    key = _canonical(name)
    if key == "cora":
        from .cora import load_cora

        ds = load_cora(**kwargs)
    elif key.startswith("synthetic"):
        ds = load_synthetic(name.strip().lower(), seed=seed, **kwargs)
    elif key in OGB_SPECS:
        _no_kwargs(key, kwargs)
        ds = load_ogbn(key, _ogb_root(key, root), force_reload=force_reload, download=download, quiet=quiet)
    elif key == "reddit2":
        _no_kwargs(key, kwargs)
        try:
            folder = _check_pyg(key, root)
        except DatasetNotFoundError as err:
            if download:
                raise DatasetNotFoundError(key, err.folder, err.missing, err.instructions, detail=(
                    "no downloader for reddit2 (neither ogb nor DGL serves it); " + err.detail)) from None
            raise
        ds = _load_pyg(key, folder)    # nothing cached: always read from the raw files
    elif key in DGL_SPECS:
        _no_kwargs(key, kwargs)
        try:
            kind, folder = _locate_dgl_or_pyg(key, root)
        except DatasetNotFoundError:
            if not download:
                raise
            kind, folder = "dgl", ""
        if kind == "dgl":
            ds = load_dgl_dataset(key, root, force_reload=force_reload, download=download, quiet=quiet)
        else:
            ds = _load_pyg(key, folder)    # nothing cached for PyG's layout
    else:  # pragma: no cover - DATASETS and the loaders are kept in sync
        raise ValueError(f"no loader for {name!r}")
    return ds


def dataset_status(name: str, root: str | os.PathLike | None = None) -> tuple[bool, str]:
    """``(present, message)``: whether :func:`load_dataset` can load ``name`` from ``root`` offline.

    Checks files only (fast; nothing is loaded). The message names the folder found, or what is
    missing and how to get it.
    """
    key = _canonical(name)
    spec = DATASETS[key]
    root = _root(root)
    if not spec.needs_root:
        return True, f"{key}: {spec.instructions}"
    try:
        if key in OGB_SPECS:
            folder = check_ogb(key, _ogb_root(key, root))
        elif key == "reddit2":
            folder = _check_pyg(key, root)
        else:
            _, folder = _locate_dgl_or_pyg(key, root)
    except DatasetNotFoundError as err:
        return False, str(err)
    return True, f"{key}: found in {folder}"


def _no_kwargs(name: str, kwargs: dict) -> None:
    if kwargs:
        raise TypeError(f"{name} takes no loader options, got {sorted(kwargs)}")

