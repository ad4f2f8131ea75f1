"""dgl_exact's autograd ops: forward equal to DGL's / torch's, exact gradients with compression disabled
(float64, against DGL's autograd and ``torch.autograd.gradcheck``), and what each op keeps for backward
(seen through ``saved_tensors_hooks``): nothing for ``copy_u_sum/mean`` and ``u_add_v``, narrow integer
indices for max/min, compressed features for ``u_mul_e_sum`` only when the edge values need a gradient,
bits for activations, nothing at all in ``torch.no_grad()`` or for modules in ``eval()``.

Graph ops run on both kernel paths: DGL's CPU kernels and dgl_exact's torch kernels
(``device_kernels_only()``, the code path GPU features take).
"""
from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact import CompressedTensor, CompressionConfig, ops
from dgl_exact.ops import graph as graph_ops
from dgl_exact.data.compact import TRAINING_FORMATS, compact_graph

import dgl  # noqa: E402  (after dgl_exact)

pytestmark = pytest.mark.usefixtures("one_thread")

OFF = CompressionConfig(enabled=False)
INT8 = CompressionConfig(bits=8)
INT2 = CompressionConfig(bits=2)




@pytest.fixture(scope="module")
def graphs():
    torch.manual_seed(3)
    g = dgl.add_self_loop(dgl.rand_graph(24, 70))
    # zero in-degree nodes (0 and 7..9), a repeated edge, and edge ids not in CSC order
    zero = dgl.graph((torch.tensor([3, 1, 2, 3, 4, 5, 6, 1, 6]), torch.tensor([4, 2, 3, 4, 5, 6, 1, 2, 2])),
                     num_nodes=10)
    _, _, blocks = dgl.dataloading.MultiLayerFullNeighborSampler(1).sample_blocks(g, torch.tensor([1, 5, 9, 13]))
    # the same graphs as the trainer prepares them: int32 ids, CSC and CSR only (no COO)
    return {"graph": g, "zero_in": zero, "block": blocks[0],
            "graph-int32": compact_graph(g, TRAINING_FORMATS), "zero_in-int32": compact_graph(zero, TRAINING_FORMATS),
            "block-int32": blocks[0].int()}


KINDS = ["graph", "zero_in", "block", "graph-int32", "zero_in-int32", "block-int32"]


def _dgl_graph(graphs, kind):
    """The graph DGL's reference ops run on: the int64 original of an ``-int32`` kind (the same edge ids;
    DGL's own SDDMM backward cannot read a graph restricted to CSC and CSR)."""
    return graphs[kind.removesuffix("-int32")]


@contextlib.contextmanager
def saved_tensors():
    """The tensors autograd saves for backward inside the scope."""
    items = []

    def pack(t):
        items.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield items


@contextlib.contextmanager
def compress_calls(monkeypatch):
    """Every compression the ops perform inside the scope (the CompressedTensors they keep)."""
    from dgl_exact.ops import keep as keeping

    made = []
    real = keeping.compress

    def recording(x, cfg):
        c = real(x, cfg)
        made.append(c)
        return c

    monkeypatch.setattr(keeping, "compress", recording)
    yield made
    monkeypatch.setattr(keeping, "compress", real)


def close(a, b, what="", rtol=1e-10, atol=1e-10):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def hidden(x):
    """``x`` as the output of an earlier op (has a grad_fn): not alive anyway, so an op compresses it."""
    return x * 1.0


