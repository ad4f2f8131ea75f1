"""The per-batch planner (``dgl-exact plan --sampler neighbor``): predictions against a measured step, the
batch-size search, and its one-line errors."""
import contextlib

import pytest
import torch
from click.testing import CliRunner

import dgl_exact  # noqa: F401  (before dgl)
from dgl_exact import memory
from dgl_exact.cli import cli
from dgl_exact.planning.minibatch import MinibatchPlanner, largest_batch
from dgl_exact.planning.predict import PlanRecord, loss_fn
from dgl_exact.planning.settings import select

TINY = "synthetic:num_nodes=2000,avg_degree=8"


@pytest.fixture(scope="module")
def planner(tmp_path_factory):
    from dgl_exact.data import load_dataset

    ds = load_dataset("synthetic:num_nodes=8000,avg_degree=8", str(tmp_path_factory.mktemp("data")))
    return MinibatchPlanner(ds, "sage", [15, 10, 5], hidden=128)


def _measured(planner, setting, batch_size):
    """The measured step peak (resident high-water mark) of each sampled batch's step, the smaller of two
    measurements (a high-water mark sometimes holds one-off allocations outside the step, never less than the
    step used); the largest over the batches."""
    from dgl_exact.compression_config import config

    memory.prepare_cpu_peak()
    peaks = {}
    for i, b in [(i, b) for i, b in enumerate(planner.batches(batch_size))] * 2:
        model, opt = planner._model(setting)
        y = b.node_data["label"]
        idx = torch.arange(y.shape[0])
        lf = loss_fn(setting.impl)
        with (config(setting.compression) if setting.compression else contextlib.nullcontext()):
            rep = memory.measure_step(lambda: lf(model(b.blocks, b.node_data["feat"]), y, idx), opt,
                                      modules=[model], exclude=[b.node_data["feat"], y, idx])
        if rep.peak_bytes is None:
            pytest.skip("no CPU peak measurement on this system")
        peaks[i] = min(peaks.get(i, rep.peak_bytes), rep.peak_bytes)
    return max(peaks.values())


@pytest.mark.nightly
# Nightly, not in .ci/run: in about one process of three the measured high-water mark of this 7 MiB step is
# 10-17 MiB (the prediction, 6.9 MiB, is the same in every process). Diagnosed (2026-12-03): the extra is
# where glibc places the step's small (< 128 KiB, heap-served) allocations, which depends on the process's
# address layout (scripts/minibatch_peak_noise.py, removed in 771b700, in git history): with ASLR off
# (`setarch -R`) and one
# PYTHONHASHSEED, processes measured the same nine steps within 0.3 MiB of each other (7.3-8.3 MiB); with ASLR
# on, from 7.1 to 17.3 MiB per step across processes, the first steps of a process the highest. Neither threads (one
# OS thread), huge pages (none mapped) nor file-backed pages (RssFile unchanged by the step) took part. The
# noise is a few MiB, absolute: at 200,000 nodes (`dgl-exact bench minibatch`, README) the prediction is
# within 1.3%; at this test's size it exceeds the 25% tolerance, so it cannot gate a landing.
# DGL fp32 is left out here for the same reason (19.6 vs 13.2 MiB in some processes).
@pytest.mark.parametrize("name", ["INT2"])
def test_prediction_matches_measured_step(planner, name):
    setting = select(name)[0]
    rec = planner.record(setting, 128)
    # the prediction is the step's operator-created memory; the measured high-water mark also holds the
    # allocator's pages and page rounding: within 25%, as the full-graph planner's tests
    assert rec.step_peak_bytes == pytest.approx(_measured(planner, setting, 128), rel=0.25)
    assert rec.breakdown["batch_bytes"] > 0 and rec.total_bytes == rec.static_bytes + rec.step_peak_bytes


@pytest.fixture(scope="module")
def tiny_planner(tmp_path_factory):
    from dgl_exact.data import load_dataset

    return MinibatchPlanner(load_dataset(TINY, str(tmp_path_factory.mktemp("data"))), "sage", [15, 10, 5], hidden=32)


def test_largest_batch_fits_and_its_double_does_not(tiny_planner):
    setting = select("INT2")[0]
    budget = int(1.5 * tiny_planner.record(setting, 16).step_peak_bytes)
    pick = largest_batch(tiny_planner, setting, budget)
    assert pick.record.step_peak_bytes <= budget
    assert tiny_planner.record(setting, 2 * pick.batch_size).step_peak_bytes > budget
    assert 16 <= pick.batch_size < tiny_planner.max_batch_size


