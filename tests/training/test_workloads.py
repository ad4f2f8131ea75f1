"""The workload facts and graph preparation of :mod:`dgl_exact.training.workloads`: the trainer, the planner and the
benchmarks prepare the same graph for every model."""
from __future__ import annotations

import pytest
import torch

import dgl_exact  # noqa: F401  (before dgl)
from dgl_exact.bench.pyg_models import PYG_MODEL_TRAITS, PYG_MODELS
from dgl_exact.bench.runner import WORKLOAD_TRAITS, Workload
from dgl_exact.bench.user_models import USER_MODEL_TRAITS, USER_MODELS
from dgl_exact.data import load_dataset
from dgl_exact.data.compact import held_formats
from dgl_exact.planning import predict as P
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.models import MODELS
from dgl_exact.training.trainer import Trainer
from dgl_exact.training.workloads import MODEL_TRAITS, model_traits, prepare_graph

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = "synthetic-small:num_nodes=300,num_features=16,num_classes=4"


@pytest.fixture(scope="module")
def small():
    return load_dataset(SMALL, "unused")


def _edges(g):
    """The graph's edges as a sorted list of (src, dst) pairs, from whichever format it holds (CSC alone
    included)."""
    indptr, indices, _ = g.adj_tensors("csc")
    dst = torch.repeat_interleave(torch.arange(g.num_nodes()), torch.diff(indptr.long()))
    return sorted(zip(indices.long().tolist(), dst.tolist()))


def _csc(g):
    indptr, indices, _ = g.adj_tensors("csc")
    return indptr.long(), indices.long()


def test_the_table_covers_every_model():
    assert set(MODEL_TRAITS) == set(MODELS)
    assert set(USER_MODEL_TRAITS) == set(USER_MODELS)
    assert set(PYG_MODEL_TRAITS) == set(PYG_MODELS)
    assert set(WORKLOAD_TRAITS) == set(MODELS) | set(USER_MODELS) | set(PYG_MODELS)
    assert all(name == t.name for name, t in WORKLOAD_TRAITS.items())


@pytest.mark.parametrize("model", sorted(MODEL_TRAITS))
def test_trainer_planner_and_bench_prepare_the_same_graph(small, model, tmp_path):
    trainer = Trainer(TrainConfig(dataset=SMALL, model=model, data_root=str(tmp_path), epochs=1, hidden=8),
                      dataset=small, progress=False, log=None)
    spec = P.spec_from_graph(small.graph, small.num_features, small.num_classes, len(small.train_idx), model)
    planned = P.prepare_sample_graph(spec, small.graph, "exact")
    benched = Workload(small, "cpu").graph_for(model)
    trained = trainer.graph
    # the trainer and the planner: the same ids, formats and CSC, array for array
    assert trained.idtype == planned.idtype == torch.int32
    assert held_formats(trained) == held_formats(planned)
    assert trained.num_nodes() == planned.num_nodes() == benched.num_nodes()
    for a, b in zip(_csc(trained), _csc(planned)):
        assert torch.equal(a, b)
    # the benchmarks: the same edges (their graph keeps the ids and formats it was loaded with)
    assert _edges(trained) == _edges(benched)
    loops = sum(1 for s, d in _edges(trained) if s == d)
    assert loops == (small.graph.num_nodes() if model_traits(model).self_loops else 0)
    # and the defaults the planner and the benchmarks take for a model are the table's
    assert spec.hidden_size == Workload(small, "cpu").hidden_for(model) == MODEL_TRAITS[model].hidden


@pytest.mark.parametrize("model", sorted(MODEL_TRAITS))
def test_sampled_training_prepares_the_sampled_layout(small, model, tmp_path):
    trainer = Trainer(TrainConfig(dataset=SMALL, model=model, sampler="saint", data_root=str(tmp_path), epochs=1,
                                  hidden=8), dataset=small, progress=False, log=None)
    expected = prepare_graph(small.graph, model, layout="sampled")
    assert "coo" in held_formats(trainer.graph) or "coo" in trainer.graph.formats()["not created"]
    assert _edges(trainer.graph) == _edges(expected)


def test_self_loops_are_replaced_once_and_kept_when_declared():
    import dgl

    g = dgl.graph(([0, 1, 1, 2], [1, 0, 1, 1]), num_nodes=3)  # one self loop at node 1
    looped = prepare_graph(g, "gcn", layout="as_given")
    assert sorted(zip(*[t.tolist() for t in looped.edges()])) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 1), (2, 2)]
    assert prepare_graph(g, "gcn", layout="as_given", has_self_loops=True) is g
    assert prepare_graph(g, "sage", layout="as_given") is g
    assert g.num_edges() == 4  # not changed


def test_csc_only_follows_the_model_and_the_caller():
    import dgl

    g = dgl.graph(([0, 1, 1, 2], [1, 0, 2, 1]), num_nodes=3)  # symmetric
    assert held_formats(prepare_graph(g, "sage")) == ["csc without edge ids"]
    assert sorted(held_formats(prepare_graph(g, "sage", csc_only=False))) == ["csc", "csr"]
    assert sorted(held_formats(prepare_graph(g, "gat"))) == ["csc", "csr"]


def test_unknown_names_say_what_is_known():
    with pytest.raises(ValueError, match="unknown model 'gin'; use one of gcn, sage, gat, gcn2"):
        model_traits("gin")
    with pytest.raises(ValueError, match="unknown graph layout 'dense'"):
        prepare_graph(None, "gcn", layout="dense")
