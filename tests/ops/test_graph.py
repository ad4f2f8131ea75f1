"""The graph ops (dgl_exact.ops.graph): forward equal to DGL's, exact gradients with compression disabled
(float64, against DGL's autograd and ``torch.autograd.gradcheck``), and what each op keeps for backward (seen
through ``saved_tensors_hooks``): nothing for ``copy_u_sum/mean`` and ``u_add_v``, narrow integer indices for
max/min, compressed features for ``u_mul_e_sum`` only when the edge values need a gradient. Graph ops run on
both kernel paths: DGL's CPU kernels and dgl_exact's torch kernels (``device_kernels_only()``, the code path GPU
features take).

``u_mul_e_sum`` keeps its edge values exactly, whatever their rank: the feature gradient (which reads
only the edge values) is the same with compression on as off, bit for bit, for ``w`` of shape ``[E]``,
``[E, H]`` and ``[E, H, 1]`` (the first is reshaped by a view made inside forward: such a view must not be
what is kept, nor be compressed)."""
from __future__ import annotations

import contextlib

import pytest
import torch

import dgl_exact
from dgl_exact import ops
from dgl_exact.ops import graph as graph_ops
from dgl_exact.ops.graph import u_mul_e_sum
from tests.ops._helpers import (INT2, INT8, KINDS, OFF, _dgl_graph, _edge_values, _feat, assert_mean_converges, close,
                                compress_calls, hidden, largest_tensor_made, saved_tensors)

dgl = pytest.importorskip("dgl")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("w_shape", [(), (2,), (2, 1)], ids=["E", "ExH", "ExHx1"])
def test_edge_values_are_kept_exactly_for_every_rank(w_shape, kernel_path):
    torch.manual_seed(0)
    g = dgl.rand_graph(40, 300)
    # [E, H, 1] against [N, H, D] (the fused kernel); [E, H] against [N, D, H] (DGL's right alignment:
    # the general path); [E] against [N, D]
    x0 = {(): torch.randn(40, 8), (2,): torch.randn(40, 8, 2), (2, 1): torch.randn(40, 2, 8)}[w_shape]
    w0 = torch.rand((300,) + w_shape)
    grads = {}
    for name, cfg in (("exact", dgl_exact.CompressionConfig(enabled=False)),
                      ("int2", dgl_exact.CompressionConfig(bits=2, kept_frac=0.5))):
        xl, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        x = xl * 1.0  # a temporary (a leaf is alive anyway and kept by reference, never compressed)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = u_mul_e_sum(g, x, w, config=cfg)
        del x
        out.square().sum().backward()
        grads[name] = (xl.grad, w.grad)
        # the edge values are among the saved tensors as themselves (not a copy, not a code buffer)
        assert any(t is w for t in saved), [tuple(t.shape) for t in saved]
    torch.testing.assert_close(grads["int2"][0], grads["exact"][0], rtol=0, atol=0)
    assert not torch.equal(grads["int2"][1], grads["exact"][1])  # the features were compressed


GRAPH_OPS = {
    "copy_u_sum": (lambda g, x, w: ops.copy_u_sum(g, x), lambda g, x, w: dgl.ops.copy_u_sum(g, x), False),
    "copy_u_mean": (lambda g, x, w: ops.copy_u_mean(g, x), lambda g, x, w: dgl.ops.copy_u_mean(g, x), False),
    "copy_u_max": (lambda g, x, w: ops.copy_u_max(g, x), lambda g, x, w: dgl.ops.copy_u_max(g, x), False),
    "copy_u_min": (lambda g, x, w: ops.copy_u_min(g, x), lambda g, x, w: dgl.ops.copy_u_min(g, x), False),
    "u_mul_e_sum": (lambda g, x, w: ops.u_mul_e_sum(g, x, w, config=OFF), lambda g, x, w: dgl.ops.u_mul_e_sum(g, x, w),
                    True),
}
# DGL right-aligns feature shapes: [E, 4] against [N, 3, 4] multiplies the last dim (the general path)
# ... and [E, 4] (or [E, 1, 4]) against [N, 3, 4] is the heads-last layout: run heads first (ops.graph.mul_layout)
SHAPES = {"2d": ((5,), (1,)), "3d-heads": ((3, 4), (3, 1)), "3d-w-last": ((3, 4), (4,)), "w-1d": ((5,), ()),
          "3d-heads-last": ((3, 4), (1, 4)), "4d-heads-last": ((2, 3, 4), (3, 4)), "4d-mixed": ((2, 3, 4), (2, 1, 4))}


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
    # two independent draws (the backward is quadratic in the output, see test_edge_softmax_int2_gradient_unbiased)
    assert len(made) == 2 and all(c.shape == (g.num_edges(), 2) for c in made)
    assert not torch.equal(made[0].packed, made[1].packed)  # independent draws
    assert sum(t.nbytes for t in kept) == made[0].nbytes + made[1].nbytes < s.nbytes
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


