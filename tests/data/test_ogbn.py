"""ogb's on-disk layout (dgl_exact.data.ogbn): tiny fake files read by the real loading code (reverse edges for
arxiv, symmetric products), missing or incomplete folders refused, and ogb's download prompt refused by the guard."""
import os
import pickle
import shutil
import time

import numpy as np
import pandas as pd
import pytest
import torch

from dgl_exact._compat import import_dgl
from dgl_exact.data import DatasetNotFoundError, dataset_status, load_dataset
from dgl_exact.data.ogbn import OGB_SPECS, _ogb_guard
from tests.data._helpers import _check_common, _edge_set, make_ogb

dgl = import_dgl()


pytestmark = pytest.mark.usefixtures("closed_stdin")


# ---------------------------------------------------------------------------------------------------
# ogb
# ---------------------------------------------------------------------------------------------------
def test_ogb_specs_match_installed_master_csv():
    import importlib.util

    ogb_dir = importlib.util.find_spec("ogb").submodule_search_locations[0]  # without importing ogb
    master = pd.read_csv(os.path.join(ogb_dir, "nodeproppred", "master.csv"), index_col=0, keep_default_na=False)
    for name, spec in OGB_SPECS.items():
        meta = master[name]
        assert spec.dir_name == "_".join(name.split("-"))
        assert int(meta["version"]) == spec.version and meta["split"] == spec.split
        assert meta["url"] == spec.url and int(meta["num classes"]) == spec.num_classes
        extra = () if meta["additional node files"] == "None" else tuple(meta["additional node files"].split(","))
        assert extra == spec.extra_node_files
        assert meta["binary"] == "False" and meta["is hetero"] == "False"


def test_ogbn_arxiv_layout_loads_with_reverse_edges(tmp_path):
    n, e = 60, 150
    _, src, dst, parts = make_ogb(str(tmp_path), "ogbn-arxiv", n=n, e=e)
    ok, msg = dataset_status("ogbn-arxiv", tmp_path)
    assert ok, msg
    ds = load_dataset("ogbn-arxiv", tmp_path)
    _check_common(ds, n, 8)
    g = ds.graph
    directed = _edge_set(src, dst)
    assert _edge_set(*g.edges()) == directed | _edge_set(dst, src)  # reverse edges added, deduplicated
    assert ds.num_edges == len(directed | _edge_set(dst, src)) and ds.info["ogb_num_edges"] == e
    assert g.ndata["label"].shape == (n,) and g.ndata["label"].dtype == torch.int64
    assert torch.equal(ds.train_idx, torch.from_numpy(np.sort(parts["train"])))
    assert torch.equal(ds.val_idx, torch.from_numpy(np.sort(parts["valid"])))
    assert ds.num_classes == 40 and "year" in g.ndata
    # second load: ogb's processed cache
    assert os.path.isfile(tmp_path / "ogbn_arxiv" / "processed" / "dgl_data_processed")
    again = load_dataset("arxiv", tmp_path)
    assert again.num_edges == ds.num_edges and torch.equal(again.labels, ds.labels)


def test_ogbn_products_layout_loads_symmetric(tmp_path):
    n, e = 50, 120
    _, src, dst, parts = make_ogb(str(tmp_path), "ogbn-products", n=n, e=e, f=5)
    ds = load_dataset("ogbn-products", tmp_path)
    _check_common(ds, n, 5)
    assert ds.num_edges == 2 * e  # ogb stores one direction on disk and adds the inverse
    s, d = ds.graph.edges()
    assert _edge_set(s, d) == _edge_set(src, dst) | _edge_set(dst, src)
    assert ds.num_classes == 47
    assert int(ds.mask("test").sum()) == len(parts["test"])


@pytest.mark.parametrize("case", ["no_folder", "no_release", "no_raw", "no_split"])
def test_ogbn_missing_or_incomplete_raises(tmp_path, case):
    root = str(tmp_path)
    if case == "no_release":
        make_ogb(root, "ogbn-arxiv", release=False)
    elif case == "no_raw":
        make_ogb(root, "ogbn-arxiv", drop=["raw/node_year.csv.gz"])
    elif case == "no_split":
        make_ogb(root, "ogbn-arxiv", drop=["split/time/valid.csv.gz"])
    t = time.perf_counter()
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("ogbn-arxiv", root)
    assert time.perf_counter() - t < 5
    msg = str(err.value)
    assert os.path.join(root, "ogbn_arxiv") in msg and "arxiv.zip" in msg
    assert isinstance(err.value, FileNotFoundError)
    expected = {"no_release": "RELEASE_v1.txt", "no_raw": "raw/node_year.csv.gz",
                "no_split": "split/time/valid.csv.gz"}.get(case)
    if expected:
        assert expected in err.value.missing
    assert not dataset_status("ogbn-arxiv", root)[0]
    assert str(pickle.loads(pickle.dumps(err.value))) == msg
    if case == "no_release":  # the folder is left untouched (ogb would offer to delete it)
        assert os.path.isfile(tmp_path / "ogbn_arxiv" / "raw" / "edge.csv.gz")


def test_ogb_prompt_is_refused_by_the_guard(tmp_path):
    """Even called directly, ogb cannot prompt inside the guard: input() raises DatasetNotFoundError."""
    folder, *_ = make_ogb(str(tmp_path), "ogbn-arxiv", release=False)
    with pytest.raises(DatasetNotFoundError, match="stdin"):
        with _ogb_guard("ogbn-arxiv", folder, "") as dataset_dgl:
            dataset_dgl.DglNodePropPredDataset("ogbn-arxiv", root=str(tmp_path))
    assert os.path.isdir(folder)
    shutil.rmtree(os.path.join(folder, "raw"))
    open(os.path.join(folder, "RELEASE_v1.txt"), "w").close()
    with pytest.raises(DatasetNotFoundError, match="download"):
        with _ogb_guard("ogbn-arxiv", folder, "") as dataset_dgl:
            dataset_dgl.DglNodePropPredDataset("ogbn-arxiv", root=str(tmp_path))
