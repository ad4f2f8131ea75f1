"""``ops.graph_conv_plus_linear`` and ``nn.conv_plus_linear``: GraphConv with a linear residual as one op (two
layer-sized buffers in each pass instead of three). Values and input gradients equal DGL's ``GraphConv(g, x) +
Linear(x)``; the weight gradients equal DGL's when the kept tensor is exact and average to them under INT2;
row chunks (the in-place product) and column chunks (the transposed aggregation) at awkward sizes; where the
fused op does not apply, the modules' own calls run and ``explain`` says why."""
import pytest
import torch

import dgl_exact
from dgl_exact.compression import CompressedTensor
from dgl_exact.ops import sage
from tests.ops._helpers import small_chunks_of, spy_apply

dgl = pytest.importorskip("dgl")

NORMS = ["both", "left", "right", "none"]


def _cfg(**kw):
    return dgl_exact.CompressionConfig(**{"bits": 2, **kw})


def _graph(n, seed=0, self_loops=True):
    """A random directed graph (not symmetric: the transposed aggregation runs on the CSR), duplicate edges
    allowed; with self loops no node lacks an in-edge (GraphConv refuses those by default)."""
    torch.manual_seed(seed)
    g = dgl.rand_graph(n, 3 * n)
    return dgl.add_self_loop(g) if self_loops else g


def _block():
    """A block of 20 source and 8 destination nodes, every destination with in-edges."""
    src = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 0, 3])
    dst = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5])
    return dgl.create_block((src, dst), num_src_nodes=20, num_dst_nodes=8)


def _pair(d_in, d_out, norm="both", bias=True):
    """DGL's GraphConv and nn.Linear, and the same two as compress_model converts them (same parameters)."""
    torch.manual_seed(1)
    ref = torch.nn.ModuleDict({"conv": dgl.nn.GraphConv(d_in, d_out, norm=norm, bias=bias),
                               "res": torch.nn.Linear(d_in, d_out, bias=bias)})
    with torch.no_grad():
        if bias:
            ref["conv"].bias.normal_()  # DGL initialises it to zeros
    ours = dgl_exact.compress_model(torch.nn.ModuleDict({"conv": dgl.nn.GraphConv(d_in, d_out, norm=norm, bias=bias),
                                                         "res": torch.nn.Linear(d_in, d_out, bias=bias)}),
                                    config=_cfg())
    ours.load_state_dict(ref.state_dict())
    return ref, ours


@pytest.fixture
def small_chunks(monkeypatch):
    small_chunks_of(monkeypatch, sage)


def _spy(monkeypatch):
    """The calls of the op's Function (SAGE's, with GCN's degree factors)."""
    return spy_apply(monkeypatch, sage.SAGEMean)


