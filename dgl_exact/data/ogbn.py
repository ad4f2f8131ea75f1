"""ogbn-arxiv and ogbn-products through ogb's ``DglNodePropPredDataset``, offline and prompt-free.

ogb downloads whatever is missing and asks on stdin in two places (a dataset folder without
``RELEASE_v1.txt``: "Will you update the dataset now?"; a download over 1 GB). Before calling ogb we check
that its on-disk layout is complete, and raise :class:`DatasetNotFoundError` otherwise; while ogb runs,
``input()`` and ogb's download functions raise instead of prompting or downloading.

ogb's layout under ``root`` (from ``ogb/nodeproppred/dataset_dgl.py`` and ``master.csv``, ogb 1.3.6)::

    <root>/ogbn_arxiv/                 (or ogbn_arxiv_dgl/, which ogb prefers when it exists)
        RELEASE_v1.txt                 without it ogb prompts (and crashes with EOFError without a tty)
        processed/dgl_data_processed   ogb's cache; if absent it is built from raw/:
        raw/edge.csv.gz, num-node-list.csv.gz, num-edge-list.csv.gz, node-feat.csv.gz,
            node-label.csv.gz, node_year.csv.gz (arxiv only)
        split/time/{train,valid,test}.csv.gz   (or split_dict.pt; products: split/sales_ranking/)

ogb writes ``processed/dgl_data_processed`` on the first load, so ``root`` must be writable then (a
read-only root works once it is there; otherwise that is said before ogb runs). The cache is
fingerprinted (:mod:`~dgl_exact.data.cache`) and rebuilt when ``raw/`` changes, when it is truncated or
replaced, or with ``force_reload=True``. ogb would read ``split/<split>/split_dict.pt`` with torch's default
``torch.load``, which unpickles anything on torch < 2.6 (or with ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``); we
read that file ourselves with ``weights_only=True`` (tensors only) and never let ogb open it, so nothing
read back runs code. A file that is not a dict of 1-D integer tensors ``train``/``valid``/``test`` is
refused with one line naming it.

``download=True`` hands a missing dataset to ogb's own downloader (ogb's progress bar; its "over 1 GB,
proceed?" prompt is answered yes). A folder without ``RELEASE_v1.txt`` is never deleted: ogb's "update
the dataset now?" prompt is refused with the fix.
"""
from __future__ import annotations

import contextlib
import gzip
import os
import zlib
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator
from unittest import mock


from .._compat import import_dgl
from .base import DatasetFileError, DatasetNotFoundError, GraphDataset, index_to_mask, missing_files, no_prompt
from .cache import cache_verdict, check_dgl_header, resolve_unrecorded, writable, write_record
from .download import fetch, quiet_output
from .validate import check_dataset, fail, int_array, numeric_array

__all__ = ["OGB_SPECS", "OgbSpec", "check_ogb", "load_ogbn"]

_BASE_RAW = ("edge.csv.gz", "num-node-list.csv.gz", "num-edge-list.csv.gz", "node-feat.csv.gz",
             "node-label.csv.gz")
_SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class OgbSpec:
    name: str
    dir_name: str          # '_'.join(name.split('-'))
    version: int           # master.csv 'version' -> RELEASE_v{version}.txt
    split: str             # master.csv 'split'
    url: str               # master.csv 'url'
    extra_node_files: tuple[str, ...]   # master.csv 'additional node files'
    num_classes: int
    reverse_edges: bool    # whether dgl_exact symmetrises the graph ogb returns

    @property
    def raw_files(self) -> tuple[str, ...]:
        return tuple(f"raw/{f}" for f in _BASE_RAW + tuple(f"{x}.csv.gz" for x in self.extra_node_files))

    @property
    def split_files(self) -> tuple[str, ...]:
        return tuple(f"split/{self.split}/{s}.csv.gz" for s in _SPLITS)

    def instructions(self, root: str) -> str:
        return (f"Get it with internet access once: `dgl-exact datasets --download {self.name} --data-root {root}` "
                f"(or `python -c \"import dgl_exact; from ogb.nodeproppred import DglNodePropPredDataset as D; "
                f"D('{self.name}', root='{root}')\"`: dgl_exact must be imported first, it makes DGL importable), "
                f"or download {self.url}, "
                f"unzip it in {root} and rename the extracted folder to {self.dir_name} (the zip holds "
                f"RELEASE_v{self.version}.txt, raw/ and split/{self.split}/).")


