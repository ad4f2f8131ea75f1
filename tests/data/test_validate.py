"""Dataset files in the real layouts (ogb, DGL's folders, PyG's raw/ folders) that are slightly wrong: each is
refused with one line naming the file (and the field and value), never used silently and never a traceback.
Tiny files built here with the helpers of ``test_data``."""
import gzip
import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

from dgl_exact.data import load_dataset
from dgl_exact.data.base import DatasetFileError
from dgl_exact.data.dgl_builtin import DGL_SPECS, dgl_raw_folder_name
from dgl_exact.data.ogbn import OGB_SPECS
from tests.data._helpers import _csv_gz, make_graphsaint, make_ogb, make_reddit

pytestmark = pytest.mark.usefixtures("closed_stdin")


def refused(name, root, path, *needles):
    """load_dataset raises one DatasetFileError line naming ``path`` and every needle."""
    with pytest.raises(DatasetFileError) as err:
        load_dataset(name, root)
    msg = str(err.value)
    assert "\n" not in msg and os.fspath(path) in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def _json_edit(path, edit):
    with open(path) as fh:
        obj = json.load(fh)
    edit(obj)
    with open(path, "w") as fh:
        json.dump(obj, fh)


# ---------------------------------------------------------------------------------------------------
# GraphSAINT files (Flickr/Yelp/Reddit2): DGL's folder and PyG's raw/ folder
# ---------------------------------------------------------------------------------------------------
LAYOUTS = {"dgl": lambda tmp: tmp / dgl_raw_folder_name(DGL_SPECS["flickr"]), "pyg": lambda tmp: tmp / "Flickr" / "raw"}


@pytest.fixture(params=sorted(LAYOUTS))
def flickr(request, tmp_path):
    folder = LAYOUTS[request.param](tmp_path)
    make_graphsaint(str(folder), n=50, e=120, f=6)
    return tmp_path, folder


def test_role_tr_null_is_refused_not_all_nodes_trained(flickr):
    root, folder = flickr
    _json_edit(folder / "role.json", lambda r: r.update(tr=None))
    refused("flickr", root, folder / "role.json", "'tr'", "null")


def test_role_tr_string_names_the_file(flickr):
    root, folder = flickr
    _json_edit(folder / "role.json", lambda r: r.update(tr="abc"))
    refused("flickr", root, folder / "role.json", "'tr'", "'abc'")


@pytest.mark.parametrize("bad", [1.5, True, "3"], ids=["float", "bool", "string"])
def test_role_ids_that_are_not_integers_are_refused(flickr, bad):
    root, folder = flickr
    _json_edit(folder / "role.json", lambda r: r["va"].append(bad))
    refused("flickr", root, folder / "role.json", "'va'")


def test_role_ids_given_as_bools_are_refused(flickr):
    root, folder = flickr
    _json_edit(folder / "role.json", lambda r: r.update(te=[True, True, False]))
    refused("flickr", root, folder / "role.json", "'te'", "true")


def test_integral_float_ids_are_refused_too(flickr):
    """DGL's reader cannot index with 3.0 and ogb's truncates 3.7: ids are stored as integers or refused."""
    root, folder = flickr
    _json_edit(folder / "role.json", lambda r: r.update(tr=[float(v) for v in r["tr"]]))
    refused("flickr", root, folder / "role.json", "'tr'", "position 0")


def test_overlapping_splits_are_refused(flickr):
    root, folder = flickr
    _json_edit(folder / "role.json", lambda r: r["te"].append(r["tr"][0]))
    refused("flickr", root, folder / "role.json", "both", "disjoint")


def test_float_label_is_refused_not_truncated(flickr):
    root, folder = flickr
    _json_edit(folder / "class_map.json", lambda c: c.update({"0": 2.7}))
    refused("flickr", root, folder / "class_map.json", "2.7", "[0, 7)")


@pytest.mark.parametrize("bad", [7, -3, 100])
def test_label_outside_classes_is_refused(flickr, bad):
    root, folder = flickr
    _json_edit(folder / "class_map.json", lambda c: c.update({"0": bad}))
    refused("flickr", root, folder / "class_map.json", str(bad), "[0, 7)")


