import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

from dgl_exact.pyg import GATConv  # noqa: E402
from tests.pyg._helpers import INT2, OFF, case_id, assert_unbiased_sampled, copy_of, random_graph, saved_bytes  # noqa: E402

N, D_IN, D_OUT = 30, 8, 5


def _pair(in_channels=D_IN, compression=None, seed=0, **kwargs):
    torch.manual_seed(seed)
    theirs = pyg_nn.GATConv(in_channels, D_OUT, **kwargs)
    if theirs.bias is not None:  # PyG initialises it to zero: a nonzero bias is checked too
        torch.nn.init.normal_(theirs.bias)
    return theirs, copy_of(GATConv, theirs, in_channels, D_OUT, compression=compression, **kwargs)


CASES = [dict(), dict(heads=3), dict(heads=3, concat=False), dict(add_self_loops=False), dict(residual=True, heads=2),
         dict(bias=False), dict(negative_slope=0.5, heads=2), dict(flow="target_to_source")]


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


def test_bipartite_equals_pyg():
    theirs, ours = _pair(in_channels=(D_IN, 3), heads=2)
    ei = random_graph(N)
    ei = ei[:, ei[1] < 20]
    x = (torch.randn(N, D_IN), torch.randn(20, 3))
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


@pytest.mark.parametrize("kwargs", [dict(), dict(heads=3, residual=True)], ids=case_id)
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


@pytest.mark.slow
def test_int2_gradients_unbiased():
    torch.manual_seed(0)
    theirs, ours = _pair(compression=INT2, heads=2)
    ei = random_graph(N)
    x0 = torch.randn(N, D_IN, requires_grad=True)
    r = torch.randn(N, 2 * D_OUT)

    def grads(module):
        module.zero_grad()
        (module(x0 * 1.0, ei) * r).sum().backward()
        return torch.cat([module.lin.weight.grad.flatten(), module.att_src.grad.flatten(),
                          module.att_dst.grad.flatten()])

    assert_unbiased_sampled(lambda: grads(ours), grads(theirs), n=300)


def test_int2_keeps_less_than_pyg():
    torch.manual_seed(0)
    ei = random_graph(N, e=400)
    theirs = pyg_nn.GATConv(64, 16, heads=4)
    ours = copy_of(GATConv, theirs, 64, 16, heads=4, compression=INT2)
    x = (torch.randn(N, 64, requires_grad=True) * 1.0).relu()  # an activation: kept by each conv
    sizes = [saved_bytes(lambda m=m: m(x, ei), exclude=[ei, *m.parameters()]) for m in (theirs, ours)]
    assert sizes[1] < sizes[0] / 4, sizes


@pytest.mark.parametrize("kwargs", [dict(), dict(add_self_loops=False), dict(residual=True)], ids=case_id)
@pytest.mark.parametrize("bipartite", [False, True])
def test_no_destination_features_equals_pyg(kwargs, bipartite):
    """``(x_src, None)``: the attention has no destination term (as PyG's): output and gradients (compression
    off) as PyG's, over ``size[1]`` destinations or, without ``size``, as many as PyG's aggregation makes."""
    theirs, ours = _pair(in_channels=(D_IN, 7) if bipartite else D_IN, compression=OFF, heads=2, **kwargs)
    ei = random_graph(N)
    ei = ei[:, ei[1] < 20]
    x = torch.randn(N, D_IN, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    for size in [(N, 20), None]:
        out1, out2 = theirs((x * 1.0, None), ei, size=size), ours((x2 * 1.0, None), ei, size=size)
        torch.testing.assert_close(out2, out1, rtol=1e-5, atol=1e-6)
        r = torch.randn_like(out1)
        (out1 * r).sum().backward()
        (out2 * r).sum().backward()
        torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])  # PyG's GATConv refuses CSC
@pytest.mark.parametrize("loops", [True, False], ids=["self_loops", "as_is"])
def test_sparse_adjacency_equals_pyg(layout, loops):
    """A torch.sparse adjacency (indexed [target, source]) gives PyG's output, gradients with compression off,
    and attention weights returned in an adjacency of the same layout and edges as PyG's."""
    theirs, ours = _pair(compression=OFF, heads=2, add_self_loops=loops)
    ei = torch.unique(random_graph(N), dim=1)  # a sparse adjacency holds each edge once
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (N, N)).coalesce()
    adj_t = {torch.sparse_coo: adj_t, torch.sparse_csr: adj_t.to_sparse_csr(),
             torch.sparse_csc: adj_t.to_sparse_csc()}[layout]
    x = torch.randn(N, D_IN, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out1, (adj1, a1) = theirs(x * 1.0, adj_t, return_attention_weights=True)
    out2, (adj2, a2) = ours(x2 * 1.0, adj_t, return_attention_weights=True)
    torch.testing.assert_close(out2, out1, rtol=1e-5, atol=1e-6)
    assert adj2.layout == adj1.layout and adj2.shape == adj1.shape
    torch.testing.assert_close(adj2.to_dense(), adj1.to_dense(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours(x2 * 1.0, adj_t), ours(x2 * 1.0, ei), rtol=1e-5, atol=1e-6)
    r = torch.randn_like(out1)
    (out1 * r).sum().backward()
    (out2 * r).sum().backward()
    torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("compression", [OFF, INT2], ids=["off", "int2"])
def test_edge_chunks_equal_pyg(compression):
    from dgl_exact.ops.edge_chunks import edge_chunks

    theirs, ours = _pair(compression=compression, heads=2)
    ei = random_graph(N)
    x0 = torch.randn(N, D_IN, requires_grad=True)
    r = torch.randn(N, 2 * D_OUT)
    expected = theirs(x0 * 1.0, ei)
    (expected * r).sum().backward()
    expected_grads = [x0.grad.clone()] + [p.grad.clone() for p in theirs.parameters()]
    x0.grad = None
    with edge_chunks(16):  # chunks of at most 16 edges in forward and backward
        out = ours(x0 * 1.0, ei)
        (out * r).sum().backward()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    if not compression.enabled:
        for a, b in zip(expected_grads, [x0.grad] + [p.grad for p in ours.parameters()]):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()))
