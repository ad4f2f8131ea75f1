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
would call it if the cache fails to load and the raw folder is gone).
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from .._compat import import_dgl
from .base import DatasetNotFoundError, GraphDataset, missing_files, no_prompt

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
        return (f"Download {url} and unzip it into {os.path.join(root, dgl_raw_folder_name(self))}/ "
                f"(or {os.path.join(root, self.name)}/), or run `dgl.data.{self.dgl_class}(raw_dir='{root}')` "
                f"once with internet access.")


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


def load_dgl_dataset(name: str, root: str | os.PathLike, force_reload: bool = False) -> GraphDataset:
    """Load ``flickr``, ``reddit`` or ``yelp`` with DGL's class; Yelp labels become float32 multi-hot."""
    dgl = import_dgl()
    spec = DGL_SPECS[name]
    root = os.fspath(root)
    folder, dgl_native = check_dgl_dataset(name, root)
    instructions = spec.instructions(root)
    cls = _offline_class(getattr(dgl.data, spec.dgl_class), spec, folder, dgl_native, instructions)
    with no_prompt(name, folder, instructions):
        ds = cls(raw_dir=root, force_reload=force_reload, verbose=False)
    g = ds[0]
    g.ndata["feat"] = g.ndata["feat"].float()
    label = g.ndata["label"]
    g.ndata["label"] = label.float() if spec.multilabel else label.long()
    for split in ("train", "val", "test"):
        g.ndata[f"{split}_mask"] = g.ndata[f"{split}_mask"].bool()
    return GraphDataset(name, g, spec.num_classes, multilabel=spec.multilabel,
                        metric="micro_f1" if spec.multilabel else "acc",
                        source=f"dgl.data.{spec.dgl_class}",
                        info={"folder": folder, "dgl_native_layout": dgl_native})

