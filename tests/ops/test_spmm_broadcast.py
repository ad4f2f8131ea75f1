"""``u_{add,sub,mul,div}_e_{sum,mean}`` for every broadcast of feature shapes (dgl_exact.ops.spmm_broadcast,
reached through ``dgl_exact.ops`` and DGL's message passing): values and gradients equal DGL's (float64,
compression off), both layouts (heads first and heads last), and a backward that forms no tensor larger than
the op's inputs and output, with compression off and on (DGL's own backward forms ``[E, *out]``)."""
from __future__ import annotations

import pytest
import torch

import dgl_exact
from dgl_exact import ops
from tests.ops._helpers import INT2, OFF, _dgl_graph, _edge_values, _feat, close, hidden, largest_tensor_made, \
    compress_calls, saved_tensors

dgl = pytest.importorskip("dgl")
import dgl.function as fn  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# (x's feature shape, y's): heads last ([N, D, H] by [E, 1, H] or [E, H]), heads first, a scalar per edge,
# x broadcast, both broadcast, 4-d mixes, a scalar per node, no broadcast
SHAPES = [((8, 3), (1, 3)), ((8, 3), (3,)), ((3, 8), (3, 1)), ((8, 3), ()), ((8,), (1,)), ((1, 3), (8, 1)),
          ((8, 3), (8, 1)), ((1, 3), (8, 3)), ((2, 4, 3), (4, 1)), ((2, 4, 3), (2, 1, 3)), ((), (5,)),
          ((8, 3), (8, 3)), ((2, 1, 3), (4, 1))]
OPS = [(op, reduce_op) for op in ("add", "sub", "mul", "div") for reduce_op in ("sum", "mean")]


def _inputs(g, xs, ys, seed=0):
    return _feat(g.num_src_nodes(), xs, seed), _edge_values(g, ys, seed + 1)


@pytest.mark.parametrize("op,reduce_op", OPS, ids=[f"{o}-{r}" for o, r in OPS])
def test_values_and_gradients_are_dgls(op, reduce_op, graphs, kernel_path):
    name = f"u_{op}_e_{reduce_op}"
    for kind in ("graph", "zero_in", "block", "block-int32"):
        g, ref_g = graphs[kind], _dgl_graph(graphs, kind)
        for xs, ys in SHAPES:
            x, y = _inputs(g, xs, ys)
            out = getattr(ops, name)(g, hidden(x), hidden(y), config=OFF)
            ref = getattr(dgl.ops, name)(ref_g, x, y)
            what = f"{name} {kind} {xs} {ys}"
            close(out, ref, what)
            r = torch.randn(ref.shape, dtype=ref.dtype, generator=torch.Generator().manual_seed(2))
            for a, b, w in zip(torch.autograd.grad((out * r).sum(), [x, y]),
                               torch.autograd.grad((ref * r).sum(), [x, y]), ("x", "y")):
                close(a, b, f"{what} grad {w}")


def _backward_largest(g, name, xs, ys, cfg):
    """The largest tensor formed by the backward of ``ops.<name>`` and by DGL's, and the op's largest input
    or output (elements)."""
    x, y = _inputs(g, xs, ys)
    out = getattr(ops, name)(g, hidden(x), hidden(y), config=cfg)
    ref = getattr(dgl.ops, name)(g, hidden(x), hidden(y))
    r = torch.randn(ref.shape, dtype=ref.dtype)
    _, ours = largest_tensor_made(lambda: torch.autograd.grad(out, [x, y], r))
    _, theirs = largest_tensor_made(lambda: torch.autograd.grad(ref, [x, y], r))
    return ours, theirs, max(x.numel(), y.numel(), out.numel())


@pytest.mark.parametrize("cfg", [OFF, INT2], ids=["off", "int2"])
@pytest.mark.parametrize("op,reduce_op", OPS, ids=[f"{o}-{r}" for o, r in OPS])
def test_backward_forms_nothing_larger_than_inputs_and_output(op, reduce_op, cfg, graphs):
    name = f"u_{op}_e_{reduce_op}"
    dgl_larger = 0
    for kind in ("graph", "block"):
        for xs, ys in SHAPES:
            ours, theirs, limit = _backward_largest(graphs[kind], name, xs, ys, cfg)
            # (kept edge values decode in whole groups of ~256 values: on these tiny graphs one group is
            # larger than the tensors; never an [E, *out] product)
            assert ours <= max(limit, 256), (kind, xs, ys, ours, limit)
            dgl_larger += theirs > limit
    assert dgl_larger  # the shapes include some where DGL's backward forms [E, *out]


