"""``ops.sage_mean``: GraphSAGE-mean as one fused op (two layer-sized buffers alive at the forward's
and the backward's peak instead of three). Values and input gradients equal DGL's SAGEConv; the weight gradients
equal DGL's when the kept tensors are exact, and average to them under INT2; row chunks (in-place
``fc_neigh``) and column chunks (the transposed aggregation) at awkward sizes."""
import pytest
import torch

import dgl_exact
from dgl_exact.compression import CompressedTensor
from dgl_exact.ops import sage
from tests.ops._helpers import small_chunks_of, spy_apply

dgl = pytest.importorskip("dgl")


def _cfg(**kw):
    return dgl_exact.CompressionConfig(**{"bits": 2, **kw})


def _graph(n, seed=0):
    torch.manual_seed(seed)
    g = dgl.rand_graph(n, 3 * n) if n > 1 else dgl.graph(([0], [0]))
    return g  # some nodes without in-edges (degree clamped to 1), duplicate edges allowed


def _pair(d_in, d_out, bias=True, dtype=torch.float32):
    torch.manual_seed(1)
    ref = dgl.nn.SAGEConv(d_in, d_out, "mean", bias=bias).to(dtype)
    ex = dgl_exact.SAGEConv(d_in, d_out, "mean", bias=bias, compression=_cfg()).to(dtype)
    ex.load_state_dict(ref.state_dict())
    return ref, ex


@pytest.fixture
def small_chunks(monkeypatch):
    small_chunks_of(monkeypatch, sage)


def _spy(monkeypatch):
    return spy_apply(monkeypatch, sage.SAGEMean)


def _run(conv, g, x, gout, inner=False):
    """Output, input gradient and parameter gradients; ``inner``: the input is a tensor autograd made (a
    hidden layer's input, kept compressed) rather than a leaf (kept by reference)."""
    x = x.clone().requires_grad_()
    out = conv(g, x * 1.0 if inner else x)
    out.backward(gout)
    return out.detach(), x.grad, {n: p.grad for n, p in conv.named_parameters()}


@pytest.mark.parametrize("n", [1, 6, 11, 40])
@pytest.mark.parametrize("d_in,d_out", [(7, 7), (7, 9), (3, 3), (9, 4)])
@pytest.mark.parametrize("bias", [True, False])
def test_equals_dgl_with_exact_kept_tensors(n, d_in, d_out, bias, small_chunks, exact_kept, monkeypatch):
    calls = _spy(monkeypatch)
    ref, ex = _pair(d_in, d_out, bias)
    g = _graph(n)
    gen = torch.Generator().manual_seed(n)
    x, gout = torch.randn(n, d_in, generator=gen), torch.randn(n, d_out, generator=gen)
    want, got = _run(ref, g, x, gout), _run(ex, g, x, gout)
    assert len(calls) == 1  # the fused op ran
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_dtypes(dtype, small_chunks):
    ref, ex = _pair(7, 7, dtype=dtype)
    g = _graph(13)
    gen = torch.Generator().manual_seed(0)
    x, gout = torch.randn(13, 7, generator=gen).to(dtype), torch.randn(13, 7, generator=gen).to(dtype)
    want, got = _run(ref, g, x, gout), _run(ex, g, x, gout)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)  # the input gradient needs no activation
    assert got[1].dtype == dtype and got[0].dtype == dtype


@pytest.mark.parametrize("d_in,d_out,n_kept", [(7, 7, 2), (9, 4, 1)])
def test_int2_forward_exact_input_grad_equal_and_kept_compressed(d_in, d_out, n_kept, small_chunks, monkeypatch):
    kept = []
    real = sage.as_kept
    monkeypatch.setattr(sage, "as_kept", lambda x, cfg, force=False: kept.append(real(x, cfg, force)) or kept[-1])
    ref, ex = _pair(d_in, d_out)
    g = _graph(23)
    gen = torch.Generator().manual_seed(0)
    x, gout = torch.randn(23, d_in, generator=gen), torch.randn(23, d_out, generator=gen)
    h = x.clone().requires_grad_()
    inner = h * 1.0  # a layer's input autograd made: kept compressed, not by reference
    out = ex(g, inner)
    out.backward(gout)
    want = _run(ref, g, x, gout)
    torch.testing.assert_close(out.detach(), want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h.grad, want[1], rtol=1e-5, atol=1e-5)
    # the mean, then the input; projecting first, the input alone (for both weight gradients)
    assert [isinstance(k, CompressedTensor) for k in kept] == [True] * n_kept


@pytest.mark.parametrize("d_in,d_out", [(7, 7), (9, 4)])
def test_weight_gradients_unbiased_at_int2(d_in, d_out, small_chunks):
    """Over seeds the INT2 weight gradients average to DGL's exact ones, within 5 standard errors of the mean
    estimated from the same draws (elementwise; a 5-sigma miss is a 1-in-1.7-million event per element)."""
    ref, ex = _pair(d_in, d_out)
    g = _graph(17)
    gen = torch.Generator().manual_seed(0)
    x, gout = torch.randn(17, d_in, generator=gen), torch.randn(17, d_out, generator=gen)
    want = _run(ref, g, x, gout)[2]
    draws = {name: [] for name in want}
    for seed in range(300):
        torch.manual_seed(seed)
        ex.zero_grad()
        for name, grad in _run(ex, g, x, gout, inner=True)[2].items():
            draws[name].append(grad)
    for name, exact in want.items():
        d = torch.stack(draws[name])
        sem = d.std(0) / d.shape[0] ** 0.5
        if name.endswith("weight"):  # stochastic: the kept tensors were compressed (the bias needs none)
            assert (d.std(0) > 0).any(), name
        assert ((d.mean(0) - exact).abs() <= 5 * sem + 1e-5 * exact.abs()).all(), name


