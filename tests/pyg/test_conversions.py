import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact  # noqa: E402
import dgl_exact.pyg as ours_nn  # noqa: E402
from tests.pyg._helpers import random_graph, saved_bytes  # noqa: E402

N, D = 30, 64
CONVS = {"GCNConv": ((D, D), {}), "SAGEConv": ((D, D), {}), "GATConv": ((D, 16), dict(heads=4)),
         "GCN2Conv": ((D, 0.1), dict(theta=0.5, layer=1))}


def _call(name, conv, x, ei):
    return conv(x, x, ei) if name == "GCN2Conv" else conv(x, ei)


@pytest.mark.parametrize("name", sorted(CONVS))
def test_convert_in_place(name):
    torch.manual_seed(0)
    args, kwargs = CONVS[name]
    theirs = getattr(pyg_nn, name)(*args, **kwargs)
    module = getattr(pyg_nn, name)(*args, **kwargs)
    module.load_state_dict(theirs.state_dict())
    ei = random_graph(N, e=400)
    x = (torch.randn(N, D, requires_grad=True) * 1.0).relu()
    assert ours_nn.convert(module) is module and type(module) is getattr(ours_nn, name)
    torch.testing.assert_close(_call(name, module, x, ei), _call(name, theirs, x, ei), rtol=1e-5, atol=1e-6)
    with dgl_exact.config(bits=2):
        sizes = [saved_bytes(lambda m=m: _call(name, m, x, ei), exclude=[ei, *m.parameters()])
                 for m in (theirs, module)]
    assert sizes[1] < sizes[0] / 4, sizes


def test_refusal():
    module = pyg_nn.GINConv(torch.nn.Linear(4, 4))
    assert "no dgl_exact.pyg drop-in" in ours_nn.refusal(module)
    with pytest.raises(ValueError, match="keep PyG's module"):
        ours_nn.convert(module)
    assert type(module) is pyg_nn.GINConv  # left as it was


@pytest.mark.parametrize("module, setting", [
    (lambda: pyg_nn.SAGEConv(4, 4, aggr="min"), "aggr 'min'"),
    (lambda: pyg_nn.SAGEConv(4, 4, aggr=["mean", "max"]), "aggr ['mean', 'max']"),
    (lambda: pyg_nn.SAGEConv(4, 4, aggr=pyg_nn.aggr.MedianAggregation()), "aggr 'MedianAggregation()'"),
    (lambda: pyg_nn.GATConv(4, 4, edge_dim=2), "edge_dim"),
    (lambda: pyg_nn.GATv2Conv(4, 4, edge_dim=2), "edge_dim"),
    (lambda: pyg_nn.GCNConv(4, 4, aggr="mean"), "aggr 'mean'"),
    (lambda: pyg_nn.GCN2Conv(4, 0.1, decomposed_layers=2), "decomposed_layers=2"),
])
def test_settings_without_a_compressed_path_convert(module, setting):
    """A setting no compressed path computes is no refusal: the conv converts and runs PyG's code
    (:func:`dgl_exact.pyg.pyg_code` names the setting, before and after the conversion)."""
    module = module()
    assert ours_nn.refusal(module) is None and setting in ours_nn.pyg_code(module)
    ours_nn.convert(module)
    assert type(module).__module__.startswith("dgl_exact.pyg") and setting in ours_nn.pyg_code(module)
    assert ours_nn.pyg_code(ours_nn.GCNConv(4, 4)) is None
