"""DGL's message-passing API on dgl_exact's ops (dgl_exact/ops/routing.py): inside ``message_passing()``,
``update_all``/``apply_edges``/``send_and_recv``/``pull`` with every built-in message and reduce function give
DGL's outputs, DGL's gradients with compression off and unbiased gradients at INT8; user-defined functions,
heterographs and other threads run DGL's own."""
from __future__ import annotations

import threading

import pytest
import torch

import dgl_exact
from dgl_exact import CompressionConfig
from dgl_exact.ops import routing

import dgl  # noqa: E402  (after dgl_exact)
import dgl.function as fn  # noqa: E402

OFF = CompressionConfig(enabled=False)
BINARY = ("add", "sub", "mul", "div", "dot")
TARGETS = ("u", "v", "e")


def _messages():
    """Every built-in message function of DGL: (name, factory of fn.<name>(..., 'm'))."""
    out = [("copy_u", lambda: fn.copy_u("hu", "m")), ("copy_e", lambda: fn.copy_e("he", "m"))]
    for lhs in TARGETS:
        for rhs in TARGETS:
            if lhs != rhs:
                for op in BINARY:
                    name = f"{lhs}_{op}_{rhs}"
                    out.append((name, lambda name=name, lhs=lhs, rhs=rhs: getattr(fn, name)(f"h{lhs}", f"h{rhs}", "m")))
    return out


MESSAGES = _messages()


def _data(g, seed, dtype=torch.float64):
    """Features on sources, destinations and edges (``[n, 2, 3]``; positive where they may divide)."""
    gen = torch.Generator().manual_seed(seed)
    leaves = {"u": torch.randn(g.num_src_nodes(), 2, 3, generator=gen, dtype=dtype),
              "v": torch.rand(g.num_dst_nodes(), 2, 3, generator=gen, dtype=dtype) + 0.5,
              "e": torch.rand(g.num_edges(), 2, 3, generator=gen, dtype=dtype) + 0.5}
    return {k: v.requires_grad_() for k, v in leaves.items()}


def _assign(g, leaves):
    """The features on ``g`` as non-leaf tensors (what a layer's activations are: compression applies)."""
    g.srcdata["hu"] = leaves["u"] * 1.0
    g.dstdata["hv"] = leaves["v"] * 1.0
    g.edata["he"] = leaves["e"] * 1.0


def _run(g, leaves, step):
    """``step(g)`` returns an output tensor; gives ``(output, gradients of the leaves)``."""
    with g.local_scope():
        _assign(g, leaves)
        out = step(g)
    finite = torch.isfinite(out)
    grads = torch.autograd.grad((out.masked_fill(~finite, 0) * _coefficients(out)).sum(), list(leaves.values()),
                                allow_unused=True)
    return out.detach(), [torch.zeros_like(v) if gr is None else gr for v, gr in zip(leaves.values(), grads)]


def _same_as_dgl(g, step, what, seed=0):
    leaves = _data(g, seed)
    want = _run(g, leaves, step)
    with dgl_exact.message_passing(), dgl_exact.config(OFF):
        got = _run(g, leaves, step)
    torch.testing.assert_close(got[0], want[0], msg=lambda m: f"{what}: {m}")
    for a, b, k in zip(got[1], want[1], "uve"):
        torch.testing.assert_close(a, b, msg=lambda m: f"{what} grad {k}: {m}")


@pytest.fixture(scope="module")
def mp_graphs(graphs):
    return {k: graphs[k] for k in ("graph", "zero_in", "block")}


@pytest.mark.parametrize("reduce_op", ["sum", "mean", "max", "min"])
def test_update_all_every_builtin_equals_dgl(reduce_op, mp_graphs):
    for kind, g in mp_graphs.items():
        for name, message in MESSAGES:
            def step(g, message=message):
                g.update_all(message(), getattr(fn, reduce_op)("m", "out"))
                return g.dstdata["out"]

            _same_as_dgl(g, step, f"update_all {name} {reduce_op} on {kind}")


