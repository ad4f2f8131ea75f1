import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

from dgl_exact.pyg import GCN2Conv  # noqa: E402
from tests.pyg._helpers import (INT2, OFF, case_id, assert_unbiased, copy_of, linear_weight_sd, random_graph,  # noqa: E402
                                saved_bytes)

N, D = 30, 8


def _pair(compression=None, seed=0, channels=D, **kwargs):
    torch.manual_seed(seed)
    theirs = pyg_nn.GCN2Conv(channels, 0.2, **kwargs)
    return theirs, copy_of(GCN2Conv, theirs, channels, 0.2, compression=compression, **kwargs)


CASES = [dict(), dict(theta=0.5, layer=2), dict(shared_weights=False, theta=0.5, layer=3), dict(normalize=False),
         dict(add_self_loops=False), dict(flow="target_to_source")]


@pytest.mark.parametrize("kwargs", CASES, ids=case_id)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("compression", [None, INT2], ids=["default", "int2"])
def test_forward_equals_pyg(kwargs, weighted, compression):
    theirs, ours = _pair(compression=compression, **kwargs)
    ei = random_graph(N)
    x, x0 = torch.randn(N, D, requires_grad=True) * 1.0, torch.randn(N + 5, D)
    ew = torch.rand(ei.shape[1]) + 0.1 if weighted else None
    torch.testing.assert_close(ours(x, x0, ei, ew), theirs(x, x0, ei, ew), rtol=1e-5, atol=1e-6)


def test_sparse_adjacency_and_cache_equal_pyg():
    theirs, ours = _pair(cached=True, theta=0.5, layer=1)
    ei = random_graph(N)
    x, x0 = torch.randn(N, D), torch.randn(N, D)
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (N, N),
                                    check_invariants=True).coalesce().to_sparse_csr()
    expected = pyg_nn.GCN2Conv(D, 0.2, theta=0.5, layer=1)
    expected.load_state_dict(theirs.state_dict())
    torch.testing.assert_close(ours(x, x0, adj_t), expected(x, x0, adj_t), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours(x, x0, ei), theirs(x, x0, ei), rtol=1e-5, atol=1e-6)
    other = random_graph(N, seed=1)  # cached: ignored, as PyG ignores it
    torch.testing.assert_close(ours(x, x0, other), theirs(x, x0, other), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(theta=0.5, layer=2), dict(shared_weights=False, theta=0.5, layer=2)],
                         ids=case_id)
def test_gradients_without_compression_equal_pyg(kwargs):
    theirs, ours = _pair(compression=OFF, **kwargs)
    ei = random_graph(N)
    leaves = [torch.randn(N, D, requires_grad=True), torch.randn(N, D, requires_grad=True),
              (torch.rand(ei.shape[1]) + 0.1).requires_grad_()]
    r = torch.randn(N, D)
    grads = []
    for module in (theirs, ours):
        x, x0, ew = (t * 1.0 for t in leaves)  # not leaves: activations
        (module(x, x0, ei, ew) * r).sum().backward()
        grads.append([t.grad.clone() for t in leaves] + [p.grad.clone() for p in module.parameters()])
        for t in leaves:
            t.grad = None
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5 * float(a.abs().max()))


@pytest.mark.slow
def test_int2_weight_gradient_unbiased():
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    torch.manual_seed(0)
    theirs, ours = _pair(compression=INT2, theta=0.5, layer=2)
    ei = random_graph(N)
    x_leaf, x0 = torch.randn(N, D, requires_grad=True), torch.randn(N, D)
    r = torch.randn(N, D)

    def weight_grad(module):
        module.zero_grad()
        x_leaf.grad = None
        (module(x_leaf * 1.0, x0, ei) * r).sum().backward()
        return module.weight1.grad.clone(), x_leaf.grad.clone()

    exact, exact_gx = weight_grad(theirs)
    ei2, w = gcn_norm(ei, None, N)
    p = torch.zeros(N, N).index_put_((ei2[1], ei2[0]), w, accumulate=True)
    h = 0.8 * p.matmul(x_leaf.detach()) + 0.2 * x0  # the mixed features the product keeps
    sd = linear_weight_sd(theirs.beta * r, h, 2).t()  # weight1's gradient is h^T (beta r)
    assert_unbiased(lambda: weight_grad(ours)[0], exact, sd, n=300)
    torch.testing.assert_close(weight_grad(ours)[1], exact_gx, rtol=1e-5, atol=1e-6)  # needs no activation


@pytest.mark.parametrize("shared_weights", [True, False])
def test_int2_keeps_less_than_pyg(shared_weights):
    torch.manual_seed(0)
    ei = random_graph(N, e=400)
    theirs = pyg_nn.GCN2Conv(64, 0.1, theta=0.5, layer=1, shared_weights=shared_weights)
    ours = copy_of(GCN2Conv, theirs, 64, 0.1, theta=0.5, layer=1, shared_weights=shared_weights, compression=INT2)
    x0 = torch.randn(N, 64)
    x = (torch.randn(N, 64, requires_grad=True) * 1.0).relu()  # an activation: kept by each conv
    sizes = [saved_bytes(lambda m=m: m(x, x0, ei), exclude=[ei, x0, *m.parameters()]) for m in (theirs, ours)]
    assert sizes[1] < sizes[0] / 4, sizes
    # nothing per edge: the mixed features at 2 bits (1/16 of them) and their per-row range, and X0 by reference
    assert sizes[1] < x.numel() * x.element_size() / 8, sizes
