"""`dgl-exact bench all --label M`: rerun every recorded run of benchmarks/M/*/runs.json (dgl_exact.bench.rerun)."""
import json
import os
import sys

import pytest
from click.testing import CliRunner

from dgl_exact.bench import rerun as rr
from dgl_exact.bench.suites import read_manifest
from dgl_exact.cli.bench import bench


def _machine(tmp_path):
    runs = {"plan": [{"results": "p.txt", "command": "dgl-exact plan --dataset cora --model gcn", "machine": "m",
                      "code": "old", "title": "T"}],
            "memory": [{"results": "a.jsonl", "command": "OMP_NUM_THREADS=1 dgl-exact bench memory --model sage",
                        "machine": "m", "code": "old"},
                       {"results": "b.jsonl", "command": "cd scripts && python x.py", "machine": "m", "code": "old"}],
            "speed": [{"results": "../checks/c.txt", "command": "dgl-exact bench speed", "machine": "m",
                       "code": "old"}],
            "checks": [{"results": "c.txt", "command": "OUT=DIR bash scripts/gpu_check.sh (pytest -m cuda tests)",
                        "machine": "m", "code": "old"}]}
    for suite, entries in runs.items():
        folder = tmp_path / "benchmarks" / "fake" / suite
        folder.mkdir(parents=True)
        (folder / "runs.json").write_text(json.dumps(entries))
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "gpu_check.sh").write_text("true\n")
    return str(tmp_path / "benchmarks")


def test_plan_orders_suites_and_refuses_shell(tmp_path):
    root = _machine(tmp_path)
    items = rr.plan(root, "fake", scripts=str(tmp_path / "scripts"))
    assert [i.suite for i in items] == ["memory", "memory", "speed", "plan", "checks"]
    mem, shell, speed, plan_, checks = items
    assert "written by another suite's run" in speed.skipped and not speed.argv
    assert mem.env == {"OMP_NUM_THREADS": "1"}
    assert mem.argv == [sys.executable, "-m", "dgl_exact", "bench", "memory", "--model", "sage", "--out",
                        os.path.join(root, "fake", "memory", ".rerun-a")]
    assert "shell command" in shell.refused and not shell.argv
    assert plan_.stdout_to == os.path.join(root, "fake", "plan", "p.txt")
    assert checks.argv == ["bash", "scripts/gpu_check.sh"] and checks.env == {"OUT": os.path.join(root, "fake",
                                                                                                    "checks")}
    assert [i.suite for i in rr.plan(root, "fake", only=["plan"], scripts=str(tmp_path / "scripts"))] == ["plan"]


def test_rerun_goes_on_after_a_failure_and_keeps_the_manifest(tmp_path):
    root = _machine(tmp_path)
    memory = os.path.join(root, "fake", "memory")
    with open(os.path.join(memory, "runs.json")) as f:
        entries = json.load(f)
    entries[0]["note"] = "kept"
    with open(os.path.join(memory, "runs.json"), "w") as f:
        json.dump(entries, f)
    items = rr.plan(root, "fake", scripts=str(tmp_path / "scripts"))
    ran, lines = [], []

    def runner(item):  # `bench memory --out SCRATCH` writes memory.jsonl/.md there and records its run
        ran.append(item.suite)
        if item.suite == "memory":
            assert item.argv[-2:] == ["--out", item.scratch]
            os.makedirs(item.scratch)
            for name in ("memory.jsonl", "memory.md", "figure.png"):
                (tmp_path / item.scratch / name).write_text(name)
            (tmp_path / item.scratch / "runs.json").write_text(json.dumps(
                [{"results": "memory.jsonl", "command": "dgl-exact bench memory --out X", "machine": "m2",
                  "code": "new"}]))
            return 0
        return 3 if item.suite == "plan" else 0

    failures = rr.rerun(items, lines.append, runner=runner)
    assert ran == ["memory", "plan", "checks"]
    assert len(lines) == 5 and lines[0].startswith("[1/5] memory: OMP_NUM_THREADS=1 dgl-exact bench memory")
    assert lines[0].endswith(" s)") and ": ok (" in lines[0]
    assert "refused" in lines[1] and "not rerun" in lines[2] and "exit status 3" in lines[3] and ": ok (" in lines[4]
    assert len(failures) == 2
    assert sorted(os.listdir(memory)) == ["a.jsonl", "a.md", "figure.png", "runs.json"]
    assert open(os.path.join(memory, "a.jsonl")).read() == "memory.jsonl"
    assert read_manifest(memory) == [
        {"results": "a.jsonl", "command": "OMP_NUM_THREADS=1 dgl-exact bench memory --model sage", "machine": "m2",
         "code": "new", "note": "kept"},
        {"results": "b.jsonl", "command": "cd scripts && python x.py", "machine": "m", "code": "old"}]
    assert read_manifest(os.path.join(root, "fake", "plan"))[0]["code"] == "old"  # failed: left as it was