# ---------------------------------------------------------------------------------------------------
# graph ops vs DGL (float64)
# ---------------------------------------------------------------------------------------------------
def _feat(n, shape, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn((n,) + shape, generator=gen, dtype=dtype).requires_grad_()


GRAPH_OPS = {
    "copy_u_sum": (lambda g, x, w: ops.copy_u_sum(g, x), lambda g, x, w: dgl.ops.copy_u_sum(g, x), False),
    "copy_u_mean": (lambda g, x, w: ops.copy_u_mean(g, x), lambda g, x, w: dgl.ops.copy_u_mean(g, x), False),
    "copy_u_max": (lambda g, x, w: ops.copy_u_max(g, x), lambda g, x, w: dgl.ops.copy_u_max(g, x), False),
    "copy_u_min": (lambda g, x, w: ops.copy_u_min(g, x), lambda g, x, w: dgl.ops.copy_u_min(g, x), False),
    "u_mul_e_sum": (lambda g, x, w: ops.u_mul_e_sum(g, x, w, config=OFF), lambda g, x, w: dgl.ops.u_mul_e_sum(g, x, w),
                    True),
}
# DGL right-aligns feature shapes: [E, 4] against [N, 3, 4] multiplies the last dim (the general path)
SHAPES = {"2d": ((5,), (1,)), "3d-heads": ((3, 4), (3, 1)), "3d-w-last": ((3, 4), (4,)), "w-1d": ((5,), ())}


def _edge_values(g, wshape, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand((g.num_edges(),) + wshape, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()


# edge-value shapes only matter for u_mul_e_sum
OP_SHAPES = [(op, shape) for op in GRAPH_OPS for shape in SHAPES if GRAPH_OPS[op][2] or shape in ("2d", "3d-heads")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op,shape", OP_SHAPES, ids=[f"{o}-{s}" for o, s in OP_SHAPES])
def test_graph_op_matches_dgl(op, kind, shape, graphs, kernel_path):
    ours, theirs, weighted = GRAPH_OPS[op]
    g = graphs[kind]
    xshape, wshape = SHAPES[shape]
    x = _feat(g.num_src_nodes(), xshape)
    w = _edge_values(g, wshape) if weighted else None
    out = ours(g, x, w)
    ref = theirs(_dgl_graph(graphs, kind), x, w)  # max/min: -inf/+inf for destinations without in-edges, as DGL's
    close(out, ref, f"{op} forward")
    assert out.shape == ref.shape and out.dtype == torch.float64
    gen = torch.Generator().manual_seed(9)
    r = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    # an infinite max/min (no in-edges) has no meaningful gradient: DGL routes it to source 0, dgl_exact drops it
    r = r * torch.isfinite(ref)
    leaves = [x] + ([w] if weighted else [])
    g_ours = torch.autograd.grad((out * r).sum(), leaves)
    g_ref = torch.autograd.grad((ref * r).sum(), leaves)
    for a, b, name in zip(g_ours, g_ref, ["x", "w"]):
        close(a, b, f"{op} grad {name}")


def test_u_add_v_and_edge_softmax_match_dgl(graphs, kernel_path):
    for kind in KINDS:
        g = graphs[kind]
        a = _feat(g.num_src_nodes(), (3,), 1)
        b = _feat(g.num_dst_nodes(), (3,), 2)
        out, ref = ops.u_add_v(g, a, b), dgl.ops.u_add_v(_dgl_graph(graphs, kind), a, b)
        close(out, ref, f"u_add_v {kind}")
        r = torch.randn(out.shape, dtype=torch.float64)
        for x, y in zip(torch.autograd.grad((out * r).sum(), [a, b]), torch.autograd.grad((ref * r).sum(), [a, b])):
            close(x, y, f"u_add_v grad {kind}")
        for eshape in ((), (3,), (3, 1)):
            e = _edge_values(g, eshape, 3)
            out = ops.edge_softmax(g, e, config=OFF)
            ref = dgl.ops.edge_softmax(_dgl_graph(graphs, kind), e)
            close(out, ref, f"edge_softmax {kind} {eshape}")
            r = torch.randn(out.shape, dtype=torch.float64)
            close(torch.autograd.grad((out * r).sum(), e)[0], torch.autograd.grad((ref * r).sum(), e)[0],
                  f"edge_softmax grad {kind} {eshape}")


@pytest.mark.parametrize("op", ["copy_u_sum", "copy_u_mean", "copy_u_max", "copy_u_min", "u_mul_e_sum", "u_add_v",
                                "edge_softmax"])
def test_graph_op_gradcheck(op, graphs, kernel_path):
    g = graphs["zero_in"]
    x = _feat(g.num_nodes(), (2, 2), 4)
    if op == "u_mul_e_sum":
        w = _edge_values(g, (2,), 5)
        fn, inputs = (lambda x, w: ops.u_mul_e_sum(g, x, w, config=OFF)), (x, w)
    elif op == "u_add_v":
        fn, inputs = (lambda a, b: ops.u_add_v(g, a, b)), (x, _feat(g.num_nodes(), (2, 2), 6))
    elif op == "edge_softmax":
        fn, inputs = (lambda e: ops.edge_softmax(g, e, config=OFF)), (_edge_values(g, (2,), 7),)
    else:  # max/min: the fused op (0 without in-edges; DGL's infinities defeat finite differences)
        fn, inputs = (lambda x: getattr(graph_ops, op)(g, x)), (x,)
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7)


def test_zero_in_degree_max_min_give_zero_and_no_gradient(graphs, kernel_path):
    g = graphs["zero_in"]
    x = _feat(g.num_nodes(), (3,), 8)
    empty = g.in_degrees() == 0
    for op in (graph_ops.copy_u_max, graph_ops.copy_u_min, ops.copy_u_mean, ops.copy_u_sum):
        out = op(g, x)
        assert torch.isfinite(out).all() and bool((out[empty] == 0).all())
    # dgl.ops' max/min (and so dgl_exact.ops'): -inf/+inf there
    assert bool((ops.copy_u_max(g, x)[empty] == float("-inf")).all())
    assert bool((ops.copy_u_min(g, x)[empty] == float("inf")).all())
    out = graph_ops.copy_u_max(g, x)
    (gx,) = torch.autograd.grad(out.sum(), x)
    # every destination with in-edges routes each column's gradient to exactly one source
    assert float(gx.sum()) == pytest.approx(float((~empty).sum() * 3))


def test_graph_op_input_errors(graphs):
    g = graphs["graph"]
    x = torch.randn(g.num_nodes() + 1, 3)
    for op in (ops.copy_u_sum, ops.copy_u_mean, ops.copy_u_max, ops.copy_u_min):
        with pytest.raises(ValueError, match=f"{g.num_nodes()} src nodes"):
            op(g, x)
    with pytest.raises(ValueError, match="edges"):
        ops.u_mul_e_sum(g, torch.randn(g.num_nodes(), 3), torch.randn(g.num_edges() - 1))
    with pytest.raises(ValueError, match="dst nodes"):
        ops.u_add_v(g, torch.randn(g.num_nodes(), 3), torch.randn(3, 3))
    with pytest.raises(ValueError, match="edges"):
        ops.edge_softmax(g, torch.randn(g.num_edges() + 2))
    with pytest.raises(TypeError, match="DGLGraph"):
        ops.copy_u_sum("not a graph", x)


# ---------------------------------------------------------------------------------------------------
# what graph ops keep for backward
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["copy_u_sum", "copy_u_mean"])
def test_copy_u_sum_mean_save_nothing(op, graphs, kernel_path, monkeypatch):
    g = graphs["graph"]
    x = hidden(torch.randn(g.num_nodes(), 8, requires_grad=True))
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        out = getattr(ops, op)(g, x)
    assert kept == [] and made == []
    assert out.grad_fn is not None
    out.sum().backward()  # and the backward works without anything kept


@pytest.mark.parametrize("n,dtype", [(100, torch.int8), (127, torch.int8), (300, torch.int16)])
def test_max_min_keep_narrow_indices(n, dtype, kernel_path):
    torch.manual_seed(0)
    g = dgl.add_self_loop(dgl.rand_graph(n, 3 * n))
    base = torch.randn(n, 2, 3, requires_grad=True)
    for op in (ops.copy_u_max, ops.copy_u_min):
        x = hidden(base)
        with saved_tensors() as kept:
            out = op(g, x)
        assert len(kept) == 1
        assert kept[0].dtype == dtype and kept[0].shape == (n, 2, 3)
        assert kept[0].nbytes == n * 6 * torch.iinfo(dtype).bits // 8
        out.sum().backward()


def test_u_mul_e_sum_keeps_features_only_for_edge_gradient(graphs, kernel_path, monkeypatch):
    g = graphs["graph"]
    n, e = g.num_nodes(), g.num_edges()
    base = torch.randn(n, 16, requires_grad=True)
    w_const = torch.rand(e) + 0.5
    # edge values need no gradient: only the edge values (alive anyway: by reference), no features
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        out = ops.u_mul_e_sum(g, hidden(base), w_const, config=INT8)
    assert made == []
    assert [t.data_ptr() for t in kept] == [w_const.data_ptr()]
    out.sum().backward()
    # edge values need a gradient: the features are kept compressed
    w = (torch.rand(e) + 0.5).requires_grad_()
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        out = ops.u_mul_e_sum(g, hidden(base), w, config=INT8)
    assert len(made) == 1 and made[0].shape == (n, 16) and made[0].bits == 8
    kept_ptrs = {t.data_ptr() for t in kept}
    assert {t.data_ptr() for t in made[0].tensors()} <= kept_ptrs
    assert sum(t.nbytes for t in kept if t.data_ptr() != w.data_ptr()) == made[0].nbytes
    out.sum().backward()
    # features needing no gradient, produced by a dgl_exact op (a temporary nobody else keeps): compressed
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        ops.u_mul_e_sum(g, ops.copy_u_mean(g, base.detach()), w, config=INT8)
    assert len(made) == 1
    # a leaf needing no gradient (input data) is alive anyway: kept by reference, not compressed
    x_data = torch.randn(n, 16)
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        ops.u_mul_e_sum(g, x_data, w, config=INT8)
    assert made == [] and {t.data_ptr() for t in kept} == {x_data.data_ptr()}


def test_u_add_v_keeps_nothing_and_edge_softmax_keeps_compressed_output(graphs, kernel_path, monkeypatch):
    g = graphs["graph"]
    a = hidden(torch.randn(g.num_nodes(), 2, requires_grad=True))
    with saved_tensors() as kept:
        ops.u_add_v(g, a, a)
    assert kept == []
    e = hidden(torch.randn(g.num_edges(), 2, requires_grad=True))
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        s = ops.edge_softmax(g, e, config=INT8)
    assert len(made) == 1 and made[0].shape == (g.num_edges(), 2)
    assert sum(t.nbytes for t in kept) == made[0].nbytes < s.nbytes
    # compression disabled: the output itself
    with saved_tensors() as kept:
        s = ops.edge_softmax(g, e, config=OFF)
    assert len(kept) == 1 and kept[0].data_ptr() == s.data_ptr()


def test_edge_softmax_int8_gradient_close(graphs, kernel_path):
    g = graphs["graph"]
    e = torch.randn(g.num_edges(), 2, requires_grad=True)
    r = torch.randn(g.num_edges(), 2)
    exact = torch.autograd.grad((ops.edge_softmax(g, hidden(e), config=OFF) * r).sum(), e)[0]
    approx = torch.autograd.grad((ops.edge_softmax(g, hidden(e), config=INT8) * r).sum(), e)[0]
    assert (approx - exact).norm() <= 0.03 * exact.norm()


# ---------------------------------------------------------------------------------------------------
# fused GAT attention
# ---------------------------------------------------------------------------------------------------
def _gat_reference(g, fs, fd, al, ar, slope, ew):
    el = (fs * al).sum(-1, keepdim=True)
    er = (fd * ar).sum(-1, keepdim=True)
    a = dgl.ops.edge_softmax(g, F.leaky_relu(dgl.ops.u_add_v(g, el, er), slope))
    if ew is not None:
        a = a * ew.view(-1, 1, 1)
    return dgl.ops.u_mul_e_sum(g, fs, a), a


@pytest.mark.parametrize("kind", ["graph", "zero_in", "block", "graph-int32", "zero_in-int32"])
@pytest.mark.parametrize("with_ew", [False, True], ids=["plain", "edge_weight"])
def test_gat_attention_matches_dgl_ops(kind, with_ew, graphs, kernel_path):
    g = graphs[kind]
    heads, d = 2, 3
    fs = _feat(g.num_src_nodes(), (heads, d), 1)
    fd_shared = kind == "block"
    fd = fs[: g.num_dst_nodes()] if fd_shared else _feat(g.num_dst_nodes(), (heads, d), 2)
    al, ar = _feat(1, (heads, d), 3), _feat(1, (heads, d), 4)
    ew = _edge_values(g, (), 5) if with_ew else None
    out, a = ops.gat_attention(g, fs, fd, al, ar, 0.2, 0.0, ew, True, OFF)
    ref_out, ref_a = _gat_reference(_dgl_graph(graphs, kind), fs, fd, al, ar, 0.2, ew)
    close(out, ref_out, "gat out")
    close(a, ref_a, "gat attention")
    r1, r2 = torch.randn(out.shape, dtype=torch.float64), torch.randn(a.shape, dtype=torch.float64)
    leaves = [fs, al, ar] + ([] if fd_shared else [fd]) + ([ew] if with_ew else [])
    ours = torch.autograd.grad((out * r1).sum() + (a * r2).sum(), leaves)
    theirs = torch.autograd.grad((ref_out * r1).sum() + (ref_a * r2).sum(), leaves)
    for x, y in zip(ours, theirs):
        close(x, y, "gat grad")


def test_gat_attention_gradcheck_with_dropout(graphs):
    """attn_drop in training: the mask is regenerated from its seed in backward (same seed: same function)."""
    g = graphs["zero_in"]
    fs, al, ar = _feat(g.num_nodes(), (2, 2), 1), _feat(1, (2, 2), 2), _feat(1, (2, 2), 3)
    ew = _edge_values(g, (), 4)

    def fn(fs, al, ar, ew):
        torch.manual_seed(11)
        out, a = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.4, ew, True, OFF)
        return out, a

    assert torch.autograd.gradcheck(fn, (fs, al, ar, ew), eps=1e-6, atol=1e-7)
    torch.manual_seed(11)
    _, a1 = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.4, None, True, OFF)
    torch.manual_seed(12)
    _, a2 = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.4, None, True, OFF)
    assert not torch.equal(a1, a2) and bool(((a1 == 0).sum() > 0))
    _, a_eval = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.4, None, False, OFF)
    close(a_eval, _gat_reference(g, fs, fs, al, ar, 0.2, None)[1], "no dropout outside training")


