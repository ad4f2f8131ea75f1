"""The dense ops (dgl_exact.ops.dense): ``linear`` and ``batch_norm`` against torch (forward, gradcheck, what
they keep, the original input kept under autocast), and their backward from the compressed input in row chunks
(no full-size decompressed copy alive at the backward's peak).

``ops.linear_reusing``: the product written into its input's own buffer in row chunks (one layer-sized
buffer fewer at the forward's peak of GraphConv), the aggregation outputs that make it possible (not views),
and GraphConv's source normalisation as an edge value (no normalised copy of the input)."""
import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact import CompressedTensor, ops
from dgl_exact.compression import decompress
from dgl_exact.ops import chunks as chunking
from tests.ops._helpers import CONFIGS, INT2, INT8, OFF, close, compress_calls, hidden, saved_tensors

dgl = pytest.importorskip("dgl")

pytestmark = pytest.mark.usefixtures("one_thread")


def _cfg(**kw):
    return dgl_exact.CompressionConfig(**{"bits": 2, **kw})


@pytest.fixture
def chunk_elements(monkeypatch):
    """Row chunks of 5 rows of 16 columns (CPU policy), so small tensors cross chunk boundaries."""
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 5 * 16)


@pytest.mark.parametrize("rows", [6, 7, 10, 33])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_linear_inplace_values_buffer_and_gradients(rows, bias, dtype, chunk_elements, kept_compressed):
    kept = kept_compressed
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 16, generator=gen, dtype=dtype).requires_grad_()
    w = torch.randn(16, 16, generator=gen, dtype=dtype).requires_grad_()
    b = torch.randn(16, generator=gen, dtype=dtype).requires_grad_() if bias else None
    h = x * 2.0  # a fresh temporary the caller owns
    ptr, want = h.data_ptr(), torch.nn.functional.linear(h.detach(), w.detach(), None if b is None else b.detach())
    out = dgl_exact.ops.linear_reusing(h, w, b, _cfg())
    assert out.data_ptr() == ptr  # written into the input's buffer
    # row by row the same product (a chunk's matmul may sum in another order than the whole one's)
    torch.testing.assert_close(out.detach(), want, rtol=1e-6, atol=1e-6)
    g = torch.randn(out.shape, generator=gen, dtype=dtype)
    out.backward(g)
    (c,) = kept  # the input, compressed before it was overwritten
    torch.testing.assert_close(w.grad, g.t() @ decompress(c).to(dtype), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, 2.0 * g @ w.detach(), rtol=0, atol=0)
    if bias:
        torch.testing.assert_close(b.grad, g.sum(0))


def test_linear_inplace_weight_grad_is_unbiased(chunk_elements):
    """Over seeds the weight gradient averages to the exact one (INT2 stochastic rounding), within 5 standard
    errors of the mean estimated from the same draws."""
    gen = torch.Generator().manual_seed(0)
    x0, w0, g = torch.randn(12, 16, generator=gen), torch.randn(16, 16, generator=gen), torch.randn(12, 16,
                                                                                                     generator=gen)
    exact = g.t() @ x0
    draws = []
    for seed in range(200):
        torch.manual_seed(seed)
        w = w0.clone().requires_grad_()
        dgl_exact.ops.linear_reusing(x0.clone().requires_grad_() * 1.0, w, None, _cfg()).backward(g)
        draws.append(w.grad)
    d = torch.stack(draws)
    se = d.std(0) / d.shape[0] ** 0.5
    assert ((d.mean(0) - exact).abs() <= 5 * se + 1e-6).all()