def test_composed_path_where_fusion_does_not_apply(monkeypatch):
    calls = _spy(monkeypatch)
    g = _graph(12)
    x = torch.randn(12, 7)
    for conv, kw in ((dgl_exact.SAGEConv(7, 7, "mean", compression=_cfg(enabled=False)), {}),  # compression off
                     (dgl_exact.SAGEConv(7, 7, "mean", compression=_cfg()), {"edge_weight": torch.rand(36)}),
                     (dgl_exact.SAGEConv(7, 7, "gcn", compression=_cfg()), {})):
        conv(g, x.clone().requires_grad_(), **kw).sum().backward()
    with torch.no_grad():
        dgl_exact.SAGEConv(7, 7, "mean", compression=_cfg())(g, x)
    assert calls == []


def test_double_backward_refused_when_compressed():
    g = _graph(9)
    conv = dgl_exact.SAGEConv(4, 4, "mean", compression=_cfg())
    x = torch.randn(9, 4, requires_grad=True)
    out = conv(g, x * 1.0)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)


@pytest.mark.parametrize("d_in,d_out", [(7, 7), (7, 9), (9, 4)])
def test_autocast_matches_dgl_under_autocast(d_in, d_out, small_chunks, exact_kept, monkeypatch):
    """bf16 autocast (CPU): the fused op runs (products in bf16, the aggregation of x in fp32, as the composed
    ops under autocast); output bf16, input gradient fp32, all close to DGL's SAGEConv under autocast."""
    calls = _spy(monkeypatch)
    ref, ex = _pair(d_in, d_out)
    g = _graph(19)
    gen = torch.Generator().manual_seed(3)
    x, gout = torch.randn(19, d_in, generator=gen), torch.randn(19, d_out, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, got = _run(ref, g, x, gout), _run(ex, g, x, gout)
    assert len(calls) == 1
    assert got[0].dtype == want[0].dtype == torch.bfloat16 and got[1].dtype == torch.float32
    tol = dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(got[0].float(), want[0].float(), **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    for name, grad in want[2].items():
        assert got[2][name].dtype == grad.dtype == torch.float32, name
        torch.testing.assert_close(got[2][name], grad, rtol=3e-2, atol=5e-2, msg=name)


def test_fused_after_compress_model_converted_the_submodules(monkeypatch):
    """``compress_model`` turns DGL's SAGEConv and its ``fc_self``/``fc_neigh`` (``nn.Linear``) into
    dgl_exact's: a dgl_exact ``Linear`` under the conv's own configuration computes what the fused op does,
    so the user's converted model runs the same fused op as the project's."""
    calls = _spy(monkeypatch)
    ref = torch.nn.ModuleList([dgl.nn.SAGEConv(7, 5, "mean")])
    mine = dgl_exact.compress_model(torch.nn.ModuleList([dgl.nn.SAGEConv(7, 5, "mean")]), _cfg())
    mine.load_state_dict(ref.state_dict())
    assert type(mine[0].fc_self) is dgl_exact.nn.layers.Linear
    g, x = _graph(12), torch.randn(12, 7)
    out = mine[0](g, x.clone().requires_grad_())
    assert len(calls) == 1
    assert torch.allclose(out, ref[0](g, x), rtol=1e-5, atol=1e-6)


def test_not_fused_when_a_converted_linear_keeps_differently(monkeypatch):
    """A dgl_exact ``Linear`` with its own compression (not the conv's) keeps its input its own way: the
    conv calls it rather than fusing it under the conv's configuration; the output is DGL's."""
    from dgl_exact.nn._base import plain_linear

    calls = _spy(monkeypatch)
    ref = torch.nn.ModuleList([dgl.nn.SAGEConv(7, 5, "mean")])
    mine = dgl_exact.compress_model(torch.nn.ModuleList([dgl.nn.SAGEConv(7, 5, "mean")]), _cfg())
    mine.load_state_dict(ref.state_dict())
    conv = mine[0]
    conv.fc_self.compression = _cfg(bits=8)
    assert not plain_linear(conv.fc_self, _cfg()) and plain_linear(conv.fc_neigh, _cfg())
    g, x = _graph(12), torch.randn(12, 7)
    out = conv(g, x.clone().requires_grad_())
    out.sum().backward()
    assert calls == []
    assert torch.allclose(out, ref[0](g, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("which", ["fc_self", "fc_neigh", "feat_drop"])
@pytest.mark.parametrize("convert", [False, True])
def test_hooks_on_submodules_fire_as_in_dgl(which, convert):
    """A forward hook on a submodule (here one that doubles its output) sees the submodule's own call and
    changes the result exactly as under DGL's SAGEConv: the conv then calls the submodule instead of
    running its op (or the fused op) itself."""
    torch.manual_seed(3)
    ref = dgl.nn.SAGEConv(7, 5, "mean", feat_drop=0.0)
    if convert:
        mine = dgl_exact.compress_model(torch.nn.ModuleList([dgl.nn.SAGEConv(7, 5, "mean")]), _cfg())[0]
    else:
        mine = dgl_exact.SAGEConv(7, 5, "mean", compression=_cfg())
    mine.load_state_dict(ref.state_dict())
    fired = []

    def double(module, args, output):
        fired.append(module)
        return output * 2

    for conv in (ref, mine):
        getattr(conv, which).register_forward_hook(double)
    g, x = _graph(12), torch.randn(12, 7)
    expected = ref(g, x)
    out = mine(g, x.clone().requires_grad_())
    out.sum().backward()
    assert len(fired) == 2
    assert torch.allclose(out, expected, rtol=1e-5, atol=1e-6)
