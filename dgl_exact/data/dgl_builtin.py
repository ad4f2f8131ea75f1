"""Flickr, Reddit and Yelp through DGL's own dataset classes, offline.

DGL's ``DGLBuiltinDataset`` reads ``<raw_dir>/<name>_<sha1(url)[:8]>/`` (the URL honours the
``DGL_REPO`` environment variable, so does the hash) and downloads ``<name>.zip`` when that folder is
missing; it caches the processed graph as ``dgl_graph.bin`` in the same folder. With the default
``DGL_REPO`` the folders are::

    <root>/flickr_b05c56ca/  adj_full.npz feats.npy class_map.json role.json   (GraphSAINT format)
    <root>/yelp_76020611/    adj_full.npz feats.npy class_map.json role.json   (labels: 100-dim multi-hot)
    <root>/reddit_69f818f5/  reddit_graph.npz reddit_data.npz                  (DGL's own format)

A plain ``<root>/flickr/`` (etc.) with the same files, e.g. the unzipped ``flickr.zip``, is accepted too.
We check that the raw files (or DGL's ``dgl_graph.bin`` cache) exist before DGL runs, and subclass the
DGL class so that its ``download()`` raises :class:`DatasetNotFoundError` instead of going online (DGL
would call it if the cache fails to load and the raw folder is gone). ``download=True`` lets DGL's own
downloader fetch a dataset whose folder does not exist (DGL prints the URL and shows a progress bar).

``dgl_graph.bin`` is DGL's binary graph format (no pickle). It is fingerprinted
(:mod:`~dgl_exact.data.cache`) and checked before DGL reads it (DGL segfaults on a truncated one): it is
rebuilt from the raw files when they changed, when it was truncated or replaced, or with
``force_reload=True``.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from .._compat import import_dgl
from .base import DatasetFileError, DatasetNotFoundError, GraphDataset, missing_files, no_prompt
from .cache import cache_verdict, check_dgl_header, resolve_unrecorded, writable, write_record
from .download import DownloadError, fetch, quiet_output
from .pyg_layout import raw_sources
from .validate import check_dataset

__all__ = ["DGL_SPECS", "DglSpec", "check_dgl_dataset", "load_dgl_dataset", "dgl_raw_folder_name"]

_DEFAULT_DGL_REPO = "https://data.dgl.ai/"
_GRAPHSAINT_FILES = ("adj_full.npz", "feats.npy", "class_map.json", "role.json")
_CACHE_FILE = "dgl_graph.bin"


@dataclass(frozen=True)
class DglSpec:
    name: str
    dgl_class: str       # in dgl.data
    dgl_name: str        # DGL's dataset name (folder prefix)
    zip_path: str        # relative to DGL_REPO
    files: tuple[str, ...]
    num_classes: int
    multilabel: bool

    def url(self) -> str:
        repo = os.environ.get("DGL_REPO", _DEFAULT_DGL_REPO)  # as dgl.data.utils._get_dgl_url
        return repo if repo.endswith("/") else repo + "/"

    def instructions(self, root: str) -> str:
        url = self.url() + self.zip_path
        return (f"Get it with internet access once: `dgl-exact datasets --download {self.name} --data-root {root}` "
                f"(or `python -c \"import dgl_exact, dgl; dgl.data.{self.dgl_class}(raw_dir='{root}')\"`: "
                f"dgl_exact must be imported first, it makes DGL importable), or download {url} and unzip it into "
                f"{os.path.join(root, dgl_raw_folder_name(self))}/ (or {os.path.join(root, self.name)}/).")


DGL_SPECS = {
    "flickr": DglSpec("flickr", "FlickrDataset", "flickr", "dataset/flickr.zip", _GRAPHSAINT_FILES, 7, False),
    "reddit": DglSpec("reddit", "RedditDataset", "reddit", "dataset/reddit.zip",
                      ("reddit_graph.npz", "reddit_data.npz"), 41, False),
    "yelp": DglSpec("yelp", "YelpDataset", "yelp", "dataset/yelp.zip", _GRAPHSAINT_FILES, 100, True),
}


def dgl_raw_folder_name(spec: DglSpec) -> str:
    """DGL's ``raw_path`` basename: ``name + '_' + sha1(url)[:8]``."""
    url = spec.url() + spec.zip_path
    return f"{spec.dgl_name}_{hashlib.sha1(url.encode('utf-8')).hexdigest()[:8]}"


def _complete(folder: str, spec: DglSpec) -> bool:
    return os.path.isdir(folder) and (not missing_files(folder, spec.files)
                                      or os.path.isfile(os.path.join(folder, _CACHE_FILE)))


def check_dgl_dataset(name: str, root: str | os.PathLike) -> tuple[str, bool]:
    """Return ``(folder, dgl_native)`` for the first complete layout, else raise DatasetNotFoundError.

    ``dgl_native`` is True for DGL's hashed folder, False for the plain ``<root>/<name>/`` one.
    """
    spec = DGL_SPECS[name]
    root = os.fspath(root)
    native = os.path.join(root, dgl_raw_folder_name(spec))
    plain = os.path.join(root, spec.name)
    for folder, is_native in ((native, True), (plain, False)):
        if _complete(folder, spec):
            return folder, is_native
    existing = [f for f in (native, plain) if os.path.isdir(f)]
    if existing:
        folder = existing[0]
        raise DatasetNotFoundError(name, folder, missing_files(folder, spec.files), spec.instructions(root),
                                   detail="incomplete folder")
    raise DatasetNotFoundError(name, native, instructions=spec.instructions(root),
                               detail=f"no such folder (nor {plain})")