def test_gat_attention_keeps_no_per_edge_tensor(graphs, kernel_path, monkeypatch):
    g = graphs["graph"]
    n, e = g.num_nodes(), g.num_edges()
    fs = hidden(torch.randn(n, 2, 4, requires_grad=True))
    al, ar = torch.randn(1, 2, 4, requires_grad=True), torch.randn(1, 2, 4, requires_grad=True)
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        out, _ = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.3, None, True, INT8)
    # the source features, twice with independent noise (unbiased attention-vector gradients)
    assert [c.shape for c in made] == [(n, 2, 4), (n, 2, 4)]
    assert not any(t.dim() > 0 and t.shape[0] == e for t in kept)
    float_kept = [t for t in kept if t.is_floating_point() and t.dtype != torch.bfloat16]
    assert sorted(tuple(t.shape) for t in float_kept if t.data_ptr() not in (al.data_ptr(), ar.data_ptr())) == \
        [(n, 2), (n, 2)]  # el and er
    out.sum().backward()
    # attention vectors frozen: a single compressed copy is enough
    with compress_calls(monkeypatch) as made:
        ops.gat_attention(g, fs, fs, al.detach(), ar.detach(), 0.2, 0.0, None, True, INT8)
    assert len(made) == 1


@pytest.mark.parametrize("cfg", [INT2, INT2.replace(kept_frac=0.5)], ids=["int2", "int2-kf0.5"])
def test_gat_attention_vector_gradients_unbiased(cfg, graphs):
    """The attention vectors' gradient multiplies the features by a gradient linear in the (decompressed)
    features: from one compressed copy it is biased (E[x_hat x_hat^T] != x x^T, ~100% of the gradient
    with projection). Averaged over K independent compressions it must converge to the exact gradient."""
    from scipy import stats

    g = graphs["graph"]
    torch.manual_seed(0)
    base = torch.randn(g.num_nodes(), 2, 4) * 2
    al, ar = torch.randn(1, 2, 4, requires_grad=True), torch.randn(1, 2, 4, requires_grad=True)
    r = torch.randn(g.num_nodes(), 2, 4)

    def attn_grads(c, seed):
        torch.manual_seed(seed)
        fs = hidden(base.clone().requires_grad_())
        out, _ = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.0, None, True, c)
        return torch.cat([t.flatten() for t in torch.autograd.grad((out * r).sum(), [al, ar])]).double()

    exact = attn_grads(OFF, 0)
    k = 160
    runs = torch.stack([attn_grads(cfg, 100 + i) for i in range(k)])
    t = (runs.mean(0) - exact) / (runs.std(0) / math.sqrt(k))
    bound = stats.t.ppf(1 - 1e-3 / (2 * t.numel()), k - 1)
    assert float(t.abs().max()) <= bound, t
    assert float((t ** 2).mean()) <= 2.0, t


