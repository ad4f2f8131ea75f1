"""The PyG models of ``bench/pyg_models.py`` (``pyg-gcn``, ``-sage``, ``-gat``, ``-gcn2``, ``-gatv2``): converted by
``compress_model`` alone (every conv, Linear, BatchNorm, ReLU and Dropout), the same outputs and gradients as
PyG's with compression off, less kept at INT2; and the benchmark workload calls them as PyG does, with PyG fp32
as their baseline."""
import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")

import dgl_exact  # noqa: E402
from dgl_exact.bench.pyg_models import PYG_MODELS, build_pyg_model  # noqa: E402
from tests.pyg._helpers import random_graph  # noqa: E402

N, FEATS, HIDDEN, LAYERS, CLASSES = 40, 8, 16, 3, 3


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    return random_graph(N, e=200), torch.randn(N, FEATS, generator=g), torch.randint(0, CLASSES, (N,), generator=g)


def _step(model, x, ei, y):
    out = model(x * 1.0, ei)
    F.cross_entropy(out, y).backward()
    return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("name", PYG_MODELS)
def test_converted_by_compress_model_and_equal_to_pyg(data, name):
    ei, x, y = data
    torch.manual_seed(0)
    ref = build_pyg_model(name, FEATS, HIDDEN, CLASSES, LAYERS, 0.5, True, impl="pyg")
    ours, report = dgl_exact.compress_model(copy.deepcopy(ref), dgl_exact.CompressionConfig(enabled=False),
                                            report=True)
    converted = list(report.converted.values())
    conv = {"pyg-gcn": "GCNConv", "pyg-sage": "SAGEConv", "pyg-gat": "GATConv", "pyg-gcn2": "GCN2Conv",
            "pyg-gatv2": "GATv2Conv"}[name]
    assert sum(v == f"torch_geometric.{conv} -> dgl_exact.{conv}" for v in converted) == LAYERS, converted
    assert sum(v == "torch.BatchNorm1d -> dgl_exact.BatchNorm1d" for v in converted) == len(ref.posts)
    assert len(report.fused) == len(ref.posts)  # ReLU + Dropout as one op
    assert report.fp32 == {}, report.fp32  # nothing left fp32
    for mode in (True, False):  # training: batch statistics; dropout compared in eval only
        if mode:
            for m in (ref, ours):
                m.train()
                for d in m.modules():
                    if isinstance(d, (torch.nn.Dropout, dgl_exact.nn.layers.ReLUDropout)):
                        d.p = 0.0
        else:
            ref.eval(), ours.eval()
        out_ref, grads_ref = _step(ref, x, ei, y)
        out_ours, grads_ours = _step(ours, x, ei, y)
        torch.testing.assert_close(out_ours, out_ref, rtol=1e-5, atol=1e-5)
        assert grads_ours.keys() == grads_ref.keys()
        for k in grads_ref:
            torch.testing.assert_close(grads_ours[k], grads_ref[k], rtol=1e-4, atol=1e-5, msg=k)
        ref.zero_grad(), ours.zero_grad()


@pytest.mark.parametrize("name", PYG_MODELS)
def test_int2_keeps_less_than_pyg(data, name):
    ei, x, y = data
    torch.manual_seed(0)
    ref = build_pyg_model(name, FEATS, HIDDEN, CLASSES, LAYERS, 0.5, True, impl="pyg")
    ours = build_pyg_model(name, FEATS, HIDDEN, CLASSES, LAYERS, 0.5, True, impl="exact")

    def kept(model):
        return dgl_exact.memory.measure(lambda: F.cross_entropy(model(x * 1.0, ei), y),
                                        modules=[model]).activation_bytes

    with dgl_exact.config(bits=2):
        assert kept(ours) < kept(ref) / 2


def test_workload_rows(monkeypatch):
    """The benchmark builds a PyG model for PyG fp32 and dgl_exact's settings, calls it ``model(x, edge_index)``,
    refuses DGL fp32 for it and takes PyG fp32 as its baseline."""
    from dgl_exact.bench import runner
    from dgl_exact.data import load_dataset

    ds = load_dataset("synthetic-small", quiet=True)
    work = runner.Workload(ds, "cpu", hidden=8, layers=2)
    assert "PyG model" in work.runnable("dgl", "pyg-gcn")
    assert work.runnable("pyg", "pyg-gat") is None and work.runnable("exact", "pyg-gat") is None
    ei = work.graph_for("pyg-sage")
    assert ei.shape == (2, ds.graph.num_edges()) and ei.dtype == torch.int64
    for impl in ("pyg", "exact"):
        model = work.build("pyg-sage", impl)
        loss, logits = work.step_fn("pyg-sage", model, impl)()
        assert logits.shape == (ds.graph.num_nodes(), ds.num_classes) and loss.requires_grad
    rows = [{"model": "pyg-gcn", "setting": "dgl_exact fp32", "x": 4.0}, {"model": "pyg-gcn", "setting": "INT2",
                                                                          "x": 1.0},
            {"model": "pyg-gcn", "setting": "PyG fp32", "x": 8.0}]
    runner._add_ratios(rows, "x", baseline_over_value=True)
    assert [r["ratio_vs_baseline"] for r in rows] == [2.0, 8.0, 1.0]
    assert {r["baseline"] for r in rows} == {"PyG fp32"}


def test_accuracy_grid_trains_pyg_models(tmp_path):
    """``bench accuracy`` with a PyG model (``framework: pyg``): PyG fp32 trains the model as written, dgl_exact's
    settings the converted one (compression off: the same test accuracy from the same seeds, since forward and
    gradients equal PyG's), DGL fp32 is skipped; rows named ``pyg-<model>``, deltas against PyG fp32."""
    from dgl_exact.bench import runner
    from dgl_exact.bench.results import ResultSink
    from dgl_exact.data import load_dataset
    from dgl_exact.planning.settings import select
    from dgl_exact.training.config import TrainConfig

    name = "synthetic-small:num_nodes=200,num_features=8,num_classes=3"
    ds = load_dataset(name, str(tmp_path))
    cfg = TrainConfig(dataset=name, model="sage", framework="pyg", hidden=8, epochs=2, data_root=str(tmp_path))
    rows = runner.accuracy_grid(ds, cfg, select("DGL fp32,PyG fp32,dgl_exact fp32,INT2"), 2,
                                ResultSink(str(tmp_path / "out"), "accuracy"), progress=False)
    assert [(r["model"], r["setting"]) for r in rows] == [("pyg-sage", s) for s in ("PyG fp32", "dgl_exact fp32",
                                                                                    "INT2")]
    assert rows[1]["tests"] == rows[0]["tests"] and rows[1]["delta_vs_fp32"] == 0.0
    assert rows[2]["delta_vs_fp32"] == pytest.approx(rows[2]["test_mean"] - rows[0]["test_mean"])
    from dgl_exact.training.trainer import Trainer

    trainer = Trainer(cfg, dataset=ds, progress=False, log=None)
    assert type(trainer.build(0)[0].net.convs[0]).__module__.startswith("dgl_exact.pyg")
    trainer.impl = "pyg"  # what the grid sets for PyG fp32
    assert type(trainer.build(0)[0].net.convs[0]).__module__.startswith("torch_geometric")