def _run(pair, g, x, gout, inner=True):
    """Output, input gradient and parameter gradients of ``conv(g, x) + res(x)``, through
    ``conv_plus_linear`` for dgl_exact's modules; ``inner``: the input is a tensor autograd made (a hidden
    layer's input, kept compressed) rather than a leaf (kept by reference)."""
    x = x.clone().requires_grad_()
    h = x * 1.0 if inner else x
    if isinstance(pair["conv"], dgl_exact.GraphConv):
        out = dgl_exact.nn.conv_plus_linear(pair["conv"], pair["res"], g, h)
    else:
        out = pair["conv"](g, h) + pair["res"](h)
    out.backward(gout)
    grads = {n: p.grad.clone() for n, p in pair.named_parameters()}
    pair.zero_grad(set_to_none=True)
    return out.detach(), x.grad, grads


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("d_in,d_out", [(7, 7), (7, 9), (9, 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_dgl_with_exact_kept_tensor(norm, d_in, d_out, bias, small_chunks, exact_kept, monkeypatch):
    calls = _spy(monkeypatch)
    ref, ours = _pair(d_in, d_out, norm, bias)
    g = _graph(23)
    gen = torch.Generator().manual_seed(d_in)
    x, gout = torch.randn(23, d_in, generator=gen), torch.randn(23, d_out, generator=gen)
    want, got = _run(ref, g, x, gout), _run(ours, g, x, gout)
    assert len(calls) == 1  # the fused op ran
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert set(got[2]) == set(want[2])
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("d_in,d_out", [(7, 7), (9, 4)])
def test_int2_output_and_input_gradient_exact_input_kept_once(d_in, d_out, small_chunks, monkeypatch):
    """At INT2 the output and the input gradient need no kept activation (equal DGL's); the input is kept once,
    compressed, for both weight gradients (the composed modules keep two compressed copies where the conv
    aggregates first)."""
    calls = _spy(monkeypatch)
    kept = []
    real = sage.as_kept
    monkeypatch.setattr(sage, "as_kept", lambda x, cfg, force=False: kept.append(real(x, cfg, force)) or kept[-1])
    ref, ours = _pair(d_in, d_out)
    g = _graph(29)
    gen = torch.Generator().manual_seed(0)
    x, gout = torch.randn(29, d_in, generator=gen), torch.randn(29, d_out, generator=gen)
    want, got = _run(ref, g, x, gout), _run(ours, g, x, gout)
    assert len(calls) == 1
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    # aggregating first (square weight) the normalised sum is kept too (the conv's weight gradient reads it)
    assert [isinstance(k, CompressedTensor) for k in kept] == [True] * (2 if d_in <= d_out else 1)


@pytest.mark.parametrize("d_in,d_out", [(7, 7), (9, 4)])
def test_weight_gradients_unbiased_at_int2(d_in, d_out, small_chunks):
    """Over seeds the INT2 weight gradients average to DGL's exact ones, within 5 standard errors of the mean
    estimated from the same draws (elementwise; a 5-sigma miss is a 1-in-1.7-million event per element)."""
    ref, ours = _pair(d_in, d_out)
    g = _graph(17)
    gen = torch.Generator().manual_seed(0)
    x, gout = torch.randn(17, d_in, generator=gen), torch.randn(17, d_out, generator=gen)
    want = _run(ref, g, x, gout)[2]
    draws = {name: [] for name in want}
    for seed in range(300):
        torch.manual_seed(seed)
        for name, grad in _run(ours, g, x, gout)[2].items():
            draws[name].append(grad)
    for name, exact in want.items():
        d = torch.stack(draws[name])
        sem = d.std(0) / d.shape[0] ** 0.5
        if name.endswith("weight"):  # stochastic: the kept tensors were compressed (the biases need none)
            assert (d.std(0) > 0).any(), name
        assert ((d.mean(0) - exact).abs() <= 5 * sem + 1e-5 * exact.abs()).all(), name


def _explained(pair, g, x):
    """What explain says of the conv: (path, reason) from one training forward of ``conv_plus_linear``."""
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.res = pair["conv"], pair["res"]

        def forward(self, g, h):
            return dgl_exact.nn.conv_plus_linear(self.conv, self.res, g, h)

    explanation = dgl_exact.explain(Layer(), g, x)
    return explanation.path("conv"), explanation.reason("conv")


def test_explain_names_the_fused_op():
    _, ours = _pair(7, 7)
    path, _ = _explained(ours, _graph(12), torch.randn(12, 7))
    assert "GraphConv + residual Linear as one op" in path


@pytest.mark.parametrize("case,reason", [
    ("dgl modules", "not dgl_exact's own module type"),
    ("compression off", "compression off"),
    ("activation", "the conv has an activation"),
    ("other residual", "the residual is not a plain nn.Linear"),
    ("hook", "a module has hooks"),
    ("conv hook", "a module has hooks"),
    ("subclass", "not dgl_exact's own module type"),
    ("eval", None),
])
def test_modules_own_calls_where_the_op_does_not_apply(case, reason, monkeypatch):
    calls = _spy(monkeypatch)
    ref, ours = _pair(7, 7)
    if case == "dgl modules":
        ours = ref
    elif case == "compression off":
        dgl_exact.set_model_config(ours, _cfg(enabled=False))
    elif case == "activation":
        ours["conv"]._activation = torch.relu
        ref["conv"]._activation = torch.relu
    elif case == "other residual":
        ours["res"] = torch.nn.Sequential(ours["res"])
        ref["res"] = torch.nn.Sequential(ref["res"])
    elif case == "hook":
        ours["res"].register_forward_hook(lambda *a: None)
    elif case == "conv hook":
        ours["conv"].register_forward_pre_hook(lambda *a: None)
    elif case == "subclass":  # a user's GraphConv whose forward is its own (here: DGL's result plus nothing)
        class MyConv(dgl_exact.GraphConv):
            def forward(self, graph, feat, weight=None, edge_weight=None):
                return super().forward(graph, feat, weight, edge_weight)

        ours["conv"].__class__ = MyConv
    g = _graph(12)
    gen = torch.Generator().manual_seed(0)
    x, gout = torch.randn(12, 7, generator=gen), torch.randn(12, 7, generator=gen)
    if case == "eval":
        ours.eval(), ref.eval()
        with torch.no_grad():
            got = dgl_exact.nn.conv_plus_linear(ours["conv"], ours["res"], g, x)
        torch.testing.assert_close(got, ref["conv"](g, x) + ref["res"](x), rtol=1e-5, atol=1e-5)
        assert calls == []
        return
    want, got = _run(ref, g, x, gout), _run(ours, g, x, gout)
    assert calls == []
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    if case != "dgl modules":
        assert reason in (_explained(ours, g, x)[1] or ""), case


def test_block_runs_the_modules_calls(monkeypatch):
    """A block: the modules' calls (the fused op covers a homogeneous graph), whatever the user's code does
    with the destination rows."""
    calls = _spy(monkeypatch)
    _, ours = _pair(5, 5)
    block = _block()
    x = torch.randn(block.num_src_nodes(), 5, requires_grad=True)
    with pytest.raises(Exception):  # conv's output has 8 rows, the linear's as many as the sources
        dgl_exact.nn.conv_plus_linear(ours["conv"], ours["res"], block, x * 1.0)
    assert calls == []


def test_zero_in_degree_refused_as_graphconv_refuses():
    _, ours = _pair(4, 4)
    g = dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 1])), num_nodes=15)  # nodes 0, 4.. without
    with pytest.raises(dgl.DGLError, match="0-in-degree"):
        dgl_exact.nn.conv_plus_linear(ours["conv"], ours["res"], g, torch.randn(15, 4) * 1.0)