def test_split_node_missing_from_class_map_is_refused(tmp_path):
    """PyG gives such a node label -1, which crashed at the first training step."""
    folder = tmp_path / "Flickr" / "raw"
    _, _, role = make_graphsaint(str(folder), n=50, e=120, f=6)
    node = role["tr"][0]
    _json_edit(folder / "class_map.json", lambda c: c.pop(str(node)))
    refused("flickr", tmp_path, folder / "class_map.json", f"node {node}", "train", "no label")


def test_unlabelled_node_outside_the_splits_is_allowed(tmp_path):
    folder = tmp_path / "Flickr" / "raw"
    _, _, role = make_graphsaint(str(folder), n=50, e=120, f=6)
    node = role["tr"][0]
    _json_edit(folder / "role.json", lambda r: r["tr"].remove(node))
    _json_edit(folder / "class_map.json", lambda c: c.pop(str(node)))
    ds = load_dataset("flickr", tmp_path)
    assert int(ds.labels[node]) == -1 and not bool(ds.mask("train")[node])


def _rewrite_adj(folder, **changes):
    with np.load(folder / "adj_full.npz") as z:
        arrays = dict(z)
    arrays.update(changes)
    np.savez(folder / "adj_full.npz", **arrays)


def test_adj_with_0d_shape_is_one_line(flickr):
    root, folder = flickr
    _rewrite_adj(folder, shape=np.array(50))
    refused("flickr", root, folder / "adj_full.npz", "shape")


def test_adj_with_fractional_indices_is_refused(flickr):
    root, folder = flickr
    with np.load(folder / "adj_full.npz") as z:
        indices = z["indices"].astype(np.float64)
    indices[3] += 0.5
    _rewrite_adj(folder, indices=indices)
    refused("flickr", root, folder / "adj_full.npz", "indices", str(indices[3]))


def test_feats_of_strings_names_the_file(flickr):
    root, folder = flickr
    np.save(folder / "feats.npy", np.full((50, 6), "1.0"))
    refused("flickr", root, folder / "feats.npy", "features", "expected numbers")


def test_yelp_multihot_of_the_wrong_width_is_refused(tmp_path):
    folder = tmp_path / "YELP" / "raw"
    make_graphsaint(str(folder), n=50, e=120, f=4, num_classes=3, multilabel=True)
    refused("yelp", tmp_path, folder / "class_map.json", "100")


# ---------------------------------------------------------------------------------------------------
# Reddit (DGL's files)
# ---------------------------------------------------------------------------------------------------
@pytest.fixture(params=["dgl", "pyg"])
def reddit(request, tmp_path):
    folder = tmp_path / (dgl_raw_folder_name(DGL_SPECS["reddit"]) if request.param == "dgl" else "Reddit/raw")
    make_reddit(str(folder), n=40, e=100, f=5)
    return tmp_path, folder


def test_reddit_graph_with_0d_shape_is_one_line(reddit):
    root, folder = reddit
    with np.load(folder / "reddit_graph.npz") as z:
        arrays = dict(z)
    arrays["shape"] = np.array(40)
    np.savez(folder / "reddit_graph.npz", **arrays)
    refused("reddit", root, folder / "reddit_graph.npz", "shape")


def test_reddit_label_outside_classes_is_refused(reddit):
    root, folder = reddit
    with np.load(folder / "reddit_data.npz") as z:
        arrays = dict(z)
    arrays["label"][5] = 41
    np.savez(folder / "reddit_data.npz", **arrays)
    refused("reddit", root, folder / "reddit_data.npz", "41", "[0, 41)")


# ---------------------------------------------------------------------------------------------------
# ogb
# ---------------------------------------------------------------------------------------------------
@pytest.fixture
def arxiv(tmp_path):
    folder, *_ = make_ogb(str(tmp_path), "ogbn-arxiv", n=30, e=60, f=4)
    return tmp_path, folder


def _raw(folder, name):
    return os.path.join(folder, "raw", name)


def _split(folder, part):
    return os.path.join(folder, "split", OGB_SPECS["ogbn-arxiv"].split, f"{part}.csv.gz")


