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

ogb writes ``processed/dgl_data_processed`` on the first load, so ``root`` must be writable then.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator
from unittest import mock


from .._compat import import_dgl
from .base import DatasetNotFoundError, GraphDataset, index_to_mask, missing_files, no_prompt

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
        return (f"Get it with internet access once: `python -c \"from ogb.nodeproppred import "
                f"DglNodePropPredDataset as D; D('{self.name}', root='{root}')\"`, or download {self.url}, "
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
def _ogb_guard(name: str, folder: str, instructions: str) -> Iterator[ModuleType]:
    """Import ogb's DGL dataset module; make ``input()`` and ogb's download functions raise."""
    import_dgl()
    from ogb.nodeproppred import dataset_dgl

    def refuse_download(*args, **kwargs):
        raise DatasetNotFoundError(name, folder, instructions=instructions,
                                   detail="ogb tried to download; dgl_exact never downloads")

    with no_prompt(name, folder, instructions), \
            mock.patch.object(dataset_dgl, "decide_download", refuse_download), \
            mock.patch.object(dataset_dgl, "download_url", refuse_download):
        yield dataset_dgl


def load_ogbn(name: str, root: str | os.PathLike) -> GraphDataset:
    """Load ``ogbn-arxiv`` or ``ogbn-products`` with ogb; arxiv gets reverse edges (``dgl.to_bidirected``).

    Labels are flattened to 1-D int64; the ogb split becomes ``train_mask``/``val_mask``/``test_mask``.
    Other node data ogb provides (arxiv's ``year``) is kept.
    """
    dgl = import_dgl()
    spec = OGB_SPECS[name]
    root = os.fspath(root)
    folder = check_ogb(name, root)
    with _ogb_guard(name, folder, spec.instructions(root)) as dataset_dgl, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # ogb's, harmless
        ds = dataset_dgl.DglNodePropPredDataset(name=name, root=root)
        split = ds.get_idx_split()
    g, labels = ds[0]
    n = g.num_nodes()
    directed_edges = g.num_edges()
    if spec.reverse_edges:
        g = dgl.to_bidirected(g, copy_ndata=True)
    g.ndata["feat"] = g.ndata["feat"].float()
    g.ndata["label"] = labels.reshape(n, -1)[:, 0].long()
    g.ndata["train_mask"] = index_to_mask(split["train"], n)
    g.ndata["val_mask"] = index_to_mask(split["valid"], n)
    g.ndata["test_mask"] = index_to_mask(split["test"], n)
    return GraphDataset(name, g, spec.num_classes, multilabel=False, metric="acc",
                        source="ogb DglNodePropPredDataset",
                        info={"folder": folder, "ogb_num_edges": directed_edges,
                              "reverse_edges_added": spec.reverse_edges})
