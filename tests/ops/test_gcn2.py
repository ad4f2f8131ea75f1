"""``ops.gcn2``: GCNII's hidden layers and output linear as one fused op (two layer-sized buffers at the
forward's and the backward's peak instead of three). With exact kept tensors the model's output, loss,
gradients and batch-norm statistics equal DGL's; under INT2 the forward stays exact and the weight
gradients average to the exact ones; with dropout the gradient is the derivative of the forward that ran;
a gradient somebody else holds is never overwritten; row and column chunks at awkward sizes."""
import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact.ops import keep as keeping, gcn2
from dgl_exact.ops import chunks as chunking
from dgl_exact.ops import donation
from dgl_exact.training import models
from dgl_exact.training.models import build_model
from tests.ops._helpers import small_chunks_of

dgl = pytest.importorskip("dgl")

pytestmark = pytest.mark.usefixtures("one_thread")  # many tiny sparse products: no spin-waiting thread pools


def _graph(n, seed=0):
    torch.manual_seed(seed)
    g = dgl.rand_graph(n, min(3 * n, n * n - n))
    return dgl.add_self_loop(dgl.remove_self_loop(g))


@pytest.fixture
def small_chunks(monkeypatch):
    small_chunks_of(monkeypatch, gcn2)


def _spy(monkeypatch):
    calls = []
    real = gcn2._GCNIIStack.apply
    monkeypatch.setattr(gcn2._GCNIIStack, "apply", lambda *a: calls.extend(a[5]) or real(*a))
    return calls


def _model(impl, layers=3, hidden=7, dropout=0.0, batch_norm=True, dtype=torch.float32, **kw):
    torch.manual_seed(1)
    m = build_model("gcn2", 6, 4, hidden=hidden, layers=layers, dropout=dropout, batch_norm=batch_norm, impl=impl,
                    **kw).to(dtype)
    return m.train()