def test_interrupt_stops_after_reporting_the_run(tmp_path):
    root = _machine(tmp_path)
    items = rr.plan(root, "fake", scripts=str(tmp_path / "scripts"))
    lines = []

    def runner(item):
        if item.suite == "plan":
            raise KeyboardInterrupt
        return 0

    failures = rr.rerun(items, lines.append, runner=lambda item: runner(item) if item.suite != "memory" else 5)
    assert len(lines) == 4 and "interrupted" in lines[-1] and lines[-1].startswith("[4/5] plan:")
    assert len(failures) == 3  # memory failed, memory refused, plan interrupted; checks not run


def test_cli_dry_run_lists_and_runs_nothing(tmp_path, monkeypatch):
    root = _machine(tmp_path)
    monkeypatch.setattr(rr, "_run", lambda item: (_ for _ in ()).throw(AssertionError("ran")))
    out = CliRunner().invoke(bench, ["all", "--label", "fake", "--out", root, "--dry-run", "--allow-dirty",
                                     "--suites", "memory,plan"])
    assert out.exit_code == 0, out.output
    assert out.output.count("\n[") + out.output.startswith("[") == 3  # memory (2), plan
    assert "refused: a shell command" in out.output and "checks" not in out.output
    bad = CliRunner().invoke(bench, ["all", "--label", "fake", "--out", root, "--dry-run", "--allow-dirty",
                                     "--suites", "profile"])
    assert bad.exit_code == 2 and "no runs.json" in bad.output



def test_cli_reports_failures_regenerates_and_exits_1(tmp_path, monkeypatch):
    root = _machine(tmp_path)
    for suite, name, text in (("memory", "a.jsonl", '{"model": "sage", "setting": "INT2"}\n'),
                              ("memory", "b.jsonl", '{"model": "gcn", "setting": "INT2"}\n'),
                              ("plan", "p.txt", "=== 3 passed in 1.0s ===\n"),
                              ("checks", "c.txt", "=== 5 passed in 1.0s ===\n")):
        (tmp_path / "benchmarks" / "fake" / suite / name).write_text(text)
    ran = []
    monkeypatch.chdir(tmp_path)  # its scripts/gpu_check.sh
    monkeypatch.setattr(rr, "_run", lambda item: ran.append(item.suite) or (4 if item.suite == "plan" else 0)
                        if item.env["DGL_EXACT_ALLOW_DIRTY"] == "1" else 9)  # --allow-dirty reaches each run
    monkeypatch.setattr(rr, "_after", lambda item, before: None)
    out = CliRunner().invoke(bench, ["all", "--label", "fake", "--out", root, "--allow-dirty"])
    assert ran == ["memory", "plan", "checks"], out.output
    assert out.exit_code == 1
    assert "2 failed or refused (of 5 runs):" in out.output and "exit status 4" in out.output
    readme = (tmp_path / "benchmarks" / "fake" / "checks" / "README.md").read_text()
    assert "5 passed" in readme and "OUT=DIR bash scripts/gpu_check.sh" in readme

@pytest.mark.slow  # a child process measuring kernels: ~20 s loaded (numba compiles)
def test_cli_reruns_a_recorded_kernels_run_and_regenerates_the_section(tmp_path):
    """End to end: a recorded `bench kernels` at a tiny size is rerun by its command (a child process), its
    result file replaced under its recorded name, and the suite's README.md and BENCHMARKS.md regenerated."""
    root = tmp_path / "benchmarks"
    folder = root / "tiny" / "kernels"
    folder.mkdir(parents=True)
    command = "DGL_EXACT_ALLOW_DIRTY=1 dgl-exact bench kernels --rows 64 --cols 8 --repeats 1 --device cpu"
    (folder / "runs.json").write_text(json.dumps([{"results": "k.jsonl", "command": command, "machine": "m",
                                                   "code": "old"}]))
    md = tmp_path / "BENCHMARKS.md"
    out = CliRunner().invoke(bench, ["all", "--label", "tiny", "--out", str(root), "--allow-dirty",
                                     "--benchmarks-md", str(md)])
    assert out.exit_code == 0, out.output
    assert out.output.startswith(f"[1/1] kernels: {command}: ok (")
    assert sorted(os.listdir(folder)) == ["README.md", "k.csv", "k.jsonl", "k.md", "runs.json"]
    (entry,) = read_manifest(str(folder))
    assert entry["command"] == command and entry["code"] != "old"
    readme = (folder / "README.md").read_text()
    assert f"Command: `{command}`" in readme and "| backend |" in readme and "64x8" in readme.replace(" ", "")
    assert "Kernel throughput" in md.read_text()
