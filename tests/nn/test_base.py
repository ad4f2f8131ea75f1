"""The modules' in-place elementwise chains (so that fewer layer-sized temporaries are alive at a step's peak).

``into`` writes an elementwise op into a buffer the module owns, and falls back to out of place for views
(a custom Function's output view refuses in-place ops), dtype promotion and broadcasting that grows the
buffer. The conv modules must give DGL's values, leave their inputs untouched, and keep their gradients
(compression off: equal to DGL's; the tolerance cases live in test_modules.py); the models release each
layer's input once its conv has returned.
"""
import weakref

import pytest
import torch

import dgl_exact
import dgl
from dgl_exact.nn import fastpaths
from dgl_exact.nn._base import into, kept_by_reference
from dgl_exact.training.models import build_model


def test_into_in_place_when_owned():
    buf = torch.randn(5, 3)
    ptr = buf.data_ptr()
    other = torch.randn(5, 1)
    expect = buf + other
    out = into(buf, "add", other)
    assert out.data_ptr() == ptr and torch.equal(out, expect)
    expect = out * 0.25
    assert torch.equal(into(out, "mul", 0.25), expect) and out.data_ptr() == ptr


@pytest.mark.parametrize("case", ["view", "promote", "broadcast"])
def test_into_out_of_place(case):
    if case == "view":
        base = torch.randn(4, 1, 3)
        buf, other = base.view(4, 3), torch.randn(3)
    elif case == "promote":
        buf, other = torch.randn(4, 3, dtype=torch.bfloat16), torch.randn(3)
    else:
        buf, other = torch.randn(4, 1), torch.randn(4, 3)
    before = buf.clone()
    out = into(buf, "add", other)
    assert torch.equal(buf, before)
    assert torch.equal(out, buf + other) and out.dtype == torch.result_type(buf, other)


def test_kept_by_reference_mirrors_keep():
    x = torch.randn(3, 2, requires_grad=True) * 2
    assert kept_by_reference(x, dgl_exact.CompressionConfig(enabled=False))
    assert not kept_by_reference(x, dgl_exact.CompressionConfig(bits=2))
    assert not kept_by_reference(x, dgl_exact.CompressionConfig(enabled=False, kept_frac=0.5))
    with torch.no_grad():
        assert not kept_by_reference(x, dgl_exact.CompressionConfig(enabled=False))


def _graph(n):
    g = dgl.rand_graph(n, min(3 * n, n * n))
    return dgl.add_self_loop(dgl.remove_self_loop(g))


def _pair(cls, *args, **kw):
    torch.manual_seed(0)
    ref = getattr(dgl.nn, cls)(*args, **kw)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ex = getattr(dgl_exact, cls)(*args, **kw)
    ex.load_state_dict(ref.state_dict())
    return ref, ex


def _beta1(pair):
    for m in pair:
        m.beta = 1.0  # EXACT's arxiv GCNII (identity_mapping=False): (1 - beta) * feat_sum is all zeros
    return pair


MODULES = {
    "gcn2-proj": lambda: _pair("GCN2Conv", 7, 2, alpha=0.3),
    "gcn2-noproj": lambda: _pair("GCN2Conv", 7, 2, project_initial_features=False),
    "gcn2-beta1": lambda: _beta1(_pair("GCN2Conv", 7, 1)),
    "graphconv": lambda: _pair("GraphConv", 7, 7),
    "graphconv-narrow": lambda: _pair("GraphConv", 7, 3),
    "graphconv-right": lambda: _pair("GraphConv", 7, 9, norm="right"),
    "sage-mean": lambda: _pair("SAGEConv", 7, 7, "mean"),
    "sage-mean-narrow": lambda: _pair("SAGEConv", 7, 3, "mean"),
}


def _call(mid, m, g, x, x0, ew):
    if mid.startswith("gcn2"):
        return m(g, x, x0, edge_weight=ew)
    return m(g, x, edge_weight=ew)