#: A group's minimum is stored rounded down to bfloat16 (8 significant bits), so the smallest value of a group
#: decodes to itself only in expectation: it rounds up by a whole step with probability ``2**-8 * |min| / step``,
#: an event 400 draws may not see. Deviations up to that relative precision of the largest value count as
#: rounding (a softmax kept in one copy misses its gradient by ``Var(s_hat) g``: several times more, here).
METADATA_FLOOR = 2.0 ** -8


def test_edge_softmax_int2_gradient_unbiased(graphs):
    """The backward ``s * (g - sum(g * s))`` is quadratic in the kept output: from one compressed copy its mean
    misses ``Var(s_hat) g`` per edge. Two independent copies (the outer factor, the sum) make it unbiased: the
    mean of 400 seeded INT2 draws is the exact gradient within its Student t bound (Bonferroni over the edges),
    up to the rounding floor below. With one copy the same check fails."""
    g = graphs["zero_in"]  # destinations with 1 to 3 in-edges: softmax values spread over (0, 1)
    torch.manual_seed(0)
    e = torch.randn(g.num_edges(), 2, dtype=torch.float64, requires_grad=True)
    r = torch.randn(g.num_edges(), 2, dtype=torch.float64)
    exact = torch.autograd.grad((ops.edge_softmax(g, hidden(e), config=OFF) * r).sum(), e)[0]
    draws = []
    for seed in range(400):
        torch.manual_seed(seed)
        draws.append(torch.autograd.grad((ops.edge_softmax(g, hidden(e), config=INT2) * r).sum(), e)[0])
    assert_mean_converges(draws, exact, floor=METADATA_FLOOR)


def test_edge_softmax_two_copies_under_hooks_subclass_eval_and_double_backward(graphs):
    """The two-copy backward against DGL's edge_softmax: a user's copying saved-tensor hook (both copies pass
    through it, the gradient is the one without it), a tensor subclass as scores, evaluation (no_grad: nothing
    kept), and double backward (exact with compression off, refused with compression on)."""
    g = graphs["graph"]
    torch.manual_seed(4)
    e = torch.randn(g.num_edges(), 2, dtype=torch.float64, requires_grad=True)
    r = torch.randn(g.num_edges(), 2, dtype=torch.float64)
    want = dgl.nn.functional.edge_softmax(g, e)

    def grad_at(cfg, scores=None, hook=False):
        torch.manual_seed(9)
        copying = torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t)
        with copying if hook else contextlib.nullcontext():
            out = ops.edge_softmax(g, hidden(e) if scores is None else scores, config=cfg)
        return out, torch.autograd.grad((out * r).sum(), e)[0]

    plain_out, plain = grad_at(INT8)
    torch.testing.assert_close(plain_out, want)
    hooked_out, hooked = grad_at(INT8, hook=True)
    assert torch.equal(hooked_out, plain_out) and torch.equal(hooked, plain)

    class Scores(torch.Tensor):
        pass

    sub_out, sub = grad_at(OFF, scores=hidden(e).as_subclass(Scores))
    torch.testing.assert_close(sub_out.as_subclass(torch.Tensor), want)
    torch.testing.assert_close(sub.as_subclass(torch.Tensor), torch.autograd.grad((want * r).sum(), e)[0])

    with torch.no_grad(), saved_tensors() as kept:
        torch.testing.assert_close(ops.edge_softmax(g, e * 1.0, config=INT8), want.detach())
    assert kept == []

    assert torch.autograd.gradgradcheck(lambda t: ops.edge_softmax(g, t * 1.0, config=OFF), (e,))
    out = ops.edge_softmax(g, hidden(e), config=INT8)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad((out * r).sum(), e, create_graph=True)


def test_softmax_int2_gradient_unbiased():
    """:func:`dgl_exact.ops.blocks.softmax`: the same quadratic backward, the same two independent copies. Rows are
    compressed on their own, so 20,000 copies of 5 rows (softmax values spread inside each row's range, where
    ``Var(s_hat)`` is largest) are 20,000 independent draws of their gradient, in one backward."""
    from dgl_exact.ops.blocks import softmax

    base = torch.tensor([[0.0, 1.2, 1.7], [0.3, -1.0, 1.1], [2.0, 1.1, 0.2], [-0.5, 0.6, 0.0], [1.0, 0.0, -0.8]],
                        dtype=torch.float64)
    torch.manual_seed(1)
    r = torch.randn(base.shape, dtype=torch.float64)
    exact = torch.autograd.grad((torch.softmax(base.requires_grad_(), 1) * r).sum(), base)[0]
    x = base.detach().repeat(20000, 1).requires_grad_()
    grad = torch.autograd.grad((softmax(hidden(x), 1, config=INT2) * r.repeat(20000, 1)).sum(), x)[0]
    assert_mean_converges(list(grad.view(20000, *base.shape)), exact, floor=METADATA_FLOOR)


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