def test_apply_edges_every_builtin_equals_dgl(mp_graphs):
    for kind, g in mp_graphs.items():
        for name, message in MESSAGES:
            def step(g, message=message):
                g.apply_edges(message())
                return g.edata["m"]

            _same_as_dgl(g, step, f"apply_edges {name} on {kind}")


def test_send_and_recv_pull_and_edge_subsets_equal_dgl(mp_graphs):
    g = mp_graphs["graph"]
    eids = torch.arange(0, g.num_edges(), 3)
    nodes = torch.tensor([0, 3, 5, 11])
    for name, message in (("u_mul_e", lambda: fn.u_mul_e("hu", "he", "m")), ("copy_u", lambda: fn.copy_u("hu", "m")),
                          ("e_sub_v", lambda: fn.e_sub_v("he", "hv", "m"))):
        for reduce_op in ("sum", "mean", "max"):
            def send_recv(g, message=message, reduce_op=reduce_op):
                g.dstdata["out"] = torch.zeros(g.num_dst_nodes(), 2, 3, dtype=torch.float64)
                g.send_and_recv(eids, message(), getattr(fn, reduce_op)("m", "out"))
                return g.dstdata["out"]

            def pull(g, message=message, reduce_op=reduce_op):
                g.dstdata["out"] = torch.zeros(g.num_dst_nodes(), 2, 3, dtype=torch.float64)
                g.pull(nodes, message(), getattr(fn, reduce_op)("m", "out"))
                return g.dstdata["out"]

            _same_as_dgl(g, send_recv, f"send_and_recv {name} {reduce_op}")
            _same_as_dgl(g, pull, f"pull {name} {reduce_op}")

        def some_edges(g, message=message):
            g.edata["m"] = torch.zeros(g.num_edges(), 2, 3, dtype=torch.float64)
            g.apply_edges(message(), eids)
            return g.edata["m"]

        _same_as_dgl(g, some_edges, f"apply_edges on some edges {name}")


def test_user_defined_functions_run_as_dgl_runs_them(mp_graphs):
    g = mp_graphs["zero_in"]

    def message(edges):
        return {"m": torch.tanh(edges.src["hu"]) * edges.data["he"]}

    def reduce(nodes):
        return {"out": nodes.mailbox["m"].max(1).values + nodes.data["hv"]}

    cases = {"udf message, builtin reduce": (message, fn.sum("m", "out")),
             "builtin message, udf reduce": (fn.u_mul_e("hu", "he", "m"), reduce),
             "both udf": (message, reduce)}
    for what, (mfunc, rfunc) in cases.items():
        def step(g, mfunc=mfunc, rfunc=rfunc):
            g.dstdata["out"] = torch.zeros(g.num_dst_nodes(), 2, 3, dtype=torch.float64)
            g.update_all(mfunc, rfunc)
            return g.dstdata["out"]

        _same_as_dgl(g, step, what)
        with dgl_exact.message_passing():  # and at the default INT8: it runs
            _run(g, _data(g, 1), step)


@pytest.mark.parametrize("home", ["dgl.ops", "dgl.nn.functional", "dgl.nn"])
def test_edge_softmax_inside_the_scope(home, mp_graphs, kept_compressed):
    import importlib

    with dgl_exact.message_passing():
        pass  # installs the switch
    g = mp_graphs["graph"]
    module = importlib.import_module(home)

    def step(g):
        g.apply_edges(fn.u_dot_v("hu", "hv", "s"))
        a = module.edge_softmax(g, g.edata["s"])
        g.edata["a"] = a
        g.update_all(fn.u_mul_e("hu", "a", "m"), fn.sum("m", "out"))
        return g.dstdata["out"]

    _same_as_dgl(g, step, f"{home}.edge_softmax")
    kept_compressed.clear()
    with dgl_exact.message_passing():
        _run(g, _data(g, 2, torch.float32), step)
    # u_dot_v's operands, edge_softmax's output, u_mul_e_sum's features: all compressed copies
    assert len(kept_compressed) >= 3 and {c.bits for c in kept_compressed} == {8}
    kept_compressed.clear()
    _run(g, _data(g, 2, torch.float32), step)  # outside the scope: DGL's own ops, nothing compressed
    assert kept_compressed == []