def test_search_records_few_batch_sizes_and_brackets_the_pick(tiny_planner):
    """The pick fits, the size 5 % (the tolerance) above it does not (recorded here to check), and few sizes
    are recorded: doubling from 1 and bisecting would record about log2(pick) + log2(1 / tolerance) of them."""
    setting = select("INT2")[0]
    budget = int(1.5 * tiny_planner.record(setting, 16).step_peak_bytes)
    lines = []
    pick = largest_batch(tiny_planner, setting, budget, log=lines.append)
    assert pick.tried[pick.batch_size] <= budget
    assert all(p <= budget for b, p in pick.tried.items() if b <= pick.batch_size)
    above = pick.batch_size + max(1, int(0.05 * pick.batch_size))
    assert tiny_planner.record(setting, above).step_peak_bytes > budget
    assert len(pick.tried) <= 8, pick.tried
    assert f"batch size {pick.batch_size:,} (step peak" in lines[-1]
    assert f"batch size {pick.batch_size:,}: step peak" in lines[-2] and "sampled batches" in lines[-2]
    assert pick.record.step_peak_bytes == pick.tried[pick.batch_size]


def test_the_pick_is_checked_on_the_batch_with_most_elements(tiny_planner):
    """Of the pick's other sampled batches the search checks the one with the most elements (recorded, or the
    elements line's rise where it is under 1 %); its step peak is the one recording every sampled batch gives,
    within the batches' spread."""
    from dgl_exact.planning.minibatch import OTHER_BATCH_SHARE, batch_elements

    setting = select("INT2")[0]
    budget = int(1.5 * tiny_planner.record(setting, 16).step_peak_bytes)
    pick = largest_batch(tiny_planner, setting, budget)
    every = tiny_planner.record(setting, pick.batch_size)
    assert pick.record.step_peak_bytes == pytest.approx(every.step_peak_bytes, rel=0.03)
    count = tiny_planner.num_sampled(pick.batch_size)
    sizes = [batch_elements(tiny_planner, pick.batch_size, i) for i in range(count)]
    one = [tiny_planner.record(setting, pick.batch_size, index=i).step_peak_bytes for i in range(count)]
    assert max(one) == every.step_peak_bytes  # index=i records batch i alone
    most = one[max(range(count), key=sizes.__getitem__)]
    assert pick.record.step_peak_bytes >= (1 - OTHER_BATCH_SHARE) * most


def test_a_close_other_batch_adds_the_line_rise_without_a_step(monkeypatch):
    """A pick whose other sampled batch has 0.1 % more elements is not recorded again: the line's rise is
    added (here exact: the peak is affine in the elements)."""
    import dgl_exact.planning.minibatch as M

    monkeypatch.setattr(M, "batch_elements", lambda planner, b, index=0: int(1000 * b * (1.001 if index else 1)))
    fake = _AffinePlanner(lambda b: 5e6 + 40_000 * b, 200_000, all_batches=1.0)
    pick = largest_batch(fake, select("INT2")[0], 2**30)
    assert all(b in fake.records for b in pick.tried)  # every size recorded is a search step, none twice
    assert len(fake.records) == len(set(fake.records))
    assert pick.record.step_peak_bytes == pytest.approx(5e6 + 40 * 1000 * pick.batch_size * 1.001, rel=1e-6)
    assert pick.record.step_peak_bytes <= 2**30


def test_sampled_sizes_are_the_batches_the_steps_run_on(tiny_planner):
    """Sizes come from sampling alone (no features gathered), and describe the very batches recorded."""
    for i, batch in enumerate(tiny_planner.batches(64)):
        sampled = tiny_planner.sampled(64, i)
        assert sampled.blocks == tuple((b.num_src_nodes(), b.num_dst_nodes(), b.num_edges()) for b in batch.blocks)
        assert sampled.input_nodes == batch.node_data["feat"].shape[0]
        assert sampled.seeds == batch.node_data["label"].shape[0]


def test_search_goes_on_where_another_sampled_batch_needs_more(monkeypatch):
    """The search records one batch per size; the pick's other batches needing 10 % more scale the budget
    down, and the pick fits on all of them."""
    import dgl_exact.planning.minibatch as M

    monkeypatch.setattr(M, "batch_elements", lambda planner, b, index=0: int(1000 * b * (1.1 if index else 1)))
    fake = _AffinePlanner(lambda b: 5e6 + 40_000 * b, 200_000, all_batches=1.1)
    pick = largest_batch(fake, select("INT2")[0], 2**30)
    truth = max(b for b in range(1, 200_001) if 1.1 * (5e6 + 40_000 * b) <= 2**30)
    assert pick.record.step_peak_bytes <= 2**30
    assert pick.batch_size <= truth and truth - pick.batch_size <= max(1, int(0.05 * pick.batch_size))


