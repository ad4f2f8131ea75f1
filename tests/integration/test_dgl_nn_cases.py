"""The kinds of cases DGL's own nn tests run for GraphConv, SAGEConv, GATConv and GCN2Conv, on dgl_exact's
modules against ``dgl.nn``'s (same initial parameters):

* compression off: output, input gradients and parameter gradients equal to DGL's (float tolerance);
* compression on (INT2): output equal to DGL's (the forward pass is exact), every gradient finite and of
  the right shape;

on both kernel paths (DGL's CPU kernels, and dgl_exact's torch kernels: the path GPU features take).

Graph kinds: a homogeneous graph with self loops (int64 and int32 ids), one with 0-in-degree nodes
(``allow_zero_in_degree``), a bipartite graph (pair input and single input), a DGL block, and a graph
without edges; options: every norm, weight and bias on/off, external weight, out size 1 / below / above
the input size, activations, edge weights (raw, ``EdgeWeightNorm``-ed, learnable), multi-dimensional
features, integer features, residual, attention returned, heads, ``feat_drop``/``attn_drop`` replaced by
``nn.Identity()``, SAGEConv's ``norm``, GCNII's variants, and ``HeteroGraphConv`` wrapping the modules.
Written for dgl_exact (DGL's test code is not copied); the whole file takes seconds.
"""
from __future__ import annotations

import io
import itertools
from typing import Callable, NamedTuple

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dgl_exact
from dgl_exact import CompressionConfig

import dgl  # noqa: E402  (after dgl_exact: installs the import shim)

pytestmark = pytest.mark.usefixtures("one_thread")

OFF = CompressionConfig(enabled=False)
INT2 = CompressionConfig(bits=2)
COMPRESSIONS = {"off": OFF, "int2": INT2}


def _graphs():
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 14, (50,), generator=gen), torch.randint(0, 14, (50,), generator=gen)
    homo = dgl.add_self_loop(dgl.remove_self_loop(dgl.graph((src, dst), num_nodes=14)))
    zero = dgl.graph((src[:20], dst[:20] % 7), num_nodes=14)  # nodes 7..13 have no in-edge
    bsrc, bdst = torch.randint(0, 9, (30,), generator=gen), torch.randint(0, 6, (30,), generator=gen)
    bipartite = dgl.heterograph({("_U", "_E", "_V"): (bsrc, torch.cat([torch.arange(6), bdst[6:]]))},
                                {"_U": 9, "_V": 6})
    block = dgl.to_block(dgl.in_subgraph(homo, torch.arange(5)), torch.arange(5))
    empty = dgl.heterograph({("_U", "_E", "_V"): ([], [])}, {"_U": 5, "_V": 3})
    return {"homo": homo, "homo-int32": homo.int(), "zero-degree": zero, "bipartite": bipartite,
            "bipartite-int32": bipartite.int(), "block": block, "empty": empty}


GRAPHS = _graphs()


class Case(NamedTuple):
    id: str
    graph: str
    make: Callable  # make(lib, **compression) -> module; lib is dgl.nn or dgl_exact
    inputs: Callable  # inputs(g) -> (positional args after the graph, keyword args)
    exact_only: bool = False  # integer inputs etc.: compared with compression off only
    # DGL's max aggregation over a graph without edges sends gradient to source node 0 (its default arg
    # index) although the output does not depend on the source features: there the gradients of the source
    # features and of the pooling layer must be 0
    pool_grads_zero: bool = False