def test_edge_softmax_bound_at_import_inside_the_scope(graphs, kept_compressed):
    """A name bound to DGL's own function (``from dgl.nn.functional import edge_softmax`` before any scope was
    entered): inside the scope it runs dgl_exact's op (DGL's values and gradients with compression off, its
    output kept compressed), on a graph, a block and a bipartite graph; a subset of edges and calls outside
    the scope run DGL's kernel."""
    from dgl_exact.ops.dgl_originals import originals

    dgl_softmax = originals().edge_softmax  # DGL's own function object, as an early import binds it
    bip = dgl.heterograph({("a", "r", "b"): (torch.tensor([0, 1, 2, 2, 4]), torch.tensor([0, 0, 1, 2, 2]))})
    for g in (graphs["graph"], graphs["block"], bip):
        e = torch.randn(g.num_edges(), 2, dtype=torch.float64, requires_grad=True)
        want = dgl_softmax(g, e * 1.0)
        with dgl_exact.message_passing(), dgl_exact.config(OFF):
            got = dgl_softmax(g, e * 1.0)
        torch.testing.assert_close(got, want)
        r = torch.randn(want.shape, dtype=want.dtype)
        torch.testing.assert_close(torch.autograd.grad(got, e, r)[0], torch.autograd.grad(want, e, r)[0])
        kept_compressed.clear()
        with dgl_exact.message_passing():
            dgl_softmax(g, e.float() * 1.0)
        assert len(kept_compressed) == 2  # two independent copies of the output (its backward is quadratic in it)
    g = graphs["graph"]
    kept_compressed.clear()
    e = torch.randn(g.num_edges(), 2, requires_grad=True)
    with dgl_exact.message_passing():
        sub = dgl_softmax(g, e[:6] * 1.0, torch.arange(6))  # a subset of edges: DGL's kernel
    dgl_softmax(g, e * 1.0)
    assert kept_compressed == [] and sub.shape == (6, 2)


def _coefficients(out):
    return torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view(out.shape)


@pytest.mark.parametrize("message,reduce_op", [("u_mul_e", "sum"), ("u_mul_e", "mean"), ("u_mul_v", None),
                                               ("u_dot_v", None), ("e_mul_v", "sum"), ("v_dot_e", "mean")])
def test_int8_gradients_unbiased(message, reduce_op, kept_compressed):
    """A bilinear message keeps each operand compressed for the other's gradient (u_mul_e keeps its edge values
    exactly). Stochastic rounding is unbiased, each value's error has variance at most step^2/4 (step: its
    row's range / 255), so each gradient entry ``sum_j C_ij b_j`` is unbiased with variance at most
    ``sum_j C_ij^2 Var(b_j)``; on a graph without repeated edges every ``(i, j)`` meets in one output entry
    ``k``, so ``C_ij^2 = r_k^2 T_kij^2 <= r_k^2 T_kij`` (``T``: 1, or 1/degree for mean), which the same op
    computes from ``(1, Var(b))`` and the squared output coefficients. The mean of ``K`` draws lies within
    ``6 sd / sqrt(K)`` of DGL's exact gradient."""
    torch.manual_seed(0)
    g = dgl.to_simple(dgl.rand_graph(30, 150))
    leaves = _data(g, 3)
    lhs, rhs = message[0], message[-1]

    def step(g):
        mfunc = getattr(fn, message)(f"h{lhs}", f"h{rhs}", "m")
        if reduce_op is None:
            g.apply_edges(mfunc)
            return g.edata["m"]
        g.update_all(mfunc, getattr(fn, reduce_op)("m", "out"))
        return g.dstdata["out"]

    exact = _run(g, leaves, step)[1]  # DGL's own ops
    draws = 64
    total = [torch.zeros_like(t) for t in exact]
    with dgl_exact.message_passing(), dgl_exact.config(bits=8):
        for _ in range(draws):
            for acc, grad in zip(total, _run(g, leaves, step)[1]):
                acc += grad
    assert kept_compressed, "nothing was compressed: the scope did not reach dgl_exact's ops"
    assert {c.bits for c in kept_compressed} == {8}
    variance = {}
    for target, t in leaves.items():
        rows = t.detach().reshape(t.shape[0], -1)
        variance[target] = (((rows.amax(1) - rows.amin(1)) / 255) ** 2 / 4).view(-1, 1, 1).expand_as(t).clone()
    bound = {}
    for own, other in ((lhs, rhs), (rhs, lhs)):
        feats = {k: torch.zeros_like(t.detach()) for k, t in leaves.items()}
        feats[own] = torch.ones_like(feats[own]).requires_grad_()
        feats[other] = variance[other]
        with g.local_scope():
            g.srcdata["hu"], g.dstdata["hv"], g.edata["he"] = feats["u"], feats["v"], feats["e"]
            out = step(g)
        bound[own] = torch.autograd.grad((out * _coefficients(out) ** 2).sum(), feats[own])[0]
    for target, got, want in zip("uve", total, exact):
        sd = bound[target].clamp(min=0).sqrt() if target in bound else torch.zeros_like(want)
        err = (got / draws - want).abs()
        tol = 6 * sd / draws ** 0.5 + 1e-9 * (want.abs() + 1)
        assert bool((err <= tol).all()), \
            f"{message} {reduce_op} grad {target}: max err/tol {float((err / tol).max()):.3g}"
        if target in bound and bool((bound[target] > 0).any()):
            assert not torch.equal(got / draws, want)  # the draws did vary: compression was exercised