@pytest.mark.parametrize("case", ["not-square", "view", "compression-off", "one-chunk", "leaf"])
def test_linear_inplace_falls_back_out_of_place(case, chunk_elements, monkeypatch):
    x = torch.randn(20, 16, requires_grad=True)
    w = torch.randn(8 if case == "not-square" else 16, 16, requires_grad=True)
    cfg = dgl_exact.CompressionConfig(enabled=False) if case == "compression-off" else _cfg()
    if case == "one-chunk":
        monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 10**9)
    h = x if case == "leaf" else (x * 1.0)
    if case == "view":
        h = h[:, :]
    before = h.detach().clone()
    out = dgl_exact.ops.linear_reusing(h, w, None, cfg)
    assert out.data_ptr() != h.data_ptr()
    torch.testing.assert_close(h.detach(), before, rtol=0, atol=0)  # the input is untouched
    torch.testing.assert_close(out, torch.nn.functional.linear(before, w), rtol=1e-6, atol=1e-6)
    out.sum().backward()
    assert w.grad is not None


def test_aggregation_outputs_are_not_views():
    """The aggregation's output is a tensor of its own, so its owner may update it in place."""
    g = dgl.add_self_loop(dgl.rand_graph(30, 90))
    x = torch.randn(30, 4, requires_grad=True)
    for out in (dgl_exact.ops.copy_u_sum(g, x * 1.0), dgl_exact.ops.u_mul_e_sum(g, x * 1.0, torch.rand(g.num_edges()))):
        assert out._base is None
        out.mul_(2.0)  # no "view created inside a custom Function" error
        out.sum().backward()


