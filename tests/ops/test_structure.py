"""The graph-structure cache (ops/structure.py) lets go of graphs: entries die with their graph.

Mini-batch training creates new blocks every step; each gets a cache entry that must go with the block
(the cache used to hold the structure object it was keyed on, so nothing was ever freed). Still: reuse
across calls on one graph and refresh on mutation (tests/nn/test_modules.py), backward after the caller
dropped the graph, and a bounded number of entries even for graphs the caller keeps alive.
"""
import contextlib
import gc
import weakref

import pytest
import torch

pytest.importorskip("dgl", reason="needs DGL (the DGL front end); the no-DGL CI job runs without it")

import dgl_exact
from dgl_exact._compat import import_dgl
from dgl_exact.ops import structure as structure_mod

dgl = import_dgl()


def _entries() -> int:
    gc.collect()
    return structure_mod.cache_size()


class _SAGE(torch.nn.Module):
    def __init__(self, d_in, d_hidden, d_out):
        super().__init__()
        self.l1 = dgl_exact.SAGEConv(d_in, d_hidden, "mean")
        self.l2 = dgl_exact.SAGEConv(d_hidden, d_out, "mean")

    def forward(self, blocks, x):
        return self.l2(blocks[1], torch.relu(self.l1(blocks[0], x)))


