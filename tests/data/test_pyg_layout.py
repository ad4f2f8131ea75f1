"""EXACT users' data: PyG's on-disk layouts (Flickr, YELP, Reddit, Reddit2 under ``<root>``, ogb under
``<root>/OGB``), ``reddit2``, EXACT's feature standardisation, corrupt files, ``~`` in the data root and
micro-F1 edge cases. Tiny hand-built files; expected values are PyG's documented semantics, worked out by
hand, and what DGL's and ogb's own loaders produce from the same files."""
import json
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from dgl_exact._compat import import_dgl
from dgl_exact.data import (DATASETS, DatasetNotFoundError, compute_metric, dataset_status, load_dataset)
from dgl_exact.data.base import DatasetFileError, standardize_features
from dgl_exact.data.dgl_builtin import DGL_SPECS, dgl_raw_folder_name

dgl = import_dgl()


pytestmark = pytest.mark.usefixtures("closed_stdin")


# A 5-node GraphSAINT graph. Row 0's column indices are stored unsorted (3 before 1): PyG keeps the CSR
# storage order, so its edges are, in order, (0,3) (0,1) (1,0) (2,4) (3,0) (4,2).
INDPTR = [0, 2, 3, 4, 5, 6]
INDICES = [3, 1, 0, 4, 0, 2]
EDGES = [(0, 3), (0, 1), (1, 0), (2, 4), (3, 0), (4, 2)]
FEATS = np.array([[1, 0], [2, 5], [3, 0], [4, 5], [5, 0]], dtype=np.float64)
CLASS_MAP = {"0": 2, "1": 0, "2": 1, "4": 6}          # node 3 unlabelled -> PyG's -1
LABELS = [2, 0, 1, -1, 6]
ROLE = {"tr": [4, 0], "va": [1], "te": [2]}    # node 3 (unlabelled) in no split


def write_graphsaint(folder, class_map=CLASS_MAP):
    os.makedirs(folder, exist_ok=True)
    adj = sp.csr_matrix((np.ones(6), np.array(INDICES), np.array(INDPTR)), shape=(5, 5))
    np.savez(os.path.join(folder, "adj_full.npz"), data=adj.data, indices=adj.indices, indptr=adj.indptr,
             shape=np.array(adj.shape), format=np.array(b"csr"))
    np.save(os.path.join(folder, "feats.npy"), FEATS)
    with open(os.path.join(folder, "class_map.json"), "w") as fh:
        json.dump(class_map, fh)
    with open(os.path.join(folder, "role.json"), "w") as fh:
        json.dump(ROLE, fh)


def _edges(ds):
    s, d = ds.graph.edges()
    return list(zip(s.tolist(), d.tolist()))


def _masks(ds):
    return [ds.idx(s).tolist() for s in ("train", "val", "test")]


@pytest.mark.parametrize("name,folder", [("flickr", "Flickr"), ("reddit2", "Reddit2")])
def test_pyg_graphsaint_layout_matches_pyg_semantics(tmp_path, name, folder):
    write_graphsaint(str(tmp_path / folder / "raw"))
    ok, msg = dataset_status(name, tmp_path)
    assert ok and os.path.join(folder, "raw") in msg, msg
    ds = load_dataset(name, tmp_path)
    assert _edges(ds) == EDGES                                    # storage order, row -> col
    assert torch.equal(ds.features, torch.tensor(FEATS, dtype=torch.float32))
    assert ds.labels.tolist() == LABELS and ds.labels.dtype == torch.int64
    assert _masks(ds) == [[0, 4], [1], [2]]
    assert ds.info["layout"] == "pyg" and ds.num_classes == DATASETS[name].num_classes
    assert sorted(os.listdir(tmp_path / folder / "raw")) == sorted(
        ["adj_full.npz", "feats.npy", "class_map.json", "role.json"])  # nothing written beside them


def test_pyg_flickr_equals_dgl_flickr_on_the_same_files(tmp_path):
    """The same raw files in DGL's folder (loaded by dgl.data.FlickrDataset) and in PyG's folder."""
    labelled = {str(i): v for i, v in enumerate([2, 0, 1, 3, 6])}   # DGL cannot hold -1 labels as PyG can
    write_graphsaint(str(tmp_path / "a" / "Flickr" / "raw"), labelled)
    write_graphsaint(str(tmp_path / "b" / dgl_raw_folder_name(DGL_SPECS["flickr"])), labelled)
    pyg = load_dataset("flickr", tmp_path / "a")
    ref = load_dataset("flickr", tmp_path / "b")
    assert ref.source == "dgl.data.FlickrDataset" and pyg.info["layout"] == "pyg"
    assert _edges(pyg) == _edges(ref)
    assert torch.equal(pyg.features, ref.features) and torch.equal(pyg.labels, ref.labels)
    assert _masks(pyg) == _masks(ref)
    assert pyg.key != ref.key