@pytest.mark.parametrize("norm", ["both", "left", "right", "none"])
@pytest.mark.parametrize("chunks", ["small", "default"])
def test_graphconv_with_inplace_linear_matches_dgl(norm, chunks, monkeypatch):
    """Forward equals DGL's GraphConv; with compression off the gradients equal DGL's too."""
    if chunks == "small":
        monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 7 * 16)
    g = dgl.add_self_loop(dgl.rand_graph(50, 200))
    ref = dgl.nn.GraphConv(16, 16, norm=norm)
    conv = dgl_exact.GraphConv(16, 16, norm=norm)
    conv.load_state_dict(ref.state_dict())
    x = torch.randn(50, 16)
    with dgl_exact.config(bits=2):
        torch.testing.assert_close(conv(g, x), ref(g, x), rtol=1e-5, atol=1e-5)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with dgl_exact.config(enabled=False):
        conv(g, xa * 1.0).square().sum().backward()
    ref(g, xb * 1.0).square().sum().backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-5)
    for p, q in zip(conv.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("edge_weight", [False, True])
def test_gcn2conv_mix_in_row_chunks(edge_weight, monkeypatch):
    """GCNII's fused mix in row chunks of 7 rows: forward equals DGL's; the gradients equal the one-chunk
    mix's for the same random rounding (same seed)."""
    g = dgl.add_self_loop(dgl.rand_graph(40, 160))
    ref = dgl.nn.GCN2Conv(16, layer=2, alpha=0.2, lambda_=1.0)
    conv = dgl_exact.GCN2Conv(16, layer=2, alpha=0.2, lambda_=1.0)
    conv.load_state_dict(ref.state_dict())
    x, x0 = torch.randn(40, 16), torch.randn(40, 16)
    ew = torch.rand(g.num_edges()) if edge_weight else None

    def run(chunk):
        monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", chunk)
        xa, x0a = x.clone().requires_grad_(), x0.clone().requires_grad_()
        torch.manual_seed(0)
        with dgl_exact.config(bits=2):
            out = conv(g, xa * 1.0, x0a * 1.0, edge_weight=ew)
        out.square().sum().backward()
        grads = [xa.grad, x0a.grad] + [p.grad.clone() for p in conv.parameters()]
        conv.zero_grad()
        return out.detach(), grads

    small, whole = run(7 * 16), run(10**9)
    torch.testing.assert_close(small[0], ref(g, x, x0, edge_weight=ew), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(small[0], whole[0], rtol=1e-6, atol=1e-6)
    for a, b in zip(small[1], whole[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------------
# dense ops# ---------------------------------------------------------------------------------------------------
# dense ops
# ---------------------------------------------------------------------------------------------------
def test_linear_matches_torch_and_gradcheck():
    x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)
    close(ops.linear(x, w, b, OFF), F.linear(x, w, b), "linear")
    close(ops.linear(x, w, None, OFF), F.linear(x, w), "linear without bias")
    assert torch.autograd.gradcheck(lambda x, w, b: ops.linear(hidden(x), w, b, OFF), (x, w, b))
    assert torch.autograd.gradcheck(lambda x, w: ops.linear(x, w, None, OFF), (x, w))
    x3 = torch.randn(4, 2, 5, dtype=torch.float64, requires_grad=True)  # leading dims are batch dims
    assert torch.autograd.gradcheck(lambda x, w, b: ops.linear(hidden(x), w, b, OFF), (x3, w, b))


def test_linear_int8_gradient_close_and_input_grad_exact():
    torch.manual_seed(0)
    x = torch.randn(50, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    r = torch.randn(50, 8)
    exact = torch.autograd.grad((F.linear(hidden(x), w) * r).sum(), [x, w])
    approx = torch.autograd.grad((ops.linear(hidden(x), w, None, INT2) * r).sum(), [x, w])
    close(approx[0], exact[0], "input gradient needs no activation", rtol=1e-5, atol=1e-6)
    approx8 = torch.autograd.grad((ops.linear(hidden(x), w, None, INT8) * r).sum(), [x, w])
    assert (approx8[1] - exact[1]).norm() <= 0.02 * exact[1].norm()


def test_linear_saves(monkeypatch):
    x_leaf = torch.randn(30, 12, requires_grad=True)
    w = torch.randn(6, 12, requires_grad=True)
    # input alive anyway (a leaf): kept by reference, nothing compressed
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        ops.linear(x_leaf, w, None, INT2)
    assert made == [] and {t.data_ptr() for t in kept} == {x_leaf.data_ptr(), w.data_ptr()}
    # input from an earlier op: kept compressed, exactly its bytes
    h = hidden(x_leaf)
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        ops.linear(h, w, None, INT2.replace(kept_frac=0.5))
    assert len(made) == 1 and made[0].width == 6
    assert sum(t.nbytes for t in kept if t.data_ptr() != w.data_ptr()) == made[0].nbytes
    # frozen weight: the input is not needed at all
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        ops.linear(h, w.detach(), None, INT2)
    assert made == [] and [t.data_ptr() for t in kept] == [w.data_ptr()]


#: which of batch norm's parameters are given (the others None): both (affine), none (``affine=False``), the weight
#: alone (a module whose bias was set to None) or the bias alone
PARAMS = ["both", "none", "weight", "bias"]


def _bn_params(params, n, gen, dtype=torch.float64):
    w = torch.randn(n, generator=gen).to(dtype).requires_grad_() if params in ("both", "weight") else None
    b = torch.randn(n, generator=gen).to(dtype).requires_grad_() if params in ("both", "bias") else None
    return w, b


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_matches_torch(params, training):
    """Forward, running statistics and gradients (gradcheck) as ``F.batch_norm``'s, whichever of the weight and
    bias are None (autograd refuses a gradient for a None input: none is returned for it)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20, 6, dtype=torch.float64, generator=gen) * 3 + 1
    w, b = _bn_params(params, 6, gen)
    rm, rv = torch.randn(6, dtype=torch.float64), torch.rand(6, dtype=torch.float64) + 0.5
    rm2, rv2 = rm.clone(), rv.clone()
    out = ops.batch_norm(x, rm, rv, w, b, training, 0.3, 1e-5, OFF)
    ref = F.batch_norm(x, rm2, rv2, w, b, training, 0.3, 1e-5)
    close(out, ref, "batch_norm forward")
    close(rm, rm2, "running mean")
    close(rv, rv2, "running var")
    given = [t for t in (w, b) if t is not None]

    def fn(x, *p):
        it = iter(p)
        wp, bp = (next(it) if w is not None else None), (next(it) if b is not None else None)
        return ops.batch_norm(x, rm.clone(), rv.clone(), wp, bp, training, 0.3, 1e-5, OFF)

    args = [hidden(x.clone().requires_grad_())] + given
    assert torch.autograd.gradcheck(fn, tuple(a.detach().requires_grad_() for a in args))


def test_batch_norm_module_matches_torch_module(monkeypatch):
    """dgl_exact.nn.BatchNorm1d vs torch.nn.BatchNorm1d: outputs, gradients, running stats and
    num_batches_tracked through train/eval steps, momentum=None (cumulative average), no running stats."""
    from dgl_exact.nn import BatchNorm1d

    for kwargs in ({}, {"momentum": None}, {"track_running_stats": False}, {"affine": False}):
        torch.manual_seed(0)
        ref = torch.nn.BatchNorm1d(5, **kwargs)
        ours = BatchNorm1d(5, **kwargs, compression=OFF)
        ours.load_state_dict(ref.state_dict())
        for step in range(3):
            for m in (ref, ours):
                m.train(step < 2)
            x = torch.randn(16, 5) * (step + 1) + step
            xr, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
            yr, yo = ref(xr), ours(xo)
            close(yo, yr, f"bn {kwargs} step {step}", rtol=1e-5, atol=1e-5)
            r = torch.randn_like(yr)
            (yr * r).sum().backward()
            (yo * r).sum().backward()
            close(xo.grad, xr.grad, f"bn grad {kwargs}", rtol=1e-4, atol=1e-5)
            for (n, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters()):
                close(a.grad, b.grad, f"bn param grad {n}", rtol=1e-4, atol=1e-5)
            for (n, a), (_, b) in zip(ours.named_buffers(), ref.named_buffers()):
                close(a, b, f"bn buffer {n} {kwargs}", rtol=1e-5, atol=1e-6)
    # batch norm keeps its input compressed but never projected
    bn = BatchNorm1d(8, compression=INT2.replace(kept_frac=0.25))
    with compress_calls(monkeypatch) as made:
        bn(hidden(torch.randn(10, 8, requires_grad=True)))
    assert len(made) == 1 and made[0].width == 8 and made[0].proj_seed is None
    with pytest.raises(ValueError, match="more than 1 value"):
        bn(torch.randn(1, 8))


def test_linear_under_autocast_keeps_the_original_input(monkeypatch):
    """Under autocast the product runs in bf16, but backward reads x from the original (fp32) input, kept
    compressed when computed and by reference when alive anyway: never the fresh bf16 copy."""
    torch.manual_seed(0)
    x = torch.randn(40, 16, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    with compress_calls(monkeypatch) as made, torch.autocast("cpu", dtype=torch.bfloat16):
        y = ops.linear(hidden(x), w, b, INT8)
    assert y.dtype == torch.bfloat16
    assert len(made) == 1 and made[0].dtype == torch.float32 and made[0].shape == (40, 16)
    # what the backward node keeps: the compressed original input (bf16 metadata) and the bf16 weight
    layout = y.grad_fn.kept_layout
    shell = layout[0][0]
    assert isinstance(shell, CompressedTensor) and shell.dtype == torch.float32 and shell.bits == 8
    assert {t.dtype for t in y.grad_fn.saved_tensors} >= {torch.uint8, torch.bfloat16}
    gx, gw, gb = torch.autograd.grad(y.float().square().sum(), [x, w, b])
    assert gx.dtype == gw.dtype == gb.dtype == torch.float32
    assert all(torch.isfinite(t).all() for t in (gx, gw, gb))
    ref = torch.autograd.grad(F.linear(x, w, b).square().sum(), [x, w, b])
    for a, r in zip((gx, gw, gb), ref):
        assert (a - r).norm() <= 0.05 * r.norm()
    # a leaf input is alive anyway: kept by reference, nothing compressed (its bf16 copy is not kept)
    with compress_calls(monkeypatch) as made, torch.autocast("cpu", dtype=torch.bfloat16):
        y = ops.linear(x, w, b, INT8)
    assert len(made) == 0
    assert not any(t.dtype == torch.bfloat16 and t.shape == x.shape for t in y.grad_fn.saved_tensors)


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few rows, so the sizes below cross many chunk boundaries."""
    real = chunking.row_chunks
    monkeypatch.setattr("dgl_exact.ops.dense.row_chunks", lambda item: real(item, 5 * 16))


@pytest.mark.parametrize("rows", [1, 2, 5, 6, 33])
@pytest.mark.parametrize("name", ["int2", "int2-blocks64-optimal", "int2-rp-blocks64"])
def test_linear_chunked_weight_grad(rows, name, small_chunks, kept_compressed):
    kept = kept_compressed
    x = (torch.randn(rows, 16) * 1.0).requires_grad_()
    h = x * 2.0  # not a leaf: kept compressed
    w = torch.randn(7, 16, requires_grad=True)
    b = torch.randn(7, requires_grad=True)
    out = dgl_exact.ops.linear(h, w, b, CONFIGS[name])
    g = torch.randn(out.shape)
    out.backward(g)
    (c,) = kept
    torch.testing.assert_close(w.grad, g.t() @ decompress(c), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, 2.0 * g @ w.detach(), rtol=0, atol=0)  # input gradient: no activation
    torch.testing.assert_close(b.grad, g.sum(0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_linear_chunked_half(dtype, small_chunks):
    _skip_without_cpu_fp16_matmul(dtype)
    x = torch.randn(23, 16).to(dtype).requires_grad_()
    w = torch.randn(4, 16).to(dtype).requires_grad_()
    out = dgl_exact.ops.linear(x * 1, w, None, _cfg(bits=8))
    out.float().sum().backward()
    assert w.grad.dtype == dtype
    torch.testing.assert_close(w.grad.float(), (torch.ones(23, 4).t() @ x.float()).to(dtype).float(),
                               rtol=5e-2, atol=5e-1)


@pytest.mark.parametrize("rows", [2, 5, 6, 33])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_batch_norm_chunked_matches_aten_on_the_same_input(rows, training, params, dtype, small_chunks,
                                                           kept_compressed):
    """The chunked backward equals ATen's batch-norm backward run on the decompressed input (no gradient for a
    parameter that is None)."""
    kept = kept_compressed
    gen = torch.Generator().manual_seed(rows)
    x = (torch.randn(rows, 16, generator=gen) * 3 + 1).to(dtype).requires_grad_()
    pdt = torch.float64 if dtype == torch.float64 else torch.float32  # parameters and buffers, as a module's
    w, b = _bn_params(params, 16, gen, pdt)
    rm, rv = torch.randn(16, generator=gen).to(pdt), (torch.rand(16, generator=gen) + 0.5).to(pdt)
    out = dgl_exact.ops.batch_norm(x * 1, rm.clone(), rv.clone(), w, b, training, 0.1, 1e-5, _cfg(block_rows=4))
    g = torch.randn(out.shape, generator=gen).to(dtype)
    grads = torch.autograd.grad(out, [x] + [t for t in (w, b) if t is not None], g)
    (c,) = kept
    # today's backward: ATen's kernel on the whole decompressed input, with the statistics forward kept
    cdt = torch.promote_types(dtype, torch.float32)
    wc = None if w is None else w.detach().to(cdt)
    _, save_mean, save_invstd = torch.native_batch_norm(x.detach().to(cdt), wc, None, rm.clone().to(cdt),
                                                        rv.clone().to(cdt), training, 0.1, 1e-5)
    stats = (None, None, save_mean, save_invstd) if training else (rm.to(cdt), rv.to(cdt), None, None)
    want = torch.ops.aten.native_batch_norm_backward(g.to(cdt), decompress(c).to(cdt), wc, *stats, training, 1e-5,
                                                     [True, w is not None, b is not None])
    want = [t for t in want if t is not None]
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    assert grads[0].dtype == dtype
    for got, exp in zip(grads, want):
        torch.testing.assert_close(got.to(cdt), exp.to(cdt), **tol)


def _skip_without_cpu_fp16_matmul(dtype):
    if dtype == torch.float16 and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 2):
        pytest.skip("torch < 2.2 has no fp16 matmul on the CPU (addmm_impl_cpu_)")
