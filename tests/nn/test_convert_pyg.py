"""compress_model on PyTorch Geometric models: PyG's convs, Linear and BatchNorm become dgl_exact's, the forward
and state_dict stay PyG's, gradients with compression off are PyG's, and a MessagePassing it does not know is
named in the report and left to PyG (its saved tensors compressed with ``saved_tensors=True``); a conv with a
setting its drop-in has no compressed path for is converted, runs PyG's code and is named in the report."""
import copy

import pytest
import torch
import torch.nn as nn

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact  # noqa: E402
import dgl_exact.pyg  # noqa: E402
from dgl_exact import CompressionConfig  # noqa: E402
from tests.pyg._helpers import INT2, OFF, random_graph  # noqa: E402

N, D = 40, 16


class EdgeGate(pyg_nn.MessagePassing):
    """A MessagePassing dgl_exact has no drop-in for: messages gated by a sigmoid of the source features."""

    def __init__(self, d):
        super().__init__(aggr="add")
        self.lin = pyg_nn.Linear(d, d)

    def forward(self, x, edge_index):
        return self.propagate(edge_index, x=self.lin(x))

    def message(self, x_j):
        return x_j * torch.sigmoid(x_j)


class Net(nn.Module):
    """Every PyG module compress_model converts, one whose setting runs PyG's code (GATConv with edge_dim), an
    unknown MessagePassing and a functional activation, in one model."""

    def __init__(self):
        super().__init__()
        self.gcn = pyg_nn.GCNConv(D, D)
        self.bn = pyg_nn.BatchNorm(D)
        self.act = nn.ReLU()
        self.sage = pyg_nn.SAGEConv(D, D)
        self.gat = pyg_nn.GATConv(D, D // 4, heads=4)
        self.gat_edges = pyg_nn.GATConv(D, D, edge_dim=2)
        self.gcn2 = pyg_nn.GCN2Conv(D, alpha=0.1, theta=0.5, layer=2)
        self.gate = EdgeGate(D)
        self.out = pyg_nn.Linear(-1, 3)

    def forward(self, x, ei, edge_attr):
        x0 = x
        x = self.act(self.bn(self.gcn(x, ei)))
        x = self.act(self.sage(x, ei))
        x = torch.nn.functional.elu(self.gat(x, ei))
        x = x + self.gat_edges(x, ei, edge_attr)
        x = self.act(self.gcn2(x, x0, ei))
        x = self.gate(x, ei)
        return self.out(x)


def _pair(seed=0):
    torch.manual_seed(seed)
    theirs = Net()
    ei = random_graph(N, e=200)
    edge_attr = torch.randn(ei.shape[1], 2)
    x = torch.randn(N, D)
    theirs(x, ei, edge_attr)  # materialises the lazy Linear
    return theirs, copy.deepcopy(theirs), x, ei, edge_attr


def test_converts_pyg_modules_and_reports_the_rest():
    theirs, ours, *_ = _pair()
    _, report = dgl_exact.compress_model(ours, config=INT2, report=True)
    for name, kind in [("gcn", "GCNConv"), ("sage", "SAGEConv"), ("gat", "GATConv"), ("gcn2", "GCN2Conv"),
                       ("out", "Linear"), ("gate.lin", "Linear"), ("gcn.lin", "Linear")]:
        module = ours.get_submodule(name)
        assert type(module) is getattr(dgl_exact.pyg, kind), name
        assert report.converted[name] == f"torch_geometric.{kind} -> dgl_exact.{kind}"
        assert module.compression == INT2
    assert type(ours.bn) is pyg_nn.BatchNorm and type(ours.bn.module) is dgl_exact.nn.layers.BatchNorm1d
    assert "bn" not in report.fp32  # the wrapper keeps nothing; its BatchNorm1d is converted
    assert report.converted["bn.module"] == "torch.BatchNorm1d -> dgl_exact.BatchNorm1d"
    assert type(ours.gat_edges) is dgl_exact.pyg.GATConv and ours.gat_edges.compression == INT2
    assert report.converted["gat_edges"] == ("torch_geometric.GATConv -> dgl_exact.GATConv (edge_dim (edge features "
                                             "in the attention): runs PyG's code, what it saves compressed by "
                                             "compress_saved)")
    assert report.fp32["gate"].startswith("PyG MessagePassing without a dgl_exact drop-in (tests.EdgeGate)")
    assert "saved_tensors=True" in report.fp32["gate"]
    assert "gate" in str(report) and "gat_edges" in str(report)
    assert set(report.fp32) == {"", "gate"}  # and the root, a custom module


@pytest.mark.parametrize("cfg", [OFF, INT2], ids=["off", "int2"])
def test_same_forward_and_state_dict(cfg):
    theirs, ours, x, ei, edge_attr = _pair()
    dgl_exact.compress_model(ours, config=cfg)
    sd_theirs, sd_ours = theirs.state_dict(), ours.state_dict()
    assert list(sd_ours) == list(sd_theirs)
    for key in sd_theirs:
        torch.testing.assert_close(sd_ours[key], sd_theirs[key], rtol=0, atol=0)
    for mode in (True, False):
        theirs.train(mode)
        ours.train(mode)
        torch.testing.assert_close(ours(x, ei, edge_attr), theirs(x, ei, edge_attr), rtol=1e-5, atol=1e-5)
    # and a PyG model loads the converted one's state_dict back (strict)
    fresh = Net()
    fresh(x, ei, edge_attr)
    fresh.load_state_dict(ours.state_dict(), strict=True)


def test_gradients_with_compression_off_equal_pyg():
    theirs, ours, x, ei, edge_attr = _pair()
    dgl_exact.compress_model(ours, config=OFF)
    xs = [x.clone().requires_grad_() for _ in range(2)]
    for model, xi in zip((theirs, ours), xs):
        model(xi, ei, edge_attr).square().sum().backward()
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(xs[1].grad, xs[0].grad, rtol=1e-4, atol=1e-5)


def test_int2_keeps_less_and_gradients_stay_close():
    """Compressed: less kept for backward than PyG, and the gradient is a noisy copy of PyG's (not exact,
    not far: the unbiasedness of each conv is tested in tests/pyg)."""
    theirs, ours, x, ei, edge_attr = _pair()
    dgl_exact.compress_model(ours, config=INT2)

    def kept(model):
        return dgl_exact.memory.measure(lambda: model(x * 1.0, ei, edge_attr).square().sum(),
                                        modules=[model]).activation_bytes

    assert kept(ours) < kept(theirs)


class Gates(nn.Module):
    """Only an unknown MessagePassing, wide enough that its messages pass compress_saved's 64 KiB minimum."""

    def __init__(self, d):
        super().__init__()
        self.gate = EdgeGate(d)

    def forward(self, x, ei):
        return self.gate(x, ei)


def test_unknown_message_passing_saved_tensors_compressed():
    torch.manual_seed(0)
    ei = random_graph(400, e=4000)
    x = torch.randn(400, 64)
    plain = Gates(64)
    model = copy.deepcopy(plain)
    _, report = dgl_exact.compress_model(model, config=CompressionConfig(bits=2), saved_tensors=True, report=True)
    assert "compressed by the saved-tensor hooks" in report.fp32["gate"]

    def kept(m):
        return dgl_exact.memory.measure(lambda: m(x * 1.0, ei).sum(), modules=[m]).activation_bytes

    # PyG keeps the [E, 64] messages (and their sigmoid) in fp32: at 2 bits (+ exact signs) far less
    assert kept(model) < kept(plain) / 4
    torch.testing.assert_close(model(x, ei), plain(x, ei), rtol=1e-5, atol=1e-6)
