"""``dgl_exact.ops`` as a drop-in for ``dgl.ops``: every public callable, DGL's signatures, broadcasting and
results (float64, compression off unless a test says otherwise), and what the bilinear ops keep."""
from __future__ import annotations

import inspect

import pytest
import torch

import dgl_exact
from dgl_exact import CompressedTensor, CompressionConfig, ops

pytest.importorskip("dgl")
import dgl  # noqa: E402  (after dgl_exact)
import dgl.ops  # noqa: E402

OFF = CompressionConfig(enabled=False)
INT2 = CompressionConfig(bits=2)
INT8 = CompressionConfig(bits=8, kept_frac=1.0)


def _dgl_callables():
    return sorted(n for n in dir(dgl.ops) if not n.startswith("_") and callable(getattr(dgl.ops, n)))


def _rand(shape, seed, positive=False):
    gen = torch.Generator().manual_seed(seed)
    t = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5 if positive else \
        torch.randn(shape, generator=gen, dtype=torch.float64)
    return t.requires_grad_()


@pytest.fixture(scope="module")
def graphs():
    torch.manual_seed(3)
    homo = dgl.rand_graph(12, 40)
    bip = dgl.heterograph({("a", "r", "b"): (torch.randint(0, 9, (30,)), torch.randint(0, 7, (30,)))},
                          num_nodes_dict={"a": 9, "b": 7})
    return {"homo": homo, "bipartite": bip}


def _count(g, target):
    return {"u": g.num_src_nodes(), "v": g.num_dst_nodes(), "e": g.num_edges()}[target]


def _compare(ours, theirs, inputs, what):
    """Forward and input gradients of ``ours`` and ``theirs`` on the same leaves."""
    with dgl_exact.config(enabled=False):
        out = ours(*inputs)
    ref = theirs(*inputs)
    assert out.shape == ref.shape, (what, out.shape, ref.shape)
    torch.testing.assert_close(out, ref, msg=lambda m: f"{what}: {m}")
    finite = torch.isfinite(ref)
    r = torch.randn(out.shape, dtype=out.dtype) * finite
    leaves = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    g_ours = torch.autograd.grad((out.masked_fill(~finite, 0) * r).sum(), leaves, allow_unused=True)
    g_ref = torch.autograd.grad((ref.masked_fill(~finite, 0) * r).sum(), leaves, allow_unused=True)
    for a, b in zip(g_ours, g_ref):
        if a is None or b is None:
            assert (a is None or not a.any()) and (b is None or not b.any()), what
            continue
        torch.testing.assert_close(a, b, msg=lambda m: f"{what} grad: {m}")


def test_every_dgl_ops_callable_with_dgls_signature():
    names = _dgl_callables()
    assert len(names) == 64
    for name in names:
        assert hasattr(ops, name), name
        theirs = inspect.signature(getattr(dgl.ops, name)).parameters
        ours = inspect.signature(getattr(ops, name)).parameters
        own = [p for p in ours.values() if p.name == "config"]
        assert all(p.kind is p.KEYWORD_ONLY for p in own), name
        assert [(p.name, p.kind, p.default) for p in theirs.values()] == \
               [(p.name, p.kind, p.default) for p in ours.values() if p.name != "config"], name
    assert inspect.signature(dgl.nn.functional.edge_softmax).parameters.keys() == \
        {k for k in inspect.signature(ops.edge_softmax).parameters if k != "config"}


def test_u_mul_e_sum_with_as_many_heads_as_features_broadcasts_as_dgl(kernel_path):
    """``x [N, D, H]`` with ``e [E, H]`` and ``D == H``: DGL multiplies the last dim (right alignment)."""
    g = dgl.rand_graph(50, 200)
    torch.manual_seed(0)
    x = torch.randn(50, 8, 8, dtype=torch.float64, requires_grad=True)
    e = torch.rand(200, 8, dtype=torch.float64, requires_grad=True)
    _compare(lambda x, e: ops.u_mul_e_sum(g, x, e), lambda x, e: dgl.ops.u_mul_e_sum(g, x, e), (x, e), "D == H")
    # and D != H works as in DGL rather than raising
    x = torch.randn(50, 5, 8, dtype=torch.float64, requires_grad=True)
    _compare(lambda x, e: ops.u_mul_e_sum(g, x, e), lambda x, e: dgl.ops.u_mul_e_sum(g, x, e), (x, e), "D != H")


MUL_SHAPES = [((5,), ()), ((5,), (1,)), ((5,), (5,)), ((3, 4), (3, 1)), ((3, 4), (4,)), ((3, 4), (1, 4)),
              ((3, 4), (3, 4)), ((1,), (3,)), ((3, 1), (1, 4)), ((2, 3, 4), (2, 1, 1)), ((2, 3, 4), (3, 1)),
              ((), ()), ((4,), (2, 1, 4))]