@pytest.mark.parametrize("cfg", [INT2, INT2.replace(block_rows=64, levels="optimal")], ids=["int2", "blocks"])
def test_gat_attention_gradients_from_row_chunks_equal_whole_decoding(cfg):
    """The backward decodes the second compressed copy row chunk by row chunk (no whole copy): the same
    gradients as one chunk, for features of both ends and both attention vectors (same compression draws)."""
    from dgl_exact.ops import keep as keeping

    gen = torch.Generator().manual_seed(0)
    g = dgl.add_self_loop(dgl.graph((torch.randint(0, 1000, (6000,), generator=gen),
                                     torch.randint(0, 1000, (6000,), generator=gen)), num_nodes=1000))
    torch.manual_seed(0)
    base = torch.randn(g.num_nodes(), 3, 8)
    al, ar = torch.randn(1, 3, 8, requires_grad=True), torch.randn(1, 3, 8, requires_grad=True)
    r = torch.randn(g.num_nodes(), 3, 8)

    def grads(scale):
        token = keeping._chunk_scale.set(scale)
        try:
            torch.manual_seed(5)
            fs = hidden(base.clone().requires_grad_())
            out, _ = ops.gat_attention(g, fs, fs, al, ar, 0.2, 0.0, None, True, cfg)
            return torch.autograd.grad((out * r).sum(), [fs, al, ar])
        finally:
            keeping._chunk_scale.reset(token)

    assert keeping.chunk_rows(1000, 24, "cpu", 64) >= 1000  # the default: one chunk at this size
    token = keeping._chunk_scale.set(0.001)
    assert keeping.chunk_rows(1000, 24, "cpu", 64) < 500  # several chunks
    keeping._chunk_scale.reset(token)
    for x, y in zip(grads(1.0), grads(0.001)):  # fp32 sums over 1000 rows in another order
        assert float((x - y).norm()) <= 1e-5 * float(y.norm()), (x - y).abs().max()


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


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_batch_norm_matches_torch(affine, training):
    torch.manual_seed(0)
    x = torch.randn(20, 6, dtype=torch.float64) * 3 + 1
    w = torch.randn(6, dtype=torch.float64, requires_grad=True) if affine else None
    b = torch.randn(6, dtype=torch.float64, requires_grad=True) if affine else None
    rm, rv = torch.randn(6, dtype=torch.float64), torch.rand(6, dtype=torch.float64) + 0.5
    rm2, rv2 = rm.clone(), rv.clone()
    out = ops.batch_norm(x, rm, rv, w, b, training, 0.3, 1e-5, OFF)
    ref = F.batch_norm(x, rm2, rv2, w, b, training, 0.3, 1e-5)
    close(out, ref, "batch_norm forward")
    close(rm, rm2, "running mean")
    close(rv, rv2, "running var")
    args = (hidden(x.clone().requires_grad_()),) + ((w, b) if affine else ())

    def fn(x, *wb):
        return ops.batch_norm(x, rm.clone(), rv.clone(), *(wb or (None, None)), training, 0.3, 1e-5, OFF)

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