@pytest.mark.parametrize("n", [1, 2, 37])
@pytest.mark.parametrize("with_ew", [False, True])
@pytest.mark.parametrize("mid", sorted(MODULES))
@pytest.mark.parametrize("setting", ["off", "int2"])
def test_conv_chain_inputs_untouched_and_values(mid, n, with_ew, setting):
    """Forward equals DGL's (compression only touches what is kept), inputs are not overwritten, and with
    compression off the gradients equal DGL's. Features enter as outputs of an earlier op (hidden layer)."""
    ref, ex = MODULES[mid]()
    g = _graph(n)
    gen = torch.Generator().manual_seed(n)
    x_leaf = torch.randn(n, 7, generator=gen, requires_grad=True)
    x0_leaf = torch.randn(n, 7, generator=gen, requires_grad=True)
    ew = (torch.rand(g.num_edges(), generator=gen) + 0.5) if with_ew else None
    cfg = dgl_exact.CompressionConfig(enabled=False) if setting == "off" else dgl_exact.CompressionConfig(bits=2)
    ex.compression = cfg
    x, x0 = x_leaf * 1.0, x0_leaf * 1.0
    before = (x.detach().clone(), x0.detach().clone())
    out = _call(mid, ex, g, x, x0, ew)
    assert torch.equal(x, before[0]) and torch.equal(x0, before[1])
    ref_out = _call(mid, ref, g, x_leaf * 1.0, x0_leaf * 1.0, ew)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    w = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad((out * w).sum(), [x_leaf, x0_leaf, *ex.parameters()], allow_unused=True)
    if setting == "off":
        ref_grads = torch.autograd.grad((ref_out * w).sum(), [x_leaf, x0_leaf, *ref.parameters()],
                                        allow_unused=True)
        for a, b in zip(grads, ref_grads):
            if a is None or b is None:
                assert a is None and b is None or (a if b is None else b).abs().max() == 0
                continue
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mid", ["gcn2-proj", "graphconv", "sage-mean"])
def test_conv_chain_half_precision(mid, dtype):
    """Half-precision modules: in-place ops keep the dtype the out-of-place ones gave (DGL's)."""
    _skip_without_cpu_fp16_matmul(dtype)
    ref, ex = MODULES[mid]()
    ex = ex.to(dtype)
    g = _graph(19)
    x = torch.randn(19, 7).to(dtype).requires_grad_()
    x0 = torch.randn(19, 7).to(dtype).requires_grad_()
    with dgl_exact.config(bits=2):
        out = _call(mid, ex, g, x * 1, x0 * 1, None)
    ref_out = _call(mid, ref, g, x.float(), x0.float(), None)  # DGL's CPU kernels refuse fp16
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref_out, rtol=5e-2, atol=5e-2)
    out.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()


def test_conv_chain_double_backward_compression_off():
    """Compression off: the in-place chain stays differentiable to second order, equal to DGL's."""
    ref, ex = MODULES["gcn2-proj"]()
    ex.compression = dgl_exact.CompressionConfig(enabled=False)
    g = _graph(11)
    x = torch.randn(11, 7, dtype=torch.float64, requires_grad=True)
    ref, ex = ref.double(), ex.double()
    results = []
    for m in (ex, ref):
        out = torch.tanh(m(g, x * 1.0, x * 0.5))
        (gx,) = torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)
        (ggx,) = torch.autograd.grad(gx.pow(2).sum(), x)
        results.append(ggx)
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize("model", ["sage", "gcn", "gcn2"])
def test_models_release_layer_input(model):
    """Each hidden layer's input is freed once its conv has returned (before BN/ReLU allocate); with
    compression on nothing else keeps it."""
    torch.manual_seed(0)
    g = _graph(40)
    m = build_model(model, 6, 3, hidden=8, layers=3, dropout=0.2, batch_norm=True)
    m.train()
    refs, checked = {}, []

    def grab(i):
        def hook(_mod, args, _kw=None):
            refs[i] = weakref.ref(args[1])
        return hook

    def check(i):
        def hook(_mod, _args):
            if i in refs:
                checked.append(refs[i]() is None)
        return hook

    for i, conv in enumerate(m.convs):
        conv.register_forward_pre_hook(grab(i))
        m.norms[i].register_forward_pre_hook(check(i)) if i < len(m.norms) else None
    x = torch.randn(40, 6)
    with dgl_exact.config(bits=2):
        out = m(g, x)
    out.sum().backward()
    # StackedGNN's layer 0 reads the caller's x (alive anyway); GCNII's reads dropout(lin_in(x)), freed too
    first = model == "gcn2"
    assert len(checked) == len(m.norms) and checked[0] is first and all(checked[1:])