@pytest.mark.parametrize("xs,es", MUL_SHAPES, ids=[f"{a}x{b}" for a, b in MUL_SHAPES])
def test_u_mul_e_sum_shapes_match_dgl(xs, es, graphs, kernel_path):
    for kind, g in graphs.items():
        x, e = _rand((g.num_src_nodes(),) + xs, 1), _rand((g.num_edges(),) + es, 2, positive=True)
        _compare(lambda x, e: ops.u_mul_e_sum(g, x, e), lambda x, e: dgl.ops.u_mul_e_sum(g, x, e), (x, e),
                 f"{kind} {xs} {es}")


SPMM_SHAPES = [((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 4))]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
@pytest.mark.parametrize("reduce_op", ["sum", "mean", "max", "min"])
def test_u_op_e_reduce_match_dgl(op, reduce_op, graphs):
    name = f"u_{op}_e_{reduce_op}"
    for kind, g in graphs.items():
        for xs, es in SPMM_SHAPES:
            x, e = _rand((g.num_src_nodes(),) + xs, 3), _rand((g.num_edges(),) + es, 4, positive=True)
            _compare(getattr(ops, name), getattr(dgl.ops, name), (g, x, e), f"{name} {kind} {xs} {es}")


@pytest.mark.parametrize("reduce_op", ["sum", "mean", "max", "min"])
def test_copy_reduce_match_dgl(reduce_op, graphs):
    for kind, g in graphs.items():
        for target in ("u", "e"):
            name = f"copy_{target}_{reduce_op}"
            x = _rand((_count(g, target), 2, 3), 5)
            _compare(getattr(ops, name), getattr(dgl.ops, name), (g, x), f"{name} {kind}")


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "dot"])
def test_sddmm_match_dgl(op, graphs):
    shapes = [((3,), (3,)), ((2, 3), (1, 3)), ((1, 3), (2, 1, 3))] if op == "dot" else \
        [((3,), (3,)), ((2, 3), (3,)), ((2, 1), (1, 4)), ((), (2,))]
    for kind, g in graphs.items():
        for lhs in "uve":
            for rhs in "uve":
                if lhs == rhs:
                    continue
                name = f"{lhs}_{op}_{rhs}"
                for ls, rs in shapes:
                    a = _rand((_count(g, lhs),) + ls, 6)
                    b = _rand((_count(g, rhs),) + rs, 7, positive=True)
                    _compare(getattr(ops, name), getattr(dgl.ops, name), (g, a, b), f"{name} {kind} {ls} {rs}")


def test_copies_and_generic_entry_points_match_dgl(graphs):
    for kind, g in graphs.items():
        for name, target in (("copy_u", "u"), ("copy_v", "v"), ("copy_e", "e")):
            x = _rand((_count(g, target), 3), 8)
            _compare(getattr(ops, name), getattr(dgl.ops, name), (g, x), f"{name} {kind}")
        x, e = _rand((g.num_src_nodes(), 2, 3), 9), _rand((g.num_edges(), 3), 10, positive=True)
        for op in ("add", "mul", "copy_lhs"):
            _compare(lambda x, e: ops.gspmm(g, op, "sum", x, e), lambda x, e: dgl.ops.gspmm(g, op, "sum", x, e),
                     (x, e), f"gspmm {op} {kind}")
        y = _rand((g.num_dst_nodes(), 3), 11)
        _compare(lambda x, y: ops.gsddmm(g, "mul", x, y, "u", "v"), lambda x, y: dgl.ops.gsddmm(g, "mul", x, y),
                 (x, y), f"gsddmm {kind}")


@pytest.mark.parametrize("norm_by", ["dst", "src"])
@pytest.mark.parametrize("shape", [(), (1,), (3,), (2, 3)])
def test_edge_softmax_matches_dgl(norm_by, shape, graphs, kernel_path):
    for kind, g in graphs.items():
        e = _rand((g.num_edges(),) + shape, 12)
        _compare(lambda e: ops.edge_softmax(g, e, norm_by=norm_by),
                 lambda e: dgl.nn.functional.edge_softmax(g, e, norm_by=norm_by), (e,), f"{kind} {norm_by}")


def test_edge_softmax_positional_eids_and_heterograph(graphs):
    g = graphs["homo"]
    eids = torch.arange(0, g.num_edges(), 2)
    e = _rand((eids.numel(), 2), 13)
    # the third positional argument is DGL's eids
    _compare(lambda e: ops.edge_softmax(g, e, eids), lambda e: dgl.ops.edge_softmax(g, e, eids), (e,), "eids")
    _compare(lambda e: ops.edge_softmax(g, e, eids, "src"), lambda e: dgl.ops.edge_softmax(g, e, eids, "src"), (e,),
             "eids src")
    hg = dgl.heterograph({("a", "x", "b"): ([0, 1, 2, 1], [0, 0, 1, 1]), ("b", "y", "b"): ([0, 1, 1], [0, 0, 1])})
    scores = {"x": torch.randn(4, 2, dtype=torch.float64), "y": torch.randn(3, 2, dtype=torch.float64)}
    ours, theirs = ops.edge_softmax(hg, scores), dgl.ops.edge_softmax(hg, scores)
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key])
    with pytest.raises(ValueError, match="norm_by"):
        ops.edge_softmax(g, torch.randn(g.num_edges()), norm_by="both")


