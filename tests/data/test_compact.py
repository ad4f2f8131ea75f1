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
    """GCN's per-edge norm is the cache's only per-edge tensor: the edge sources it is gathered with are
    not kept (DGL holds the structure), and the cache says its size."""
    from dgl_exact.nn import GraphConv

    h = compact_graph(_graph(), TRAINING_FORMATS)
    GraphConv(4, 2)(h, torch.randn(h.num_nodes(), 4))
    st = structure_of(h, "cpu")
    norm = st.src_edge_norm("out", "sqrt", torch.float32)
    assert st._src is None and st._dst is None and st._csc is None and st._csr is None
    assert st.in_degrees().dtype == torch.int32 and st.out_degrees().dtype == torch.int32
    held = st.static_tensors()
    assert any(t is norm for t in held)
    assert st.nbytes() == sum(t.numel() * t.element_size() for t in held)
    assert st.nbytes() == h.num_edges() * 4 + 2 * h.num_nodes() * 4  # the norm, two int32 degree vectors
    # the edge endpoints, when an op needs them, come from CSR / CSC in edge-id order
    src, dst = h.int().formats(["coo", "csr", "csc"]).edges(order="eid")
    assert torch.equal(st.src, src) and torch.equal(st.dst, dst)


def test_loader_compacts_on_request_and_trainer_keeps_int32_csc_csr(tmp_path):
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
    assert sorted(full.graph.formats()["created"]) == ["csc", "csr"]
    assert full.structure_note.startswith("int32 ids, ")
    full.fit()
    sampled = Trainer(TrainConfig(dataset=SMALL, data_root=str(tmp_path), epochs=1, hidden=8, sampler="cluster",
                                  num_parts=4, parts_per_batch=2), dataset=ds, progress=False, log=None)
    assert "coo" in sampled.graph.formats()["created"]  # samplers read the COO
    sampled.fit()
    assert ds.graph.idtype == torch.int64  # the user's dataset is not changed


def test_planner_counts_formats_in_the_trainers_id_type():
    from dgl_exact.planning.predict import _format_bytes

    assert _format_bytes(["csc", "csr"], 100, 1000) == 2 * 4 * (101 + 2000)
    assert _format_bytes(["coo"], 2 ** 31, 10) == 8 * 20