def _step(model, g, x, y, seed=0):
    """Output, loss, parameter gradients and buffers after one training forward and backward."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    out = model(g, x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), loss.detach(), grads, {n: b.clone() for n, b in model.named_buffers()}


def _data(n, dtype=torch.float32, seed=2):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=gen).to(dtype), torch.randint(0, 4, (n,), generator=gen)


def _assert_close(got, want, tol):
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    assert got[2].keys() == want[2].keys()
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, msg=name, **tol)
    for name, buf in want[3].items():
        torch.testing.assert_close(got[3][name], buf, msg=name, **tol)


@pytest.mark.parametrize("n", [3, 6, 11, 40])
@pytest.mark.parametrize("layers", [1, 2, 4])
@pytest.mark.parametrize("batch_norm", [True, False])
def test_equals_dgl_with_exact_kept_tensors(n, layers, batch_norm, small_chunks, exact_kept, monkeypatch):
    calls = _spy(monkeypatch)
    g = _graph(n)
    # float64: batch norm over a handful of rows amplifies float32 rounding beyond any fixed tolerance (a
    # bias before batch norm has a zero gradient up to rounding, whose sign the kernels' order decides)
    x, y = _data(n, torch.float64)
    ref = _model("dgl", layers, batch_norm=batch_norm, dtype=torch.float64)
    ex = _model("exact", layers, batch_norm=batch_norm, dtype=torch.float64)
    ex.load_state_dict(ref.state_dict())
    want, got = _step(ref, g, x, y), _step(ex, g, x, y)
    assert len(calls) == layers  # every hidden layer ran fused
    _assert_close(got, want, dict(rtol=1e-7, atol=1e-9))


def test_identity_mapping_off_and_no_bias_and_float64(small_chunks, exact_kept, monkeypatch):
    """beta = 1 (EXACT's arxiv GCNII), a conv without bias, double precision."""
    calls = _spy(monkeypatch)
    g = _graph(13)
    x, y = _data(13, torch.float64)
    ref = _model("dgl", 3, identity_mapping=False, dtype=torch.float64)
    ex = _model("exact", 3, identity_mapping=False, dtype=torch.float64)
    for m in (ref, ex):
        m.convs[1]._bias = False
        m.convs[1].bias = None
    ex.load_state_dict(ref.state_dict())
    want, got = _step(ref, g, x, y), _step(ex, g, x, y)
    assert len(calls) == 3
    _assert_close(got, want, dict(rtol=1e-10, atol=1e-12))


def test_composed_modules_equal_too(small_chunks, exact_kept, monkeypatch):
    """The fused stack against dgl_exact's own composed modules (the path it replaces)."""
    g = _graph(17)
    x, y = _data(17)
    fused = _step(_model("exact"), g, x, y)
    monkeypatch.setattr(models, "gcnii_stack", lambda *a, **k: None)
    composed = _step(_model("exact"), g, x, y)
    _assert_close(fused, composed, dict(rtol=1e-5, atol=1e-6))


@pytest.mark.parametrize("dropout", [0.3, 0.6])
def test_gradient_is_the_derivative_of_the_forward_that_ran(dropout, small_chunks, exact_kept):
    """With dropout (masks drawn per row chunk) the gradient matches central differences of the same
    forward (same seed, same masks) along random directions, in double precision."""
    g = _graph(12)
    x, y = _data(12, torch.float64)
    model = _model("exact", 3, dropout=dropout, dtype=torch.float64)
    params = [p for p in model.parameters()]

    def loss():
        torch.manual_seed(7)
        return F.cross_entropy(model(g, x), y)

    loss().backward()
    grads = [p.grad.clone() for p in params]
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        v = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
        eps = 1e-6
        with torch.no_grad():
            for p, d in zip(params, v):
                p.add_(d, alpha=eps)
        # training mode without grad would take the composed path; keep grad on, discard it
        up = loss().item()
        with torch.no_grad():
            for p, d in zip(params, v):
                p.sub_(d, alpha=2 * eps)
        down = loss().item()
        with torch.no_grad():
            for p, d in zip(params, v):
                p.add_(d, alpha=eps)
        numeric = (up - down) / (2 * eps)
        analytic = sum((gr * d).sum().item() for gr, d in zip(grads, v))
        assert abs(numeric - analytic) <= 1e-5 * max(1.0, abs(analytic)), (numeric, analytic)


def test_batch_norm_running_statistics_and_eval_after_training(small_chunks, exact_kept):
    g = _graph(15)
    x, y = _data(15)
    ref, ex = _model("dgl"), _model("exact")
    ex.load_state_dict(ref.state_dict())
    for _ in range(3):
        _step(ref, g, x, y)
        _step(ex, g, x, y)
    for name, buf in ref.state_dict().items():
        torch.testing.assert_close(ex.state_dict()[name], buf, rtol=1e-5, atol=1e-6, msg=name)
    ref.eval(), ex.eval()
    with torch.no_grad():
        torch.testing.assert_close(ex(g, x), ref(g, x), rtol=1e-5, atol=1e-6)


def test_int2_forward_exact_and_weight_gradients_unbiased():
    """Under INT2 the output is the exact one for every seed and, over 200 seeds, each weight gradient
    averages to the exact gradient within 5 standard errors of the mean. Without batch norm the gradient
    reaching each layer needs no activation (exact), and ``dW = beta s^T g`` is linear in the kept ``s``, an
    unbiased estimate. (Batch norm's backward is quadratic in its kept input, an O(variance / N) bias the
    composed ops share; its gradients are compared exactly above.)"""
    g = _graph(20)
    x, y = _data(20)
    model = _model("exact", 2, batch_norm=False)
    with keeping.keep_hook(lambda t, cfg, force: t.clone() if force else t):
        exact = _step(model, g, x, y)
    samples = {n: [] for n in exact[2]}
    for seed in range(200):
        out, _, grads, _ = _step(model, g, x, y, seed)
        torch.testing.assert_close(out, exact[0], rtol=1e-5, atol=1e-6)
        for name, grad in grads.items():
            samples[name].append(grad)
    for name, ref in exact[2].items():
        d = torch.stack(samples[name])
        sem = d.std(0) / d.shape[0] ** 0.5
        assert ((d.mean(0) - ref).abs() <= 5 * sem + 1e-5 * ref.abs() + 1e-7).all(), name


def _stack_inputs(n, d, cfg, batch_norm=False, seed=0):
    g = _graph(n, seed)
    st = dgl_exact.ops.structure_of(g, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    h0 = torch.randn(n, d, generator=gen, requires_grad=True)
    w = torch.randn(d, d, generator=gen, requires_grad=True)
    head = torch.randn(3, d, generator=gen, requires_grad=True)
    bn = None
    if batch_norm:
        bn = gcn2.BatchNormArgs(torch.ones(d, requires_grad=True), torch.zeros(d, requires_grad=True),
                                torch.zeros(d), torch.ones(d), True, 0.1, 1e-5)
    layer = gcn2.GCN2Layer(gcn2.GCN2Step(0.1, 0.5, 0.0, 0.0, 0), w, None, bn, cfg)
    return g, st, h0, w, head, layer


def test_kept_compressed_and_incoming_gradient_never_written():
    """The fused op keeps compressed tensors (one per layer without batch norm, plus the output layer's
    input); the incoming gradient is read, never overwritten."""
    _, st, h0, w, head, layer = _stack_inputs(30, 8, dgl_exact.CompressionConfig(bits=2))
    kept = []

    def hook(t, cfg, force):
        item = keeping.default_keep(t, cfg, force)
        kept.append(item)
        return item

    with keeping.keep_hook(hook):
        out = gcn2.gcnii_layers(st, h0 * 1.0, [layer], head, None, layer.config)
    assert len(kept) == 2 and all(isinstance(k, dgl_exact.compression.CompressedTensor) for k in kept)
    gout = torch.randn(30, 3)
    before = gout.clone()
    out.backward(gout)
    assert torch.equal(gout, before)
    assert h0.grad is not None and w.grad is not None and head.grad is not None


@pytest.mark.parametrize("cfg", [dgl_exact.CompressionConfig(enabled=False),
                                 dgl_exact.CompressionConfig(enabled=False, kept_frac=0.5)], ids=["off", "off-rp"])
@pytest.mark.parametrize("batch_norm", [False, True])
def test_exact_config_keeps_a_copy_of_the_buffer_it_overwrites(cfg, batch_norm):
    """With compression off the op keeps its tensors exactly: a copy where it overwrites the buffer afterwards
    (it kept a reference to its working buffer and then overwrote it: weight gradients off by up to 1000x).
    Gradients equal plain autograd's composition of the same layer in float64."""
    n, d = 16, 5
    g, st, h0, w, head, layer = _stack_inputs(n, d, cfg, batch_norm)
    h0, w, head = h0.double().detach().requires_grad_(), w.double().detach().requires_grad_(), \
        head.double().detach().requires_grad_()
    bn = layer.bn
    if bn is not None:
        bn = gcn2.BatchNormArgs(bn.weight.detach().double().requires_grad_(),
                                bn.bias.detach().double().requires_grad_(), torch.zeros(d, dtype=torch.float64),
                                torch.ones(d, dtype=torch.float64), True, 0.1, 1e-5)
    layer = gcn2.GCN2Layer(layer.step, w, None, bn, cfg)
    wrt = [h0, w, head] + ([bn.weight, bn.bias] if bn else [])
    draws = []
    for seed in range(1 if cfg.kept_frac == 1.0 else 300):
        torch.manual_seed(seed)
        out = gcn2.gcnii_layers(st, h0, [layer], head, None, cfg)
        draws.append(torch.autograd.grad(out.square().sum(), wrt))
    # the same layer in plain autograd
    deg = g.in_degrees().double().clamp(min=1).pow(-0.5).unsqueeze(1)
    a = dgl.ops.copy_u_sum(g, h0 * deg) * deg * 0.9
    s = a + 0.1 * h0
    o = 0.5 * s + 0.5 * s @ w
    if bn is not None:
        o = torch.nn.functional.batch_norm(o, None, None, bn.weight, bn.bias, True, 0.1, 1e-5)
    ref = torch.relu(o) @ head.t()
    want = torch.autograd.grad(ref.square().sum(), wrt)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    for i, ref_grad in enumerate(want):
        d = torch.stack([draw[i] for draw in draws])
        if i in (1, 2) and len(draws) > 1:
            # a random projection keeps s and the output layer's input: an unbiased estimate of these two
            # (within 5 standard errors of the mean over the draws); every other gradient reads no projection
            sem = d.std(0) / len(draws) ** 0.5
            assert ((d.mean(0) - ref_grad).abs() <= 5 * sem + 1e-9).all(), i
        else:
            for g_ in d:
                torch.testing.assert_close(g_, ref_grad, rtol=1e-8, atol=1e-10)


def test_repeated_backward_with_retain_graph_gives_the_same_gradients(small_chunks, exact_kept):
    g = _graph(14)
    x, y = _data(14)
    model = _model("exact")
    torch.manual_seed(0)
    loss = F.cross_entropy(model(g, x), y)
    loss.backward(retain_graph=True)
    first = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    loss.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, first[n], msg=n)


def test_double_backward_refused():
    g = _graph(9)
    x, y = _data(9)
    model = _model("exact")
    loss = F.cross_entropy(model(g, x), y)
    with pytest.raises(RuntimeError, match="double backward"):
        grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        sum(gr.pow(2).sum() for gr in grads).backward()


@pytest.mark.parametrize("case", ["residual", "separate_weights", "edge_weight", "eval", "no_grad", "fp32",
                                  "dropout2", "hook", "backward_hook", "backward_pre_hook", "head_hook",
                                  "global_backward_hook", "autocast"])
def test_composed_path_where_fusion_does_not_apply(case, monkeypatch):
    calls = _spy(monkeypatch)
    g = _graph(10)
    x, y = _data(10)
    kw = {"residual": {"residual": True}, "separate_weights": {"shared_weights": False},
          "dropout2": {"dropout2": True}}.get(case, {})
    model = _model("exact", **kw)
    ew = torch.rand(g.num_edges()) if case == "edge_weight" else None
    if case == "eval":
        model.eval()
    if case == "hook":
        model.norms[1].register_forward_hook(lambda *a: None)
    if case == "backward_hook":
        model.convs[1].register_full_backward_hook(lambda *a: None)
    if case == "backward_pre_hook":
        model.norms[0].register_full_backward_pre_hook(lambda *a: None)
    if case == "head_hook":
        model.lin_out.register_forward_pre_hook(lambda *a: None)
    handle = torch.nn.modules.module.register_module_full_backward_hook(lambda *a: None) \
        if case == "global_backward_hook" else None
    scope = dgl_exact.config(enabled=False) if case == "fp32" else torch.no_grad() if case == "no_grad" else \
        torch.autocast("cpu", dtype=torch.bfloat16) if case == "autocast" else torch.enable_grad()
    try:
        with scope:
            model(g, x, edge_weight=ew)
    finally:
        if handle is not None:
            handle.remove()
    assert calls == []


@pytest.mark.cuda
@pytest.mark.parametrize("chunked", [False, True])
def test_cuda_equals_dgl_on_cpu(chunked, exact_kept, monkeypatch):
    """Features and parameters on the GPU (graph on the CPU, as PyPI's DGL leaves it): the fused stack runs
    and equals DGL's model on the CPU; ``chunked``: the GPU's chunk policy shrunk so that rows and columns
    are chunked there too."""
    if chunked:
        monkeypatch.setattr(chunking, "CUDA_CHUNK_ELEMENTS", 5 * 7)
        monkeypatch.setattr(gcn2, "COLUMN_CHUNK", 3)
    calls = _spy(monkeypatch)
    g = _graph(40)
    x, y = _data(40)
    ref, ex = _model("dgl", 3), _model("exact", 3).cuda()
    ex.load_state_dict(ref.state_dict())
    want = _step(ref, g, x, y)
    out, loss, grads, bufs = _step(ex, g, x.cuda(), y.cuda())
    assert len(calls) == 3 and out.is_cuda
    got = (out.cpu(), loss.cpu(), {n: t.cpu() for n, t in grads.items()}, {n: t.cpu() for n, t in bufs.items()})
    _assert_close(got, want, dict(rtol=1e-4, atol=1e-5))


@pytest.mark.parametrize("where", ["conv", "norm"])
@pytest.mark.parametrize("kind", ["full_backward", "full_backward_pre"])
def test_backward_hooks_fire_as_with_dgl(where, kind):
    """Full backward (pre-)hooks on a GCN2Conv or a BatchNorm of the GCNII model fire once per backward with
    compression on, as with DGL's modules and with compression off (the fused stack bypassed the modules:
    the hooks fired 0 times)."""
    g = _graph(12)
    x, y = _data(12)
    counts = {}
    for impl, scope in (("dgl", torch.enable_grad()), ("exact", dgl_exact.config(bits=2)),
                        ("exact-off", dgl_exact.config(enabled=False))):
        model = _model("dgl" if impl == "dgl" else "exact")
        mod = model.convs[1] if where == "conv" else model.norms[1]
        fired = counts.setdefault(impl, [])
        register = getattr(mod, f"register_{kind}_hook")
        register(lambda *a: fired.append(1))
        with scope:
            F.cross_entropy(model(g, x), y).backward()
    assert counts == {"dgl": [1], "exact": [1], "exact-off": [1]}


def test_a_gcn2conv_subclass_overriding_forward_is_called():
    """A subclass of GCN2Conv that overrides forward, in the GCNII model: its forward runs (the fused stack
    skipped it: outputs differed by 2.25 between compression off and on)."""

    class Scaled(dgl_exact.GCN2Conv):
        def forward(self, graph, feat, feat_0, edge_weight=None):
            return 2.0 * super().forward(graph, feat, feat_0, edge_weight)

    g = _graph(15)
    x, _ = _data(15)
    model = _model("exact", dropout=0.0, batch_norm=False)
    for conv in model.convs:
        conv.__class__ = Scaled
    with dgl_exact.config(enabled=False):
        torch.manual_seed(0)
        off = model(g, x)
    with dgl_exact.config(bits=8):
        torch.manual_seed(0)
        on = model(g, x)
    torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-5)