def test_pyg_yelp_multilabel(tmp_path):
    labels = np.zeros((5, 100), dtype=int)     # Yelp's 100 labels
    labels[:, :3] = [[1, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1], [0, 0, 1]]
    write_graphsaint(str(tmp_path / "YELP" / "raw"), {str(i): labels[i].tolist() for i in range(5)})
    ds = load_dataset("yelp", tmp_path)
    assert ds.multilabel and ds.metric == "micro_f1"
    assert ds.labels.dtype == torch.float32 and torch.equal(ds.labels, torch.tensor(labels, dtype=torch.float32))
    assert _edges(ds) == EDGES and _masks(ds) == [[0, 4], [1], [2]]


def test_pyg_reddit_layout_is_coalesced(tmp_path):
    folder = tmp_path / "Reddit" / "raw"
    folder.mkdir(parents=True)
    # COO with a duplicate (2,1) and unsorted order; PyG coalesces: sorted by (row, col), unique
    row, col = np.array([2, 0, 3, 2, 1, 0]), np.array([1, 3, 0, 1, 2, 1])
    sp.save_npz(folder / "reddit_graph.npz", sp.coo_matrix((np.ones(6), (row, col)), shape=(4, 4)))
    feat = np.arange(12, dtype=np.float64).reshape(4, 3)
    np.savez(folder / "reddit_data.npz", feature=feat, label=np.array([5, 40, 0, 7]),
             node_types=np.array([1, 3, 2, 1]))
    ds = load_dataset("reddit", tmp_path)
    assert _edges(ds) == [(0, 1), (0, 3), (1, 2), (2, 1), (3, 0)]
    assert torch.equal(ds.features, torch.tensor(feat, dtype=torch.float32))
    assert ds.labels.tolist() == [5, 40, 0, 7] and _masks(ds) == [[0, 3], [2], [1]]
    assert ds.key == "reddit-pyg"   # DGL's RedditDataset orders nodes differently: caches must not mix