def test_edge_chunks_follow_the_chunk_budget(graphs):
    """Both operands broadcast (``x [N, 1, H]`` by ``y [E, D, 1]``): the per-edge products are formed in edge
    chunks of :func:`dgl_exact.ops.chunks.chunk_rows`' budget (here scaled down to 64 elements), with DGL's
    gradients."""
    from dgl_exact.ops.chunks import sample_chunking

    g = graphs["graph"]
    x, y = _inputs(g, (1, 3), (8, 1))
    r = torch.randn(g.num_nodes(), 8, 3, dtype=torch.float64)
    ref = torch.autograd.grad((dgl.ops.u_mul_e_sum(g, x, y) * r).sum(), [x, y])
    with sample_chunking(64 / (1 << 20)):
        out = ops.u_mul_e_sum(g, hidden(x), hidden(y), config=OFF)
        got, largest = largest_tensor_made(lambda: torch.autograd.grad((out * r).sum(), [x, y]))
    for a, b in zip(got, ref):
        close(a, b, "chunked grad")
    assert largest <= max(x.numel(), y.numel(), out.numel())


@pytest.mark.parametrize("op", ["mul", "div", "add"])
def test_what_is_kept(op, graphs):
    """``mul``/``div`` keep ``x`` compressed and edge values given as data (no autograd history) by reference
    (so ``x``'s gradient is exact with compression on); ``add`` keeps nothing (both gradients exact). (Edge
    values with autograd history, attention weights: ``test_attention_weights_kept_at_8_bits_unbiased``.)"""
    g = graphs["graph"]
    x, y = _inputs(g, (16, 4), (1, 4))
    grads = {}
    for label, cfg in (("off", OFF), ("int2", INT2)):
        xh, yh = hidden(x), y
        with saved_tensors() as saved:
            out = getattr(ops, f"u_{op}_e_sum")(g, xh, yh, config=cfg)
        assert not any(t.is_floating_point() and t.numel() >= x.numel() for t in saved) or label == "off"
        if op == "add":
            assert not saved
        else:
            assert any(t is yh for t in saved)
        grads[label] = torch.autograd.grad(out.square().sum(), [x, y])
    close(grads["int2"][0], grads["off"][0], "x grad")
    if op == "add":
        close(grads["int2"][1], grads["off"][1], "y grad")


def test_attention_weights_kept_at_8_bits_unbiased(graphs, monkeypatch):
    """Edge values with autograd history (attention weights) are kept compressed at 8 bits whatever the
    configuration (INT2 here): nothing edge-sized in fp32; the feature gradient ``A_w^T g`` is linear in them,
    so over 400 seeded draws its mean is within 5 standard errors of the exact one (elementwise; the standard
    error estimated from the same draws)."""
    g = graphs["graph"]
    x, y = _inputs(g, (3, 4), (3, 1))  # heads first: x [N, 3, 4], y [E, 3, 1]
    r = torch.randn((g.num_dst_nodes(), 3, 4), generator=torch.Generator().manual_seed(5))
    yh = hidden(y)
    with saved_tensors() as saved:
        ops.u_mul_e_sum(g, hidden(x), yh, config=INT2)
    assert not any(t is yh for t in saved)
    with compress_calls(monkeypatch) as made:
        ops.u_mul_e_sum(g, hidden(x), hidden(y), config=INT2)
    assert {(tuple(c.shape), c.bits) for c in made} == {(tuple(x.shape), 2), (tuple(y.shape), 8)}
    exact = torch.autograd.grad((ops.u_mul_e_sum(g, hidden(x), hidden(y), config=OFF) * r).sum(), x)[0]
    draws = []
    for seed in range(400):
        torch.manual_seed(seed)
        draws.append(torch.autograd.grad((ops.u_mul_e_sum(g, hidden(x), hidden(y), config=INT2) * r).sum(), x)[0])
    d = torch.stack(draws)
    assert (d.std(0) > 0).any()  # the kept weights were compressed
    assert ((d.mean(0) - exact).abs() <= 5 * d.std(0) / len(draws) ** 0.5 + 1e-6).all()