# Values of ogb 1.3.6's master.csv (tests check they still agree with the installed ogb).
OGB_SPECS = {
    "ogbn-arxiv": OgbSpec("ogbn-arxiv", "ogbn_arxiv", 1, "time",
                          "http://snap.stanford.edu/ogb/data/nodeproppred/arxiv.zip", ("node_year",), 40,
                          reverse_edges=True),
    "ogbn-products": OgbSpec("ogbn-products", "ogbn_products", 1, "sales_ranking",
                             "http://snap.stanford.edu/ogb/data/nodeproppred/products.zip", (), 47,
                             reverse_edges=False),
}


def dataset_folder(spec: OgbSpec, root: str) -> str:
    """The folder ogb will use: ``<root>/<dir_name>_dgl`` if it exists, else ``<root>/<dir_name>``."""
    dgl_variant = os.path.join(root, spec.dir_name + "_dgl")
    return dgl_variant if os.path.exists(dgl_variant) else os.path.join(root, spec.dir_name)


def check_ogb(name: str, root: str | os.PathLike) -> str:
    """Return the dataset folder if ogb can load ``name`` from ``root`` without network or prompts.

    Raises :class:`DatasetNotFoundError` naming the folder and the missing files otherwise.
    """
    spec = OGB_SPECS[name]
    root = os.fspath(root)
    folder = dataset_folder(spec, root)
    instructions = spec.instructions(root)
    if not os.path.isdir(folder):
        raise DatasetNotFoundError(name, folder, instructions=instructions, detail="no such folder")
    release = f"RELEASE_v{spec.version}.txt"
    missing = missing_files(folder, [release])
    if missing:
        raise DatasetNotFoundError(
            name, folder, missing, instructions, detail=(
                f"{release} is missing, so ogb would ask on stdin whether to delete the folder and "
                f"download again; if the files are ogb's current release, create the empty file "
                f"{os.path.join(folder, release)}"))
    if not os.path.isfile(os.path.join(folder, "processed", "dgl_data_processed")):
        missing += missing_files(folder, spec.raw_files)
    if not os.path.isfile(os.path.join(folder, "split", spec.split, "split_dict.pt")):
        missing += missing_files(folder, spec.split_files)
    if missing:
        raise DatasetNotFoundError(name, folder, missing, instructions, detail="incomplete folder")
    return folder


@contextlib.contextmanager
def _ogb_guard(name: str, folder: str, instructions: str, download: bool = False,
               quiet: bool = False) -> Iterator[ModuleType]:
    """Import ogb's DGL dataset module; make ``input()`` raise and, unless ``download``, ogb's download
    functions too. With ``download``, ogb's size prompt is answered yes (nothing else is answered) and ogb's
    downloader is dgl_exact's :func:`~dgl_exact.data.download.fetch` (one line on an HTTP error, bounded
    attempts). With ``quiet``, ogb prints nothing (its processing messages and progress bars)."""
    import_dgl()
    from ogb.nodeproppred import dataset_dgl

    def fetch_into(url, folder, log=True):
        return fetch(url, os.path.join(folder, url.rpartition("/")[2]), quiet=quiet or not log)

    def refuse_download(*args, **kwargs):
        raise DatasetNotFoundError(name, folder, instructions=instructions,
                                   detail="ogb tried to download; pass download=True (CLI: --download) to allow it")

    if download:
        patches = [mock.patch.object(dataset_dgl, "decide_download", lambda url: True),
                   mock.patch.object(dataset_dgl, "download_url", fetch_into)]
    else:
        patches = [mock.patch.object(dataset_dgl, "decide_download", refuse_download),
                   mock.patch.object(dataset_dgl, "download_url", refuse_download)]
    with no_prompt(name, folder, instructions), contextlib.ExitStack() as stack, quiet_output(quiet):
        for p in patches:
            stack.enter_context(p)
        yield dataset_dgl


