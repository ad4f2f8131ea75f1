"""The trainer's models on PyG's layers (``framework: pyg``): called as the trainer calls its models, on a DGL
graph kept as CSC/CSR alone, they compute what the PyG network computes on the graph's edge_index (edge weights
in edge-id order); on the neighbour sampler's blocks, what it computes on the sampled subgraph; and the
configuration refuses what they do not have."""
import copy

import pytest
import torch

pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact  # noqa: E402
from dgl_exact.training.config import TrainConfig  # noqa: E402
from dgl_exact.training.models import build_model  # noqa: E402
from dgl_exact.training.pyg_models import PyGModel, blocks_edge_index  # noqa: E402

import dgl  # noqa: E402  (after dgl_exact)

N, FEATS, CLASSES = 30, 6, 3


@pytest.fixture(scope="module")
def graph():
    g = dgl.rand_graph(N, 150)
    return g.formats(["csc"])  # as the trainer keeps a training graph: no COO, edges listed source-destination


@pytest.mark.parametrize("model", ["gcn", "sage", "gat", "gcn2", "gatv2"])
def test_same_as_the_pyg_network(graph, model):
    torch.manual_seed(0)
    ours = build_model(model, FEATS, CLASSES, hidden=8, layers=2, batch_norm=True, framework="pyg")
    assert isinstance(ours, PyGModel) and type(ours.net.convs[0]).__module__.startswith("dgl_exact.pyg")
    x = torch.randn(N, FEATS)
    plain = copy.deepcopy(ours)
    ours.eval(), plain.eval()
    src, dst, eid = graph.edges(form="all", order="srcdst")
    edge_index = torch.stack([src, dst])
    weight = torch.rand(graph.num_edges()) + 0.5 if model in ("gcn", "gcn2") else None
    with dgl_exact.config(enabled=False):
        expected = plain.net(x, edge_index, None if weight is None else weight[eid])
        torch.testing.assert_close(ours(graph, x, edge_weight=weight), expected, rtol=1e-5, atol=1e-5)


def _blocks(graph, fanouts=(3, 2), seeds=(0, 4, 7, 11)):
    sampler = dgl.dataloading.NeighborSampler(list(fanouts))
    _, _, blocks = sampler.sample_blocks(graph, torch.tensor(seeds, dtype=graph.idtype))
    return blocks


def test_blocks_edge_index_expands_each_node_once(graph):
    """The subgraph of the sampled blocks: edges of the graph, over the first block's input nodes; the seeds'
    in-edges are the last block's, every other destination's those of the one block that first holds it; each
    node expanded once (no destination takes in-edges from two blocks)."""
    torch.manual_seed(1)
    blocks = _blocks(graph)
    ei = blocks_edge_index(blocks)
    nid = blocks[0].srcdata[dgl.NID].long()
    assert ei.dtype == torch.int64 and int(ei.max()) < blocks[0].num_src_nodes()
    assert bool(graph.has_edges_between(nid[ei[0]], nid[ei[1]]).all())  # edges of the graph
    n_seeds, n_hop1 = blocks[1].num_dst_nodes(), blocks[0].num_dst_nodes()
    last_src, last_dst = blocks[1].edges(order="srcdst")
    seeds_edges = ei[:, ei[1] < n_seeds]
    assert torch.equal(seeds_edges, torch.stack([last_src, last_dst]).long())  # the last block's, all of them
    first_src, first_dst = blocks[0].edges(order="srcdst")
    new = first_dst >= n_seeds
    assert torch.equal(ei[:, ei[1] >= n_seeds], torch.stack([first_src[new], first_dst[new]]).long())
    assert int(ei[1].max()) < n_hop1  # the outermost hop's nodes are inputs only


@pytest.mark.parametrize("model", ["gcn", "sage", "gat", "gcn2", "gatv2"])
def test_blocks_as_pyg_runs_a_neighbor_loader_batch(graph, model):
    """On the neighbour sampler's blocks: the PyG network on the sampled subgraph, the seeds' rows (and a training
    step at INT2 runs)."""
    torch.manual_seed(0)
    ours = build_model(model, FEATS, CLASSES, hidden=8, layers=2, batch_norm=True, framework="pyg")
    blocks = _blocks(graph)
    x = torch.randn(blocks[0].num_src_nodes(), FEATS)
    plain = copy.deepcopy(ours)
    ours.eval(), plain.eval()
    with dgl_exact.config(enabled=False):
        expected = plain.net(x, blocks_edge_index(blocks))[:blocks[-1].num_dst_nodes()]
        torch.testing.assert_close(ours(blocks, x), expected, rtol=1e-5, atol=1e-5)
    ours.train()
    with dgl_exact.config(bits=2):
        ours(blocks, x).square().sum().backward()
    assert all(p.grad is not None for p in ours.parameters())
    with pytest.raises(ValueError, match="takes no edge weights"):
        ours(blocks, x, edge_weight=torch.ones(blocks[0].num_edges()))