class _AffinePlanner:
    """A planner whose step peak is a known function of the batch size (no steps run)."""

    num_batches = 3

    def __init__(self, peak_of, top, all_batches=1.0):
        self.peak_of, self.max_batch_size, self.records, self.all_batches = peak_of, top, [], all_batches

    def record(self, setting, b, num_batches=None, index=None):
        self.records.append(b)
        scale = self.all_batches if index else 1.0  # the other batches need this much more
        return PlanRecord("fake", 0, 0, int(scale * self.peak_of(b)), int(scale * self.peak_of(b)), None, None)

    def num_sampled(self, b):
        return min(self.num_batches, -(-self.max_batch_size // b))


@pytest.mark.parametrize("elements, peak, top", [
    (lambda b: 1000 * b, lambda e: 5e6 + 40 * e, 200_000),                     # affine: exact line
    (lambda b: 1000 * b ** 0.8, lambda e: 5e6 + 40 * e, 200_000),              # neighbourhoods overlap
    (lambda b: 1000 * b, lambda e: 5e6 + 40 * e + 1e-4 * e ** 1.5, 200_000),   # a little convex
    (lambda b: 1000 * b, lambda e: 5e6 + 40 * e, 3000),                        # all training nodes fit
])
def test_search_on_the_elements_line_converges_in_few_records(monkeypatch, elements, peak, top):
    import dgl_exact.planning.minibatch as M

    monkeypatch.setattr(M, "batch_elements", lambda planner, b, index=0: int(elements(b)))
    fake = _AffinePlanner(lambda b: peak(int(elements(b))), top)
    budget = 2**30
    pick = largest_batch(fake, select("INT2")[0], budget)
    truth = max([b for b in range(1, top + 1) if fake.peak_of(b) <= budget], default=1)
    assert pick.batch_size <= truth and truth - pick.batch_size <= max(1, int(0.05 * pick.batch_size))
    assert len(fake.records) <= 8, fake.records  # the last: the pick on all sampled batches


@pytest.mark.slow
def test_compressed_setting_fits_larger_batches(planner):
    budget = planner.record(select("DGL fp32")[0], 64).step_peak_bytes
    assert largest_batch(planner, select("INT2")[0], budget).batch_size > 64


def test_cli_auto_table(tmp_path):
    res = CliRunner().invoke(cli, ["plan", "--dataset", TINY, "--data-root", str(tmp_path), "--sampler", "neighbor",
                                   "--batch-size", "auto", "--memory-budget", "2MiB", "--settings", "INT2",
                                   "--json", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    assert "| INT2 |" in res.output and (tmp_path / "p.json").exists()


@pytest.mark.parametrize("args, message", [
    (["--batch-size", "auto"], "--batch-size auto needs --memory-budget"),
    (["--batch-size", "auto", "--memory-budget", "1KiB"], "even batch size 1 needs"),
    (["--batch-size", "zero"], "--batch-size must be a positive int or 'auto'"),
    (["--fanouts", "15,x"], "fanouts must be comma-separated ints"),
    (["--settings", "INT2 + recompute"], "recompute is GCNII's"),
])
def test_cli_errors_are_one_line(tmp_path, args, message):
    res = CliRunner().invoke(cli, ["plan", "--dataset", TINY, "--data-root", str(tmp_path), "--sampler", "neighbor",
                                   "--settings", "INT2", *args])
    assert res.exit_code != 0
    assert message in res.output and "Traceback" not in res.output


def test_cli_batch_size_needs_neighbor_sampler():
    res = CliRunner().invoke(cli, ["plan", "--nodes", "600", "--edges", "3000", "--features", "8", "--classes", "3",
                                   "--batch-size", "512"])
    assert res.exit_code != 0 and "--sampler neighbor" in res.output


@pytest.mark.slow
def test_bench_minibatch_end_to_end(tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(cli, ["bench", "minibatch", "--dataset", TINY, "--data-root", str(tmp_path),
                                   "--settings", "INT2", "--hidden", "32", "--memory-budget", "1MiB",
                                   "--max-batches", "1", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert "| INT2 |" in res.output
    for name in ("minibatch.md", "minibatch.csv", "minibatch.jsonl"):
        assert (out / name).exists()


def test_bench_minibatch_bad_budget_is_one_line(tmp_path):
    res = CliRunner().invoke(cli, ["bench", "minibatch", "--dataset", TINY, "--data-root", str(tmp_path),
                                   "--settings", "INT2", "--memory-budget", "lots", "--out", str(tmp_path / "o")])
    assert res.exit_code != 0 and "--memory-budget" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("value, message", [("auto", "give --sampler neighbor and --memory-budget"),
                                            ("many", "--batch-size must be a positive int")])
def test_train_batch_size_auto_without_a_budget_says_what_to_give(value, message):
    res = CliRunner().invoke(cli, ["train", "--sampler", "neighbor", "--batch-size", value])
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output


@pytest.mark.slow
@pytest.mark.skipif(memory.vmhwm_available() is not None, reason="needs the resident high-water mark (Linux)")
def test_bench_measures_a_step_whose_batch_features_outweigh_it(tmp_path):
    """The batch's features exist before the step: the bench's meter excludes them, as the planner does.
    Counted as activations (a first layer keeps its input by reference) they were more than the step's
    high-water mark rises, and every products-sized measurement came back empty ("missed allocations")."""
    from dgl_exact.bench.minibatch import measured_peak
    from dgl_exact.data import load_dataset

    memory.prepare_cpu_peak()
    ds = load_dataset("synthetic:num_nodes=3000,avg_degree=8,num_features=2048", str(tmp_path))
    wide = MinibatchPlanner(ds, "sage", [15, 10], num_batches=1, hidden=8)
    feat_bytes = wide.batches(256)[0].node_data["feat"].numel() * 4
    peak = measured_peak(wide, select("INT2")[0], 256)
    assert peak is not None and 0 < peak < feat_bytes


def test_a_deep_model_is_refused_before_any_step(tiny_planner):
    with pytest.raises(ValueError, match=r"--layers 513: the mini-batch planner .* it plans at most 512 layers"):
        MinibatchPlanner(tiny_planner.dataset, "sage", [2] * 513, hidden=8)


def test_a_recorded_step_does_not_depend_on_the_thread_count(tiny_planner, monkeypatch):
    """Large steps are recorded with all threads, small ones with one: the recorded tensors are the same."""

    before = torch.get_num_threads()
    torch.set_num_threads(2)  # restored below: "all threads" is two
    try:
        _record_both_ways(tiny_planner, monkeypatch)
    finally:
        torch.set_num_threads(before)


def _record_both_ways(tiny_planner, monkeypatch):
    import dgl_exact.planning.minibatch as M

    setting = select("INT2")[0]
    tiny_planner.record(setting, 8)  # warm: the first step of a setting runs unrecorded in one thread
    monkeypatch.setattr(M, "ONE_THREAD_ELEMENTS", 0)
    threads = []
    monkeypatch.setattr(M.MinibatchPlanner, "_step",
                        lambda self, *a, _step=M.MinibatchPlanner._step: (threads.append(torch.get_num_threads()),
                                                                          _step(self, *a))[1])
    every = tiny_planner.record(setting, 64).step_peak_bytes
    monkeypatch.setattr(M, "ONE_THREAD_ELEMENTS", 2**62)
    one = tiny_planner.record(setting, 64).step_peak_bytes
    assert one == every
    assert threads[-1] == 1 and threads[0] == 2


def test_pyg_model_planned_on_the_sampled_subgraph(tmp_path):
    """A PyG model runs on the neighbour sampler's batches as PyG's NeighborLoader batches (the sampled subgraph):
    planned per batch, INT2 below PyG fp32; the CLI takes it."""
    pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install 'dgl-exact[pyg]')")
    from dgl_exact.data import load_dataset

    planner = MinibatchPlanner(load_dataset(TINY, str(tmp_path)), "pyg-sage", [5, 5], num_batches=1, hidden=16)
    pyg, int2 = (planner.record(select(name)[0], 64) for name in ("PyG fp32", "INT2"))
    assert 0 < int2.activation_bytes < pyg.activation_bytes / 4
    assert int2.step_peak_bytes < pyg.step_peak_bytes
    res = CliRunner().invoke(cli, ["plan", "--dataset", TINY, "--data-root", str(tmp_path), "--model", "pyg-gcn",
                                   "--sampler", "neighbor", "--fanouts", "4,4", "--batch-size", "64", "--hidden", "8",
                                   "--settings", "INT2"])
    assert res.exit_code == 0 and "| INT2 |" in res.output, res.output
