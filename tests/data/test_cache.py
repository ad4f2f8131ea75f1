"""ogb's and DGL's processed caches are fingerprinted: rebuilt when the raw files change or the cache is
truncated, ``force_reload`` rebuilds, corrupt files give one line naming the file, and a read-only data
root works once the processed files exist (and says so up front otherwise). Tiny files in the libraries'
own layouts; ogb and DGL do the loading."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch

from dgl_exact.data import load_dataset
from dgl_exact.data.base import DatasetFileError
from dgl_exact.data.cache import record_path
from dgl_exact.data.dgl_builtin import DGL_SPECS, dgl_raw_folder_name
from tests.data._helpers import _csv_gz, make_graphsaint, make_ogb, make_reddit


pytestmark = pytest.mark.usefixtures("closed_stdin")


def _arxiv(tmp_path, **kw):
    folder, src, dst, parts = make_ogb(str(tmp_path), "ogbn-arxiv", n=40, e=90, **kw)
    return folder


def _labels_csv(folder):
    return pd.read_csv(os.path.join(folder, "raw", "node-label.csv.gz"), header=None).values[:, 0]


def test_ogb_cache_rebuilt_when_raw_labels_change(tmp_path):
    folder = _arxiv(tmp_path)
    first = load_dataset("ogbn-arxiv", tmp_path)
    cache = os.path.join(folder, "processed", "dgl_data_processed")
    record = json.load(open(record_path(cache)))
    assert set(record["raw"]) == {f"raw/{f}" for f in ("edge.csv.gz", "num-node-list.csv.gz", "num-edge-list.csv.gz",
                                                       "node-feat.csv.gz", "node-label.csv.gz", "node_year.csv.gz")}
    assert record["cache"]["size"] == os.path.getsize(cache)
    before = os.stat(cache).st_mtime_ns
    os.utime(os.path.join(folder, "raw", "edge.csv.gz"))     # same content, new mtime: hashed, not rebuilt
    load_dataset("ogbn-arxiv", tmp_path)
    assert os.stat(cache).st_mtime_ns == before
    new = (_labels_csv(folder) + 1) % 40
    _csv_gz(os.path.join(folder, "raw", "node-label.csv.gz"), new[:, None])
    again = load_dataset("ogbn-arxiv", tmp_path)
    assert torch.equal(again.labels, torch.from_numpy(new)) and not torch.equal(again.labels, first.labels)


def test_force_reload_rebuilds_ogb_and_dgl(tmp_path):
    folder = _arxiv(tmp_path)
    load_dataset("ogbn-arxiv", tmp_path)
    label_path = os.path.join(folder, "raw", "node-label.csv.gz")
    st = os.stat(label_path)
    new = (_labels_csv(folder) + 1) % 40
    _csv_gz(label_path, new[:, None])
    os.utime(label_path, ns=(st.st_atime_ns, st.st_mtime_ns))   # mtime restored: only force_reload can see it
    if os.path.getsize(label_path) == st.st_size:
        assert not torch.equal(load_dataset("ogbn-arxiv", tmp_path).labels, torch.from_numpy(new))
    assert torch.equal(load_dataset("ogbn-arxiv", tmp_path, force_reload=True).labels, torch.from_numpy(new))

    dgl_folder = tmp_path / "flickr"
    make_graphsaint(str(dgl_folder), n=30, e=60, f=4)
    load_dataset("flickr", tmp_path)
    feats = np.load(dgl_folder / "feats.npy")
    st = os.stat(dgl_folder / "feats.npy")
    np.save(dgl_folder / "feats.npy", feats + 1)
    os.utime(dgl_folder / "feats.npy", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert torch.equal(load_dataset("flickr", tmp_path).features, torch.from_numpy(feats).float())  # fooled
    assert torch.equal(load_dataset("flickr", tmp_path, force_reload=True).features,
                       torch.from_numpy(feats + 1).float())


def test_dgl_cache_rebuilt_when_raw_changes(tmp_path):
    folder = tmp_path / dgl_raw_folder_name(DGL_SPECS["flickr"])
    make_graphsaint(str(folder), n=30, e=60, f=4, seed=0)
    load_dataset("flickr", tmp_path)
    assert os.path.isfile(record_path(str(folder / "dgl_graph.bin")))
    _, labels, _ = make_graphsaint(str(folder), n=30, e=80, f=4, seed=1)
    ds = load_dataset("flickr", tmp_path)
    assert torch.equal(ds.labels, torch.from_numpy(labels))
    assert ds.num_edges == len(np.load(folder / "adj_full.npz")["indices"])


def test_cache_made_outside_dgl_exact_is_rebuilt_once(tmp_path):
    folder = _arxiv(tmp_path)
    load_dataset("ogbn-arxiv", tmp_path)
    cache = os.path.join(folder, "processed", "dgl_data_processed")
    os.remove(record_path(cache))
    new = (_labels_csv(folder) + 3) % 40
    _csv_gz(os.path.join(folder, "raw", "node-label.csv.gz"), new[:, None])
    assert torch.equal(load_dataset("ogbn-arxiv", tmp_path).labels, torch.from_numpy(new))
    assert os.path.isfile(record_path(cache))


_TRUNCATED_RUN = textwrap.dedent("""
    import sys
    from dgl_exact.data import load_dataset
    try:
        load_dataset(sys.argv[1], sys.argv[2])
    except Exception as e:
        print(type(e).__name__, str(e), sep="|")
        sys.exit(3)
    print("loaded")
