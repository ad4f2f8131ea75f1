"""The data layer: bundled Cora, ogb and DGL on-disk layouts (tiny fake files, real loading code),
offline/no-prompt guarantees, and the synthetic generator."""
import os
import pickle
import shutil
import time

import numpy as np
import pandas as pd
import pytest
import torch

from dgl_exact._compat import import_dgl
from dgl_exact.data import (DATASETS, SYNTHETIC_PRESETS, DatasetNotFoundError, GraphDataset,
                            SyntheticConfig, compute_metric, dataset_status, generate_synthetic,
                            load_dataset)
from dgl_exact.data.cora import CORA_PATH
from dgl_exact.data.dgl_builtin import DGL_SPECS, dgl_raw_folder_name
from dgl_exact.data.ogbn import OGB_SPECS, _ogb_guard
from tests.data._helpers import make_graphsaint, make_ogb, make_reddit

dgl = import_dgl()

PLANETOID = "/work/shared/data/planetoid"


pytestmark = pytest.mark.usefixtures("closed_stdin")


def _check_common(ds: GraphDataset, n, f):
    g = ds.graph
    assert ds.num_nodes == n and ds.num_features == f
    assert g.ndata["feat"].dtype == torch.float32 and g.ndata["feat"].shape == (n, f)
    for split in ("train", "val", "test"):
        assert g.ndata[f"{split}_mask"].dtype == torch.bool
    masks = torch.stack([ds.mask(s) for s in ("train", "val", "test")]).int()
    assert int(masks.sum(0).max()) <= 1  # disjoint


def _edge_set(src, dst):
    return set(zip(np.asarray(src).tolist(), np.asarray(dst).tolist()))


# ---------------------------------------------------------------------------------------------------
# Cora
# ---------------------------------------------------------------------------------------------------
def test_cora_bundled_counts():
    assert os.path.getsize(CORA_PATH) < 200_000
    with np.load(CORA_PATH, allow_pickle=False) as z:
        assert z["edge_src"].dtype == np.int32
    ds = load_dataset("cora")
    g = ds.graph
    assert (ds.num_nodes, ds.num_edges, ds.num_features, ds.num_classes) == (2708, 10556, 1433, 7)
    assert [int(ds.mask(s).sum()) for s in ("train", "val", "test")] == [140, 500, 1000]
    assert torch.equal(ds.train_idx, torch.arange(140)) and torch.equal(ds.val_idx, torch.arange(140, 640))
    assert int(ds.test_idx.min()) == 1708 and int(ds.test_idx.max()) == 2707
    src, dst = g.edges()
    assert not bool((src == dst).any())
    assert _edge_set(src, dst) == _edge_set(dst, src)  # symmetric
    assert len(_edge_set(src, dst)) == 10556  # simple
    assert torch.allclose(g.ndata["feat"].sum(1), torch.ones(2708))  # row-normalised like DGL
    assert g.ndata["label"].dtype == torch.int64 and int(g.ndata["label"].max()) == 6
    assert ds.metric == "acc" and not ds.multilabel
    raw = load_dataset("cora", normalize_features=False).graph.ndata["feat"]
    assert set(raw.unique().tolist()) == {0.0, 1.0} and int(raw.sum()) == 49216
    assert ds.key == "cora" and load_dataset("cora", self_loop=True).key == "cora-selfloop"


@pytest.mark.skipif(not os.path.isdir(PLANETOID), reason="planetoid files not available")
def test_cora_matches_dgl(tmp_path):
    raw = tmp_path / "cora_v2_d697a464"  # DGL's raw_path for cora: name + sha1(url)[:8]
    raw.mkdir()
    for k in ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index"):
        shutil.copy(os.path.join(PLANETOID, f"ind.cora.{k}"), raw / f"ind.cora_v2.{k}")
    ref = dgl.data.CoraGraphDataset(raw_dir=str(tmp_path), verbose=False)[0]
    g = load_dataset("cora").graph
    for a, b in zip(ref.edges(), g.edges()):
        assert torch.equal(a, b)  # same edges, same order
    for key in ("label", "train_mask", "val_mask", "test_mask"):
        assert torch.equal(ref.ndata[key], g.ndata[key]), key
    # DGL row-normalises with numpy/scipy, whose summation order differs across versions: equal to fp32
    # rounding, and exactly the same non-zero pattern
    assert torch.equal(ref.ndata["feat"] != 0, g.ndata["feat"] != 0)
    torch.testing.assert_close(ref.ndata["feat"], g.ndata["feat"], rtol=1e-6, atol=1e-7)


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


# ---------------------------------------------------------------------------------------------------
# registry, metrics
# ---------------------------------------------------------------------------------------------------
def test_registry():
    for name in ("cora", "ogbn-arxiv", "ogbn-products", "flickr", "reddit", "yelp", "synthetic"):
        spec = DATASETS[name]
        assert spec.name == name and spec.source and spec.layout and spec.instructions
    assert DATASETS["yelp"].multilabel and DATASETS["yelp"].metric == "micro_f1"
    assert dataset_status("cora", "/nonexistent")[0] and dataset_status("synthetic-arxiv", None)[0]
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("nope")
    with pytest.raises(TypeError):
        load_dataset("ogbn-arxiv", "/nonexistent", bogus=1)


