import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact  # noqa: E402
from dgl_exact.pyg import GATv2Conv  # noqa: E402
from tests.pyg._helpers import INT2, OFF, case_id, assert_unbiased_sampled, copy_of, random_graph, saved_bytes  # noqa: E402

N, D_IN, D_OUT = 30, 8, 5


def _pair(in_channels=D_IN, compression=None, seed=0, **kwargs):
    torch.manual_seed(seed)
    theirs = pyg_nn.GATv2Conv(in_channels, D_OUT, **kwargs)
    if theirs.bias is not None:  # PyG initialises it to zero: a nonzero bias is checked too
        torch.nn.init.normal_(theirs.bias)
    return theirs, copy_of(GATv2Conv, theirs, in_channels, D_OUT, compression=compression, **kwargs)


CASES = [dict(), dict(heads=3), dict(heads=3, concat=False), dict(add_self_loops=False), dict(residual=True, heads=2),
         dict(bias=False), dict(share_weights=True, heads=2), dict(negative_slope=0.5, heads=2),
         dict(flow="target_to_source")]


@pytest.mark.parametrize("kwargs", CASES, ids=case_id)
@pytest.mark.parametrize("compression", [None, INT2], ids=["default", "int2"])
def test_forward_equals_pyg(kwargs, compression):
    theirs, ours = _pair(compression=compression, **kwargs)
    ei = random_graph(N)
    x = torch.randn(N, D_IN, requires_grad=True) * 1.0
    torch.testing.assert_close(ours(x, ei), theirs(x, ei), rtol=1e-5, atol=1e-6)
    out, (graph, alpha) = ours(x, ei, return_attention_weights=True)
    expected, (expected_graph, expected_alpha) = theirs(x, ei, return_attention_weights=True)
    assert torch.equal(graph, expected_graph)
    torch.testing.assert_close(alpha, expected_alpha, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share_weights", [False, True])
def test_bipartite_equals_pyg(share_weights):
    theirs, ours = _pair(in_channels=(D_IN, D_IN if share_weights else 3), heads=2, share_weights=share_weights)
    ei = random_graph(N)
    ei = ei[:, ei[1] < 20]
    x = (torch.randn(N, D_IN), torch.randn(20, D_IN if share_weights else 3))
    torch.testing.assert_close(ours(x, ei), theirs(x, ei), rtol=1e-5, atol=1e-6)


def test_attention_dropout():
    theirs, ours = _pair(heads=2, dropout=0.5, compression=INT2)
    ei = random_graph(N)
    x = torch.randn(N, D_IN)
    _, (_, alpha) = ours(x, ei, return_attention_weights=True)
    dropped = float((alpha == 0).float().mean())
    assert 0.3 < dropped < 0.7  # about half of the attention weights dropped, the rest scaled by 2
    ours.eval(), theirs.eval()
    torch.testing.assert_close(ours(x, ei), theirs(x, ei), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(), dict(heads=3, residual=True), dict(share_weights=True, heads=2)],
                         ids=case_id)
def test_gradients_without_compression_equal_pyg(kwargs):
    theirs, ours = _pair(compression=OFF, **kwargs)
    ei = random_graph(N)
    x0 = torch.randn(N, D_IN, requires_grad=True)
    r = torch.randn(N, theirs.bias.numel())
    grads = []
    for module in (theirs, ours):
        (module(x0 * 1.5, ei) * r).sum().backward()
        grads.append([x0.grad.clone()] + [p.grad.clone() for p in module.parameters()])
        x0.grad = None
    for a, b in zip(*grads):  # float32 sums in other orders: up to 1e-5 of the largest element
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()))


def test_double_backward_without_compression_equals_pyg():
    theirs, ours = _pair(compression=OFF, heads=2)
    ei = random_graph(N)
    x = torch.randn(N, D_IN, requires_grad=True)
    penalties = []
    for module in (theirs, ours):
        (g,) = torch.autograd.grad(module(x * 1.0, ei).pow(2).sum(), x, create_graph=True)
        penalties.append(torch.autograd.grad(g.pow(2).sum(), module.att)[0])
    torch.testing.assert_close(penalties[1], penalties[0], rtol=1e-4, atol=1e-5 * float(penalties[0].abs().max()))
    ours.compression = INT2
    with pytest.raises(RuntimeError, match="double backward"):  # a compressed copy is not differentiable
        torch.autograd.grad(ours(x * 1.0, ei).pow(2).sum(), x, create_graph=True)