def test_dgl_layout_is_preferred_and_missing_message_names_pyg_layout(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("flickr", tmp_path)
    assert os.path.join(str(tmp_path), "Flickr", "raw") in str(err.value)
    (tmp_path / "Flickr" / "raw").mkdir(parents=True)
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("flickr", tmp_path)
    assert set(err.value.missing) == {"adj_full.npz", "feats.npy", "class_map.json", "role.json"}
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("reddit2", tmp_path)
    assert "Reddit2" in str(err.value)


def test_reddit2_plain_folder(tmp_path):
    write_graphsaint(str(tmp_path / "reddit2"))
    ds = load_dataset("reddit2", tmp_path)
    assert _edges(ds) == EDGES and ds.key == "reddit2"


def test_ogb_under_exact_root(tmp_path):
    from tests.data._helpers import make_ogb

    *_, parts = make_ogb(str(tmp_path / "OGB"), "ogbn-arxiv", n=30, e=60)
    ok, msg = dataset_status("ogbn-arxiv", tmp_path)
    assert ok and os.path.join("OGB", "ogbn_arxiv") in msg, msg
    ds = load_dataset("arxiv", tmp_path)
    ref = load_dataset("arxiv", tmp_path / "OGB")
    assert _edges(ds) == _edges(ref) and torch.equal(ds.labels, ref.labels)
    assert torch.equal(ds.train_idx, torch.from_numpy(np.sort(parts["train"])))


# ---------------------------------------------------------------------------------------------------
# standardisation, corrupt files, data root
# ---------------------------------------------------------------------------------------------------
def test_standardize_as_exact():
    x = torch.tensor([[1.0, 2.0, 7.0], [3.0, 2.0, 1.0], [8.0, 2.0, 4.0], [0.0, 2.0, 4.0]])
    out = standardize_features(x)
    # hand-checked column 0: mean 3, sample std sqrt((4 + 0 + 25 + 9) / 3)
    assert out[:, 0].tolist() == pytest.approx([(v - 3) / np.sqrt(38 / 3) for v in (1, 3, 8, 0)], rel=1e-6)
    assert out[:, 1].tolist() == [0.0] * 4                  # constant column: 0 (EXACT would give NaN)
    ref = (x - x.mean(0)) / x.std(0)                         # EXACT's expression, where it is finite
    assert torch.allclose(out[:, [0, 2]], ref[:, [0, 2]], atol=1e-6)


def test_load_dataset_standardize(tmp_path):
    write_graphsaint(str(tmp_path / "Reddit2" / "raw"))
    ds = load_dataset("reddit2", tmp_path, standardize=True)
    f = torch.tensor(FEATS)
    assert torch.allclose(ds.features.double(), (f - f.mean(0)) / f.std(0), atol=1e-6)
    assert ds.key == "reddit2-std" and ds.info["standardized"]
    assert torch.equal(load_dataset("reddit2", tmp_path).features, torch.tensor(FEATS, dtype=torch.float32))


@pytest.mark.parametrize("victim", ["adj_full.npz", "feats.npy", "class_map.json", "role.json"])
def test_corrupt_raw_file_is_one_line_naming_it(tmp_path, victim):
    folder = tmp_path / "Reddit2" / "raw"
    write_graphsaint(str(folder))
    data = (folder / victim).read_bytes()
    (folder / victim).write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetFileError) as err:
        load_dataset("reddit2", tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and str(folder / victim) in msg and "replace" in msg


def test_feature_rows_must_match_nodes(tmp_path):
    folder = tmp_path / "Flickr" / "raw"
    write_graphsaint(str(folder))
    np.save(folder / "feats.npy", FEATS[:4])
    with pytest.raises(DatasetFileError, match="feats.npy"):
        load_dataset("flickr", tmp_path)


def test_tilde_in_data_root(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from dgl_exact.cli import cli

    monkeypatch.setenv("HOME", str(tmp_path))
    write_graphsaint(str(tmp_path / "d" / "Reddit2" / "raw"))
    monkeypatch.setenv("DGL_EXACT_DATA", "~/d")
    assert load_dataset("reddit2", "~/d").num_nodes == 5
    assert load_dataset("reddit2").num_nodes == 5
    out = CliRunner().invoke(cli, ["datasets"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if " reddit2 " in x)
    assert line.startswith("[x]"), out.output


def test_micro_f1_no_positives_is_zero_as_sklearn():
    from sklearn.metrics import f1_score

    labels = torch.zeros(4, 3)
    logits = -torch.ones(4, 3)
    assert compute_metric("micro_f1", logits, labels) == 0.0
    assert f1_score(labels.numpy(), (logits > 0).numpy(), average="micro", zero_division=0) == 0.0
    rng = np.random.default_rng(0)
    y, p = rng.random((20, 5)) < 0.3, rng.standard_normal((20, 5))
    assert compute_metric("micro_f1", torch.tensor(p), torch.tensor(y).float()) == pytest.approx(
        f1_score(y, p > 0, average="micro"))


def test_train_config_standardize_reaches_the_trainer(tmp_path):
    from dgl_exact.training.config import TrainConfig
    from dgl_exact.training.trainer import Trainer

    write_graphsaint(str(tmp_path / "Reddit2" / "raw"))
    cfg = TrainConfig(dataset="reddit2", data_root=str(tmp_path), standardize=True, epochs=1, device="cpu")
    f = torch.tensor(FEATS)
    feats = Trainer(cfg, progress=False, log=lambda *a, **k: None).dataset.features
    assert torch.allclose(feats.double(), (f - f.mean(0)) / f.std(0), atol=1e-6)
    plain = Trainer(cfg.replace(standardize=False), progress=False, log=lambda *a, **k: None).dataset.features
    assert torch.equal(plain, f.float())


def test_cli_flags_and_datasets_table():
    from click.testing import CliRunner

    from dgl_exact.cli import cli

    out = CliRunner().invoke(cli, ["train", "--help"]).output
    assert "--sample-coverage" in out and "--standardize" in out and "reddit2" in out
    out = CliRunner().invoke(cli, ["datasets", "--help"]).output
    row = next(x for x in out.splitlines() if x.strip().startswith("reddit2"))
    assert "Reddit2/raw/" in row and "EXACT's 'Reddit'" in row
    assert "Flickr/raw/" in out and "YELP/raw/" in out and "OGB/ogbn_arxiv/" in out
