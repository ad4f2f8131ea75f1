"""`dgl-exact bench all --label M`: rerun every recorded run of benchmarks/M/*/runs.json (dgl_exact.bench.rerun)."""
import json
import os
import sys

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
    assert [i.suite for i in items] == ["memory", "memory", "plan", "checks"]
    mem, shell, plan_, checks = items
    assert mem.env == {"OMP_NUM_THREADS": "1"}
    assert mem.argv == [sys.executable, "-m", "dgl_exact", "bench", "memory", "--model", "sage", "--out",
                        os.path.join(root, "fake", "memory")]
    assert "shell command" in shell.refused and not shell.argv
    assert plan_.stdout_to == os.path.join(root, "fake", "plan", "p.txt")
    assert checks.argv == ["bash", "scripts/gpu_check.sh"] and checks.env == {"OUT": os.path.join(root, "fake",
                                                                                                    "checks")}
    assert [i.suite for i in rr.plan(root, "fake", only=["plan"], scripts=str(tmp_path / "scripts"))] == ["plan"]


def test_rerun_goes_on_after_a_failure_and_keeps_the_manifest(tmp_path):
    root = _machine(tmp_path)
    items = rr.plan(root, "fake", scripts=str(tmp_path / "scripts"))
    ran, lines = [], []

    def runner(item):
        ran.append(item.suite)
        if item.suite == "plan":  # a run records itself (appended, new code); the manifest keeps order and title
            folder = item.folder
            (tmp_path / "benchmarks" / "fake" / "plan" / "runs.json").write_text(json.dumps(
                [{"results": "p.txt", "command": "dgl-exact plan --out X", "machine": "m2", "code": "new"}]))
            assert os.path.isdir(folder)
            return 0
        return 3 if item.suite == "memory" else 0

    failures = rr.rerun(items, lines.append, runner=runner)
    assert ran == ["memory", "plan", "checks"]
    assert len(lines) == 4 and lines[0].startswith("[1/4] memory: OMP_NUM_THREADS=1 dgl-exact bench memory")
    assert "exit status 3" in lines[0] and "refused" in lines[1] and lines[2].endswith(" s)")
    assert len(failures) == 2
    (entry,) = read_manifest(os.path.join(root, "fake", "plan"))
    assert entry == {"results": "p.txt", "command": "dgl-exact plan --dataset cora --model gcn", "machine": "m2",
                     "code": "new", "title": "T"}


def test_cli_dry_run_lists_and_runs_nothing(tmp_path, monkeypatch):
    root = _machine(tmp_path)
    monkeypatch.setattr(rr, "_run", lambda item: (_ for _ in ()).throw(AssertionError("ran")))
    out = CliRunner().invoke(bench, ["all", "--label", "fake", "--out", root, "--dry-run", "--allow-dirty",
                                     "--suites", "memory,plan"])
    assert out.exit_code == 0, out.output
    assert out.output.count("\n[") + out.output.startswith("[") == 3
    assert "refused: a shell command" in out.output and "checks" not in out.output
    bad = CliRunner().invoke(bench, ["all", "--label", "fake", "--out", root, "--dry-run", "--allow-dirty",
                                     "--suites", "speed"])
    assert bad.exit_code == 2 and "no runs.json" in bad.output