@pytest.mark.slow
def test_int2_gradients_unbiased():
    """The weight and attention-vector gradients at INT2 average to PyG's: the attention vector's is a product of
    two independently compressed copies of the source features (the aggregation's and the attention's)."""
    torch.manual_seed(0)
    theirs, ours = _pair(compression=INT2, heads=2)
    ei = random_graph(N)
    x0 = torch.randn(N, D_IN, requires_grad=True)
    r = torch.randn(N, 2 * D_OUT)

    def grads(module):
        module.zero_grad()
        (module(x0 * 1.0, ei) * r).sum().backward()
        return torch.cat([module.lin_l.weight.grad.flatten(), module.lin_r.weight.grad.flatten(),
                          module.att.grad.flatten()])

    assert_unbiased_sampled(lambda: grads(ours), grads(theirs), n=300)


def test_int2_keeps_less_than_pyg():
    torch.manual_seed(0)
    ei = random_graph(N, e=400)
    theirs = pyg_nn.GATv2Conv(64, 16, heads=4)
    ours = copy_of(GATv2Conv, theirs, 64, 16, heads=4, compression=INT2)
    x = (torch.randn(N, 64, requires_grad=True) * 1.0).relu()  # an activation: kept by each conv
    sizes = [saved_bytes(lambda m=m: m(x, ei), exclude=[ei, *m.parameters()]) for m in (theirs, ours)]
    assert sizes[1] < sizes[0] / 4, sizes


def test_no_destination_features_refused():
    conv = GATv2Conv((D_IN, D_IN), D_OUT)
    with pytest.raises(ValueError, match="destination features"):
        conv((torch.randn(N, D_IN), None), random_graph(N))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
@pytest.mark.parametrize("loops", [True, False], ids=["self_loops", "as_is"])
def test_sparse_adjacency_equals_pyg(layout, loops):
    """A torch.sparse adjacency (indexed [target, source]) gives PyG's output, gradients with compression off,
    and attention weights returned in an adjacency of the same layout and edges as PyG's."""
    theirs, ours = _pair(compression=OFF, heads=2, add_self_loops=loops)
    ei = torch.unique(random_graph(N), dim=1)  # a sparse adjacency holds each edge once
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (N, N)).coalesce()
    adj_t = adj_t if layout == torch.sparse_coo else adj_t.to_sparse_csr()
    x = torch.randn(N, D_IN, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out1, (adj1, a1) = theirs(x * 1.0, adj_t, return_attention_weights=True)
    out2, (adj2, a2) = ours(x2 * 1.0, adj_t, return_attention_weights=True)
    torch.testing.assert_close(out2, out1, rtol=1e-5, atol=1e-6)
    assert adj2.layout == adj1.layout and adj2.shape == adj1.shape
    torch.testing.assert_close(adj2.to_dense(), adj1.to_dense(), rtol=1e-5, atol=1e-6)
    r = torch.randn_like(out1)
    (out1 * r).sum().backward()
    (out2 * r).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-5)


def test_compress_model_converts_it():
    torch.manual_seed(0)
    model = torch.nn.Sequential(pyg_nn.GATv2Conv(D_IN, D_OUT, heads=2))
    x, ei = torch.randn(N, D_IN), random_graph(N)
    expected = model[0](x, ei)
    model, report = dgl_exact.compress_model(model, INT2, report=True)
    assert type(model[0]) is GATv2Conv and report.converted["0"].endswith("GATv2Conv")
    torch.testing.assert_close(model[0](x, ei), expected, rtol=1e-5, atol=1e-6)
    with_edges = torch.nn.Sequential(pyg_nn.GATv2Conv(D_IN, D_OUT, edge_dim=2))
    _, report = dgl_exact.compress_model(with_edges, INT2, report=True)
    assert type(with_edges[0]) is GATv2Conv and "edge_dim" in report.converted["0"] and "0" not in report.fp32