def test_u_mul_e_sum_heads_last_backward_forms_no_edge_by_feature_tensor(graphs):
    """Heads last (``x [N, D, H]``, ``e [E, H]``): the edge gradient is a per-edge, per-head dot product; the
    backward forms nothing of ``E x D x H`` elements (DGL's own op does), and its gradients are DGL's."""
    g = graphs["graph"]
    n, n_edges, d, h = g.num_nodes(), g.num_edges(), 16, 2
    x = _feat(n, (d, h))
    e = _edge_values(g, (h,))
    r = torch.randn(n, d, h, dtype=torch.float64)

    def grads(op):
        return lambda: torch.autograd.grad((op(g, hidden(x), hidden(e)) * r).sum(), [x, e])

    (gx, ge), ours = largest_tensor_made(grads(lambda g, a, b: ops.u_mul_e_sum(g, a, b, config=OFF)))
    (rx, re), theirs = largest_tensor_made(grads(dgl.ops.u_mul_e_sum))
    close(gx, rx, "grad x")
    close(ge, re, "grad e")
    assert theirs >= n_edges * d * h > ours, (theirs, ours)


@pytest.mark.parametrize("shapes", [((40, 2, 8), (300, 2, 1)), ((40, 8), (300,)), ((40, 8, 2), (300, 2))],
                         ids=["heads-first", "flat", "heads-last"])
@pytest.mark.parametrize("cfg", [OFF, INT8], ids=["off", "int8"])
def test_aggregation_output_takes_in_place_updates(shapes, cfg, kernel_path):
    """A layer may update an aggregation's output in place, as it may DGL's (``rst = g.dstdata["ft"];
    rst += res``): the output is no view made inside the op's Function (autograd refuses those), and the
    gradients of the features and the residual are the out-of-place sum's (the same draws of the kept edge
    values: compressed at INT8, since they have autograd history)."""
    gen = torch.Generator().manual_seed(0)
    g = dgl.rand_graph(40, 300)
    x = torch.randn(shapes[0], generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.rand(shapes[1], generator=gen, dtype=torch.float64, requires_grad=True)
    res = torch.randn(shapes[0], generator=gen, dtype=torch.float64, requires_grad=True)
    r = torch.randn(shapes[0], generator=gen, dtype=torch.float64)
    with dgl_exact.config(cfg):
        torch.manual_seed(1)
        want = u_mul_e_sum(g, x * 1.0, w * 1.0) + res * 1.0
        torch.manual_seed(1)
        got = u_mul_e_sum(g, x * 1.0, w * 1.0)
    got += res * 1.0
    assert got._base is None
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, [x, res], r), torch.autograd.grad(want, [x, res], r)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("shapes", [((400, 2, 8), (3000, 2, 1)), ((400, 8, 2), (3000, 2))],
                         ids=["heads-first", "heads-last"])
@pytest.mark.parametrize("bipartite", [False, True], ids=["graph", "bipartite"])
def test_edge_gradient_in_source_chunks_is_the_whole(shapes, bipartite, kernel_path, monkeypatch):
    """The edge gradient of ``u_mul_e_sum`` from compressed features, one decoded chunk of source rows at a time
    (each chunk's out-edges), is the per-edge dot product over the whole decoded copy: the same seed gives the
    same codes, so the two agree up to float summation order."""
    from dgl_exact.ops import chunks

    gen = torch.Generator().manual_seed(0)
    g = dgl.heterograph({("a", "r", "b"): (torch.randint(0, 400, (3000,), generator=gen),
                                           torch.randint(0, 300, (3000,), generator=gen))}) if bipartite \
        else dgl.rand_graph(400, 3000)
    x0 = torch.randn(shapes[0], generator=gen)
    w = torch.rand(shapes[1], generator=gen, requires_grad=True)
    r = torch.randn((g.num_dst_nodes(),) + shapes[0][1:], generator=gen)
    grads = []
    for chunk_elements in (10**9, 16 * 64):  # whole, then 64 rows a chunk (or a block): several chunks
        monkeypatch.setattr(chunks, "CHUNK_ELEMENTS", chunk_elements)
        torch.manual_seed(1)
        x = x0.clone().requires_grad_()
        with dgl_exact.config(INT2):
            out = u_mul_e_sum(g, x * 1.0, w)
        grads.append(torch.autograd.grad(out, w, r)[0])
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5)