def _read(path):
    return pd.read_csv(path, header=None, compression="gzip").values


def test_ogb_edge_id_beyond_the_nodes_is_one_line(arxiv):
    root, folder = arxiv
    edges = _read(_raw(folder, "edge.csv.gz"))
    edges[4, 1] = 30
    _csv_gz(_raw(folder, "edge.csv.gz"), edges)
    refused("ogbn-arxiv", root, _raw(folder, "edge.csv.gz"), "30", "[0, 30)")


def test_ogb_float_edge_ids_are_refused_not_truncated(arxiv):
    root, folder = arxiv
    edges = _read(_raw(folder, "edge.csv.gz")).astype(float)
    edges[2, 0] += 0.5
    _csv_gz(_raw(folder, "edge.csv.gz"), edges)
    refused("ogbn-arxiv", root, _raw(folder, "edge.csv.gz"), str(edges[2, 0]))


def test_ogb_num_node_list_too_small_is_one_line(arxiv):
    root, folder = arxiv
    _csv_gz(_raw(folder, "num-node-list.csv.gz"), [[10]])
    refused("ogbn-arxiv", root, _raw(folder, "edge.csv.gz"), "[0, 10)")


def test_ogb_feature_rows_must_match(arxiv):
    root, folder = arxiv
    _csv_gz(_raw(folder, "node-feat.csv.gz"), _read(_raw(folder, "node-feat.csv.gz"))[:-1])
    refused("ogbn-arxiv", root, _raw(folder, "node-feat.csv.gz"), "29 rows", "expected 30")


def test_ogb_text_in_edge_csv_names_the_file(arxiv):
    root, folder = arxiv
    with gzip.open(_raw(folder, "edge.csv.gz"), "wt") as fh:
        fh.write("0,1\nfoo,bar\n")
    refused("ogbn-arxiv", root, _raw(folder, "edge.csv.gz"), "edge")


def test_ogb_empty_node_label_names_the_file(arxiv):
    root, folder = arxiv
    with gzip.open(_raw(folder, "node-label.csv.gz"), "wt"):
        pass
    refused("ogbn-arxiv", root, _raw(folder, "node-label.csv.gz"), "empty")


@pytest.mark.parametrize("bad", [40, 2.5, -1])
def test_ogb_bad_label_is_refused(arxiv, bad):
    root, folder = arxiv
    labels = _read(_raw(folder, "node-label.csv.gz")).astype(object)
    labels[3, 0] = bad
    _csv_gz(_raw(folder, "node-label.csv.gz"), labels)
    refused("ogbn-arxiv", root, _raw(folder, "node-label.csv.gz"), str(bad))


def test_ogb_split_csv_with_two_columns_is_refused(arxiv):
    root, folder = arxiv
    ids = _read(_split(folder, "train"))
    _csv_gz(_split(folder, "train"), np.concatenate([ids, ids], 1))
    refused("ogbn-arxiv", root, _split(folder, "train"), "2 columns")


def test_ogb_non_numeric_split_csv_names_the_file(arxiv):
    root, folder = arxiv
    _csv_gz(_split(folder, "valid"), [["a"], ["b"]])
    refused("ogbn-arxiv", root, _split(folder, "valid"), "valid ids")


def test_ogb_empty_split_csv_names_the_file(arxiv):
    root, folder = arxiv
    with gzip.open(_split(folder, "test"), "wt"):
        pass
    refused("ogbn-arxiv", root, _split(folder, "test"), "empty")


def test_ogb_overlapping_split_is_refused(arxiv):
    root, folder = arxiv
    train = _read(_split(folder, "train"))
    _csv_gz(_split(folder, "test"), np.concatenate([_read(_split(folder, "test")), train[:1]]))
    refused("ogbn-arxiv", root, _split(folder, "test"), "both", "disjoint")


def test_ogb_valid_files_still_load_twice(arxiv):
    root, folder = arxiv
    a = load_dataset("ogbn-arxiv", root)
    b = load_dataset("ogbn-arxiv", root)  # from ogb's cache
    assert torch.equal(a.labels, b.labels) and a.labels.dtype == torch.int64
    assert torch.equal(a.train_idx, b.train_idx)
