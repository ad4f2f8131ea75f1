"""``dgl-exact bench all``: where it writes (``ROOT/LABEL/<suite>/`` with each suite's results, figures and
README.md) and the BENCHMARKS.md it assembles, checked with the measuring grids replaced by canned rows (the
grids themselves are tested in tests/bench)."""
import pytest

from dgl_exact.bench import runner
from tests.cli._helpers import TINY, _in_tmp_and_signals_restored, run  # noqa: F401


@pytest.fixture
def canned_grids(monkeypatch):
    def memory_grid(work, models, settings, sink, progress=True):
        for m in models:
            for i, s in enumerate(settings):
                sink.add({"model": m, "setting": s.name, "activation_MiB": 100.0 / (i + 1), "ratio_vs_baseline":
                          float(i + 1), "step_peak_MiB": 200.0 / (i + 1), "peak_ratio_vs_baseline": float(i + 1),
                          "device": "cpu", "note": "n/a"})
        return sink.rows

    def speed_grid(work, models, settings, sink, epochs=3, warmup=1, progress=True):
        for m in models:
            for s in settings:
                sink.add({"model": m, "setting": s.name, "epoch_ms": 10.0, "epoch_ms_std": 1.0,
                          "ratio_vs_baseline": 1.0, "device": "cpu", "note": "n/a"})
        return sink.rows

    def kernel_grid(sink, device, progress=True, **kwargs):
        sink.add({"backend": "torch", "op": "compress", "setting": "INT2", "shape": "4x4", "ms": 1.0,
                  "GB_per_s": 1.0, "device": "cpu"})
        return sink.rows

    def accuracy_grid(ds, cfg, settings, runs, sink, progress=True):
        rows = [{"dataset": cfg.dataset, "model": cfg.model, "setting": s.name, "runs": runs, "test_mean": 0.8,
                 "test_std": 0.01, "delta_vs_fp32": 0.0, "epoch_ms": 5.0} for s in settings]
        for r in rows:
            sink.add(r)
        return rows

    for name, fn in (("memory_grid", memory_grid), ("speed_grid", speed_grid), ("kernel_grid", kernel_grid),
                     ("accuracy_grid", accuracy_grid)):
        monkeypatch.setattr(runner, name, fn)


def test_bench_all_writes_one_folder_per_suite_and_assembles_benchmarks_md(tmp_path, capsys, canned_grids):
    code, out, err = run(["bench", "all", "--label", "box", "--root", "results", "--dataset", TINY, "--models",
                          "sage", "--runs", "1", "--device", "cpu", "--benchmarks-md", "B.md", "--allow-dirty",
                          "-q"], capsys)
    assert code == 0, err
    machine = tmp_path / "results" / "box"
    assert sorted(p.name for p in machine.iterdir()) == ["accuracy", "kernels", "memory", "speed"]
    for suite in ("memory", "speed", "kernels", "accuracy"):
        names = {p.name for p in (machine / suite).iterdir()}
        assert {"README.md", f"{suite}.jsonl", f"{suite}.csv", f"{suite}.md"} <= names, (suite, names)
        readme = (machine / suite / "README.md").read_text()
        assert readme.startswith("### ") and "Command: `dgl-exact bench all" in readme and "--label box" in readme
        assert readme.count("### ") == 1 and readme.count("Code: ") == 1, readme
        assert f"report: results/box/{suite}/README.md" in out
    text = (tmp_path / "B.md").read_text()
    order = [text.index(h) for h in ("## box", "### Activation memory and step peak", "### Epoch time",
                                     "### Kernel throughput", "### Accuracy")]
    assert order == sorted(order), text
    if (machine / "memory" / "memory.png").exists():  # matplotlib installed: figures linked from B.md's folder
        assert "](results/box/memory/memory.png)" in text
