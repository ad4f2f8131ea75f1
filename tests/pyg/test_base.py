"""What the four drop-ins share (dgl_exact/pyg/_base.py): PyG's hooks, the compression setting, the cached
structure."""
import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact  # noqa: E402
import dgl_exact.pyg as ours_nn  # noqa: E402
from dgl_exact.pyg import structure as pyg_structure  # noqa: E402
from tests.pyg._helpers import copy_of, random_graph  # noqa: E402

N, D = 30, 8
CONVS = {"GCNConv": (D, D), "SAGEConv": (D, D), "GATConv": (D, D), "GCN2Conv": (D, 0.1)}


def _call(name, conv, x, ei):
    return conv(x, x, ei) if name == "GCN2Conv" else conv(x, ei)


@pytest.mark.parametrize("name", sorted(CONVS))
def test_pyg_hooks_run_pygs_forward(name):
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(*CONVS[name])
    ours = copy_of(getattr(ours_nn, name), theirs, *CONVS[name], compression=dgl_exact.CompressionConfig(bits=2))
    seen = []
    ours.register_propagate_forward_hook(lambda module, inputs, out: seen.append(out.shape))
    ei = random_graph(N)
    x = torch.randn(N, D, requires_grad=True) * 1.0
    torch.testing.assert_close(_call(name, ours, x, ei), _call(name, theirs, x, ei))
    assert seen, "the propagate hook was not called"


@pytest.mark.parametrize("name", sorted(CONVS))
def test_layers_share_one_structure(name):
    pyg_structure.clear_cache()
    ei = random_graph(N)
    convs = [getattr(ours_nn, name)(*CONVS[name]) for _ in range(2)]
    x = torch.randn(N, D)
    for conv in convs:
        x = _call(name, conv, x, ei)
    assert pyg_structure.cache_size() == 1


def test_compression_must_be_a_config():
    with pytest.raises(TypeError, match="CompressionConfig"):
        ours_nn.GCNConv(D, D, compression=2)


def test_sparse_adjacency_with_reverse_flow_refused():
    ei = random_graph(N)
    adj_t = torch.sparse_coo_tensor(ei.flip(0), torch.ones(ei.shape[1]), (N, N), check_invariants=True)
    with pytest.raises(ValueError, match="adj_t.t()"):
        ours_nn.GCNConv(D, D, flow="target_to_source")(torch.randn(N, D), adj_t.coalesce().to_sparse_csr())


GRADCHECK = {
    "GCNConv": ((4, 3), lambda conv, x, w, ei: conv(x, ei, w)),
    "GCNConv-unweighted": ((4, 3), lambda conv, x, w, ei: conv(x, ei)),
    "SAGEConv": ((4, 3), lambda conv, x, w, ei: conv(x, ei)),
    "GATConv": ((4, 3), lambda conv, x, w, ei: conv(x, ei)),
    "GCN2Conv": ((4, 0.2), lambda conv, x, w, ei: conv(x, x * 0.5, ei, w)),
    "GCN2Conv-unweighted": ((4, 0.2), lambda conv, x, w, ei: conv(x, x, ei)),
}


@pytest.mark.parametrize("case", sorted(GRADCHECK))
def test_first_and_second_derivatives_without_compression(case):
    """Compression off, float64: the backward of every path (and its own backward, ``create_graph``) against
    finite differences."""
    torch.manual_seed(0)
    args, call = GRADCHECK[case]
    conv = getattr(ours_nn, case.split("-")[0])(*args, compression=dgl_exact.CompressionConfig(enabled=False))
    conv = conv.double()
    ei = random_graph(12, e=30, isolated=2, duplicates=3)
    x = torch.randn(12, 4, dtype=torch.double, requires_grad=True)
    w = (torch.rand(ei.shape[1], dtype=torch.double) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, w: call(conv, x, w, ei), (x, w))
    assert torch.autograd.gradgradcheck(lambda x, w: call(conv, x, w, ei), (x, w))


@pytest.mark.parametrize("name", sorted(CONVS))
def test_no_dgl_kernel_even_when_forced(name):
    """An EdgeStructure has no DGL graph index: every graph kernel of a drop-in's forward and backward is
    dgl_exact's own, also where DGL's backend is forced (a path asking the registry directly would fail)."""
    from dgl_exact import kernels

    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(*CONVS[name])
    ours = copy_of(getattr(ours_nn, name), theirs, *CONVS[name], compression=dgl_exact.CompressionConfig(bits=2))
    ei = random_graph(N)
    x = torch.randn(N, D, requires_grad=True)
    with kernels.use_backend("dgl"):
        out = _call(name, ours, x * 1.0, ei)
        out.sum().backward()
    torch.testing.assert_close(out, _call(name, theirs, x * 1.0, ei))
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