""")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reddit", "ogbn-arxiv"])
def test_truncated_cache_without_raw_is_one_line_not_a_segfault(tmp_path, name):
    if name == "reddit":
        folder = tmp_path / dgl_raw_folder_name(DGL_SPECS["reddit"])
        make_reddit(str(folder), n=30, e=60, f=4)
        cache = folder / "dgl_graph.bin"
        raw = [folder / f for f in DGL_SPECS["reddit"].files]
    else:
        folder = tmp_path / "ogbn_arxiv"
        _arxiv(tmp_path)
        cache = folder / "processed" / "dgl_data_processed"
        raw = sorted((folder / "raw").iterdir())
    load_dataset(name, tmp_path)
    data = cache.read_bytes()
    cache.write_bytes(data[: len(data) // 3])
    for f in raw:
        f.unlink()
    # in a child process: DGL 2.1 segfaults reading a truncated graph file
    r = subprocess.run([sys.executable, "-c", _TRUNCATED_RUN, name, str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr[-2000:])
    kind, msg = r.stdout.strip().split("|", 1)
    assert kind == "DatasetFileError" and "\n" not in msg and str(cache) in msg, msg


@pytest.mark.slow
@pytest.mark.parametrize("name", ["reddit", "ogbn-arxiv"])
def test_truncated_cache_with_raw_is_rebuilt(tmp_path, name):
    if name == "reddit":
        folder = tmp_path / dgl_raw_folder_name(DGL_SPECS["reddit"])
        make_reddit(str(folder), n=30, e=60, f=4)
        cache = folder / "dgl_graph.bin"
    else:
        _arxiv(tmp_path)
        cache = tmp_path / "ogbn_arxiv" / "processed" / "dgl_data_processed"
    first = load_dataset(name, tmp_path)
    cache.write_bytes(cache.read_bytes()[: cache.stat().st_size // 3])
    r = subprocess.run([sys.executable, "-c", _TRUNCATED_RUN, name, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)                  # a child: DGL may segfault on a truncated file
    assert r.returncode == 0 and r.stdout.strip().endswith("loaded"), (r.returncode, r.stdout, r.stderr[-2000:])
    again = load_dataset(name, tmp_path)
    assert again.num_edges == first.num_edges and torch.equal(again.features, first.features)
    assert torch.equal(again.labels, first.labels)


@pytest.mark.parametrize("victim", ["raw/node-feat.csv.gz", "raw/edge.csv.gz", "split/time/train.csv.gz"])
def test_corrupt_ogb_file_is_one_line_naming_it(tmp_path, victim):
    folder = _arxiv(tmp_path)
    path = os.path.join(folder, victim)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(DatasetFileError) as err:
        load_dataset("ogbn-arxiv", tmp_path)
    assert "\n" not in str(err.value) and path in str(err.value), str(err.value)


def test_corrupt_dgl_raw_file_is_one_line_naming_it(tmp_path):
    folder = tmp_path / dgl_raw_folder_name(DGL_SPECS["yelp"])
    make_graphsaint(str(folder), n=30, e=60, f=4, num_classes=100, multilabel=True)
    (folder / "class_map.json").write_text('{"0": [1, 0')
    with pytest.raises(DatasetFileError) as err:
        load_dataset("yelp", tmp_path)
    assert "\n" not in str(err.value) and str(folder / "class_map.json") in str(err.value)


def test_read_only_root(tmp_path, monkeypatch):
    import dgl_exact.data.dgl_builtin as dgl_builtin
    import dgl_exact.data.ogbn as ogbn

    folder = _arxiv(tmp_path)
    flickr = tmp_path / "flickr"
    make_graphsaint(str(flickr), n=30, e=60, f=4)
    monkeypatch.setattr(ogbn, "writable", lambda path: False)       # root may ignore permissions: simulate
    monkeypatch.setattr(dgl_builtin, "writable", lambda path: False)
    with pytest.raises(DatasetFileError, match="read-only") as err:
        load_dataset("ogbn-arxiv", tmp_path)
    assert "dgl_data_processed" in str(err.value) and not os.path.exists(os.path.join(folder, "processed"))
    with pytest.raises(DatasetFileError, match="read-only"):
        load_dataset("flickr", tmp_path)
    assert not (flickr / "dgl_graph.bin").exists()
    monkeypatch.undo()
    load_dataset("ogbn-arxiv", tmp_path)
    load_dataset("flickr", tmp_path)
    monkeypatch.setattr(ogbn, "writable", lambda path: False)
    monkeypatch.setattr(dgl_builtin, "writable", lambda path: False)
    assert load_dataset("ogbn-arxiv", tmp_path).num_nodes == 40     # processed files there: works
    assert load_dataset("flickr", tmp_path).num_nodes == 30
    # made outside dgl_exact (no fingerprint) in a read-only root: used as it is, with a warning
    import dgl_exact.data.cache as cache

    monkeypatch.setattr(cache, "writable", lambda path: False)
    os.remove(record_path(os.path.join(folder, "processed", "dgl_data_processed")))
    os.remove(record_path(str(flickr / "dgl_graph.bin")))
    with pytest.warns(UserWarning, match="no dgl_exact fingerprint"):
        assert load_dataset("ogbn-arxiv", tmp_path).num_nodes == 40
    with pytest.warns(UserWarning, match="no dgl_exact fingerprint"):
        assert load_dataset("flickr", tmp_path).num_nodes == 30


def test_fingerprint_record_on_a_full_disk_keeps_the_previous_one(tmp_path, full_disk):
    from dgl_exact.data.cache import write_record

    cache_file = tmp_path / "graph.bin"
    cache_file.write_bytes(b"graph")
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "a.csv").write_text("1")
    record = record_path(str(cache_file))
    with open(record, "w") as f:
        f.write("the previous record")
    assert write_record(str(cache_file), str(tmp_path / "raw"), ["a.csv"]) is False
    with open(record) as f:
        assert f.read() == "the previous record"
    assert sorted(os.listdir(tmp_path)) == sorted(["graph.bin", "raw", os.path.basename(record)])