def test_metrics():
    logits = torch.tensor([[2.0, -1.0], [-1.0, 1.0], [1.0, 0.5]])
    assert compute_metric("acc", logits, torch.tensor([0, 1, 1])) == pytest.approx(2 / 3)
    multi = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    tp, fp, fn = 2, 2, 1  # predicted (logits > 0): tp (0,0) (1,1); fp (2,0) (2,1); fn (1,0)
    assert compute_metric("micro_f1", logits, multi) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    with pytest.raises(ValueError):
        compute_metric("auc", logits, multi)


# ---------------------------------------------------------------------------------------------------
# synthetic
# ---------------------------------------------------------------------------------------------------
def test_synthetic_deterministic_and_well_formed():
    cfg = SyntheticConfig(num_nodes=1000, avg_degree=8, num_features=16, num_classes=5, homophily=0.7)
    a, b, c = generate_synthetic(cfg, 3), generate_synthetic(cfg, 3), generate_synthetic(cfg, 4)
    for key in a:
        assert np.array_equal(a[key], b[key]), key
    assert not np.array_equal(a["label"], c["label"]) and not np.array_equal(a["feat"], c["feat"])
    src, dst = a["src"], a["dst"]
    assert not (src == dst).any()
    keys = src * 1000 + dst
    assert np.all(np.diff(keys) > 0)  # sorted by (src, dst), no duplicates
    assert _edge_set(src, dst) == _edge_set(dst, src)
    assert abs(len(src) - 8000) < 200
    assert abs(float(a["edge_homophily"]) - 0.7) < 0.05
    assert np.bincount(a["label"]).tolist() == [200] * 5
    assert [int(a[f"{s}_mask"].sum()) for s in ("train", "val", "test")] == [600, 200, 200]


def test_synthetic_names_and_kwargs():
    ds = load_dataset("synthetic-small:num_nodes=300,homophily=0.9", seed=1, num_classes=3)
    assert ds.num_nodes == 300 and ds.num_classes == 3 and ds.info["config"]["homophily"] == 0.9
    same = load_dataset("synthetic", seed=1, num_nodes=300, homophily=0.9, num_classes=3)
    assert torch.equal(same.features, ds.features)
    assert same.key == ds.key.replace("synthetic-small", "synthetic")  # key: parameters + seed
    assert load_dataset("synthetic", seed=2, num_nodes=300, homophily=0.9, num_classes=3).key != same.key
    assert load_dataset("synthetic", seed=1, num_nodes=301, homophily=0.9, num_classes=3).key != same.key
    assert set(SYNTHETIC_PRESETS) >= {"synthetic", "synthetic-small", "synthetic-arxiv", "synthetic-products"}
    arxiv = SYNTHETIC_PRESETS["synthetic-arxiv"]
    assert (arxiv.num_nodes, arxiv.num_features, arxiv.num_classes) == (169_343, 128, 40)
    products = SYNTHETIC_PRESETS["synthetic-products"]
    assert (products.num_nodes, products.num_features, products.num_classes) == (2_449_029, 100, 47)
    with pytest.raises(TypeError):
        load_dataset("synthetic", bogus=1)
    with pytest.raises(TypeError):
        load_dataset("synthetic:bogus=1")
    with pytest.raises(ValueError):
        load_dataset("synthetic-huge")


def _nearest_centroid_accuracy(x, y, train, test, k):
    """A training-free linear classifier: the nearest class mean of the training nodes."""
    centroids = torch.stack([x[train][y[train] == c].mean(0) for c in range(k)])
    pred = torch.cdist(x[test], centroids).argmin(1)
    return (pred == y[test]).float().mean().item()


def test_synthetic_is_learnable_and_structure_helps():
    ds = load_dataset("synthetic-small", seed=0)
    g, x, y = ds.graph, ds.features, ds.labels
    deg = g.in_degrees().clamp(min=1).float()[:, None]
    s, d = g.edges()
    nbr = torch.zeros_like(x).index_add_(0, d, x[s]) / deg
    tr, te = ds.train_idx, ds.test_idx
    chance = 1.0 / ds.num_classes
    acc_feat = _nearest_centroid_accuracy(x, y, tr, te, ds.num_classes)
    acc_both = _nearest_centroid_accuracy(x + nbr, y, tr, te, ds.num_classes)
    assert acc_feat > chance + 0.15
    assert acc_both > acc_feat + 0.1
    assert ds.evaluate(torch.nn.functional.one_hot(y, ds.num_classes).float()) == 1.0


def test_synthetic_arxiv_size_is_fast():
    t = time.perf_counter()
    a = generate_synthetic(SYNTHETIC_PRESETS["synthetic-arxiv"], seed=0)
    elapsed = time.perf_counter() - t
    assert 2_250_000 < len(a["src"]) < 2_400_000 and a["feat"].shape == (169_343, 128)
    assert elapsed < 20, elapsed
