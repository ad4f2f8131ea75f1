"""DGL's on-disk folders (dgl_exact.data.dgl_builtin): Flickr, Yelp (multilabel) and Reddit in DGL's layout or a
plain folder, folder names equal to DGL's, missing or incomplete folders refused."""
import os
import time

import pytest
import torch

from dgl_exact._compat import import_dgl
from dgl_exact.data import DatasetNotFoundError, dataset_status, load_dataset
from dgl_exact.data.dgl_builtin import DGL_SPECS, dgl_raw_folder_name
from tests.data._helpers import _check_common, _edge_set, make_graphsaint, make_reddit

dgl = import_dgl()


pytestmark = pytest.mark.usefixtures("closed_stdin")


# ---------------------------------------------------------------------------------------------------
# DGL: Flickr, Yelp, Reddit
# ---------------------------------------------------------------------------------------------------
def test_dgl_folder_names_match_dgl():
    for name, spec in DGL_SPECS.items():
        cls = getattr(dgl.data, spec.dgl_class)
        obj = cls.__new__(cls)  # raw_path without loading anything
        obj._raw_dir, obj._name = "/r", spec.dgl_name
        obj._url = dgl.data.utils._get_dgl_url(spec.zip_path)
        assert obj.raw_path == os.path.join("/r", dgl_raw_folder_name(spec)), name


@pytest.mark.parametrize("plain", [False, True], ids=["dgl_layout", "plain_folder"])
def test_flickr_layout_loads(tmp_path, plain):
    folder = tmp_path / ("flickr" if plain else dgl_raw_folder_name(DGL_SPECS["flickr"]))
    adj, labels, role = make_graphsaint(str(folder), n=50, e=120, f=6)
    ds = load_dataset("flickr", tmp_path)
    _check_common(ds, 50, 6)
    s, d = ds.graph.edges()
    assert _edge_set(s, d) == _edge_set(*adj.nonzero())
    assert torch.equal(ds.labels, torch.from_numpy(labels)) and ds.labels.dtype == torch.int64
    assert torch.equal(ds.train_idx, torch.tensor(sorted(role["tr"])))
    assert ds.metric == "acc" and ds.num_classes == 7
    assert os.path.isfile(folder / "dgl_graph.bin")  # DGL cached next to the raw files
    assert load_dataset("flickr", tmp_path).num_edges == ds.num_edges  # from the cache


def test_yelp_layout_loads_multilabel(tmp_path):
    folder = tmp_path / dgl_raw_folder_name(DGL_SPECS["yelp"])
    _, labels, role = make_graphsaint(str(folder), n=50, e=120, f=4, num_classes=100, multilabel=True)
    ds = load_dataset("yelp", tmp_path)
    _check_common(ds, 50, 4)
    assert ds.multilabel and ds.metric == "micro_f1" and ds.num_classes == 100
    assert ds.labels.dtype == torch.float32 and ds.labels.shape == (50, 100)
    assert torch.equal(ds.labels, torch.from_numpy(labels).float())
    logits = torch.where(ds.labels > 0, 3.0, -3.0)
    assert ds.evaluate(logits, "train") == 1.0
    assert ds.loss(logits, "train").item() < 0.1


def test_reddit_layout_loads(tmp_path):
    folder = tmp_path / dgl_raw_folder_name(DGL_SPECS["reddit"])
    adj, labels, node_types = make_reddit(str(folder), n=40, e=100, f=5)
    ds = load_dataset("reddit", tmp_path)
    _check_common(ds, 40, 5)
    assert ds.num_edges == adj.nnz and ds.num_classes == 41
    # DGL reorders Reddit's nodes (RCMK): compare as multisets
    assert sorted(ds.labels.tolist()) == sorted(labels.tolist())
    assert int(ds.mask("val").sum()) == int((node_types == 2).sum())
    sl = load_dataset("reddit", tmp_path, self_loop=True)
    s, d = sl.graph.edges()
    assert int((s == d).sum()) == 40 and sl.num_edges == adj.nnz + 40


@pytest.mark.parametrize("name", ["flickr", "reddit", "yelp"])
def test_dgl_missing_or_incomplete_raises(tmp_path, name):
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(name, tmp_path)
    assert dgl_raw_folder_name(DGL_SPECS[name]) in str(err.value) and f"{name}.zip" in str(err.value)
    folder = tmp_path / dgl_raw_folder_name(DGL_SPECS[name])
    folder.mkdir()
    first = DGL_SPECS[name].files[0]
    (folder / first).write_bytes(b"")
    t = time.perf_counter()
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(name, tmp_path)
    assert time.perf_counter() - t < 2
    assert set(err.value.missing) == set(DGL_SPECS[name].files[1:])
    ok, msg = dataset_status(name, tmp_path)
    assert not ok and "missing" in msg