def test_one_row_under_batch_norm_raises_as_dgl():
    """The fused stack on a one-row graph in training: batch norm raises as torch's and DGL's modules do (it
    ran and updated running_var)."""
    g = dgl.graph(([0], [0]), num_nodes=1)
    x, _ = _data(1)
    ref = _model("dgl")
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        ref(g, x)
    model = _model("exact")
    before = {n: b.clone() for n, b in model.named_buffers()}
    with dgl_exact.config(bits=2), pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        model(g, x)
    for n, b in model.named_buffers():
        if "running" in n:
            torch.testing.assert_close(b, before[n], msg=n)


def test_explain_names_the_reason():
    g = _graph(10)
    x, _ = _data(10)
    model = _model("exact")
    with dgl_exact.config(bits=2):
        fused = dgl_exact.explain(model, g, x)
        model.convs[2].register_full_backward_hook(lambda *a: None)
        composed = dgl_exact.explain(model, g, x)
    assert fused.path("convs.0").startswith("fused GCNII stack") and fused.reason("convs.0") == ""
    assert composed.path("convs.0") == "modules' own calls" and "hooks" in composed.reason("norms.1")
    assert "why not fused" in str(composed)


@pytest.mark.parametrize("dropout", [0.0, 0.4])
def test_the_model_donates_h0_to_the_stack_same_step_as_without(dropout, monkeypatch):
    """GCNII's model hands ``h0`` to the fused stack donated; the stack releases it after the last layer.
    Output, loss, gradients and batch-norm statistics equal a run whose stack keeps ``h0`` to the end."""
    g = _graph(12)
    x, y = _data(12)
    with dgl_exact.config(bits=2):
        released = []
        real = donation.release
        monkeypatch.setattr(gcn2, "release", lambda t: released.append(True) or real(t))
        got = _step(_model("exact", dropout=dropout), g, x, y)
        assert released == [True]
        monkeypatch.setattr(gcn2, "release", lambda t: False)
        want = _step(_model("exact", dropout=dropout), g, x, y)
    _assert_close(got, want, dict(rtol=0, atol=0))


