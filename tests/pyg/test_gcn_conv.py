import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact  # noqa: E402
from dgl_exact.pyg import GCNConv  # noqa: E402
from tests.pyg._helpers import (INT2, OFF, assert_unbiased, copy_of, linear_weight_sd, random_graph,  # noqa: E402
                                saved_bytes)

N, D_IN, D_OUT = 30, 8, 5


def _pair(seed=0, compression=None, **kwargs):
    torch.manual_seed(seed)
    theirs = pyg_nn.GCNConv(D_IN, D_OUT, **kwargs)
    if theirs.bias is not None:  # PyG initialises it to zero: a nonzero bias is checked too
        torch.nn.init.normal_(theirs.bias)
    return theirs, copy_of(GCNConv, theirs, D_IN, D_OUT, compression=compression, **kwargs)


CASES = [dict(), dict(improved=True), dict(add_self_loops=False), dict(normalize=False), dict(bias=False),
         dict(flow="target_to_source")]


@pytest.mark.parametrize("kwargs", CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "default")
@pytest.mark.parametrize("weighted", [False, True])
def test_forward_equals_pyg(kwargs, weighted):
    theirs, ours = _pair(**kwargs)
    ei = random_graph(N)
    x = torch.randn(N, D_IN)
    ew = torch.rand(ei.shape[1]) + 0.1 if weighted else None
    for module in (theirs, ours):
        module.train()
    torch.testing.assert_close(ours(x, ei, ew), theirs(x, ei, ew), rtol=1e-5, atol=1e-6)
    ours.eval(), theirs.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, ei, ew), theirs(x, ei, ew), rtol=1e-5, atol=1e-6)


def test_sparse_adjacency_and_cache_equal_pyg():
    theirs, ours = _pair(cached=True)
    ei = random_graph(N)
    x = torch.randn(N, D_IN)
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (N, N),
                                    check_invariants=True).coalesce().to_sparse_csr()
    expected = pyg_nn.GCNConv(D_IN, D_OUT)
    expected.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(x, adj_t), expected(x, adj_t), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours(x, ei), theirs(x, ei), rtol=1e-5, atol=1e-6)
    # cached: the second call ignores its graph, as PyG's does
    other = random_graph(N, seed=1)
    torch.testing.assert_close(ours(x, other), theirs(x, other), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("compression", [OFF, INT2], ids=["off", "int2"])
def test_static_graph_batches_equal_pyg(weighted, compression):
    """Features ``[B, N, F]`` on one graph (PyG's node_dim=-2): PyG's output, and its gradients with compression
    off."""
    theirs, ours = _pair(compression=compression)
    ei = random_graph(N)
    ew = torch.rand(ei.shape[1]) + 0.1 if weighted else None
    x = torch.randn(3, N, D_IN, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    out1, out2 = theirs(x * 1.0, ei, ew), ours(x2 * 1.0, ei, ew)
    torch.testing.assert_close(out2, out1, rtol=1e-5, atol=1e-6)
    if not compression.enabled:
        r = torch.randn_like(out1)
        (out1 * r).sum().backward()
        (out2 * r).sum().backward()
        torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours.lin.weight.grad, theirs.lin.weight.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weighted", [False, True])
def test_gradients_without_compression_equal_pyg(weighted):
    theirs, ours = _pair(compression=OFF)
    ei = random_graph(N)
    x0 = torch.randn(N, D_IN, requires_grad=True)
    ew0 = (torch.rand(ei.shape[1]) + 0.1).requires_grad_() if weighted else None
    r = torch.randn(N, D_OUT)
    grads = []
    for module in (theirs, ours):
        x = x0 * 1.5  # not a leaf: kept as an activation
        ew = ew0 * 1.0 if weighted else None
        (module(x, ei, ew) * r).sum().backward()
        grads.append([x0.grad.clone()] + [p.grad.clone() for p in module.parameters()]
                     + ([ew0.grad.clone()] if weighted else []))
        x0.grad = None
        if weighted:
            ew0.grad = None
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def _normalized_adjacency(ei, n):
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    ei2, w = gcn_norm(ei, None, n, add_self_loops=True)
    return torch.zeros(n, n).index_put_((ei2[1], ei2[0]), w, accumulate=True)


@pytest.mark.slow
def test_int2_weight_gradient_unbiased():
    torch.manual_seed(0)
    theirs, ours = _pair(compression=dgl_exact.CompressionConfig(bits=2))
    ei = random_graph(N)
    x0 = torch.randn(N, D_IN, requires_grad=True)
    r = torch.randn(N, D_OUT)

    def weight_grad(module):
        module.zero_grad()
        (module(x0 * 1.0, ei) * r).sum().backward()
        return module.lin.weight.grad.clone()

    exact = weight_grad(theirs)
    grad_h = _normalized_adjacency(ei, N).t().matmul(r)  # the linear's output gradient
    sd = linear_weight_sd(grad_h, x0.detach(), bits=2)
    assert_unbiased(lambda: weight_grad(ours), exact, sd, n=300)
    # the input gradient needs no activation: exact
    x0.grad = None
    weight_grad(theirs)
    expected, x0.grad = x0.grad, None
    weight_grad(ours)
    torch.testing.assert_close(x0.grad, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_int2_keeps_less_than_pyg(weighted):
    torch.manual_seed(0)
    ei = random_graph(N, e=400)
    theirs = pyg_nn.GCNConv(64, 64)
    ours = copy_of(GCNConv, theirs, 64, 64, compression=dgl_exact.CompressionConfig(bits=2))
    x0 = torch.randn(N, 64, requires_grad=True)
    x = (x0 * 1.0).relu()  # an activation (not a leaf): kept by each conv
    ew = (torch.rand(ei.shape[1]) + 0.1).requires_grad_() if weighted else None
    sizes = [saved_bytes(lambda m=m: m(x, ei, ew), exclude=[ei, *m.parameters()] + ([ew] if weighted else []))
             for m in (theirs, ours)]
    # PyG keeps the input, its self-looped edge_index and the normalised edge weights (with weights that need a
    # gradient, the [E, D] messages too); ours the input at 2 bits and the edge weights (with weights that need a
    # gradient, the input at 2 bits once more)
    assert sizes[1] < sizes[0] / 4, sizes
    if not weighted:  # nothing per edge: the input at 2 bits (1/16 of it) and its per-row range
        assert sizes[1] < x.numel() * x.element_size() / 8, sizes


def test_errors():
    conv = GCNConv(D_IN, D_OUT)
    x = torch.randn(N, D_IN)
    with pytest.raises(ValueError, match="tuple of node features"):
        conv((x, x), random_graph(N))
    with pytest.raises(ValueError, match=r"shape \[2, num_edges\]"):
        conv(x, random_graph(N).t())
    with pytest.raises(ValueError, match="outside the graph"):
        GCNConv(D_IN, D_OUT, normalize=False)(x[:10], random_graph(N))


def test_lazy_in_channels():
    torch.manual_seed(0)
    conv = GCNConv(-1, D_OUT)
    out = conv(torch.randn(N, D_IN), random_graph(N))
    assert out.shape == (N, D_OUT) and conv.lin.weight.shape == (D_OUT, D_IN)
