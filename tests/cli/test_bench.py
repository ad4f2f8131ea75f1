"""Smoke tests of the benchmark commands on tiny grids: they run, write JSONL/CSV/Markdown and PNGs."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = "synthetic-small:num_nodes=400,num_features=16,num_classes=4"


def cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "dgl_exact", "bench", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd, stdin=subprocess.DEVNULL)


def _rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.mark.slow
def test_bench_memory_and_speed(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    proc = cli("memory", "--dataset", TINY, "--model", "sage", "--hidden", "16", "--layers", "2", "--out", str(out),
               "--plot", "-q", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = {r["setting"]: r for r in _rows(out / "memory.jsonl")}
    assert rows["DGL fp32"]["ratio_vs_baseline"] == pytest.approx(1.0)
    assert rows["INT2"]["activation_bytes"] < rows["INT8"]["activation_bytes"] < rows["DGL fp32"]["activation_bytes"]
    assert "PyG fp32" in rows  # listed, with a note where PyG is not installed
    # the step peak (forward + backward + Adam) beside the activations, both against DGL fp32
    assert all(rows[s]["step_peak_bytes"] is None or rows[s]["step_peak_bytes"] >= 0 for s in ("DGL fp32", "INT2"))
    assert all(rows[s]["peak_method"] for s in ("DGL fp32", "INT2"))
    assert "step_peak_MiB" in (out / "memory.md").read_text()
    for name in ("memory.csv", "memory.md", "memory.png"):
        assert (out / name).stat().st_size > 0
    proc = cli("speed", "--dataset", TINY, "--model", "gcn", "--hidden", "16", "--layers", "2", "--epochs", "1",
               "--warmup", "0", "--settings", "DGL fp32,INT2", "--out", str(out), "--plot", "-q", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out / "speed.jsonl")
    assert [r["setting"] for r in rows] == ["DGL fp32", "INT2"] and all(r["epoch_ms"] > 0 for r in rows)
    assert (out / "speed.png").exists()


@pytest.mark.slow
def test_bench_kernels_and_accuracy(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    proc = cli("kernels", "--rows", "500", "--cols", "32", "--repeats", "1", "--out", str(out), "-q", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out / "kernels.jsonl")
    assert {r["op"] for r in rows} == {"compress", "decompress", "spmm_weighted_sum", "spmm_sum (no weights)"}
    assert all(r["GB_per_s"] > 0 for r in rows)
    proc = cli("memory", "--dataset", TINY, "--model", "gcn", "--hidden", "16", "--layers", "2",
               "--settings", "dgl_exact fp32,INT2", "--out", str(out), "-q", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    proc = cli("accuracy", "--dataset", TINY, "--model", "gcn", "--runs", "2", "--epochs", "3",
               "--settings", "dgl_exact fp32,INT2", "--out", str(out), "--plot", "-q", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out / "accuracy.jsonl")
    assert [r["setting"] for r in rows] == ["dgl_exact fp32", "INT2"]
    assert rows[0]["delta_vs_fp32"] == 0 and len(rows[1]["tests"]) == 2
    assert (out / "tradeoff.png").exists() and (out / "accuracy.md").exists()


def test_bench_rows_survive_a_crash(tmp_path):
    from dgl_exact.bench.results import ResultSink, read_rows

    sink = ResultSink(str(tmp_path), "grid")
    sink.add({"setting": "a", "value": 1})
    sink.add({"setting": "b", "value": 2})
    # no finish(): a run that died mid-grid still has every measured row on disk
    rows = read_rows(str(tmp_path / "grid.jsonl"))
    assert [{k: r[k] for k in ("setting", "value")} for r in rows] == [{"setting": "a", "value": 1},
                                                                         {"setting": "b", "value": 2}]
    assert all("code" in r and "commit" in r for r in rows)  # each row names the code it measured


@pytest.mark.slow
def test_bench_bad_input(tmp_path):
    proc = cli("memory", "--model", "mlp", "--dataset", TINY, cwd=str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and "Traceback" not in proc.stderr
    proc = cli("memory", "--settings", "INT3", "--dataset", TINY, cwd=str(tmp_path))
    assert proc.returncode == 2 and "unknown setting" in proc.stderr


@pytest.mark.slow
def test_bench_profile_writes_per_op_tables(tmp_path):
    out = tmp_path / "out"
    proc = cli("profile", "--dataset", TINY, "--model", "gcn", "--hidden", "16", "--layers", "2", "--steps", "1",
               "--warmup", "0", "--settings", "dgl_exact fp32,INT2", "--out", str(out), "-q", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out / "profile.jsonl")
    assert [r["setting"] for r in rows] == ["dgl_exact fp32", "INT2"] and all(r["wall_ms"] > 0 for r in rows)
    int2 = (out / rows[1]["table"]).read_text()
    # the compressed path shows up op by op: the numba CPU kernels by name, the torch reference's aminmax otherwise
    compressing = ("dgl_exact::numba::compress_groups", "aten::aminmax")
    assert "_Linear" in int2 and any(name in int2 for name in compressing)
    table = (out / rows[0]["table"]).read_text()
    assert "_Linear" in table and not any(name in table for name in compressing)
    bad = cli("profile", "--dataset", TINY, "--steps", "0", "--out", str(out), "-q", cwd=str(tmp_path))
    assert bad.returncode == 2 and bad.stderr.startswith("error:")


def test_sync_sites_counts_each_synchronising_call_site(monkeypatch):
    """The GPU profile's list of host-GPU synchronisations: torch's sync debug mode warns at each site;
    counted per file:line, most frequent first, and the mode is restored even if the step raises."""
    import warnings

    import torch

    from dgl_exact.bench import runner

    modes = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def step():
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation")  # one site, three times
        warnings.warn("called a synchronizing CUDA operation")  # another site, once
        warnings.warn("something else")

    sites = runner._sync_sites(step)
    assert len(sites) == 2 and sites[0].endswith(" x3") and sites[1].endswith(" x1")
    assert all("test_bench.py:" in s for s in sites) and sites[0].split(" ")[0] != sites[1].split(" ")[0]
    assert modes == ["warn", 0]

    def failing():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        runner._sync_sites(failing)
    assert modes[-1] == 0


@pytest.mark.slow
def test_memory_grid_in_process_deep_gcnii(tmp_path):
    """The grid in one process (isolate=False): 16 GCNII layers, step peak and activations per row."""
    from dgl_exact.bench.results import ResultSink
    from dgl_exact.bench.runner import Workload, memory_grid
    from dgl_exact.planning.settings import select
    from dgl_exact.data import load_dataset

    # 4,000 nodes x 16: layer tensors of 250 KiB, above the 128 KiB mmap threshold, so the in-process
    # resident high-water mark sees them (on TINY's 12 KiB tensors it is allocator noise)
    work = Workload(load_dataset("synthetic-small:num_nodes=4000,num_features=16,num_classes=4", str(tmp_path)),
                    "cpu", hidden=16, layers=16)
    rows = memory_grid(work, ["gcn2"], select("dgl_exact fp32,INT2,PyG"), ResultSink(str(tmp_path), "m"),
                       progress=False, isolate=False)
    assert [r["layers"] for r in rows] == [16, 16, 16] and rows[2]["note"].startswith("n/a")
    assert rows[1]["activation_bytes"] < rows[0]["activation_bytes"]
    for r in rows[:2]:
        # in process: never labelled "fresh process per setting"; in a long-lived process (the whole suite)
        # the resident high-water mark can miss reused pages, and then the row says so instead of a number
        assert r["peak_method"] and "fresh process per setting" not in r["peak_method"]
        if r["step_peak_bytes"] is None:
            assert r["peak_method"].startswith("not measured")
        else:
            assert r["step_peak_bytes"] >= r["activation_bytes"]
    assert rows[0]["ratio_vs_baseline"] == pytest.approx(1.0)  # no DGL row: the first measured setting


@pytest.mark.nightly
def test_bench_memory_step_peak_and_deep_gcnii(tmp_path):
    """--model gcn2 --layers 16 (EXACT's arxiv GCNII depth) runs; each row has the step peak measured on
    a 6,000-node graph (tensors of MiB size: above the allocator's noise) and DGL fp32's ratio is 1."""
    from dgl_exact.memory import vmhwm_available

    out = tmp_path / "out"
    graph = "synthetic-small:num_nodes=6000,num_features=64,num_classes=4"
    proc = cli("memory", "--dataset", graph, "--model", "gcn2", "--hidden", "64", "--layers", "16",
               "--settings", "DGL fp32,dgl_exact fp32,INT2", "--out", str(out), "-q", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = {r["setting"]: r for r in _rows(out / "memory.jsonl")}
    assert set(rows) == {"DGL fp32", "dgl_exact fp32", "INT2"} and all(r["layers"] == 16 for r in rows.values())
    assert "step peak" in proc.stdout
    if vmhwm_available() is None:
        assert rows["DGL fp32"]["peak_ratio_vs_baseline"] == pytest.approx(1.0)
        assert rows["INT2"]["step_peak_bytes"] < rows["DGL fp32"]["step_peak_bytes"]
        assert rows["INT2"]["activation_bytes"] < rows["dgl_exact fp32"]["activation_bytes"] <= \
            rows["dgl_exact fp32"]["step_peak_bytes"]


@pytest.mark.slow
def test_fresh_process_round_trip_through_pipes():
    """A measurement child gets its task on stdin and answers in JSON through a pipe (no pickle is ever
    read from a file); its failure is raised with its stderr."""
    import os

    from dgl_exact.bench.runner import in_fresh_process

    child = in_fresh_process(os.getpid)
    assert isinstance(child, int) and child != os.getpid()
    assert in_fresh_process(dict, {"a": 1.5, "b": None}) == {"a": 1.5, "b": None}
    with pytest.raises(RuntimeError, match="invalid literal"):
        in_fresh_process(int, "not a number")


def test_bench_memory_out_on_a_full_disk_keeps_the_earlier_rows(tmp_path, capsys, monkeypatch, full_disk):
    """One line naming the file, exit 2, the earlier memory.jsonl as it was and no empty file beside it (the
    grid is a stand-in that hands one row to the sink: measuring takes fresh processes)."""
    import dgl_exact.bench.runner as runner
    from tests.cli._helpers import assert_one_line_error, run

    def grid(work, models, settings, sink, progress=True):
        row = {"model": models[0], "setting": settings[0].name, "activation_MiB": 1.0}
        sink.add(row)
        return [row]

    monkeypatch.setattr(runner, "memory_grid", grid)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "memory.jsonl").write_text('{"setting": "earlier"}\n')
    assert_one_line_error(run(["bench", "memory", "--dataset", TINY, "--model", "gcn", "--settings", "INT2",
                               "--hidden", "8", "--layers", "2", "--out", out, "-q"], capsys),
                          f"could not write {out / 'memory.jsonl'}", "no space left on device")
    assert os.listdir(out) == ["memory.jsonl"] and (out / "memory.jsonl").read_text() == '{"setting": "earlier"}\n'