def _bad_gzip(folder: str, files) -> tuple[str, str] | None:
    """The first of ``files`` (relative to ``folder``) that is not a complete gzip stream, with the reason."""
    for rel in files:
        path = os.path.join(folder, rel)
        if not os.path.isfile(path):
            continue
        try:
            with gzip.open(path, "rb") as f:
                while f.read(1 << 22):
                    pass
        except (OSError, EOFError, zlib.error) as err:
            return path, f"{type(err).__name__}: {err}"
    return None


def _read_csv(name: str, folder: str, rel: str, spec: OgbSpec, columns: int | None = None):
    """``rel`` (a gzipped csv without header, as ogb reads it) as a numpy array, or one DatasetFileError line
    naming it: unreadable, empty, or not ``columns`` columns."""
    import pandas as pd

    path = os.path.join(folder, rel)
    fix = f"replace it with the file from {spec.url} (or get the dataset again)"
    try:
        values = pd.read_csv(path, compression="gzip", header=None).values
    except pd.errors.EmptyDataError:
        fail(name, path, "empty file; expected one row per entry", fix)
    except (OSError, EOFError, zlib.error, ValueError, pd.errors.ParserError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        fail(name, path, f"unreadable ({type(err).__name__}: {reason})", fix)
    if values.shape[0] == 0:
        fail(name, path, "empty file; expected one row per entry", fix)
    if columns is not None and values.shape[1] != columns:
        fail(name, path, f"{values.shape[1]} columns; expected {columns}", fix)
    return values, path, fix


def _check_ogb_raw(name: str, folder: str, spec: OgbSpec) -> None:
    """Validate ``raw/`` before ogb reads it: ogb truncates float ids (``astype(int64)``), and DGL fails with a
    traceback on edge ids beyond the node count or a feature row count that does not match."""
    nodes, path, fix = _read_csv(name, folder, "raw/num-node-list.csv.gz", spec, columns=1)
    if nodes.shape[0] != 1:
        fail(name, path, f"{nodes.shape[0]} rows; expected 1 (one graph)", fix)
    n = int(int_array(nodes[:, 0], dataset=name, path=path, field="num nodes", low=1, what="a node count",
                      fix=fix)[0])
    edges, path, fix = _read_csv(name, folder, "raw/edge.csv.gz", spec, columns=2)
    int_array(edges, dataset=name, path=path, field="edge", high=n,
              what=f"node ids (num-node-list.csv.gz says {n} nodes)", fix=fix)
    counts, path, fix = _read_csv(name, folder, "raw/num-edge-list.csv.gz", spec, columns=1)
    m = int_array(counts[:, 0], dataset=name, path=path, field="num edges", what="an edge count", fix=fix)
    if m.shape[0] != 1 or int(m[0]) != edges.shape[0]:
        fail(name, path, f"says {m.tolist()} edges; expected [{edges.shape[0]}] (the rows of edge.csv.gz)", fix)
    feat, path, fix = _read_csv(name, folder, "raw/node-feat.csv.gz", spec)
    numeric_array(feat, dataset=name, path=path, field="features", fix=fix)
    if feat.shape[0] != n:
        fail(name, path, f"{feat.shape[0]} rows; expected {n} (one per node, num-node-list.csv.gz)", fix)
    label, path, fix = _read_csv(name, folder, "raw/node-label.csv.gz", spec, columns=1)
    if label.shape[0] != n:
        fail(name, path, f"{label.shape[0]} rows; expected {n} (one per node, num-node-list.csv.gz)", fix)
    int_array(label[:, 0], dataset=name, path=path, field="label", high=spec.num_classes, what="classes", fix=fix)
    for extra in spec.extra_node_files:
        values, path, fix = _read_csv(name, folder, f"raw/{extra}.csv.gz", spec)
        numeric_array(values, dataset=name, path=path, field=extra, fix=fix)
        if values.shape[0] != n:
            fail(name, path, f"{values.shape[0]} rows; expected {n} (one per node, num-node-list.csv.gz)", fix)


def _split_csv(name: str, folder: str, spec: OgbSpec, n: int) -> dict:
    """The split csv files, read and validated here (ogb would take the first column of anything, and fail
    with a TypeError on text): one column of node ids in ``[0, n)``."""
    import torch

    split = {}
    for part in _SPLITS:
        values, path, fix = _read_csv(name, folder, f"split/{spec.split}/{part}.csv.gz", spec, columns=1)
        split[part] = torch.from_numpy(int_array(values[:, 0], dataset=name, path=path, field=f"{part} ids",
                                                 high=n, fix=fix))
    return split


def _download(name: str, root: str, quiet: bool = False) -> None:
    """Let ogb download ``name`` into ``root`` (only when its folder does not exist)."""
    spec = OGB_SPECS[name]
    folder = dataset_folder(spec, root)
    if os.path.isdir(folder):
        raise DatasetNotFoundError(name, folder, instructions=spec.instructions(root), detail=(
            "the folder exists but is incomplete; dgl_exact does not delete it: move it away and rerun with "
            "--download"))
    if not writable(root):
        raise DatasetFileError(name, root, "read-only, cannot download into it", "choose a writable --data-root")
    os.makedirs(root, exist_ok=True)
    with _ogb_guard(name, folder, spec.instructions(root), download=True, quiet=quiet) as dataset_dgl, \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # ogb's, harmless
        dataset_dgl.DglNodePropPredDataset(name=name, root=root)


def _prepare_cache(name: str, folder: str, force_reload: bool) -> bool:
    """Check ogb's processed file against its fingerprint; delete it when it must be rebuilt. Returns
    whether ogb will (re)build it."""
    spec = OGB_SPECS[name]
    cache = os.path.join(folder, "processed", "dgl_data_processed")
    verdict, reason = cache_verdict(cache, folder, spec.raw_files)
    if force_reload and verdict != "missing":
        verdict, reason = "rebuild", "force_reload"
    verdict, reason = resolve_unrecorded(name, cache, verdict, reason)
    fix_raw = f"restore {folder}/raw/ (or get the dataset again) so that it can be rebuilt"
    if verdict == "rebuild":
        missing = missing_files(folder, spec.raw_files)
        if missing:
            raise DatasetFileError(name, cache, f"must be rebuilt ({reason}) but raw files are missing "
                                   f"({', '.join(missing)})", fix_raw)
        if not writable(os.path.dirname(cache)):
            raise DatasetFileError(name, cache, f"must be rebuilt ({reason}) but its folder is read-only",
                                   "run once with write access to the data root")
        os.remove(cache)
        return True
    if verdict == "unchecked":
        check_dgl_header(name, cache, fix_raw)
    if verdict == "missing" and not writable(os.path.join(folder, "processed")):
        raise DatasetFileError(name, cache, "not built yet and the data root is read-only (ogb writes it on the "
                               "first load)", "run once with write access to the data root")
    return verdict == "missing"


def _split_dict_path(folder: str, spec: OgbSpec) -> str:
    return os.path.join(folder, "split", spec.split, "split_dict.pt")


def _split_dict(name: str, folder: str, spec: OgbSpec) -> dict:
    """Read ogb's optional ``split_dict.pt`` tensors-only (ogb itself would unpickle it with torch's default)."""
    import torch

    path = _split_dict_path(folder, spec)
    fix = (f"delete it (the split csv files under {os.path.dirname(path)} are used then) or replace it with "
           f"the one from {spec.url}")
    try:
        split = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - UnpicklingError for anything but tensors, zip errors, ...
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DatasetFileError(name, path, f"not a tensors-only split file, not loaded ({reason})", fix) from None
    ok = isinstance(split, dict) and all(
        isinstance(split.get(s), torch.Tensor) and split[s].dim() == 1 and not split[s].is_floating_point()
        and not split[s].is_complex() and split[s].dtype != torch.bool for s in _SPLITS)
    if not ok:
        raise DatasetFileError(name, path, "not a dict of 1-D integer index tensors 'train', 'valid', 'test'", fix)
    return {s: split[s].long() for s in _SPLITS}


def load_ogbn(name: str, root: str | os.PathLike, force_reload: bool = False,
              download: bool = False, quiet: bool = False) -> GraphDataset:
    """Load ``ogbn-arxiv`` or ``ogbn-products`` with ogb; arxiv gets reverse edges (``dgl.to_bidirected``).

    Labels are flattened to 1-D int64; the ogb split becomes ``train_mask``/``val_mask``/``test_mask``.
    Other node data ogb provides (arxiv's ``year``) is kept. ``force_reload`` rebuilds ogb's processed
    file from ``raw/``; ``download`` lets ogb download a dataset whose folder does not exist.
    """
    import torch

    dgl = import_dgl()
    spec = OGB_SPECS[name]
    root = os.fspath(root)
    if download and not os.path.isdir(dataset_folder(spec, root)):
        _download(name, root, quiet)
    folder = check_ogb(name, root)
    building = _prepare_cache(name, folder, force_reload)
    if building:
        bad = _bad_gzip(folder, spec.raw_files)
        if bad:
            raise DatasetFileError(name, bad[0], f"unreadable ({bad[1]})", "replace it with the file from "
                                   f"{spec.url} (or get the dataset again)")
        _check_ogb_raw(name, folder, spec)   # before ogb reads (and caches) anything
    cache = os.path.join(folder, "processed", "dgl_data_processed")
    with _ogb_guard(name, folder, spec.instructions(root), quiet=quiet) as dataset_dgl, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # ogb's, harmless
        try:
            ds = dataset_dgl.DglNodePropPredDataset(name=name, root=root)
        except DatasetNotFoundError:
            raise
        except Exception as err:
            if building:
                bad = _bad_gzip(folder, spec.raw_files)
                if bad:
                    raise DatasetFileError(name, bad[0], f"unreadable ({bad[1]})", "replace it with the file from "
                                           f"{spec.url} (or get the dataset again)") from None
                raise
            raise DatasetFileError(name, cache, f"ogb cannot read it ({type(err).__name__}: {err})",
                                   "delete it (it is rebuilt from raw/) or pass force_reload=True "
                                   "(CLI: dgl-exact datasets --force-reload)") from None
    if building:
        write_record(cache, folder, spec.raw_files)
    g, labels = ds[0]
    n = g.num_nodes()
    split = _split_dict(name, folder, spec) if os.path.isfile(_split_dict_path(folder, spec)) \
        else _split_csv(name, folder, spec, n)
    directed_edges = g.num_edges()
    if spec.reverse_edges:
        g = dgl.to_bidirected(g, copy_ndata=True)
    g.ndata["feat"] = g.ndata["feat"].float()
    label_path = os.path.join(folder, "raw", "node-label.csv.gz")
    if labels.numel() != n:
        fail(name, cache, f"{labels.numel()} labels for {n} nodes", "delete it (it is rebuilt from raw/) or pass "
             "force_reload=True (CLI: dgl-exact datasets --force-reload)")
    g.ndata["label"] = labels.reshape(n)
    for part in _SPLITS:
        idx = torch.as_tensor(split[part])
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
            where = _split_dict_path(folder, spec) if os.path.isfile(_split_dict_path(folder, spec)) else \
                os.path.join(folder, "split", spec.split, f"{part}.csv.gz")
            raise DatasetFileError(name, where, f"{part} node ids outside [0, {n})",
                                   f"replace it with the file from {spec.url} (or get the dataset again)")
    g.ndata["train_mask"] = index_to_mask(split["train"], n)
    g.ndata["val_mask"] = index_to_mask(split["valid"], n)
    g.ndata["test_mask"] = index_to_mask(split["test"], n)
    split_path = _split_dict_path(folder, spec)
    split_files = {s: split_path if os.path.isfile(split_path) else os.path.join(folder, "split", spec.split,
                                                                                   f"{p}.csv.gz")
                   for s, p in (("train", "train"), ("val", "valid"), ("test", "test"))}
    ds = GraphDataset(name, g, spec.num_classes, multilabel=False, metric="acc",
                      source="ogb DglNodePropPredDataset",
                      info={"folder": folder, "ogb_num_edges": directed_edges,
                            "reverse_edges_added": spec.reverse_edges})
    check_dataset(ds, {"feat": os.path.join(folder, "raw", "node-feat.csv.gz"), "label": label_path, **split_files})
    g.ndata["label"] = g.ndata["label"].long()
    return ds