def _randn(*shape, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _single(feats=5, tail=()):
    return lambda g: ((_randn(g.num_src_nodes(), *tail, feats),), {})


def _pair(src_feats=5, dst_feats=5):
    return lambda g: (((_randn(g.num_src_nodes(), src_feats), _randn(g.num_dst_nodes(), dst_feats, seed=2)),), {})


def _edge_weight(g, kind):
    w = torch.rand(g.num_edges(), generator=torch.Generator().manual_seed(3)) + 0.1
    if kind == "signed":
        w = w - 0.6
    if kind in ("both", "right"):
        w = dgl.nn.EdgeWeightNorm(norm=kind)(g, w)
    return w


def _with_edge_weight(inputs, kind="raw"):
    def build(g):
        args, kwargs = inputs(g)
        return args, dict(kwargs, edge_weight=_edge_weight(g, kind))

    return build


# --- cases ------------------------------------------------------------------------------------------
def _graphconv_cases():
    cases = []
    for norm, weight, bias, out in itertools.product(["none", "both", "right", "left"], [True, False],
                                                     [True, False], [1, 2, 8]):
        graph = ["homo", "homo-int32", "bipartite", "block"][(len(cases)) % 4]

        def make(lib, norm=norm, weight=weight, bias=bias, out=out, **c):
            return lib.GraphConv(5, out, norm=norm, weight=weight, bias=bias, **c)

        def inputs(g, weight=weight, out=out):
            args, kwargs = _single()(g)
            return args, (kwargs if weight else dict(kwargs, weight=_randn(5, out, seed=4)))

        cases.append(Case(f"gcn-{norm}-w{int(weight)}-b{int(bias)}-out{out}", graph, make, inputs))
    for norm, graph in itertools.product(["none", "both", "right"], ["homo", "bipartite", "block"]):
        cases.append(Case(f"gcn-ew-{norm}", graph, lambda lib, norm=norm, **c: lib.GraphConv(5, 3, norm=norm, **c),
                          _with_edge_weight(_single(), norm)))
    cases += [
        Case("gcn-pair", "bipartite", lambda lib, **c: lib.GraphConv(5, 2, **c), _pair(5, 2)),
        Case("gcn-zero-degree", "zero-degree",
             lambda lib, **c: lib.GraphConv(5, 4, allow_zero_in_degree=True, **c), _single()),
        Case("gcn-relu", "homo", lambda lib, **c: lib.GraphConv(5, 4, activation=torch.relu, **c), _single()),
        Case("gcn-elu-in>out", "block", lambda lib, **c: lib.GraphConv(5, 2, activation=F.elu, **c), _single()),
        Case("gcn-3d-none", "homo", lambda lib, **c: lib.GraphConv(5, 2, norm="none", **c), _single(tail=(3,))),
        Case("gcn-3d-both", "homo", lambda lib, **c: lib.GraphConv(5, 7, **c), _single(tail=(3,))),
        Case("gcn-3d-ew", "homo", lambda lib, **c: lib.GraphConv(5, 2, **c), _with_edge_weight(_single(tail=(3,)))),
    ]
    for norm, out in itertools.product(["both", "left"], [2, 8]):
        cases.append(Case(f"gcn-int64-{norm}-out{out}", "homo",
                          lambda lib, norm=norm, out=out, **c: lib.GraphConv(5, out, norm=norm, **c),
                          lambda g: ((torch.randint(0, 3, (g.num_src_nodes(), 5),
                                                    generator=torch.Generator().manual_seed(5)),), {}),
                          exact_only=True))
    return cases


def _sage_cases():
    cases = []
    for agg, graph, out in itertools.product(["mean", "gcn", "pool"], ["homo", "homo-int32", "block", "zero-degree"],
                                             [2, 10]):
        cases.append(Case(f"sage-{agg}-out{out}", graph,
                          lambda lib, agg=agg, out=out, **c: lib.SAGEConv(5, out, agg, **c), _single()))
    for agg, out in itertools.product(["mean", "pool"], [1, 2]):
        cases.append(Case(f"sage-{agg}-pair-out{out}", "bipartite",
                          lambda lib, agg=agg, out=out, **c: lib.SAGEConv((10, 5), out, agg, **c), _pair(10, 5)))
        cases.append(Case(f"sage-{agg}-no-edges-out{out}", "empty",
                          lambda lib, agg=agg, out=out, **c: lib.SAGEConv((3, 1), out, agg, **c), _pair(3, 1),
                          pool_grads_zero=agg == "pool"))
    cases.append(Case("sage-gcn-pair", "bipartite", lambda lib, **c: lib.SAGEConv((10, 10), 2, "gcn", **c),
                      _pair(10, 10)))
    cases.append(Case("sage-gcn-no-edges", "empty", lambda lib, **c: lib.SAGEConv((3, 3), 2, "gcn", **c),
                      _pair(3, 3)))
    for agg, graph in itertools.product(["mean", "gcn", "pool"], ["homo", "block"]):
        cases.append(Case(f"sage-{agg}-ew", graph, lambda lib, agg=agg, **c: lib.SAGEConv(5, 4, agg, **c),
                          _with_edge_weight(_single())))
    cases += [
        Case("sage-mean-nobias-relu-norm", "homo",
             lambda lib, **c: lib.SAGEConv(5, 4, "mean", bias=False, activation=torch.relu,
                                           norm=nn.LayerNorm(4), **c), _single()),
        Case("sage-gcn-elu", "block", lambda lib, **c: lib.SAGEConv(5, 4, "gcn", activation=F.elu, **c), _single()),
        Case("sage-mean-3d", "homo", lambda lib, **c: lib.SAGEConv(5, 4, "mean", **c), _single(tail=(2,))),
        Case("sage-pool-3d", "homo", lambda lib, **c: lib.SAGEConv(5, 4, "pool", **c), _single(tail=(2,))),
    ]
    return cases


def _gat_cases():
    cases = []
    for graph, out, heads in itertools.product(["homo", "homo-int32", "block"], [1, 5], [1, 4]):
        cases.append(Case(f"gat-out{out}-h{heads}", graph,
                          lambda lib, out=out, heads=heads, **c: lib.GATConv(5, out, heads, **c), _single()))
        cases.append(Case(f"gat-res-out{out}-h{heads}", graph,
                          lambda lib, out=out, heads=heads, **c: lib.GATConv(5, out, heads, residual=True, **c),
                          _single()))
    for out, heads in itertools.product([1, 2], [1, 4]):
        cases.append(Case(f"gat-pair-out{out}-h{heads}", "bipartite",
                          lambda lib, out=out, heads=heads, **c: lib.GATConv(5, out, heads, **c), _pair()))
        cases.append(Case(f"gat-pair-ew-out{out}-h{heads}", "bipartite",
                          lambda lib, out=out, heads=heads, **c: lib.GATConv(5, out, heads, **c),
                          _with_edge_weight(_pair(), "signed")))
    cases += [
        Case("gat-res-identity", "homo", lambda lib, **c: lib.GATConv(6, 3, 2, residual=True, **c), _single(6)),
        Case("gat-nobias-elu", "homo", lambda lib, **c: lib.GATConv(5, 3, 2, bias=False, activation=F.elu, **c),
             _single()),
        Case("gat-zero-degree", "zero-degree",
             lambda lib, **c: lib.GATConv(5, 3, 2, allow_zero_in_degree=True, **c), _single()),
        Case("gat-3d", "homo", lambda lib, **c: lib.GATConv(5, 3, 2, **c), _single(tail=(2,))),
        Case("gat-pair-dst-dim", "bipartite", lambda lib, **c: lib.GATConv((5, 4), 3, 2, residual=True, **c),
             _pair(5, 4)),
    ]
    return cases


def _gcn2_cases():
    cases = []
    for layer, bias, proj in itertools.product([1, 2], [True, False], [True, False]):
        def make(lib, layer=layer, bias=bias, proj=proj, **c):
            return lib.GCN2Conv(5, layer, alpha=0.5, bias=bias, project_initial_features=proj, **c)

        def feats(g):
            return (_randn(g.num_nodes(), 5), _randn(g.num_nodes(), 5, seed=2)), {}

        cases.append(Case(f"gcn2-l{layer}-b{int(bias)}-p{int(proj)}", ["homo", "homo-int32"][layer - 1], make, feats))
        cases.append(Case(f"gcn2-ew-l{layer}-b{int(bias)}-p{int(proj)}", "homo", make, _with_edge_weight(feats)))
    cases += [
        Case("gcn2-relu", "homo", lambda lib, **c: lib.GCN2Conv(5, 3, activation=torch.relu, **c),
             lambda g: ((_randn(g.num_nodes(), 5), _randn(g.num_nodes(), 5, seed=2)), {})),
        Case("gcn2-zero-degree", "zero-degree", lambda lib, **c: lib.GCN2Conv(5, 1, allow_zero_in_degree=True, **c),
             lambda g: ((_randn(g.num_nodes(), 5), _randn(g.num_nodes(), 5, seed=2)), {})),
    ]
    return cases


CASES = _graphconv_cases() + _sage_cases() + _gat_cases() + _gcn2_cases()


# --- the comparison ---------------------------------------------------------------------------------
def _build(case, compression):
    torch.manual_seed(0)
    ref = case.make(dgl.nn)
    ours = case.make(dgl_exact, compression=compression)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _run(module, g, args, kwargs, get_attention=False):
    """Output(s) and gradients w.r.t. floating inputs (positional, pair members, edge weight) and parameters."""
    leaves = []

    def leaf(t):
        if isinstance(t, tuple):
            return tuple(leaf(u) for u in t)
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            t = t.clone().requires_grad_()
            leaves.append(t)
        return t

    args = tuple(leaf(a) for a in args)
    kwargs = {k: leaf(v) for k, v in kwargs.items()}
    if get_attention:
        kwargs["get_attention"] = True
    out = module(g, *args, **kwargs)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * _randn(*o.shape, seed=7 + i)).sum() for i, o in enumerate(outs))
    wrt = leaves + list(module.parameters())
    grads = torch.autograd.grad(loss, wrt, allow_unused=True) if loss.requires_grad else [None] * len(wrt)
    names = [f"input{i}" for i in range(len(leaves))] + [n for n, _ in module.named_parameters()]
    return outs, [torch.zeros_like(w) if gr is None else gr for w, gr in zip(wrt, grads)], wrt, names