def test_the_model_takes_h0_back_where_the_stack_declines_it():
    """Eval mode (and anything else the stack refuses): ``h0`` is reclaimed and the modules run on it."""
    g = _graph(12)
    x, _ = _data(12)
    with dgl_exact.config(bits=2):
        model = _model("exact", dropout=0.3)
        explained = dgl_exact.explain(model, g, x)
        assert "donated h0 released" in explained.path("convs.0")
        model.eval()
        with torch.no_grad():
            a, b = model(g, x), model(g, x)
    assert torch.equal(a, b)
    assert dgl_exact.explain(model, g, x).path("convs.0") == "modules' own calls"


def test_mix_backward_forms_the_h0_gradient_after_its_incoming_gradient_is_gone():
    """``gcn2_mix`` is two autograd nodes: the mix's backward holds its incoming gradient and ``gs``, the
    residual's holds ``gs`` and ``alpha gs``; never the three at once (one layer-sized buffer fewer than one
    node forming both gradients beside the incoming one). The gradients are the composed ops'."""
    from tests._op_census import Census

    n, d, alpha, beta = 512, 32, 0.1, 0.4
    block = n * d * 4
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(n, d, generator=gen, requires_grad=True)
    h0 = torch.randn(n, d, generator=gen, requires_grad=True)
    w = torch.randn(d, d, generator=gen, requires_grad=True)
    r = torch.randn(n, d, generator=gen)
    cfg = dgl_exact.CompressionConfig(bits=2)
    with Census(min_bytes=block) as census:
        out = gcn2.gcn2_mix(h.clone(), h0, w, None, alpha, beta, cfg)  # a clone: the propagation's own buffer
        y = out * 1.5  # the incoming gradient of the mix is then a buffer the backward makes
        del out
        census.phase = "backward"
        gh, gh0, gw = torch.autograd.grad(y, (h, h0, w), r)
    # y (alive here), then two buffers: the incoming gradient and gs (the gradient of h, as clone passes it
    # on), then gs and alpha gs
    assert census.best["backward"] <= 3 * block, census.snapshot["backward"]
    gs = (1.5 * r).matmul(w.t()) * beta + (1 - beta) * 1.5 * r
    torch.testing.assert_close(gh, gs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gh0, alpha * gs, rtol=1e-6, atol=1e-6)
    assert gw.shape == w.shape
