"""dgl_exact.planning.predict: memory prediction (``dgl-exact plan``): activation and step-peak bytes against
measurement, extrapolation to a full-size graph without materialising it, and the plan's JSON records."""
import json
import sys

import pytest
from click.testing import CliRunner

from dgl_exact import memory
from dgl_exact.planning.settings import select
from dgl_exact.cli import cli
from dgl_exact.planning import predict as P

REQUIRED = {"setting", "static_bytes", "activation_bytes", "step_peak_bytes", "total_bytes", "fits"}


def _measured_activation(spec, setting, seed=5):
    """Activation bytes of a real training forward on a random graph of the spec's full size."""
    g, feat, y, idx = P.sample_graph(spec, spec.nodes, spec.edges, seed)
    model = P.build_for(spec, setting.impl, recompute=setting.recompute)
    model.train()
    loss_of = P.loss_fn(setting.impl)
    from dgl_exact.compression_config import config

    with config(setting.compression):
        loss_of(model(g, feat), y, idx).backward()  # warm-up step, as dgl-exact bench memory (structure caches)
        def step():  # returns the logits too, as dgl-exact bench memory's step: they are output, not activation
            logits = model(g, feat)
            return loss_of(logits, y, idx), logits

        report = memory.measure(step, modules=[model], exclude=[feat, y, idx])
    return report.activation_bytes


def test_parse_bytes():
    assert P.parse_bytes("2GiB") == 2 * 2**30
    assert P.parse_bytes("512 MiB") == 512 * 2**20
    assert P.parse_bytes("1.5GB") == 1_500_000_000
    assert P.parse_bytes(1000) == 1000
    with pytest.raises(ValueError, match="memory size"):
        P.parse_bytes("lots")


