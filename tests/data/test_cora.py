"""The bundled Cora (dgl_exact.data.cora): its counts, and equality with DGL's CoraGraphDataset where the
planetoid files are available."""
import os
import shutil

import numpy as np
import pytest
import torch

from dgl_exact._compat import import_dgl
from dgl_exact.data import load_dataset
from dgl_exact.data.cora import CORA_PATH
from tests.data._helpers import _edge_set

dgl = import_dgl()

PLANETOID = "/work/shared/data/planetoid"


pytestmark = pytest.mark.usefixtures("closed_stdin")


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