# ---------------------------------------------------------------------------------------------------
# activations and dropout
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["relu", "leaky_relu", "elu"])
def test_activations_match_torch(name):
    x = torch.randn(40, 5, dtype=torch.float64)
    ours = {"relu": lambda x: ops.relu(x), "leaky_relu": lambda x: ops.leaky_relu(x, 0.1),
            "elu": lambda x: ops.elu(x, 0.7, OFF)}[name]
    ref = {"relu": F.relu, "leaky_relu": lambda x: F.leaky_relu(x, 0.1), "elu": lambda x: F.elu(x, 0.7)}[name]
    close(ours(x), ref(x), name)
    assert torch.autograd.gradcheck(lambda x: ours(hidden(x)), (x.clone().requires_grad_(),))


def test_activation_bits(monkeypatch):
    x = hidden(torch.randn(64, 8, requires_grad=True))
    for fn in (ops.relu, lambda x: ops.leaky_relu(x, 0.2), lambda x: ops.relu_dropout(x, 0.5)):
        with saved_tensors() as kept:
            fn(x)
        assert len(kept) == 1 and kept[0].dtype == torch.uint8 and kept[0].numel() == 64 * 8 // 8
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        ops.elu(x, 1.0, INT8)
    assert len(made) == 1 and made[0].proj_seed is None
    assert sum(t.nbytes for t in kept) == 64 + made[0].nbytes
    with saved_tensors() as kept:
        ops.dropout(x, 0.5)
    assert kept == []
    # the INT8 ELU gradient: exact where x > 0, close elsewhere
    r = torch.randn(64, 8)
    base = x.detach().requires_grad_()
    exact = torch.autograd.grad((F.elu(hidden(base)) * r).sum(), base)[0]
    approx = torch.autograd.grad((ops.elu(hidden(base), 1.0, INT8) * r).sum(), base)[0]
    pos = base.detach() > 0
    close(approx[pos], exact[pos], "elu positive part", rtol=0, atol=0)
    assert (approx - exact).norm() <= 0.02 * exact.norm()