@pytest.mark.parametrize("n", [1, 2, 45])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("with_ew", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gcn2_fused_mix(n, bias, with_ew, dtype, monkeypatch):
    """The fused GCNII mix (compression on): forward bit-identical to the unfused chain (compression off),
    the gradients of h, h0 and the bias equal the unfused ones (no activation involved), and the weight
    gradient is beta * s_hat^T g from the kept copy."""
    from dgl_exact.ops import gcn2 as ops_gcn2
    from dgl_exact.ops import keep as keeping

    kept = []
    real = keeping.compress
    monkeypatch.setattr(keeping, "compress", lambda x, cfg, seed=None: kept.append(real(x, cfg, seed)) or kept[-1])
    g = _graph(n)
    torch.manual_seed(n)
    conv = dgl_exact.GCN2Conv(6, 2, alpha=0.3, bias=bias).to(dtype)
    with torch.no_grad():
        for p in conv.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x = torch.randn(n, 6).to(dtype).requires_grad_()
    x0 = torch.randn(n, 6).to(dtype).requires_grad_()
    ew = torch.rand(g.num_edges()) + 0.5 if with_ew else None
    w = torch.randn(n, 6).to(dtype)
    params = [x, x0] + list(conv.parameters())
    outs, grads = [], []
    for cfg in (dgl_exact.CompressionConfig(bits=2), dgl_exact.CompressionConfig(enabled=False)):
        conv.compression = cfg
        calls = []
        monkeypatch.setattr(ops_gcn2.MixGCN2, "apply", _spy(ops_gcn2.MixGCN2.apply, calls))
        out = conv(g, x * 1, x0 * 1, edge_weight=ew)
        assert bool(calls) == cfg.enabled  # fused with compression on only
        outs.append(out)
        grads.append(torch.autograd.grad((out * w).sum(), params))
    assert torch.equal(outs[0], outs[1])
    for i, (a, b) in enumerate(zip(*grads)):
        if params[i] is conv.weight1:
            s_hat = keeping.decompress(kept[-1]).to(dtype)
            torch.testing.assert_close(a.float(), (conv.beta * s_hat.float().t() @ w.float()),
                                       rtol=2e-2 if dtype != torch.float32 else 1e-5, atol=1e-2 if
                                       dtype != torch.float32 else 1e-5)
        else:
            tol = {} if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(a, b, **tol)


def _spy(fn, calls):
    def wrapper(*args):
        calls.append(1)
        return fn(*args)
    return wrapper


def test_gcn2_fused_mix_refuses_double_backward():
    g = _graph(12)
    conv = dgl_exact.GCN2Conv(6, 1, compression=dgl_exact.CompressionConfig(bits=2))
    x = torch.randn(12, 6, requires_grad=True)
    out = conv(g, x * 1, x * 1)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.pow(2).sum(), x, create_graph=True)


@pytest.mark.parametrize("case", ["donated", "edge-weight", "feat-is-h0", "eval"])
def test_gcn2_donated_input_released_once_propagated_same_results(case):
    """``conv(g, dgl_exact.donate(h), h0)``: the propagation keeps nothing of ``h``, so its memory goes before
    the mix allocates; output and gradients equal the undonated call's. Kept where releasing could change what
    is read: edge weights, ``h`` sharing ``h0``'s memory, eval mode (explain says why)."""
    g = _graph(20)
    gen = torch.Generator().manual_seed(1)
    conv = dgl_exact.GCN2Conv(6, 2, alpha=0.2, compression=dgl_exact.CompressionConfig(bits=2))
    x = torch.randn(20, 6, generator=gen, requires_grad=True)
    ew = torch.rand(g.num_edges(), generator=gen) + 0.5 if case == "edge-weight" else None
    r = torch.randn(20, 6, generator=gen)
    if case == "eval":
        conv.eval()
    results = []
    for give in (False, True):
        torch.manual_seed(3)  # the same stochastic rounding draws
        h = x * 1.0
        h0 = h if case == "feat-is-h0" else x * 2.0
        out = conv(g, dgl_exact.donate(h) if give else h, h0, edge_weight=ew)
        results.append((out.detach(), *torch.autograd.grad(out, (x, *conv.parameters()), r, allow_unused=True)))
        if give:
            released = type(h) is dgl_exact.ops.donation.Released
    assert released == (case == "donated")
    if case != "donated":  # the reason explain prints
        h = x * 1.0
        why = fastpaths.GCN2_DONATED_INPUT.refusal(conv, h, h if case == "feat-is-h0" else x * 2.0, ew)
        assert why == {"edge-weight": "donated input kept: edge weights (their gradient may read the input)",
                       "feat-is-h0": "donated input kept: a view, or it shares memory with h0",
                       "eval": "eval mode"}[case]
    for a, b in zip(*results):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("with_ew", [False, True])
