"""The trainer's models on PyG's layers (``framework: pyg``): called as the trainer calls its models, on a DGL
graph kept as CSC/CSR alone, they compute what the PyG network computes on the graph's edge_index (edge weights
in edge-id order); and the configuration refuses what they do not have."""
import copy

import pytest
import torch

pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact  # noqa: E402
from dgl_exact.training.config import TrainConfig  # noqa: E402
from dgl_exact.training.models import build_model  # noqa: E402
from dgl_exact.training.pyg_models import PyGModel  # noqa: E402

import dgl  # noqa: E402  (after dgl_exact)

N, FEATS, CLASSES = 30, 6, 3


@pytest.fixture(scope="module")
def graph():
    g = dgl.rand_graph(N, 150)
    return g.formats(["csc"])  # as the trainer keeps a training graph: no COO, edges listed source-destination


@pytest.mark.parametrize("model", ["gcn", "sage", "gat", "gcn2"])
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


def test_refuses_blocks_and_edge_weights_it_cannot_take(graph):
    model = build_model("sage", FEATS, CLASSES, hidden=8, layers=2, framework="pyg")
    with pytest.raises(ValueError, match="neighbour sampler's blocks"):
        model([graph, graph], torch.randn(N, FEATS))
    with pytest.raises(ValueError, match="takes no edge weights"):
        model(graph, torch.randn(N, FEATS), edge_weight=torch.ones(graph.num_edges()))


def test_config():
    assert TrainConfig(framework="pyg", model="gat").framework == "pyg"
    with pytest.raises(ValueError, match="not on the neighbour sampler's blocks"):
        TrainConfig(framework="pyg", sampler="neighbor")
    with pytest.raises(ValueError, match="--edge-drop"):
        TrainConfig(framework="pyg", model="gat", edge_drop=0.1)
    with pytest.raises(ValueError, match="framework"):
        TrainConfig(framework="jax")