def test_dropout_mask_regenerated_in_backward():
    torch.manual_seed(0)
    x = torch.randn(200, 10, requires_grad=True)
    p = 0.3
    torch.manual_seed(5)
    y = ops.dropout(hidden(x), p)
    kept = y != 0
    close(y[kept], x.detach()[kept] / (1 - p), "kept values scaled", rtol=1e-6, atol=1e-6)
    (gx,) = torch.autograd.grad(y.sum(), x)
    # the gradient's mask is the forward's: g / (1 - p) where kept, 0 elsewhere
    close(gx, kept.float() / (1 - p), "dropout gradient", rtol=1e-6, atol=0)
    frac = 1 - kept.float().mean().item()
    assert abs(frac - p) < 4 * math.sqrt(p * (1 - p) / kept.numel())
    # same seed, same mask; another seed, another mask
    torch.manual_seed(5)
    torch.testing.assert_close(ops.dropout(hidden(x), p), y, rtol=0, atol=0)
    torch.manual_seed(6)
    assert not torch.equal(ops.dropout(hidden(x), p) != 0, kept)
    # p = 0 and eval: identity (the very tensor); p = 1: zeros with zero gradient
    assert ops.dropout(x, 0.0) is x and ops.dropout(x, 0.5, training=False) is x
    y1 = ops.dropout(hidden(x), 1.0)
    assert bool((y1 == 0).all())
    assert bool((torch.autograd.grad(y1.sum(), x)[0] == 0).all())
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            ops.dropout(x, bad)
        with pytest.raises(ValueError):
            ops.relu_dropout(x, bad)
    # without autograd: same mask as with it
    torch.manual_seed(5)
    with torch.no_grad():
        torch.testing.assert_close(ops.dropout(x, p), y.detach(), rtol=0, atol=0)