def _offline_class(base, spec: DglSpec, folder: str, dgl_native: bool, instructions: str):
    def download(self):
        raise DatasetNotFoundError(spec.name, folder, missing_files(folder, spec.files), instructions,
                                   detail="DGL tried to download; dgl_exact never downloads")

    attrs = {"download": download, "__module__": __name__}
    if not dgl_native:  # read and cache in the plain folder instead of DGL's hashed one
        attrs["raw_path"] = property(lambda self: folder)
        attrs["save_path"] = property(lambda self: folder)
    return type(f"Offline{base.__name__}", (base,), attrs)


def _download(spec: DglSpec, root: str, quiet: bool = False) -> None:
    """DGL's class downloads and extracts ``spec``'s zip into ``root``, through dgl_exact's
    :func:`~dgl_exact.data.download.fetch` (DGL's own retries an HTTP 404 and ends in a RuntimeError)."""
    from unittest import mock

    dgl = import_dgl()
    from dgl.data import dgl_dataset

    failed = []

    def fetch_to(url, path=None, **kwargs):
        if failed:   # DGL calls download() again when it failed once (retry_method_with_fix): same answer
            raise failed[0]
        try:
            return fetch(url, path or os.path.join(root, url.rpartition("/")[2]), quiet=quiet)
        except DownloadError as err:
            failed.append(err)
            raise

    if not writable(root):
        raise DatasetFileError(spec.name, root, "read-only, cannot download into it", "choose a writable --data-root")
    os.makedirs(root, exist_ok=True)
    folder = os.path.join(root, dgl_raw_folder_name(spec))
    with no_prompt(spec.name, folder, spec.instructions(root)), quiet_output(quiet), \
            mock.patch.object(dgl_dataset, "download", fetch_to):
        getattr(dgl.data, spec.dgl_class)(raw_dir=root, verbose=not quiet)


def _diagnose_raw(name: str, folder: str) -> None:
    """Raise DatasetFileError naming the first unreadable or invalid raw file of ``folder``, if there is one
    (the same validation as PyG's layout: DGL's own readers would coerce what they cannot use, e.g. a
    ``"tr": null`` in ``role.json`` marks every node for training)."""
    from .pyg_layout import read_graphsaint, read_reddit

    spec = DGL_SPECS[name]
    if name == "reddit":
        read_reddit(name, folder, spec.num_classes)
    else:
        read_graphsaint(name, folder, spec.multilabel, spec.num_classes)


def load_dgl_dataset(name: str, root: str | os.PathLike, force_reload: bool = False,
                     download: bool = False, quiet: bool = False) -> GraphDataset:
    """Load ``flickr``, ``reddit`` or ``yelp`` with DGL's class; Yelp labels become float32 multi-hot.

    ``force_reload`` rebuilds ``dgl_graph.bin`` from the raw files; ``download`` lets DGL download the
    dataset when neither of its folders exists."""
    dgl = import_dgl()
    spec = DGL_SPECS[name]
    root = os.fspath(root)
    if download and not any(os.path.isdir(os.path.join(root, f)) for f in (dgl_raw_folder_name(spec), spec.name)):
        _download(spec, root, quiet)
    folder, dgl_native = check_dgl_dataset(name, root)
    instructions = spec.instructions(root)
    cache = os.path.join(folder, _CACHE_FILE)
    verdict, reason = cache_verdict(cache, folder, spec.files)
    if force_reload and verdict != "missing":
        verdict, reason = "rebuild", "force_reload"
    verdict, reason = resolve_unrecorded(name, cache, verdict, reason)
    fix_raw = f"put the raw files ({', '.join(spec.files)}) back in {folder} so that it can be rebuilt"
    if verdict == "rebuild" and missing_files(folder, spec.files):
        raise DatasetFileError(name, cache, f"must be rebuilt ({reason}) but raw files are missing", fix_raw)
    if verdict in ("rebuild", "missing") and not writable(folder):
        raise DatasetFileError(name, cache, ("not built yet" if verdict == "missing" else f"must be rebuilt ({reason})")
                               + " and its folder is read-only", "run once with write access to the data root")
    if verdict == "unchecked":
        check_dgl_header(name, cache, fix_raw)
    building = verdict in ("rebuild", "missing")
    if building:
        _diagnose_raw(name, folder)   # validated before DGL reads (and caches) anything
    cls = _offline_class(getattr(dgl.data, spec.dgl_class), spec, folder, dgl_native, instructions)
    with no_prompt(name, folder, instructions), quiet_output(quiet):
        try:
            ds = cls(raw_dir=root, force_reload=verdict == "rebuild", verbose=False)
        except DatasetNotFoundError:
            raise
        except Exception:
            if building:
                _diagnose_raw(name, folder)
            raise
    if building:
        write_record(cache, folder, spec.files)
    g = ds[0]
    g.ndata["feat"] = g.ndata["feat"].float()
    label = g.ndata["label"]
    g.ndata["label"] = label.float() if spec.multilabel else label.long()
    for split in ("train", "val", "test"):
        g.ndata[f"{split}_mask"] = g.ndata[f"{split}_mask"].bool()
    ds = GraphDataset(name, g, spec.num_classes, multilabel=spec.multilabel,
                      metric="micro_f1" if spec.multilabel else "acc",
                      source=f"dgl.data.{spec.dgl_class}",
                      info={"folder": folder, "dgl_native_layout": dgl_native})
    sources = raw_sources(name, folder)
    if not building:   # read from DGL's cache: name it, the fix is a rebuild
        sources = {k: cache for k in sources}
    check_dataset(ds, sources, None if building else "delete it (it is rebuilt from the raw files) or pass "
                  "force_reload=True (CLI: dgl-exact datasets --force-reload)")
    return ds