def _check(case, compression_name, get_attention=False):
    g = GRAPHS[case.graph]
    ref, ours = _build(case, COMPRESSIONS[compression_name])
    ref.train(), ours.train()
    args, kwargs = case.inputs(g)
    data_before = (set(g.ndata), set(g.edata))
    ref_outs, ref_grads, _, _ = _run(ref, g, args, kwargs, get_attention)
    outs, grads, wrt, names = _run(ours, g, args, kwargs, get_attention)
    assert (set(g.ndata), set(g.edata)) == data_before, "the module left data on the graph"
    for o, r in zip(outs, ref_outs):
        assert o.shape == r.shape and o.dtype == r.dtype
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6)
    for gr, r, w, name in zip(grads, ref_grads, wrt, names):
        assert gr.shape == w.shape
        if case.pool_grads_zero and name in ("input0", "fc_pool.weight", "fc_pool.bias"):
            assert not gr.any(), name
        elif compression_name == "off":
            torch.testing.assert_close(gr, r, rtol=1e-4, atol=1e-5)
        else:
            assert torch.isfinite(gr).all()


@pytest.mark.parametrize("compression", ["off", "int2"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.id}@{c.graph}")
def test_matches_dgl(case, compression, kernel_path):
    if case.exact_only and compression != "off":
        pytest.skip("integer inputs: compared with compression off")
    _check(case, compression)


GAT_ATTENTION = [c for c in CASES if c.id.startswith("gat-") and "res" not in c.id][:6]


@pytest.mark.parametrize("case", GAT_ATTENTION, ids=lambda c: f"{c.id}@{c.graph}")
def test_gat_attention_returned(case):
    _check(case, "off", get_attention=True)


@pytest.mark.parametrize("cls,args", [("SAGEConv", (5, 4, "mean")), ("SAGEConv", (5, 4, "pool")),
                                      ("GATConv", (5, 3, 2))])
@pytest.mark.parametrize("what", ["feat_drop", "attn_drop", "fc"])
@pytest.mark.parametrize("compression", ["off", "int2"])
def test_replaced_submodules_applied_as_dgl_does(cls, args, what, compression):
    if what == "attn_drop" and cls != "GATConv":
        pytest.skip("SAGEConv has no attention")
    g = GRAPHS["homo"]
    torch.manual_seed(0)
    ref = getattr(dgl.nn, cls)(*args)
    ours = getattr(dgl_exact, cls)(*args, compression=COMPRESSIONS[compression])
    ours.load_state_dict(ref.state_dict())
    for m in (ref, ours):
        if what == "fc":
            name = "fc" if cls == "GATConv" else "fc_self"
            old = getattr(m, name)
            setattr(m, name, nn.Sequential(old, nn.Tanh()))
        else:
            setattr(m, what, nn.Identity())
    x = _randn(g.num_nodes(), 5)
    ref_outs, ref_grads, _, _ = _run(ref, g, (x,), {})
    outs, grads, _, _ = _run(ours, g, (x,), {})
    torch.testing.assert_close(outs[0], ref_outs[0], rtol=1e-5, atol=1e-6)
    for gr, r in zip(grads, ref_grads):
        if compression == "off":
            torch.testing.assert_close(gr, r, rtol=1e-4, atol=1e-5)
        assert torch.isfinite(gr).all()


def test_gat_replaced_leaky_relu_runs_dgl_path():
    g = GRAPHS["homo"]
    torch.manual_seed(0)
    ref, ours = dgl.nn.GATConv(5, 3, 2), dgl_exact.GATConv(5, 3, 2)
    ours.load_state_dict(ref.state_dict())
    ref.leaky_relu, ours.leaky_relu = nn.ELU(), nn.ELU()
    x = _randn(g.num_nodes(), 5)
    with pytest.warns(UserWarning, match="uncompressed"):
        out = ours(g, x)
    torch.testing.assert_close(out, ref(g, x))


@pytest.mark.parametrize("agg", ["sum", "stack"])
@pytest.mark.parametrize("compression", ["off", "int2"])
def test_inside_hetero_graph_conv(agg, compression):
    g = dgl.heterograph({("user", "follows", "user"): ([0, 0, 2, 1], [1, 2, 1, 3]),
                         ("user", "plays", "game"): ([0, 0, 0, 1, 2], [0, 2, 3, 0, 2]),
                         ("store", "sells", "game"): ([0, 0, 1, 1], [0, 3, 1, 2])})
    feats = {"user": _randn(4, 2), "game": _randn(4, 4, seed=2), "store": _randn(2, 3, seed=3)}

    def make(lib, **c):
        torch.manual_seed(0)
        return dgl.nn.HeteroGraphConv({
            "follows": lib.GraphConv(2, 3, allow_zero_in_degree=True, **c),
            "plays": lib.SAGEConv((2, 4), 4, "mean", **c),
            "sells": lib.GraphConv(3, 4, allow_zero_in_degree=True, **c)}, agg)

    ref, ours = make(dgl.nn), make(dgl_exact, compression=COMPRESSIONS[compression])
    ours.load_state_dict(ref.state_dict())
    block = dgl.to_block(g, {"user": [0, 1, 2, 3], "game": [0, 1, 2, 3], "store": []})
    no_edges = g.clone()
    for etype in no_edges.canonical_etypes:
        no_edges = dgl.remove_edges(no_edges, no_edges.edges(form="eid", etype=etype), etype=etype)
    for graph, inputs in [(g, feats), (block, (feats, {**feats, "store": feats["store"][:0]})),
                          (no_edges, feats)]:
        outs = []
        for m in (ref, ours):
            out = m(graph, inputs)
            loss = sum((v * v).sum() for v in out.values())
            outs.append((out, torch.autograd.grad(loss, list(m.parameters()), allow_unused=True)))
        (ref_out, ref_g), (out, gs) = outs
        assert set(out) == set(ref_out)
        for k in out:
            torch.testing.assert_close(out[k], ref_out[k], rtol=1e-5, atol=1e-6)
        for a, b in zip(gs, ref_g):
            if b is None:
                assert a is None or not a.any()
            elif compression == "off":
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
            else:
                assert torch.isfinite(a).all()


@pytest.mark.parametrize("cls,args", [("GraphConv", (5, 2)), ("SAGEConv", (5, 2, "pool")), ("GATConv", (5, 2, 3)),
                                      ("GCN2Conv", (5, 1))])
def test_pickle_and_reset_parameters(cls, args):
    module = getattr(dgl_exact, cls)(*args, compression=INT2)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded) is type(module) and loaded.compression == INT2
    for a, b in zip(module.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(a, b)
    before = [p.detach().clone() for p in module.parameters()]
    module.reset_parameters()
    assert any(not torch.equal(a, p) for a, p in zip(before, module.parameters()) if a.numel() > 1)