MESSAGE_PASSING = [(fn.u_mul_e, fn.sum), (fn.u_mul_e, fn.mean), (fn.u_add_e, fn.sum), (fn.u_div_e, fn.sum),
                   (fn.u_sub_e, fn.mean)]


@pytest.mark.parametrize("message,reduce", MESSAGE_PASSING,
                         ids=[f"{m.__name__}-{r.__name__}" for m, r in MESSAGE_PASSING])
@pytest.mark.parametrize("xs,ys", [((8, 3), (1, 3)), ((3, 8), (3, 1)), ((1, 3), (8, 1))],
                         ids=["heads-last", "heads-first", "both-broadcast"])
def test_update_all_in_a_scope_is_dgls_and_bounded(message, reduce, xs, ys, graphs):
    g = graphs["graph"]
    x, y = _inputs(g, xs, ys)

    def run(scope):
        with g.local_scope(), scope, dgl_exact.config(enabled=False):
            g.ndata["h"], g.edata["a"] = hidden(x), hidden(y)
            g.update_all(message("h", "a", "m"), reduce("m", "out"))
            return g.ndata["out"]

    out, ref = run(ops.message_passing()), run(ops.message_passing(False))
    close(out, ref, "forward")
    r = torch.randn(ref.shape, dtype=ref.dtype)
    got, largest = largest_tensor_made(lambda: torch.autograd.grad(out, [x, y], r))
    for a, b in zip(got, torch.autograd.grad(ref, [x, y], r)):
        close(a, b, "grad")
    assert largest <= max(x.numel(), y.numel(), out.numel())


SDDMM = [f"{lhs}_{op}_{rhs}" for lhs, rhs in (("u", "v"), ("u", "e"), ("e", "v"), ("v", "u")) for op in
         ("add", "sub", "mul", "div")]


@pytest.mark.parametrize("cfg", [OFF, INT2], ids=["off", "int2"])
@pytest.mark.parametrize("name", SDDMM)
def test_sddmm_backward_forms_nothing_larger_than_inputs_and_output(name, cfg, graphs):
    """The per-edge ops (DGL's, or the bilinear path's re-run of DGL's for ``mul``) already reduce their
    broadcast gradients within the output's size; kept so."""
    for kind in ("graph", "block"):
        g = graphs[kind]
        count = {"u": g.num_src_nodes(), "v": g.num_dst_nodes(), "e": g.num_edges()}
        for xs, ys in SHAPES:
            x = _feat(count[name[0]], xs)
            y = _feat(count[name[-1]], ys, 1).detach().abs().add(0.5).requires_grad_()
            with dgl_exact.config(cfg):
                out = getattr(ops, name)(g, hidden(x), hidden(y))
            r = torch.randn(out.shape, dtype=out.dtype)
            _, largest = largest_tensor_made(lambda: torch.autograd.grad(out, [x, y], r))
            assert largest <= max(x.numel(), y.numel(), out.numel()), (kind, xs, ys, largest)


@pytest.mark.parametrize("op", ["mul", "div", "add"])
def test_double_backward(op, graphs):
    """Compression off: the backward is differentiable (DGL's op re-run with autograd), exact to second order;
    on, an op that keeps a compressed operand refuses with the package's message."""
    g = dgl.rand_graph(6, 14)
    x, y = _inputs(g, (1, 2), (3, 1))
    fn_ = getattr(ops, f"u_{op}_e_mean")
    assert torch.autograd.gradgradcheck(lambda a, b: torch.tanh(fn_(g, a * 1.0, b * 1.0, config=OFF)), (x, y))
    if op != "add":
        out = fn_(g, x * 1.0, y * 1.0, config=INT2)
        with pytest.raises(RuntimeError, match="double backward"):
            torch.autograd.grad(out.sum(), y, create_graph=True)