def test_plan_json_records(tmp_path):
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(cli, ["plan", "--nodes", "600", "--edges", "3000", "--features", "16", "--classes", "4",
                                   "--model", "sage", "--hidden", "16", "--layers", "2", "--device", "1GiB",
                                   "--settings", "dgl_exact fp32,INT2,INT1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    records = json.loads(out.read_text())
    assert [r["setting"] for r in records] == ["dgl_exact fp32", "INT2", "INT1"]
    for r in records:
        assert REQUIRED <= set(r)
        assert r["total_bytes"] == r["static_bytes"] + r["step_peak_bytes"]
        assert r["fits"] is True and r["device_bytes"] == 2**30
        assert r["step_peak_bytes"] >= r["activation_bytes"] > 0
    fp32, int2, int1 = records
    assert fp32["activation_bytes"] > int2["activation_bytes"] > int1["activation_bytes"]
    assert "| INT2 |" in res.output


def test_plan_refuses_missing_counts():
    res = CliRunner().invoke(cli, ["plan", "--nodes", "600"])
    assert res.exit_code == 2 and "missing" in res.output


@pytest.mark.parametrize("layers, settings, refused", [(1000, None, True), (74, None, True), (73, None, False),
                                                      (512, "INT2", False), (513, "INT2", True)])
def test_deep_plans_are_refused_before_any_recording(monkeypatch, layers, settings, refused):
    """Recording is linear in depth (one step per layer, setting and sample): a plan whose layers x settings pass
    MAX_RECORDED_LAYERS is refused in one line naming the deepest plan allowed, before a sample is made."""
    made = []
    monkeypatch.setattr(P, "samples_for", lambda *a, **k: made.append(a) or (_ for _ in ()).throw(RuntimeError("ran")))
    spec = P.PlanSpec(model="gcn", nodes=1000, edges=2000, features=16, classes=4, layers=layers)
    if refused:
        most = P.MAX_RECORDED_LAYERS // (1 if settings else len(P.DEFAULT_SETTINGS))
        with pytest.raises(ValueError, match=rf"--layers {layers} .* plan at most {most} layers"):
            P.plan(spec, settings=[settings] if settings else None)
        assert not made
    else:
        with pytest.raises(RuntimeError, match="ran"):
            P.plan(spec, settings=[settings] if settings else None)


def test_deep_plan_command_is_one_line():
    res = CliRunner().invoke(cli, ["plan", "--nodes", "1000", "--edges", "2000", "--features", "16", "--classes",
                                   "4", "--layers", "1000"])
    assert res.exit_code == 2 and "plan at most 73 layers" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize("model", ["sage", "gat"])
def test_activation_prediction_is_exact_at_sample_size(model):
    """The second sample graph is the full graph when it is small: compressed bytes match exactly."""
    spec = P.PlanSpec(model=model, nodes=500, edges=2500, features=24, classes=5, hidden=16, layers=2, heads=2)
    for name in ("INT2", "INT2 + RP(0.125) + blocks(64) + optimal"):
        setting = select(name)[0]
        rec = P.predict(spec, setting, sample_nodes=300)
        assert rec.activation_bytes == _measured_activation(spec, setting)


@pytest.mark.parametrize("model", ["pyg-gcn", "pyg-gat"])
def test_pyg_models_planned_as_the_trainer_builds_them(model):
    """``pyg-*``: the trainer's PyG network, as written for 'PyG fp32' and converted by compress_model for INT2;
    the activations predicted at sample size are those measured; INT2 keeps a fraction of PyG's; a DGL setting is
    refused."""
    pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")
    spec = P.PlanSpec(model=model, nodes=500, edges=2500, features=24, classes=5, hidden=16, layers=2, heads=2)
    assert type(P.build_for(spec, "exact").net.convs[0]).__module__.startswith("dgl_exact.pyg")
    assert type(P.build_for(spec, "pyg").net.convs[0]).__module__.startswith("torch_geometric")
    records = {}
    for name in ("PyG fp32", "INT2"):
        setting = select(name)[0]
        records[name] = P.predict(spec, setting, sample_nodes=300)
        assert records[name].activation_bytes == _measured_activation(spec, setting)
    assert records["INT2"].activation_bytes < records["PyG fp32"].activation_bytes / 4
    with pytest.raises(ValueError, match="its baseline is 'PyG fp32'"):
        P.build_for(spec, "dgl")


@pytest.mark.parametrize("model", ["pyg-gcn", "pyg-gatv2"])
def test_pyg_graph_counted_as_static_as_a_model_holds_it(model):
    """A PyG model's graph as the trainer's model holds it through every step: the ``edge_index`` and edge ids it
    reads, and (converted) the structures dgl_exact.pyg's convs cache for it, are static memory, predicted from
    the samples as a model holds them after a training step on a graph of the spec's full size (no longer 0 B, nor
    part of the step peak)."""
    pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")
    import contextlib

    from dgl_exact.compression_config import config
    from dgl_exact.training.pyg_models import PyGModel

    spec = P.PlanSpec(model=model, nodes=2400, edges=19200, features=8, classes=3, hidden=8, layers=2, heads=2,
                      symmetric=True)
    records = {r.setting: r for r in P.plan(spec, "cpu", ["PyG fp32", "INT2"], sample_nodes=300)}
    for name, rec in records.items():
        setting = select(name)[0]
        g, feat, y, idx = P.sample_graph(spec, spec.nodes, spec.edges, 5, setting.impl)
        net = P.build_for(spec, setting.impl)
        with config(setting.compression) if setting.compression else contextlib.nullcontext():
            P.loss_fn(setting.impl)(net(g, feat), y, idx).backward()
        edge_index = memory.tensor_bytes(PyGModel.graph_tensors(g))
        structure = memory.tensor_bytes(PyGModel.structure_tensors(g))
        assert edge_index == 24 * spec.edges  # int64 edge_index [2, E] and edge ids [E]
        # linear in the graph's size (the structures' node and edge arrays): extrapolated to the byte or two
        assert abs(rec.breakdown["edge_index_bytes"] - edge_index) <= 2, name
        assert abs(rec.breakdown["structure_cache_bytes"] - structure) <= 2, name
        assert (structure > 10 * spec.edges) == (name == "INT2")  # PyG's own convs cache nothing here


@pytest.mark.slow
def test_recompute_prediction_is_the_recomputed_models():
    """``INT2 + recompute`` is planned with GCNII's recompute mode on: its activations (the segments'
    boundaries and ``h0``) exactly as measured at sample size, a fraction of plain INT2's at 12 layers; the
    record says the segment length; other models refuse the setting before sampling anything."""
    spec = P.PlanSpec(model="gcn2", nodes=500, edges=2500, features=16, classes=5, hidden=24, layers=12)
    plain, auto, two = (P.predict(spec, select(n)[0], sample_nodes=300)
                        for n in ("INT2", "INT2 + recompute", "INT2 + recompute(2)"))
    for rec, name in ((auto, "INT2 + recompute"), (two, "INT2 + recompute(2)")):
        assert rec.activation_bytes == _measured_activation(spec, select(name)[0])
    assert auto.activation_bytes < two.activation_bytes < plain.activation_bytes / 2
    assert "segments of 3 layers" in auto.compression and "segments of 2 layers" in two.compression
    with pytest.raises(ValueError, match="GCNII"):
        P.plan(P.PlanSpec(model="sage", nodes=500, edges=2500, features=16, classes=5), settings=["INT2 + recompute"])


def test_activation_prediction_extrapolates():
    """Extrapolated from samples 10x and 5x smaller: within rounding of the packed codes and block metadata."""
    spec = P.PlanSpec(model="gcn", nodes=8000, edges=40000, features=32, classes=6, hidden=32, layers=3)
    setting = select("INT2")[0]
    rec = P.predict(spec, setting, sample_nodes=800)
    measured = _measured_activation(spec, setting)
    assert abs(rec.activation_bytes - measured) <= 0.001 * measured


def test_step_peak_prediction_tracks_timeline():
    """The extrapolated peak is at least the activations and grows with the graph."""
    small = P.PlanSpec(model="sage", nodes=4000, edges=20000, features=32, classes=4, hidden=32, layers=2)
    big = P.PlanSpec(model="sage", nodes=40000, edges=200000, features=32, classes=4, hidden=32, layers=2)
    setting = select("INT2")[0]
    a, b = P.predict(small, setting, sample_nodes=500), P.predict(big, setting, sample_nodes=500)
    assert a.step_peak_bytes >= a.activation_bytes
    # 10x the graph: about 10x the transients (measured: 13x, as allocations below glibc's mmap threshold
    # stop being served from a reused heap)
    assert 5 * a.step_peak_bytes < b.step_peak_bytes < 20 * a.step_peak_bytes


@pytest.mark.nightly
@pytest.mark.parametrize("model", ["sage", "gcn", "gat", "gcn2", "pyg-gcn", "pyg-gat", "pyg-gatv2"])
def test_step_peak_prediction_against_measurement(model):
    """Predicted against measured (fresh process, resident high-water mark) on a 60k-node random graph (a PyG
    model against its PyG fp32 baseline)."""
    from dgl_exact.bench.runner import in_fresh_process
    from dgl_exact.bench.plan_validation import measure_spec

    if memory.vmhwm_available():
        pytest.skip(memory.vmhwm_available())
    if model.startswith("pyg-"):
        pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")
    spec = P.PlanSpec(model=model, nodes=60000, edges=600000, features=64, classes=8, hidden=64, layers=3)
    for name in ("PyG fp32" if model.startswith("pyg-") else "dgl_exact fp32", "INT2"):
        setting = select(name)[0]
        rec = P.predict(spec, setting)
        meas = in_fresh_process(measure_spec, spec, setting)
        assert rec.activation_bytes == pytest.approx(meas["activation_bytes"], rel=0.001)
        assert rec.step_peak_bytes == pytest.approx(meas["step_peak_bytes"], rel=0.25)


@pytest.mark.nightly
def test_chunked_gat_prediction_against_measurement():
    """GAT on a dense graph runs its attention in edge chunks (ops/edge_chunks.py): the sample runs chunk as
    the full graph does, so the prediction holds there too (it was 1.5x the measured peak before)."""
    from dgl_exact.bench.runner import in_fresh_process
    from dgl_exact.bench.plan_validation import measure_spec

    if memory.vmhwm_available():
        pytest.skip(memory.vmhwm_available())
    spec = P.PlanSpec(model="gat", nodes=6000, edges=6000 * 300, features=32, classes=4, hidden=64, layers=3)
    setting = select("INT2")[0]
    rec = P.predict(spec, setting)
    meas = in_fresh_process(measure_spec, spec, setting)
    assert rec.step_peak_bytes == pytest.approx(meas["step_peak_bytes"], rel=0.25)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident high-water mark needs Linux")
def test_products_sized_plan_materialises_nothing_full_size():
    spec = P.spec_for_dataset("synthetic-products", "sage", hidden=256, batch_norm=False)
    why = memory.vmhwm_available()
    if why:
        pytest.skip(why)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = memory._status_bytes("VmRSS:")
    rec = P.plan(spec, "cpu", ["INT2"])[0]
    grown = memory._status_bytes("VmHWM:") - before
    # a single full-size [N, 256] fp32 tensor would be 2.3 GiB; the prediction is several GiB
    assert rec.step_peak_bytes > 4 * 2**30
    assert grown < 512 * 2**20


def test_static_prediction_does_not_depend_on_the_settings_before_it():
    """The structure cache a setting's static memory counts is its own graph's: recording DGL's fp32 first
    (which builds no dgl_exact cache) left dgl_exact's cache out of every later setting, and a previous
    sample pair dying meanwhile made it 0."""
    spec = P.PlanSpec(model="gcn", nodes=3000, edges=24000, features=16, classes=4, hidden=16, layers=2)
    alone = P.plan(spec, "cpu", ["INT2"], sample_nodes=600)[0]
    after_dgl = {r.setting: r for r in P.plan(spec, "cpu", ["DGL fp32", "INT2"], sample_nodes=600)}["INT2"]
    assert alone.breakdown["structure_cache_bytes"] > 0
    assert after_dgl.breakdown == alone.breakdown and after_dgl.static_bytes == alone.static_bytes


@pytest.mark.parametrize("model, formats", [("gcn", "csc alone"), ("sage", "csc alone"), ("gat", "csc+csr")])
def test_a_symmetric_spec_plans_the_trainers_formats(model, formats):
    """A symmetric graph: dgl_exact's GCN and SAGE train from the CSC alone without edge ids (``N + 1 + E``
    ids), GAT keeps CSC and CSR with edge ids; a directed graph's spec plans CSC and CSR for every model."""
    import dataclasses

    from dgl_exact.planning.settings import select

    spec = P.PlanSpec(model=model, nodes=2000, edges=16000, features=8, classes=3, hidden=16, layers=2,
                      heads=2, symmetric=True)
    e = spec.model_edges
    both = 2 * 4 * (spec.nodes + 1 + 2 * e)
    rec = P.predict(spec, select("INT2")[0])
    assert rec.breakdown["graph_bytes"] == (4 * (spec.nodes + 1 + e) if formats == "csc alone" else both)
    directed = P.predict(dataclasses.replace(spec, symmetric=False), select("INT2")[0])
    assert directed.breakdown["graph_bytes"] == both


def test_plan_prints_each_static_part(capsys):
    from tests.cli._helpers import run

    code, out, err = run(["plan", "--nodes", "600", "--edges", "3000", "--features", "16", "--classes", "4",
                          "--model", "gcn", "--hidden", "16", "--layers", "2", "--settings", "DGL fp32,INT2"], capsys)
    assert code == 0, err
    lines = [ln for ln in out.splitlines() if ln.startswith("static memory (")]
    assert [ln.split(")")[0] for ln in lines] == ["static memory (DGL fp32", "static memory (INT2"]


def test_a_shared_copy_is_recorded_once():
    """Two products keep one activation under one configuration: one compressed copy (ownership rule 6), so the
    recording counts its bytes at the first keeper and marks the second "shared" (no bytes, not a slot)."""
    import torch

    from dgl_exact import CompressionConfig
    from dgl_exact.ops import keep as keeping
    from dgl_exact.ops.products import Product
    from dgl_exact.planning.slots import slots_from_runs

    int2 = CompressionConfig(bits=2)
    x = torch.randn(64, 16, requires_grad=True) * 1.0
    p1, p2 = torch.nn.Parameter(torch.randn(1, 16)), torch.nn.Parameter(torch.randn(1, 16))
    records = []
    with keeping.keep_hook(P._keep_recorder(records), records_only=True):
        with keeping.op_inputs(x, p1, p2):
            y = Product.apply(x, p1, int2) + Product.apply(x, p2, int2)  # x's copy, p1 by reference, x's, p2's
    assert [r.kept for r in records] == ["compressed", "reference", "shared", "reference"]
    assert records[0].nbytes == keeping.compress(x, int2).nbytes > 0 and records[2].nbytes == 0
    run = P.SampleRun(64, 0, [], [], 0, records, 0, 0, 0, [], 0.0)
    assert [s.index for s in slots_from_runs(run, run, 0.5, 1.0)] == [0]
    y.sum().backward()