def test_op_refuses_what_it_does_not_cover():
    g = _graph(10)
    w, lw = torch.randn(4, 4), torch.randn(4, 4)
    with pytest.raises(ValueError, match="norm"):
        dgl_exact.ops.graph_conv_plus_linear(g, torch.randn(10, 4), w, None, lw, None, "mean")
    with pytest.raises(ValueError, match="do not fit"):
        dgl_exact.ops.graph_conv_plus_linear(g, torch.randn(10, 4), torch.randn(4, 3), None, lw, None)
    with pytest.raises(ValueError, match="homogeneous"):
        dgl_exact.ops.graph_conv_plus_linear(_block(), torch.randn(20, 4), w, None, lw, None)


def test_double_backward_with_compression_off_equals_dgl(monkeypatch):
    """Compression off: the modules' own calls (kept exactly), so second-order gradients are DGL's."""
    calls = _spy(monkeypatch)
    ref, ours = _pair(5, 5)
    dgl_exact.set_model_config(ours, _cfg(enabled=False))
    g = _graph(11)
    x0 = torch.randn(11, 5)
    grads = []
    for pair, fused in ((ref, False), (ours, True)):
        x = x0.clone().requires_grad_()
        h = x * 1.0
        out = (dgl_exact.nn.conv_plus_linear(pair["conv"], pair["res"], g, h) if fused
               else pair["conv"](g, h) + pair["res"](h))
        (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        grads.append(torch.autograd.grad(gx.pow(2).sum(), [x, pair["conv"].weight, pair["res"].weight]))
    assert calls == []
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_double_backward_refused_when_compressed():
    _, ours = _pair(4, 4)
    g = _graph(9)
    x = torch.randn(9, 4, requires_grad=True)
    out = dgl_exact.nn.conv_plus_linear(ours["conv"], ours["res"], g, x * 1.0)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
