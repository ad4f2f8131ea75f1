"""Graphs in int32 ids with only the sparse formats training needs: the conversion, what it keeps, that every
model computes exactly what it computes on the int64 COO graph (both kernel paths), the structure cache's
contents, the loaders, the trainer and the planner."""
from __future__ import annotations

import pytest
import torch

import dgl_exact  # noqa: F401  (before dgl)
from dgl_exact import CompressionConfig
from dgl_exact.data import compact as compact_mod
from dgl_exact.data import load_dataset
from dgl_exact.data.compact import TRAINING_FORMATS, compact_graph, describe_structure, index_dtype, structure_bytes
from dgl_exact.ops.structure import _adj_tensors, device_kernels_only, structure_of

import dgl  # noqa: E402  (after dgl_exact)

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = "synthetic-small:num_nodes=300,num_features=16,num_classes=4"


def _graph(n=60, e=400, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    return dgl.add_self_loop(dgl.remove_self_loop(dgl.graph((src, dst), num_nodes=n)))


def test_index_dtype_thresholds():
    assert index_dtype(10, 10) == torch.int32
    assert index_dtype(2 ** 31 - 1, 2 ** 31 - 1) == torch.int32
    assert index_dtype(2 ** 31, 5) == torch.int64
    assert index_dtype(5, 2 ** 31) == torch.int64


def test_compact_graph_keeps_edges_order_and_data():
    g = _graph()
    g.ndata["x"] = torch.randn(g.num_nodes(), 3)
    h = compact_graph(g, TRAINING_FORMATS)
    assert h.idtype == torch.int32
    assert sorted(h.formats()["created"]) == ["csc", "csr"] and not h.formats()["not created"]
    assert h.ndata["x"].data_ptr() == g.ndata["x"].data_ptr()  # shared, not copied
    for fmt in ("csc", "csr"):  # the same arrays as the int64 graph's, edge ids included (same sums)
        for a, b in zip(_adj_tensors(g._graph, fmt), _adj_tensors(h._graph, fmt)):
            assert (a is None and b is None) or torch.equal(a, b.long())
    assert structure_bytes(h) == 2 * 4 * (g.num_nodes() + 1 + 2 * g.num_edges())
    assert describe_structure(h).startswith("int32 ids, ")
    assert compact_graph(h, TRAINING_FORMATS) is h  # nothing to change
    assert compact_graph(h) is h


def test_compact_graph_keeps_int64_beyond_the_limit(monkeypatch):
    monkeypatch.setattr(compact_mod, "INT32_LIMIT", 50)
    g = _graph(n=60)
    assert compact_graph(g).idtype == torch.int64
    assert compact_graph(g.int()).idtype == torch.int64  # widened when the counts need it


@pytest.mark.parametrize("path", ["dgl_kernels", "device_kernels"])
@pytest.mark.parametrize("model", ["gcn", "sage", "gat", "gcn2"])
def test_models_compute_the_same_on_int32_graphs(model, path):
    """A fast path never changes what a model computes: INT2 training steps (stochastic rounding seeded alike)
    give bit-identical outputs and gradients on the int64 COO graph and its compact form."""
    from dgl_exact import config as compression_scope
    from dgl_exact.training.models import build_model

    g = _graph(n=80, e=600, seed=1)
    h = compact_graph(g, TRAINING_FORMATS)
    x = torch.randn(g.num_nodes(), 8)
    results = []
    for graph in (g, h):
        torch.manual_seed(0)
        net = build_model(model, 8, 3, hidden=16, layers=2, dropout=0.5)
        scope = device_kernels_only() if path == "device_kernels" else torch.enable_grad()
        with scope, compression_scope(CompressionConfig(bits=2)):
            torch.manual_seed(5)
            out = net(graph, x)
            out.square().sum().backward()
        results.append([out.detach()] + [p.grad.clone() for p in net.parameters() if p.grad is not None])
    assert len(results[0]) == len(results[1]) > 1
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_structure_cache_keeps_no_copy_of_the_structure():
    """Nothing per edge is cached: GCN's per-edge source norm is built for each forward call and freed (the
    edge sources it is gathered with are DGL's), and the cache holds only the degrees, as it says."""
    from dgl_exact.nn import GraphConv

    h = compact_graph(_graph(), TRAINING_FORMATS)
    x = torch.randn(h.num_nodes(), 4, requires_grad=True)
    GraphConv(4, 2)(h, x).sum().backward()
    st = structure_of(h, "cpu")
    assert st._src is None and st._dst is None and st._csc is None and st._csr is None
    assert st.in_degrees().dtype == torch.int32 and st.out_degrees().dtype == torch.int32
    held = st.static_tensors()
    assert st.nbytes() == sum(t.numel() * t.element_size() for t in held)
    assert st.nbytes() == 2 * h.num_nodes() * 4  # two int32 degree vectors
    norm = st.src_edge_norm("out", "sqrt", torch.float32)
    src, dst = h.int().formats(["coo", "csr", "csc"]).edges(order="eid")
    assert torch.equal(norm, st.out_degrees().float().clamp(min=1).pow(-0.5)[src.long()])
    assert not any(t is norm for t in st.static_tensors())
    # the edge endpoints, when an op needs them, come from CSR / CSC in edge-id order
    assert torch.equal(st.src, src) and torch.equal(st.dst, dst)


def test_loader_compacts_on_request_and_trainer_keeps_int32_structure(tmp_path):
    """``load_dataset`` gives DGL's int64 ids unless asked (``compact=True``, as the trainer loads); the
    trainer prepares its own int32 CSC+CSR graph from a user's int64 dataset, leaving the dataset as it was."""
    from dgl_exact.training.config import TrainConfig
    from dgl_exact.training.trainer import Trainer

    assert load_dataset(SMALL, "unused", compact=True).graph.idtype == torch.int32
    ds = load_dataset(SMALL, "unused")
    assert ds.graph.idtype == torch.int64
    full = Trainer(TrainConfig(dataset=SMALL, data_root=str(tmp_path), epochs=1, hidden=8), dataset=ds,
                   progress=False, log=None)
    assert full.graph.idtype == torch.int32
    # the synthetic graph is symmetric: GCN trains from its CSC alone, GAT's attention needs the CSR too
    assert full.graph.formats()["created"] == ["csc"]
    assert full.structure_note.startswith("int32 ids, csc, ")
    full.fit()
    gat = Trainer(TrainConfig(dataset=SMALL, data_root=str(tmp_path), epochs=1, hidden=8, model="gat", heads=2),
                  dataset=ds, progress=False, log=None)
    assert sorted(gat.graph.formats()["created"]) == ["csc", "csr"]
    gat.fit()
    sampled = Trainer(TrainConfig(dataset=SMALL, data_root=str(tmp_path), epochs=1, hidden=8, sampler="cluster",
                                  num_parts=4, parts_per_batch=2), dataset=ds, progress=False, log=None)
    assert "coo" in sampled.graph.formats()["created"]  # samplers read the COO
    sampled.fit()
    assert ds.graph.idtype == torch.int64  # the user's dataset is not changed


def test_planner_counts_formats_in_the_trainers_id_type():
    from dgl_exact.planning.predict import _format_bytes

    assert _format_bytes(["csc", "csr"], 100, 1000) == 2 * 4 * (101 + 2000)
    assert _format_bytes(["coo"], 2 ** 31, 10) == 8 * 20


# --- a symmetric graph from its CSC alone ----------------------------------------------------------------
def _symmetric(n=60, e=300, seed=0):
    """An undirected multigraph stored with both directions, self loops added (as the trainer's GCN sees it)."""
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    g = dgl.graph((torch.cat([src, dst]), torch.cat([dst, src])), num_nodes=n)
    return dgl.add_self_loop(dgl.remove_self_loop(g))


@pytest.mark.parametrize("chunk", [1 << 24, 50, 1])
def test_is_symmetric_is_exact_in_every_format(monkeypatch, chunk):
    """Exact at any node-range size (the keys are compared range by range)."""
    from dgl_exact.ops import is_symmetric
    from dgl_exact.ops import structure as structure_mod

    monkeypatch.setattr(structure_mod, "SYMMETRY_CHUNK_EDGES", chunk)

    g = _symmetric()
    for fmts in (["coo"], ["csr"], ["csc"]):
        h = g.formats(fmts)
        h.create_formats_()
        assert is_symmetric(h)
    assert is_symmetric(dgl.graph(([0, 0, 1, 1], [1, 1, 0, 0]), num_nodes=3))  # multi-edges, both ways
    assert not is_symmetric(dgl.graph(([0, 0, 1], [1, 1, 0]), num_nodes=3))  # 0->1 twice, 1->0 once
    # a directed cycle: every node's in- and out-degree is 1, yet no edge has its reverse
    cycle = dgl.graph(([0, 1, 2], [1, 2, 0]), num_nodes=3)
    assert not is_symmetric(cycle)
    assert not is_symmetric(dgl.graph(([0, 1], [1, 2]), num_nodes=3))
    assert not is_symmetric(dgl.to_block(g, torch.arange(10)))  # blocks never are
    assert is_symmetric(dgl.graph(([], []), num_nodes=4))  # no edges
    # a directed triangle added to a symmetric graph: every degree still matches
    s, d = g.edges()
    tri = dgl.graph((torch.cat([s, torch.tensor([0, 1, 2])]), torch.cat([d, torch.tensor([1, 2, 0])])),
                    num_nodes=g.num_nodes())
    assert not is_symmetric(tri)


def test_csc_graph_holds_the_csc_alone_without_edge_ids():
    g = _symmetric()
    g.ndata["x"] = torch.randn(g.num_nodes(), 3)
    g.edata["w"] = torch.randn(g.num_edges())
    h = compact_mod.csc_graph(g)
    assert h.idtype == torch.int32
    assert h.formats() == {"created": ["csc"], "not created": []}
    indptr, indices, eids = h._graph.adjacency_matrix_tensors(0, True, "csr")[2:]
    assert eids.numel() == 0  # edge ids are positions: no array
    assert structure_bytes(h) == 4 * (g.num_nodes() + 1 + g.num_edges())
    assert h.ndata["x"].data_ptr() == g.ndata["x"].data_ptr()
    # the same in-edges per node in the same order (the same forward sums), edge data moved with its edge
    g_indptr, g_indices, g_eids = _adj_tensors(g._graph, "csc")
    assert torch.equal(indptr.long(), g_indptr) and torch.equal(indices.long(), g_indices)
    assert torch.equal(h.edata["w"], g.edata["w"][g_eids if g_eids is not None else slice(None)])
    assert compact_mod.csc_graph(h) is h


def test_training_graph_picks_the_csc_alone_only_for_symmetric_graphs():
    from dgl_exact.ops.structure import structure_of

    sym = compact_mod.training_graph(_symmetric())
    assert sym.formats()["created"] == ["csc"] and structure_of(sym, "cpu").symmetric
    directed = compact_mod.training_graph(_graph())
    assert sorted(directed.formats()["created"]) == ["csc", "csr"] and not structure_of(directed, "cpu").symmetric
    both = compact_mod.training_graph(_symmetric(), csc_only=False)
    assert sorted(both.formats()["created"]) == ["csc", "csr"]


def test_out_degrees_and_endpoints_of_a_csc_only_graph():
    """DGL computes out-degrees from a COO or CSR only; the structure counts them from the CSC."""
    g = compact_graph(_graph(), TRAINING_FORMATS)  # directed: out- and in-degrees differ
    h = compact_mod.csc_graph(g)
    st = structure_of(h, "cpu")
    assert torch.equal(st.out_degrees(), g.out_degrees()) and torch.equal(st.in_degrees(), g.in_degrees())
    src, dst = h.formats(["coo", "csr", "csc"]).edges(order="eid")
    assert torch.equal(st.src, src) and torch.equal(st.dst, dst)


@pytest.mark.parametrize("path", ["dgl_kernels", "device_kernels"])
@pytest.mark.parametrize("model", ["gcn", "sage", "gcn2"])
def test_models_on_the_symmetric_csc_compute_what_they_compute_with_a_csr(model, path):
    """A fast path never changes what a model computes: INT2 training steps (stochastic rounding seeded alike)
    on a symmetric graph's CSC alone give the outputs of the CSC+CSR graph bit for bit (the same forward
    sums) and its gradients up to the summation order of backward's transposed sums."""
    from dgl_exact import config as compression_scope
    from dgl_exact.training.models import build_model

    g = _symmetric(n=80, e=400, seed=1)
    graphs = (compact_graph(g, TRAINING_FORMATS), compact_mod.training_graph(g))
    assert graphs[1].formats()["created"] == ["csc"]
    x = torch.randn(g.num_nodes(), 8)
    results = []
    for graph in graphs:
        torch.manual_seed(0)
        net = build_model(model, 8, 3, hidden=16, layers=3, dropout=0.5, batch_norm=True)
        scope = device_kernels_only() if path == "device_kernels" else torch.enable_grad()
        with scope, compression_scope(CompressionConfig(bits=2)):
            torch.manual_seed(5)
            out = net(graph, x)
            out.square().sum().backward()
        results.append([out.detach()] + [p.grad.clone() for p in net.parameters() if p.grad is not None])
    assert len(results[0]) == len(results[1]) > 1
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1:], results[1][1:]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("norm", ["both", "right", "left", "none"])
def test_graphconv_on_the_symmetric_csc_matches_dgl(norm):
    """dgl_exact's GraphConv on the CSC alone against DGL's on the int64 COO graph: the same outputs and input
    gradients (compression off), double backward included."""
    from dgl_exact import config as compression_scope
    from dgl_exact.nn import GraphConv

    g = _symmetric(seed=3)
    h = compact_mod.training_graph(g)
    torch.manual_seed(0)
    ours, theirs = GraphConv(6, 6, norm=norm), dgl.nn.GraphConv(6, 6, norm=norm)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(g.num_nodes(), 6)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    with compression_scope(enabled=False):
        ya = ours(h, xa)
        yb = theirs(g, xb)
        torch.testing.assert_close(ya, yb)
        (ga,) = torch.autograd.grad(ya.square().sum(), xa, create_graph=True)
        (gb,) = torch.autograd.grad(yb.square().sum(), xb, create_graph=True)
        torch.testing.assert_close(ga, gb)
        torch.testing.assert_close(torch.autograd.grad(ga.sum(), xa)[0], torch.autograd.grad(gb.sum(), xb)[0])


