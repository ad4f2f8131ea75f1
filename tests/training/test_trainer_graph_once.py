"""The trainer holds the graph once: no reference to the dataset's own graph (a second edge list, int64 as DGL
loads it) beside the compacted one it trains on; a dataset passed in is not changed; the trainer's ``dataset``
shares the trained graph's structure and still serves a second trainer."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

import dgl_exact  # noqa: F401  (before dgl)
from dgl_exact.data import load_dataset
from dgl_exact.ops.structure import _adj_tensors
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = "synthetic-small:num_nodes=300,num_features=16,num_classes=4"


def _config(tmp_path, **kw):
    return TrainConfig(**{"dataset": SMALL, "data_root": str(tmp_path), "epochs": 1, "hidden": 8, **kw})


@pytest.mark.parametrize("model", ["gcn", "sage"])
@pytest.mark.parametrize("compact", [False, True])
def test_trainer_keeps_no_reference_to_the_datasets_graph(tmp_path, model, compact):
    ds = load_dataset(SMALL, "unused", compact=compact)
    edges, idtype, formats = ds.graph.num_edges(), ds.graph.idtype, ds.graph.formats()
    ndata = sorted(ds.graph.ndata)
    trainer = Trainer(_config(tmp_path, model=model), dataset=ds, progress=False, log=None)
    # the caller's dataset is as it was: its edges, id type, formats and node data (the trainer's degree
    # columns go on its own graph only)
    assert ds.graph.num_edges() == edges and ds.graph.idtype == idtype
    assert ds.graph.formats()["created"] == formats["created"]
    assert sorted(ds.graph.ndata) == ndata
    assert trainer.dataset is not ds and trainer.dataset.graph is not ds.graph
    assert trainer.dataset_summary == ds.summary()
    # once the caller drops it, nothing holds the dataset's graph: its edge list is freed
    gone = weakref.ref(ds.graph)
    del ds
    gc.collect()
    assert gone() is None
    # the trainer's dataset holds the trained graph's structure (shared: the same arrays) and no COO; the
    # synthetic graph is symmetric: its CSC alone, without edge ids
    view, g = trainer.dataset.graph, trainer.graph
    assert view.formats()["created"] == g.formats()["created"] == ["csc"]
    for a, b in zip(_adj_tensors(view._graph, "csc"), _adj_tensors(g._graph, "csc")):
        assert (a is None and b is None) or a.data_ptr() == b.data_ptr()
    assert view.num_edges() == g.num_edges()
    trainer.fit()
    assert trainer.dataset.graph.formats()["created"] == ["csc"]  # training created no COO or CSR


def test_trainer_loading_the_dataset_itself_keeps_one_structure(tmp_path):
    trainer = Trainer(_config(tmp_path), progress=False, log=None)
    assert trainer.dataset.graph.formats()["created"] == ["csc"]
    assert trainer.dataset.info["self_loop"]  # GCN: the graph trained on has one self loop per node
    assert trainer.dataset.num_edges == trainer.graph.num_edges()
    assert trainer.dataset_summary != trainer.dataset.summary()  # the header: the dataset's own edges


@pytest.mark.parametrize("second", [{}, {"eval_batch_size": 64}, {"sampler": "cluster", "num_parts": 4,
                                                                    "parts_per_batch": 2}])
def test_a_second_trainer_on_the_first_ones_dataset_trains_the_same_graph(tmp_path, second):
    fresh = Trainer(_config(tmp_path, **second), progress=False, log=None)
    first = Trainer(_config(tmp_path), progress=False, log=None)
    reused = Trainer(_config(tmp_path, **second), dataset=first.dataset, progress=False, log=None)
    a, b = fresh.graph.formats(["coo", "csr", "csc"]), reused.graph.formats(["coo", "csr", "csc"])
    assert a.num_edges() == b.num_edges()
    if not second:  # both from the symmetric graph's CSC: the same edges in the same (CSC) order
        for x, y in zip(a.edges(order="eid"), b.edges(order="eid")):
            assert torch.equal(x, y)
        assert fresh.fit().runs[0].final_loss == reused.fit().runs[0].final_loss
    else:  # the first trainer renumbered the edges in CSC order (csc_graph): the same edges, as a set
        n = a.num_nodes()
        keys = [torch.sort(s.long() * n + d.long()).values for s, d in (a.edges(), b.edges())]
        assert torch.equal(*keys)
        assert all(torch.isfinite(torch.tensor(t.fit().runs[0].final_loss)) for t in (fresh, reused))
    if not second:  # the same formats: nothing created on the shared structure
        assert first.dataset.graph.formats()["created"] == ["csc"]