def test_refuses_edge_weights_it_cannot_take(graph):
    model = build_model("sage", FEATS, CLASSES, hidden=8, layers=2, framework="pyg")
    with pytest.raises(ValueError, match="takes no edge weights"):
        model(graph, torch.randn(N, FEATS), edge_weight=torch.ones(graph.num_edges()))


def test_config():
    assert TrainConfig(framework="pyg", model="gat").framework == "pyg"
    assert TrainConfig(framework="pyg", model="gcn2", sampler="neighbor", layers=2, fanouts="5,5").sampler == "neighbor"
    with pytest.raises(ValueError, match="--eval-batch-size"):
        TrainConfig(framework="pyg", sampler="neighbor", eval_batch_size=64)
    with pytest.raises(ValueError, match="--edge-drop"):
        TrainConfig(framework="pyg", model="gat", edge_drop=0.1)
    with pytest.raises(ValueError, match="framework"):
        TrainConfig(framework="jax")
    assert TrainConfig(framework="pyg", model="gatv2").model == "gatv2"
    with pytest.raises(ValueError, match="gatv2 is built of PyG's layers only: add --framework pyg"):
        TrainConfig(model="gatv2")
    with pytest.raises(ValueError, match="unknown model 'gatv2'"):
        build_model("gatv2", FEATS, CLASSES)  # (framework dgl)


SMALL = "synthetic-small:num_nodes=200,num_features=8,num_classes=3"


@pytest.mark.parametrize("model", ["sage", "gcn2"])
def test_trains_with_the_neighbor_sampler(tmp_path, model):
    from dgl_exact.data import load_dataset
    from dgl_exact.training.trainer import Trainer

    cfg = TrainConfig(dataset=SMALL, framework="pyg", model=model, sampler="neighbor", fanouts="4,4", layers=2,
                      batch_size=64, hidden=8, epochs=2, bits=2, data_root=str(tmp_path))
    result = Trainer(cfg, dataset=load_dataset(SMALL, str(tmp_path)), progress=False, log=None).fit()
    (run,) = result.runs
    assert 0.0 <= run.test <= 1.0 and run.final_loss == run.final_loss  # (not NaN)


def test_edge_index_made_once_per_graph_for_every_model(graph):
    """The ``edge_index`` of a graph is made once and shared by every model called on it (a new run's model, the
    planner's recorded step), so a converted conv's structure cache, keyed on it, is built once too; it dies with
    the graph."""
    import gc
    import weakref

    a = build_model("gcn", FEATS, CLASSES, hidden=8, layers=2, framework="pyg")
    b = build_model("gcn", FEATS, CLASSES, hidden=8, layers=2, framework="pyg")
    g = dgl.rand_graph(N, 90)
    x = torch.randn(N, FEATS)
    assert PyGModel.graph_tensors(g) == [] and PyGModel.structure_tensors(g) == []
    with dgl_exact.config(bits=2):
        a(g, x).sum().backward()
    ei, eid = PyGModel.graph_tensors(g)
    held = PyGModel.structure_tensors(g)
    assert held and ei.shape == (2, g.num_edges()) and eid.dtype == torch.int64
    with dgl_exact.config(bits=2):
        b(g, x).sum().backward()
    assert PyGModel.graph_tensors(g)[0] is ei  # the same tensor: the structure is not built again
    assert [t.data_ptr() for t in PyGModel.structure_tensors(g)] == [t.data_ptr() for t in held]
    alive = weakref.ref(ei)
    del g, ei, eid, held
    gc.collect()
    assert alive() is None


def test_train_command_takes_gatv2_with_framework_pyg(tmp_path, capsys, monkeypatch):
    """``dgl-exact train --framework pyg --model gatv2`` trains PyG's GATv2 network converted by compress_model;
    without ``--framework pyg``, one ``error:`` line says to add it."""
    import signal

    from tests.cli._helpers import run

    monkeypatch.chdir(tmp_path)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # train installs its own handlers
    try:
        args = ["train", "--dataset", SMALL, "--data-root", tmp_path, "--model", "gatv2", "--hidden", "4",
                "--layers", "2", "--epochs", "1"]
        code, out, err = run(args + ["--framework", "pyg"], capsys)
        assert code == 0, err
        code, out, err = run(args, capsys)
        assert code == 2 and "gatv2 is built of PyG's layers only: add --framework pyg" in err, err
        assert len(err.strip().splitlines()) == 1
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