def test_scope_is_local_to_its_thread_and_restored(mp_graphs, kept_compressed):
    g = mp_graphs["graph"]

    def step(g):
        g.update_all(fn.u_mul_e("hu", "he", "m"), fn.sum("m", "out"))
        return g.dstdata["out"]

    seen = {}

    def other_thread():
        kept_before = len(kept_compressed)
        seen["active"] = routing.message_passing_active()
        _run(g, _data(g, 4, torch.float32), step)
        seen["compressed"] = len(kept_compressed) - kept_before

    with dgl_exact.message_passing():
        assert routing.message_passing_active()
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        with dgl_exact.message_passing(False):  # turned off inside
            assert not routing.message_passing_active()
        assert routing.message_passing_active()
    assert seen == {"active": False, "compressed": 0}
    assert not routing.message_passing_active()
    with pytest.raises(RuntimeError), dgl_exact.message_passing():
        raise RuntimeError("inside")
    assert not routing.message_passing_active()


def test_heterograph_with_several_edge_types_runs_dgls_ops():
    hg = dgl.heterograph({("a", "x", "b"): ([0, 1, 2, 1], [0, 0, 1, 1]), ("b", "y", "b"): ([0, 1, 1], [0, 0, 1])})
    torch.manual_seed(5)
    feats = {"a": torch.randn(3, 4, dtype=torch.float64), "b": torch.randn(2, 4, dtype=torch.float64)}

    def run():
        hg.ndata["h"] = {k: v * 1.0 for k, v in feats.items()}
        hg.update_all(fn.copy_u("h", "m"), fn.sum("m", "out"))
        return hg.nodes["b"].data["out"]

    want = run()
    with dgl_exact.message_passing():
        torch.testing.assert_close(run(), want)


def test_message_passing_rejects_non_bool():
    with pytest.raises(TypeError, match="True or False"), dgl_exact.message_passing("yes"):
        pass


def test_dgl_core_sees_dgl_exact_ops_only_inside_the_scope():
    import dgl.core
    import dgl.ops

    from dgl_exact import ops

    with dgl_exact.message_passing():
        routed = dgl.core.ops.u_mul_e_sum
        assert routed.__wrapped__ is ops.u_mul_e_sum
        assert getattr(dgl.core.ops, "u_add_v_sum", None) is None  # no fused op: DGL's core takes two steps
        assert dgl.core.ops.segment_reduce is dgl.ops.segment_reduce  # not a message-passing op
    assert dgl.core.ops.u_mul_e_sum is dgl.ops.u_mul_e_sum
