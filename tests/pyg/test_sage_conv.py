import sys

import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

from dgl_exact.pyg import SAGEConv  # noqa: E402
from tests.pyg._helpers import (INT2, OFF, case_id, assert_unbiased, copy_of, linear_weight_sd, random_graph,  # noqa: E402
                                saved_bytes)

N, D_IN, D_OUT = 30, 8, 5


def _pair(in_channels=D_IN, compression=None, seed=0, **kwargs):
    torch.manual_seed(seed)
    theirs = pyg_nn.SAGEConv(in_channels, D_OUT, **kwargs)
    return theirs, copy_of(SAGEConv, theirs, in_channels, D_OUT, compression=compression, **kwargs)


CASES = [dict(), dict(aggr="max"), dict(aggr="sum"), dict(aggr="add"), dict(project=True), dict(normalize=True),
         dict(root_weight=False), dict(bias=False), dict(flow="target_to_source")]


@pytest.mark.parametrize("kwargs", CASES, ids=case_id)
@pytest.mark.parametrize("compression", [None, INT2], ids=["default", "int2"])
def test_forward_equals_pyg(kwargs, compression):
    theirs, ours = _pair(compression=compression, **kwargs)
    ei = random_graph(N)
    x = torch.randn(N, D_IN, requires_grad=True) * 1.0
    torch.testing.assert_close(ours(x, ei), theirs(x, ei), rtol=1e-5, atol=1e-6)
    ours.eval(), theirs.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(x, ei), theirs(x, ei), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(), dict(aggr="max"), dict(root_weight=False)], ids=case_id)
def test_bipartite_equals_pyg(kwargs):
    theirs, ours = _pair(in_channels=(D_IN, 3), **kwargs)
    ei = random_graph(N)
    ei = ei[:, ei[1] < 20]  # 20 destination nodes
    x_src, x_dst = torch.randn(N, D_IN), torch.randn(20, 3)
    torch.testing.assert_close(ours((x_src, x_dst), ei), theirs((x_src, x_dst), ei), rtol=1e-5, atol=1e-6)
    if kwargs.get("root_weight", True):
        return
    torch.testing.assert_close(ours((x_src, None), ei, size=(N, 20)), theirs((x_src, None), ei, size=(N, 20)),
                               rtol=1e-5, atol=1e-6)


@pytest.fixture
def fresh_propagate():
    """PyG compiles ``propagate`` once per class, at its first instance, into a module it caches in
    ``sys.modules`` by the class's name; this makes the next instance of the drop-in's class and of PyG's compile
    it afresh (as in a new process), and restores both afterwards."""
    keys = ("propagate", "collect", "_orig_propagate", "_jinja_propagate")
    classes = (SAGEConv, pyg_nn.SAGEConv)
    saved = {cls: {k: cls.__dict__[k] for k in keys if k in cls.__dict__} for cls in classes}
    names = [f"{cls.__module__}_{cls.__name__}_propagate" for cls in classes]
    cached = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    for cls, entries in saved.items():
        for k in entries:
            delattr(cls, k)
    yield
    for cls, entries in saved.items():
        for k in keys:
            if k in cls.__dict__:
                delattr(cls, k)
        for k, v in entries.items():
            setattr(cls, k, v)
    for name in names:
        sys.modules.pop(name, None)
    sys.modules.update(cached)


def test_sparse_adjacency_equals_pyg(fresh_propagate):
    # (fresh: a PyG SAGEConv built earlier in this process with aggr="lstm" leaves PyG's class without the
    # fused path, so that PyG's own conv raises on a sparse adjacency; the drop-in compiles it in)
    theirs, ours = _pair()
    ei = torch.unique(random_graph(N), dim=1)  # unit values after coalescing
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (N, N), check_invariants=True).coalesce()
    x = torch.randn(N, D_IN)
    torch.testing.assert_close(ours(x, adj_t.to_sparse_csr()), theirs(x, adj_t.to_sparse_csr()), rtol=1e-5,
                               atol=1e-6)
    weighted = (adj_t * torch.rand(N, N).add(0.5)).to_sparse_csr()  # PyG weighs the sum: its code runs
    torch.testing.assert_close(ours(x, weighted), theirs(x, weighted), rtol=1e-5, atol=1e-6)


def test_sparse_adjacency_after_an_lstm_instance(fresh_propagate):
    """The class's first instance aggregates with an LSTM (no fused path): a later mean instance given a
    weighted sparse adjacency (PyG's code runs) still takes the fused path (CI's no-DGL job once built them in
    this order and PyG's compiled propagate raised "'message_and_aggregate' not implemented")."""
    SAGEConv(D_IN, D_OUT, aggr="lstm")
    theirs, ours = _pair()
    ei = torch.unique(random_graph(N), dim=1)
    adj = torch.sparse_coo_tensor(ei.flip(0), torch.rand(ei.shape[1]).add(0.5), (N, N)).coalesce().to_sparse_csr()
    x = torch.randn(N, D_IN)
    torch.testing.assert_close(ours(x, adj), theirs(x, adj), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(), dict(aggr="max"), dict(project=True, normalize=True)], ids=case_id)
def test_gradients_without_compression_equal_pyg(kwargs):
    theirs, ours = _pair(compression=OFF, **kwargs)
    ei = random_graph(N)
    x0 = torch.randn(N, D_IN, requires_grad=True)
    r = torch.randn(N, D_OUT)
    grads = []
    for module in (theirs, ours):
        (module(x0 * 1.5, ei) * r).sum().backward()
        grads.append([x0.grad.clone()] + [p.grad.clone() for p in module.parameters()])
        x0.grad = None
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("root_weight", [True, False])
@pytest.mark.slow
def test_int2_weight_gradients_unbiased(root_weight):
    torch.manual_seed(0)
    theirs, ours = _pair(compression=INT2, root_weight=root_weight)
    ei = random_graph(N)
    x0 = torch.randn(N, D_IN, requires_grad=True)
    r = torch.randn(N, D_OUT)
    names = ["lin_l.weight"] + (["lin_r.weight"] if root_weight else [])

    def weight_grads(module):
        module.zero_grad()
        x0.grad = None
        (module(x0 * 1.0, ei) * r).sum().backward()
        params = dict(module.named_parameters())
        return torch.cat([params[n].grad for n in names]), x0.grad.clone()

    exact, exact_gx = weight_grads(theirs)
    a = torch.zeros(N, N).index_put_((ei[1], ei[0]), torch.ones(ei.shape[1]), accumulate=True)
    neighbour_mean = (a / a.sum(1, keepdim=True).clamp(min=1)).matmul(x0.detach())
    sds = [linear_weight_sd(r, neighbour_mean, 2)] + ([linear_weight_sd(r, x0.detach(), 2)] if root_weight else [])
    assert_unbiased(lambda: weight_grads(ours)[0], exact, torch.cat(sds), n=300)
    torch.testing.assert_close(weight_grads(ours)[1], exact_gx, rtol=1e-5, atol=1e-6)  # needs no activation


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_int2_keeps_less_than_pyg(aggr):
    torch.manual_seed(0)
    ei = random_graph(N, e=400)
    theirs = pyg_nn.SAGEConv(64, 64, aggr=aggr)
    ours = copy_of(SAGEConv, theirs, 64, 64, aggr=aggr, compression=INT2)
    x = (torch.randn(N, 64, requires_grad=True) * 1.0).relu()  # an activation: kept by each conv
    sizes = [saved_bytes(lambda m=m: m(x, ei), exclude=[ei, *m.parameters()]) for m in (theirs, ours)]
    assert sizes[1] < sizes[0] / 4, sizes