def test_relu_dropout_is_dropout_of_relu():
    torch.manual_seed(0)
    x = torch.randn(100, 7, requires_grad=True)
    for p in (0.0, 0.4):
        torch.manual_seed(9)
        y = ops.relu_dropout(hidden(x), p)
        torch.manual_seed(9)
        ref = ops.dropout(F.relu(hidden(x)), p) if p > 0 else F.relu(x)
        torch.testing.assert_close(y, ref, rtol=0, atol=0)
        (gx,) = torch.autograd.grad(y.sum(), x)
        mask = (x.detach() > 0) & (y.detach() != 0) if p > 0 else x.detach() > 0
        close(gx, mask.float() / (1 - p), f"relu_dropout gradient p={p}", rtol=1e-6, atol=0)
    y1 = ops.relu_dropout(hidden(x), 1.0)
    assert bool((y1 == 0).all())
    y_eval = ops.relu_dropout(x, 0.5, training=False)
    torch.testing.assert_close(y_eval, F.relu(x), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["plain", "index", "weight", "index+weight"])
def test_cross_entropy(variant):
    torch.manual_seed(0)
    logits = torch.randn(30, 4, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([0, 3, 5, 8, 9, 20, 29]) if "index" in variant else None
    n = 30 if index is None else len(index)
    target = torch.randint(0, 4, (n,))
    weight = torch.rand(n, dtype=torch.float64) if "weight" in variant else None
    z = logits if index is None else logits[index]
    per_row = F.cross_entropy(z, target, reduction="none")
    ref = (per_row * weight).sum() if weight is not None else per_row.mean()
    out = ops.cross_entropy(logits, target, index, weight)
    close(out, ref, "cross_entropy")
    close(torch.autograd.grad(out, logits)[0], torch.autograd.grad(ref, logits)[0], "cross_entropy grad")
    assert torch.autograd.gradcheck(lambda z: ops.cross_entropy(z, target, index, weight), (logits,))
    with torch.no_grad():
        close(ops.cross_entropy(logits, target, index, weight), ref.detach(), "no_grad")
    # keeps no activation: only the logits (alive anyway) and the integer/weight inputs
    with saved_tensors() as kept:
        ops.cross_entropy(logits, target, index, weight)
    assert {t.data_ptr() for t in kept} <= {t.data_ptr() for t in (logits, target, index, weight) if t is not None}
    with pytest.raises(TypeError, match="integer"):
        ops.cross_entropy(logits, target.double(), index, weight)


@pytest.mark.parametrize("variant", ["plain", "index", "weight", "index+weight"])
def test_binary_cross_entropy_with_logits(variant):
    torch.manual_seed(1)
    logits = torch.randn(30, 5, dtype=torch.float64, requires_grad=True)
    index = torch.tensor([1, 2, 7, 11, 29]) if "index" in variant else None
    n = 30 if index is None else len(index)
    target = (torch.rand(n, 5) > 0.5).to(torch.float64)
    weight = torch.rand(n, dtype=torch.float64) if "weight" in variant else None
    z = logits if index is None else logits[index]
    per_row = F.binary_cross_entropy_with_logits(z, target, reduction="none").mean(-1)
    ref = (per_row * weight).sum() if weight is not None else per_row.mean()
    out = ops.binary_cross_entropy_with_logits(logits, target, index, weight)
    close(out, ref, "bce")
    close(torch.autograd.grad(out, logits)[0], torch.autograd.grad(ref, logits)[0], "bce grad")
    assert torch.autograd.gradcheck(lambda z: ops.binary_cross_entropy_with_logits(z, target, index, weight),
                                    (logits,))
    with saved_tensors() as kept:
        ops.binary_cross_entropy_with_logits(logits, target, index, weight)
    assert {t.data_ptr() for t in kept} <= {t.data_ptr() for t in (logits, target, index, weight) if t is not None}


# ---------------------------------------------------------------------------------------------------
# no_grad / eval: nothing kept, nothing compressed
# ---------------------------------------------------------------------------------------------------
def _all_ops(g, x, e_vals, cfg):
    n = g.num_nodes()
    w = torch.randn(4, x.shape[1])
    fs = x[:, :4].reshape(n, 2, 2)
    return [
        ops.copy_u_sum(g, x), ops.copy_u_mean(g, x), ops.copy_u_max(g, x), ops.copy_u_min(g, x),
        ops.u_mul_e_sum(g, x, e_vals, config=cfg), ops.u_add_v(g, x, x), ops.edge_softmax(g, e_vals, config=cfg),
        ops.gat_attention(g, fs, fs, torch.randn(1, 2, 2), torch.randn(1, 2, 2), 0.2, 0.5, e_vals, True, cfg)[0],
        ops.linear(x, w, None, cfg), ops.batch_norm(x, torch.zeros(x.shape[1]), torch.ones(x.shape[1]),
                                                     training=True, config=cfg),
        ops.relu(x), ops.leaky_relu(x), ops.elu(x, 1.0, cfg), ops.dropout(x, 0.3), ops.relu_dropout(x, 0.3),
        ops.cross_entropy(x, torch.zeros(n, dtype=torch.long)),
        ops.binary_cross_entropy_with_logits(x, torch.zeros_like(x)),
    ]


def test_no_grad_keeps_and_compresses_nothing(graphs, kernel_path, monkeypatch):
    g = graphs["graph"]
    x = hidden(torch.randn(g.num_nodes(), 6, requires_grad=True))
    e_vals = hidden(torch.rand(g.num_edges(), requires_grad=True))
    with compress_calls(monkeypatch) as made, saved_tensors() as kept, torch.no_grad():
        outs = _all_ops(g, x, e_vals, INT2)
    assert kept == [] and made == []
    assert all(o.grad_fn is None for o in outs)


def test_eval_modules_compress_nothing(graphs, kernel_path, monkeypatch):
    g = graphs["graph"]
    mods = [dgl_exact.GraphConv(6, 9, activation=F.elu), dgl_exact.SAGEConv(6, 9, "pool"),
            dgl_exact.GATConv(6, 3, 2), dgl_exact.GCN2Conv(6, 1), dgl_exact.nn.Linear(6, 4),
            dgl_exact.nn.BatchNorm1d(6), dgl_exact.nn.ELU()]

    def run():
        h = hidden(torch.randn(g.num_nodes(), 6, requires_grad=True))
        return [mods[0](g, h), mods[1](g, h), mods[2](g, h), mods[3](g, h, h)] + [m(h) for m in mods[4:]]

    with dgl_exact.config(bits=2, kept_frac=0.5):
        for m in mods:
            m.eval()
        with compress_calls(monkeypatch) as made:
            outs = run()
        assert made == []
        assert all(o.grad_fn is not None for o in outs)  # still differentiable, just not compressed
        with compress_calls(monkeypatch) as made, saved_tensors() as kept, torch.no_grad():
            run()
        assert made == [] and kept == []
        for m in mods:
            m.train()
        with compress_calls(monkeypatch) as made:
            run()
        assert made and all(c.bits == 2 for c in made)


# ---------------------------------------------------------------------------------------------------
# edge weight normalisation, AMP
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("norm", ["both", "right", "none"])
def test_normalize_edge_weight_matches_dgl(norm, graphs, kernel_path):
    for kind in ("graph", "zero_in", "block"):
        g = graphs[kind]
        w = _edge_values(g, (), 2)
        ours = ops.normalize_edge_weight(g, w, norm)
        ref = dgl.nn.EdgeWeightNorm(norm)(g, w)
        close(ours, ref, f"edge weight norm {norm} {kind}")
        r = torch.randn(ours.shape, dtype=torch.float64)
        close(torch.autograd.grad((ours * r).sum(), w)[0], torch.autograd.grad((ref * r).sum(), w)[0],
              f"edge weight norm grad {norm} {kind}")
    g = graphs["graph"]
    with pytest.raises(ValueError, match="Non-positive"):
        ops.normalize_edge_weight(g, torch.zeros(g.num_edges()), "both")
    with pytest.raises(ValueError, match="norm must be"):
        ops.normalize_edge_weight(g, torch.ones(g.num_edges()), "left")


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