def test_edge_weighted_transpose_on_a_csc_only_graph_stays_exact():
    """GAT's backward aggregates with per-edge weights, which the symmetric CSC cannot serve: DGL builds the
    transposed format for it (in the reverse graph the structure holds; no saving, hence the trainer keeps
    CSC and CSR for GAT), and the gradients are those of the CSC+CSR graph."""
    from dgl_exact import config as compression_scope
    from dgl_exact.nn import GATConv

    g = _symmetric()
    results = []
    for graph in (compact_mod.training_graph(g), compact_graph(g, TRAINING_FORMATS)):
        torch.manual_seed(0)
        conv = GATConv(4, 2, num_heads=2)
        x = torch.randn(g.num_nodes(), 4, generator=torch.Generator().manual_seed(1), requires_grad=True)
        with compression_scope(enabled=False):
            out = conv(graph, x)
            out.square().sum().backward()
        results.append((out.detach(), x.grad, conv.attn_l.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b)


def test_a_symmetric_mark_survives_the_cache_bound(monkeypatch):
    from dgl_exact.ops import structure as structure_mod

    monkeypatch.setattr(structure_mod, "MAX_CACHED_GRAPHS", 2)
    h = compact_mod.training_graph(_symmetric())
    others = [compact_graph(_graph(seed=s)) for s in range(4)]
    for o in others:
        structure_of(o, "cpu")
    assert structure_of(h, "cpu").symmetric


def _kept(g, frac=0.6, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(g.num_edges(), generator=gen)[int(g.num_edges() * frac):].sort().values


@pytest.mark.parametrize("held", ["csc+csr", "csc", "csr", "coo"])
def test_keep_edges_is_the_edge_subgraph_without_a_coo(held):
    g = _graph().int()
    g.edata["w"] = torch.rand(g.num_edges(), generator=torch.Generator().manual_seed(2))
    g.ndata["x"] = torch.arange(g.num_nodes())
    keep = _kept(g)
    ref = dgl.edge_subgraph(g, keep.int(), relabel_nodes=False, store_ids=False)
    t = {"csc+csr": lambda: compact_graph(g, TRAINING_FORMATS), "csc": lambda: compact_graph(g, ["csc"]),
         "csr": lambda: compact_graph(g, ["csr"]), "coo": lambda: g}[held]()
    before = t.formats()
    out = compact_mod.keep_edges(t, keep)
    assert t.formats() == before                                   # nothing created on the graph given
    assert sorted(out.formats()["created"] + out.formats()["not created"]) == sorted(
        before["created"] + before["not created"])                 # the formats it allows, no others
    if held != "coo":
        assert "coo" not in out.formats()["created"]
    assert out.num_nodes() == g.num_nodes() and out.num_edges() == keep.numel() and out.idtype == g.idtype
    assert out.ndata["x"].data_ptr() == g.ndata["x"].data_ptr()   # node data shared
    assert torch.equal(out.edata["w"], ref.edata["w"])
    every = compact_mod.allow_all_formats(out)
    for a, b in zip(every.edges(order="eid"), ref.edges(order="eid")):  # edge i of both: the same endpoints
        assert torch.equal(a, b)
    held_fmt = "csr" if held == "csr" else "csc"                    # masked in its order: the same arrays
    for a, b in zip(out.adj_tensors(held_fmt), ref.adj_tensors(held_fmt)):
        assert torch.equal(a, b)


def test_keep_edges_without_edge_ids_and_with_empty_rows():
    g = _graph(n=80, e=60)          # nodes without in-edges besides their self loop, and a symmetric CSC alone
    g = dgl.graph((torch.cat([g.edges()[0], g.edges()[1]]), torch.cat([g.edges()[1], g.edges()[0]])),
                  num_nodes=82)     # two isolated nodes at the end
    c = compact_mod.csc_graph(g)
    assert compact_mod.held_formats(c) == ["csc without edge ids"]
    keep = _kept(c, frac=0.5)
    out = compact_mod.keep_edges(c, keep)
    assert compact_mod.held_formats(out) == ["csc without edge ids"] and out.formats()["not created"] == []
    ref = dgl.edge_subgraph(compact_mod.allow_all_formats(c), keep.int(), relabel_nodes=False, store_ids=False)
    for a, b in zip(out.adj_tensors("csc")[:2], ref.adj_tensors("csc")[:2]):
        assert torch.equal(a, b)
    assert torch.equal(ref.adj_tensors("csc")[2].long(), torch.arange(keep.numel()))
    none = compact_mod.keep_edges(c, keep[:0])
    assert none.num_edges() == 0 and none.num_nodes() == 82