def test_segment_ops_and_gather_mm_match_dgl():
    seglen = torch.tensor([2, 3, 0, 4, 1])
    value = _rand((10, 3), 14)
    for reducer in ("sum", "mean", "max", "min"):
        _compare(lambda v: ops.segment_reduce(seglen, v, reducer), lambda v: dgl.ops.segment_reduce(seglen, v, reducer),
                 (value,), f"segment_reduce {reducer}")
    _compare(lambda v: ops.segment_softmax(seglen, v), lambda v: dgl.ops.segment_softmax(seglen, v), (value,),
             "segment_softmax")
    a, b = _rand((10, 4), 15), _rand((5, 4, 3), 16)
    _compare(lambda a, b: ops.segment_mm(a, b, seglen), lambda a, b: dgl.ops.segment_mm(a, b, seglen), (a, b),
             "segment_mm")
    idx = torch.randint(0, 5, (10,))
    _compare(lambda a, b: ops.gather_mm(a, b, idx_b=idx), lambda a, b: dgl.ops.gather_mm(a, b, idx_b=idx), (a, b),
             "gather_mm")


def test_bilinear_ops_keep_compressed_operands(graphs):
    """``u_mul_v`` keeps each operand (compressed) for the other's gradient; ``u_mul_e_mean`` keeps its edge
    values exactly; gradients stay close to the exact ones."""
    g = graphs["homo"]
    a0, b0 = torch.randn(g.num_nodes(), 64, requires_grad=True), torch.randn(g.num_nodes(), 64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = ops.u_mul_v(g, a0 * 1.0, b0 * 1.0, config=INT8)
    # no float tensor of the operands' size is kept as is: only codes and per-group metadata
    assert not any(t.is_floating_point() and t.numel() >= a0.numel() for t in saved), \
        [(t.dtype, tuple(t.shape)) for t in saved]
    r = torch.randn(out.shape)
    ga, gb = torch.autograd.grad((out * r).sum(), [a0, b0])
    ea, eb = torch.autograd.grad((dgl.ops.u_mul_v(g, a0, b0) * r).sum(), [a0, b0])
    assert ((ga - ea).norm() / ea.norm()) < 0.05 and ((gb - eb).norm() / eb.norm()) < 0.05
    assert not torch.equal(ga, ea)
    # edge values of u_mul_e_mean: kept themselves (the feature gradient is exact)
    x0, w = torch.randn(g.num_nodes(), 4, 3, requires_grad=True), torch.rand(g.num_edges(), 3, requires_grad=True)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = ops.u_mul_e_mean(g, x0 * 1.0, w, config=INT2)
    assert any(t is w for t in saved)
    gx = torch.autograd.grad(out.sum(), x0)[0]
    torch.testing.assert_close(gx, torch.autograd.grad(dgl.ops.u_mul_e_mean(g, x0, w).sum(), x0)[0])


def test_u_mul_e_sum_general_path_compresses_features(graphs, monkeypatch):
    from dgl_exact.ops import keep as keeping

    g = graphs["homo"]
    made = []
    real = keeping.compress
    monkeypatch.setattr(keeping, "compress", lambda x, cfg: made.append(real(x, cfg)) or made[-1])
    x = torch.randn(g.num_nodes(), 8, 4, requires_grad=True)
    e = torch.rand(g.num_edges(), 4, requires_grad=True)
    out = ops.u_mul_e_sum(g, x * 1.0, e, config=INT2)  # [E, 4] against [N, 8, 4]: the general path
    assert len(made) == 1 and isinstance(made[0], CompressedTensor) and tuple(made[0].shape) == (g.num_nodes(), 8, 4)
    out.sum().backward()
    assert x.grad is not None and e.grad is not None


def test_config_is_keyword_only(graphs):
    g = graphs["homo"]
    with pytest.raises(TypeError):
        ops.u_mul_e_sum(g, torch.randn(g.num_nodes(), 2), torch.rand(g.num_edges()), OFF)
    with pytest.raises(TypeError):
        ops.u_mul_v(g, torch.randn(g.num_nodes(), 2), torch.randn(g.num_nodes(), 2), OFF)


@pytest.mark.slow
def test_general_path_double_backward(graphs):
    """Compression off: the general path's backward is differentiable (exact to second order); on, it
    refuses with the package's message."""
    g = graphs["homo"]
    n, m = g.num_nodes(), g.num_edges()
    a, b = _rand((n, 3), 17), _rand((n, 3), 18)
    x, e = _rand((n, 2, 3), 19), _rand((m, 3), 20, positive=True)
    with dgl_exact.config(enabled=False):
        assert torch.autograd.gradgradcheck(lambda a, b: torch.tanh(ops.u_mul_v(g, a * 1.0, b * 1.0)), (a, b))
        assert torch.autograd.gradgradcheck(lambda x, e: torch.tanh(ops.u_mul_e_sum(g, x * 1.0, e * 1.0)), (x, e))
    out = ops.u_mul_v(g, a * 1.0, b * 1.0, config=INT8)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), a, create_graph=True)
