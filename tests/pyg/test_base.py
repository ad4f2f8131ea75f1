"""What the drop-ins share (dgl_exact/pyg/_base.py): PyG's hooks, the compression setting, the cached
structure, the settings that run PyG's code (compressed by compress_saved), TorchScript."""
import copy

import pytest
import torch

pyg_nn = pytest.importorskip("torch_geometric.nn", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact  # noqa: E402
import dgl_exact.pyg as ours_nn  # noqa: E402
from dgl_exact.pyg import structure as pyg_structure  # noqa: E402
from tests.pyg._helpers import assert_unbiased_sampled, copy_of, random_graph, saved_bytes  # noqa: E402

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


# --- settings without a compressed path: PyG's code, what it saves through compress_saved ---------------------

#: conv, constructor arguments, whether it reads edge features: a setting of each kind pyg_setting names
FALLBACKS = {
    "SAGEConv-lstm": ("SAGEConv", (D, D), dict(aggr="lstm"), False),
    "SAGEConv-multi": ("SAGEConv", (D, D), dict(aggr=["mean", "max"]), False),
    "SAGEConv-aggregation": ("SAGEConv", (D, D), dict(aggr=pyg_nn.aggr.SoftmaxAggregation(learn=True)), False),
    "GCNConv-decomposed": ("GCNConv", (D, D), dict(decomposed_layers=2), False),
    "GCNConv-mean": ("GCNConv", (D, D), dict(aggr="mean"), False),
    "GATConv-edge_dim": ("GATConv", (D, 4), dict(heads=2, edge_dim=3), True),
    "GATv2Conv-edge_dim": ("GATv2Conv", (D, 4), dict(heads=2, edge_dim=3), True),
    "GCN2Conv-decomposed": ("GCN2Conv", (D, 0.1), dict(decomposed_layers=2), False),
}


def _fallback_pair(case, compression, width=D):
    """PyG's conv of ``case`` (its feature width ``width``) and the drop-in holding its parameters."""
    name, args, kwargs, _ = FALLBACKS[case]
    args = tuple(width if a == D else a for a in args)
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(*args, **copy.deepcopy(kwargs))
    ours = copy_of(getattr(ours_nn, name), theirs, *args, compression=compression, **copy.deepcopy(kwargs))
    return theirs, ours


def _fallback_call(case, conv, x, ei, edge_attr):
    name, _, _, edges = FALLBACKS[case]
    if name == "GCN2Conv":
        return conv(x, x * 0.5, ei)
    return conv(x, ei, edge_attr) if edges else conv(x, ei)


def _sorted_graph(n, e):
    """A graph sorted by destination (PyG's LSTM aggregation needs its index sorted)."""
    ei = random_graph(n, e=e)
    return ei[:, torch.argsort(ei[1], stable=True)]


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_setting_without_compressed_path_runs_pygs_code(case):
    """Accepted as PyG accepts it; PyG's output (compression off and at INT2: the forward is PyG's code) and,
    compression off, PyG's gradients, bit for bit."""
    ei = _sorted_graph(N, 120)
    edge_attr = torch.randn(ei.shape[1], 3)
    for cfg in (dgl_exact.CompressionConfig(enabled=False), dgl_exact.CompressionConfig(bits=2)):
        theirs, ours = _fallback_pair(case, cfg)
        assert ours.pyg_setting(ours) is not None
        x = torch.randn(N, D, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        out1, out2 = (_fallback_call(case, m, xi * 1.0, ei, edge_attr) for m, xi in ((theirs, x), (ours, x2)))
        torch.testing.assert_close(out2, out1, rtol=0, atol=0)
        if cfg.enabled:
            continue
        r = torch.randn_like(out1)
        (out1 * r).sum().backward()
        (out2 * r).sum().backward()
        torch.testing.assert_close(x2.grad, x.grad, rtol=0, atol=0)
        for (key, p), q in zip(theirs.named_parameters(), ours.parameters()):
            torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=key)


def _compressible_bytes(fn) -> int:
    """Bytes of the distinct floating-point storages saved for backward while ``fn()`` runs that
    compress_saved compresses: made by autograd (not alive anyway), contiguous, of 64 KiB or more."""
    seen = {}

    def pack(t):
        made = t.grad_fn is not None or (t._base is not None and t._base.grad_fn is not None)
        nbytes = t.numel() * t.element_size()
        if t.is_floating_point() and made and t.is_contiguous() and nbytes >= 64 * 1024:
            seen[t.untyped_storage().data_ptr()] = nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


@pytest.mark.parametrize("case", sorted(FALLBACKS))
def test_setting_without_compressed_path_keeps_less_at_int2(case):
    """At INT2 what PyG's code saves is compressed by compress_saved: each floating tensor it compresses (64 KiB
    and more, made by autograd) is kept in at most a quarter of its bytes (2 bits of magnitude and at most 2 of
    sign and zero per 32-bit element, plus a few bytes of range per row), so the drop-in keeps at least three
    quarters of those bytes less than PyG; compression off or in eval mode, exactly what PyG keeps."""
    n, width = 600, 64
    ei = _sorted_graph(n, 6000)
    edge_attr = torch.randn(ei.shape[1], 3)
    x = (torch.randn(n, width, requires_grad=True) * 1.0).relu()  # an activation: not alive anyway
    sizes = {}
    for label, cfg in (("int2", dgl_exact.CompressionConfig(bits=2)),
                       ("off", dgl_exact.CompressionConfig(enabled=False))):
        theirs, ours = _fallback_pair(case, cfg, width)
        sizes[label] = [saved_bytes(lambda m=m: _fallback_call(case, m, x, ei, edge_attr),
                                    exclude=[ei, edge_attr, *m.parameters()]) for m in (theirs, ours)]
        if label == "int2":
            compressible = _compressible_bytes(lambda: _fallback_call(case, theirs, x, ei, edge_attr))
            ours.eval()
            theirs.eval()
            assert saved_bytes(lambda: _fallback_call(case, ours, x, ei, edge_attr), exclude=[ei, edge_attr]) == \
                saved_bytes(lambda: _fallback_call(case, theirs, x, ei, edge_attr), exclude=[ei, edge_attr])
    assert sizes["off"][1] == sizes["off"][0], sizes
    assert compressible > 0
    assert sizes["int2"][1] <= sizes["int2"][0] - 0.75 * compressible, (sizes, compressible)


@pytest.mark.parametrize("case, weight", [("GCNConv-decomposed", "lin.weight"), ("SAGEConv-multi", "lin_l.weight")])
def test_setting_without_compressed_path_unbiased_where_linear(case, weight):
    """Where the backward is linear in what PyG's code saved (a linear's weight gradient, its input compressed by
    compress_saved: the generic path's claim), the INT2 gradient's mean over seeded draws is the exact one."""
    n = 2500  # [2500, 8] fp32 inputs: 78 KiB, above compress_saved's 64 KiB minimum
    ei = _sorted_graph(n, 10000)
    x = torch.randn(n, D) * torch.rand(n, 1)
    _, exact_conv = _fallback_pair(case, dgl_exact.CompressionConfig(enabled=False))
    _, ours = _fallback_pair(case, dgl_exact.CompressionConfig(bits=2))
    r = torch.randn(n, _out(ours))

    def grad(conv):
        conv.zero_grad()
        h = x.clone().requires_grad_() * 1.0  # not a leaf: compressed, not kept by reference
        (_fallback_call(case, conv, h, ei, None) * r).sum().backward()
        return conv.get_parameter(weight).grad.clone()

    assert_unbiased_sampled(lambda: grad(ours), grad(exact_conv), n=200)


def _out(conv):
    return conv.out_channels if hasattr(conv, "out_channels") else conv.channels


def test_explain_names_the_setting():
    conv = ours_nn.SAGEConv(D, D, aggr="lstm")
    assert conv.explain_path() == ("PyG's own code, its saved tensors compressed by compress_saved",
                                   "aggr 'lstm': no compressed path in dgl_exact.pyg")
    explanation = dgl_exact.explain(conv, torch.randn(N, D), _sorted_graph(N, 120))
    assert explanation.path("<root>").startswith("PyG's own code") and "aggr 'lstm'" in explanation.reason("<root>")
    assert ours_nn.SAGEConv(D, D).explain_path() is None
    hooked = ours_nn.GCNConv(D, D)
    hooked.register_message_forward_hook(lambda *args: None)
    assert hooked.explain_path()[0] == "PyG's own forward (uncompressed)"


@pytest.mark.parametrize("name", sorted(set(CONVS) - {"GATConv"}))  # (GATConv scripts inside a typed module only)
def test_torchscript_compiles_pygs_class(name):
    """``torch.jit.script`` of a drop-in compiles PyG's class over the drop-in's weights (TorchScript cannot run
    dgl_exact's ops): PyG's output; the drop-in itself is left as it was."""
    torch.manual_seed(0)
    theirs = getattr(pyg_nn, name)(*CONVS[name])
    ours = copy_of(getattr(ours_nn, name), theirs, *CONVS[name], compression=dgl_exact.CompressionConfig(bits=2))
    lin = [m for m in ours.modules() if type(m) is pyg_nn.Linear]
    for m in lin:
        ours_nn.convert(m)
    scripted = torch.jit.script(ours)
    ei, x = random_graph(N), torch.randn(N, D)
    torch.testing.assert_close(_call(name, scripted, x, ei), _call(name, theirs, x, ei))
    assert type(ours) is getattr(ours_nn, name) and all(type(m) is ours_nn.Linear for m in lin)
    assert ours.compression == dgl_exact.CompressionConfig(bits=2)