def test_sage_mean_of_leaf_features_kept_compressed(with_ew, monkeypatch):
    """SAGEConv('mean') on input features (no gradient): the neighbour mean is a temporary nobody else
    keeps, so fc_neigh keeps it compressed, not by reference (the sum-then-divide form must stay fresh)."""
    from dgl_exact.compression import CompressedTensor
    from dgl_exact.ops import dense, sage

    kept = []
    real = dense.as_kept
    for module in (dense, sage):  # the composed ops (with edge weights) and the fused sage_mean
        monkeypatch.setattr(module, "as_kept",
                            lambda x, cfg, force=False, **kw: kept.append(real(x, cfg, force, **kw)) or kept[-1])
    g = _graph(30)
    conv = dgl_exact.SAGEConv(5, 5, "mean", compression=dgl_exact.CompressionConfig(bits=2))
    x = torch.randn(30, 5)
    ew = torch.rand(g.num_edges()) + 0.5 if with_ew else None
    conv(g, x, edge_weight=ew).sum().backward()
    # fc_self keeps x (alive anyway, by reference); fc_neigh keeps the mean compressed
    assert [isinstance(k, CompressedTensor) for k in kept].count(True) == 1


def _skip_without_cpu_fp16_matmul(dtype):
    if dtype == torch.float16 and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 2):
        pytest.skip("torch < 2.2 has no fp16 matmul on the CPU (addmm_impl_cpu_)")


@pytest.mark.parametrize("case", ["hook", "subclass", "double-backward"])
def test_gcn2_donated_input_with_hooks_subclass_and_double_backward(case):
    """The donated-input path under a forward hook (declines: a hook may read the input), in a subclass (same
    results as undonated) and with a double backward (the same as the undonated call: both give the same second
    derivative or both refuse with the same error)."""
    g = _graph(20)
    gen = torch.Generator().manual_seed(2)
    cls = dgl_exact.GCN2Conv if case != "subclass" else type("MyGCN2Conv", (dgl_exact.GCN2Conv,), {})
    conv = cls(6, 2, alpha=0.2, compression=dgl_exact.CompressionConfig(bits=2))
    if case == "hook":
        conv.register_forward_hook(lambda mod, args, out: None)
    x = torch.randn(20, 6, generator=gen, requires_grad=True)
    r = torch.randn(20, 6, generator=gen)
    results = []
    for give in (False, True):
        torch.manual_seed(3)
        h = x * 1.0
        out = conv(g, dgl_exact.donate(h) if give else h, x * 2.0)
        if case == "double-backward":
            try:
                (gx,) = torch.autograd.grad((out * r).sum(), x, create_graph=True)
                results.append(("ok", torch.autograd.grad(gx.pow(2).sum(), x)[0]))
            except RuntimeError as e:
                results.append(("error", str(e).splitlines()[0]))
            continue
        results.append((out.detach(), *torch.autograd.grad(out, (x, *conv.parameters()), r, allow_unused=True)))
        if give:
            released = type(h) is dgl_exact.ops.donation.Released
    if case == "double-backward":
        assert results[0][0] == results[1][0]
        if results[0][0] == "ok":
            assert torch.equal(results[0][1], results[1][1])
        return
    assert released == (case == "subclass")
    for a, b in zip(*results):
        assert (a is None and b is None) or torch.equal(a, b)
