"""DGL's kernels bound once (dgl_exact/ops/dgl_originals.py): routing ``dgl.ops`` through dgl_exact does not
recurse, and every op gives what it gives unrouted."""
from __future__ import annotations

import importlib

import pytest
import torch

import dgl_exact
from dgl_exact import ops
from dgl_exact.ops import dgl_originals

import dgl  # noqa: E402  (after dgl_exact)
import dgl.ops  # noqa: E402

SPMM = {"add", "sub", "mul", "div"}
REDUCERS = {"sum", "mean", "max", "min"}


def _names():
    return sorted(n for n in dir(dgl.ops) if not n.startswith("_") and callable(getattr(dgl.ops, n)))


def _inputs(g, seed):
    gen = torch.Generator().manual_seed(seed)

    def rand(rows, *shape, positive=False):
        t = torch.rand((rows,) + shape, generator=gen, dtype=torch.float64)
        return (t + 0.5 if positive else t * 2 - 1).requires_grad_()

    n, m = g.num_nodes(), g.num_edges()
    return {"u": rand(n, 2, 3), "v": rand(n, 2, 3, positive=True), "e": rand(m, 2, 3, positive=True),
            "seg": rand(10, 3), "a": rand(10, 4), "b": rand(5, 4, 3)}


def _call(lib, name, g, t):
    """``lib.<name>`` (``lib``: dgl.ops or dgl_exact.ops) on inputs of the shapes it takes; returns
    ``(output, leaves)``."""
    seglen = torch.tensor([2, 3, 0, 4, 1])
    fn = getattr(lib, name)
    parts = name.split("_")
    if name == "gspmm":
        return fn(g, "mul", "sum", t["u"], t["e"]), [t["u"], t["e"]]
    if name == "gsddmm":
        return fn(g, "dot", t["u"], t["v"], "u", "v"), [t["u"], t["v"]]
    if name in ("copy_u", "copy_v", "copy_e"):
        x = t[name[-1]]
        return fn(g, x), [x]
    if name == "edge_softmax":
        return fn(g, t["e"]), [t["e"]]
    if name in ("segment_reduce", "segment_softmax"):
        return (fn(seglen, t["seg"], "sum") if name == "segment_reduce" else fn(seglen, t["seg"])), [t["seg"]]
    if name == "segment_mm":
        return fn(t["a"], t["b"], seglen), [t["a"], t["b"]]
    if name == "gather_mm":
        return fn(t["a"], t["b"], idx_b=torch.tensor([0, 1, 2, 3, 4, 4, 3, 2, 1, 0])), [t["a"], t["b"]]
    if parts[0] == "copy":  # copy_u_<reduce>, copy_e_<reduce>
        x = t[parts[1]]
        return fn(g, x), [x]
    if len(parts) == 4 and parts[1] in SPMM and parts[3] in REDUCERS:  # u_<op>_e_<reduce>
        return fn(g, t["u"], t["e"]), [t["u"], t["e"]]
    lhs, _, rhs = parts  # <lhs>_<op>_<rhs>
    return fn(g, t[lhs], t[rhs]), [t[lhs], t[rhs]]


def _result(lib, name, g, seed=0):
    t = _inputs(g, seed)
    out, leaves = _call(lib, name, g, t)
    finite = torch.isfinite(out)
    grads = torch.autograd.grad(out.masked_fill(~finite, 0).sum(), leaves, allow_unused=True)
    return out.detach(), [None if gr is None else gr.detach() for gr in grads]


@pytest.fixture()
def graph():
    torch.manual_seed(0)
    return dgl.add_self_loop(dgl.rand_graph(12, 40))


def test_originals_are_dgls_own_functions():
    bound = dgl_originals.originals()
    for name, module_name in dgl_originals.ORIGINS.items():
        assert getattr(bound, name) is getattr(importlib.import_module(module_name), name)
        assert getattr(bound, name).__module__ == module_name
    assert dgl_originals.originals() is bound  # bound once


def test_every_op_routed_through_dgl_exact_equals_unrouted(graph, monkeypatch):
    names = _names()
    assert len(names) == 64
    with dgl_exact.config(enabled=False):
        expected = {name: _result(dgl.ops, name, graph) for name in names}
        for name in names:
            monkeypatch.setattr(dgl.ops, name, getattr(ops, name))
        for name in names:
            assert getattr(dgl.ops, name) is getattr(ops, name)
            for lib in (dgl.ops, ops):  # the routed name and dgl_exact's own: neither recurses
                out, grads = _result(lib, name, graph)
                ref_out, ref_grads = expected[name]
                torch.testing.assert_close(out, ref_out, msg=lambda m: f"{name}: {m}")
                for a, b in zip(grads, ref_grads):
                    if a is None or b is None:
                        assert (a is None or not a.any()) and (b is None or not b.any()), name
                    else:
                        torch.testing.assert_close(a, b, msg=lambda m: f"{name} grad: {m}")


@pytest.mark.parametrize("conv", ["GraphConv", "GraphConv-weighted", "GATConv"])
def test_dgl_convs_with_dgl_ops_routed_equal_unrouted(conv, graph, monkeypatch):
    torch.manual_seed(1)
    feat = torch.randn(graph.num_nodes(), 5, dtype=torch.float64)
    module = (dgl.nn.GATConv(5, 4, num_heads=2) if conv == "GATConv" else dgl.nn.GraphConv(5, 4)).double()
    kwargs = {"edge_weight": torch.rand(graph.num_edges(), dtype=torch.float64)} if conv.endswith("weighted") else {}

    def run():
        module.zero_grad()
        x = feat.clone().requires_grad_()
        out = module(graph, x, **kwargs)
        out.pow(2).sum().backward()
        return [out.detach(), x.grad] + [p.grad.clone() for p in module.parameters()]

    want = run()  # DGL's own ops
    # the convs' update_all/apply_edges look dgl.ops up at call time: now they run dgl_exact's ops
    for name in _names():
        monkeypatch.setattr(dgl.ops, name, getattr(ops, name))
    with dgl_exact.config(enabled=False):
        got = run()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


def test_a_replaced_dgl_submodule_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.setattr(dgl_originals, "_bound", None)
    monkeypatch.setattr(importlib.import_module("dgl.ops.spmm"), "gspmm", ops.gspmm)
    with pytest.raises(RuntimeError, match=r"dgl\.ops\.spmm\.gspmm is not DGL's own function.*dgl\.ops\.gspmm = "):
        dgl_originals.originals()