def test_neighbor_sampler_minibatches_keep_the_cache_bounded():
    """DGL's DataLoader + NeighborSampler, a 2-layer SAGEConv, 3 epochs: the cache stays at the
    blocks alive (the last batch), it does not grow by one entry per block."""
    torch.manual_seed(0)
    g = dgl.rand_graph(600, 4000)
    feat, labels = torch.randn(600, 8), torch.randint(0, 3, (600,))
    model = _SAGE(8, 16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = dgl.dataloading.DataLoader(g, torch.arange(200), dgl.dataloading.NeighborSampler([4, 4]),
                                        batch_size=25, shuffle=True)
    base = _entries()
    sizes = []
    for _ in range(3):
        for input_nodes, output_nodes, blocks in loader:
            loss = torch.nn.functional.cross_entropy(model(blocks, feat[input_nodes]), labels[output_nodes])
            opt.zero_grad()
            loss.backward()
            opt.step()
        sizes.append(_entries() - base)
    # 8 batches x 2 blocks per epoch: the old cache held 16, 32, 48 entries
    assert max(sizes) <= 2, sizes
    del input_nodes, output_nodes, blocks, loss
    assert _entries() == base


def test_loop_over_fresh_graphs_keeps_the_cache_bounded():
    torch.manual_seed(0)
    conv = dgl_exact.SAGEConv(4, 4, "mean")
    base = _entries()
    for _ in range(30):
        g = dgl.rand_graph(50, 200)
        conv(g, torch.randn(50, 4)).sum().backward()
    assert _entries() - base == 1  # the last graph, still referenced by g
    del g
    assert _entries() == base


def test_deleted_graph_loses_its_entry_and_structure_object():
    g = dgl.rand_graph(40, 160)
    base = _entries()
    st = structure_mod.structure_of(g, "cpu")
    st.csc, st.in_degrees()  # materialise cached tensors
    key_ref, st_ref = weakref.ref(g._graph), weakref.ref(st)
    assert _entries() == base + 1
    del g, st
    assert key_ref() is None, "the cache (or its entry) keeps the graph's structure object alive"
    assert st_ref() is None
    assert _entries() == base


@pytest.mark.parametrize("device_kernels", [False, True], ids=["dgl_kernels", "device_kernels"])
def test_backward_after_the_caller_dropped_the_graph(device_kernels):
    """A temporary graph (``conv(dgl.add_self_loop(g), x)``) is gone before backward: the structure
    autograd kept still reads the same C++ graph, and its cache entry is gone."""
    torch.manual_seed(0)
    g = dgl.rand_graph(30, 90)
    ref = dgl.nn.SAGEConv(5, 4, "mean")
    ex = dgl_exact.SAGEConv(5, 4, "mean")
    ex.load_state_dict(ref.state_dict())
    x = torch.randn(30, 5, requires_grad=True)
    ref(dgl.add_self_loop(g), x).square().sum().backward()
    want = x.grad.clone()
    x.grad = None
    base = _entries()
    scope = structure_mod.device_kernels_only() if device_kernels else contextlib.nullcontext()
    with scope:
        out = ex(dgl.add_self_loop(g), x)
        assert _entries() == base  # the temporary graph died: its entry went with it
        out.square().sum().backward()
    torch.testing.assert_close(x.grad, want, rtol=1e-5, atol=1e-6)


def test_cache_is_bounded_for_graphs_kept_alive(monkeypatch):
    """At most MAX_CACHED_GRAPHS entries (least recently used evicted); an evicted graph is rebuilt."""
    monkeypatch.setattr(structure_mod, "MAX_CACHED_GRAPHS", 3)
    structure_mod.clear_cache()
    graphs = [dgl.rand_graph(10 + i, 30) for i in range(5)]
    first = structure_mod.structure_of(graphs[0], "cpu")
    for h in graphs[1:]:
        structure_mod.structure_of(h, "cpu")
        structure_mod.structure_of(graphs[0], "cpu")  # recently used: stays
    assert _entries() == 3
    assert structure_mod.structure_of(graphs[0], "cpu") is first
    rebuilt = structure_mod.structure_of(graphs[1], "cpu")  # evicted earlier: a fresh entry
    assert rebuilt.num_src == 11 and torch.equal(rebuilt.in_degrees(), graphs[1].in_degrees())
    assert _entries() == 3
    key_ref = weakref.ref(graphs[0]._graph)
    del graphs, first, rebuilt, h
    assert key_ref() is None and _entries() == 0


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    pytest.skip("no /proc/self/status")


@pytest.mark.nightly
def test_resident_memory_flat_over_1000_fresh_graphs():
    """Resident memory stays flat while 1,000 new 2,000-node graphs (20,000 edges) go through a 2-layer
    SAGEConv, forward and backward. A cache keeping one entry per graph grew resident memory from ~350 to
    ~1,770 MiB; this one stays flat after warm-up. ``pytest -m slow -k resident -s`` prints the figures."""
    torch.manual_seed(0)
    l1, l2 = dgl_exact.SAGEConv(16, 32, "mean"), dgl_exact.SAGEConv(32, 8, "mean")
    rss = {}
    for i in range(1000):
        g = dgl.rand_graph(2000, 20000)
        l2(g, torch.relu(l1(g, torch.randn(2000, 16)))).sum().backward()
        if i + 1 in (100, 1000):
            gc.collect()
            rss[i + 1] = _rss_mib()
    print(f"\nRSS after 100 graphs {rss[100]:.0f} MiB, after 1000 {rss[1000]:.0f} MiB, "
          f"cache entries {structure_mod.cache_size()}")
    assert structure_mod.cache_size() <= 1
    assert rss[1000] - rss[100] < 64, rss  # the old cache: about +1,270 MiB over these 900 graphs


def test_the_csr_of_a_csc_only_graph_is_regrouped_from_its_csc():
    """A graph restricted to CSC cannot give DGL's CSR; the structure regroups its CSC into the same CSR
    (rows, their edges in edge-id order, the edge ids), which the weighted transposed sum reads."""
    g = dgl.graph((torch.tensor([0, 3, 1, 3, 2, 0, 4]), torch.tensor([1, 1, 0, 2, 4, 4, 3])), num_nodes=5)
    want = structure_mod.structure_of(g, "cpu").csr
    got = structure_mod.structure_of(g.formats(["csc"]), "cpu").csr
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1].to(got[1].dtype))
    ids = lambda t: torch.arange(7) if t is None else t.long()  # noqa: E731
    assert torch.equal(ids(got[2]), ids(want[2]))
