"""The synthetic generator (dgl_exact.data.synthetic): deterministic and well formed, its names and keyword
arguments, learnable with the structure helping, and fast at arxiv's size."""
import time

import numpy as np
import pytest
import torch

from dgl_exact._compat import import_dgl
from dgl_exact.data import (SYNTHETIC_PRESETS, SyntheticConfig, generate_synthetic,
                            load_dataset)
from tests.data._helpers import _edge_set

dgl = import_dgl()


pytestmark = pytest.mark.usefixtures("closed_stdin")


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
