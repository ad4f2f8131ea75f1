"""dgl_exact/bench/report.py: the layout of ``benchmarks/`` (``<machine>/<suite>/README.md``), the assembled
BENCHMARKS.md (machines sorted, suites in their fixed order, links rebased), both written atomically (a full
disk leaves the earlier files as they were)."""
import json
import os
import re
from pathlib import Path

import pytest

from dgl_exact.bench.report import SUITES, assemble, render, write_suite_report
from dgl_exact.bench.suites import render_suite
from dgl_exact.errors import WriteError


def _results(folder, name="rows.jsonl", text="x"):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        f.write(json.dumps({"model": text, "setting": "INT2"}) + "\n")
    return {"results": name, "command": "dgl-exact bench all", "machine": "here", "code": "abc", "columns": ["model"]}


def test_suite_reports_assemble_per_machine_in_suite_order(tmp_path):
    root = tmp_path / "benchmarks"
    (root / "gpu" / "memory").mkdir(parents=True)
    (root / "gpu" / "memory" / "memory.png").write_bytes(b"png")
    for machine, suite in (("laptop", "accuracy"), ("laptop", "memory"), ("gpu", "memory"), ("laptop", "extra")):
        run = _results(root / machine / suite, text=f"{machine} {suite}")
        run["command"] = f"dgl-exact bench all --label {machine}"
        path = write_suite_report(str(root), machine, suite, run)
        assert path == str(root / machine / suite / "README.md")
        text = open(path).read()
        assert text.startswith(f"### {SUITES.get(suite, suite)}\n") and f"--label {machine}`" in text
    assert "![memory.png](memory.png)" in open(root / "gpu" / "memory" / "README.md").read()
    (root / "laptop" / "README.md").write_text("Laptop: 4 cores, see [memory](memory/README.md).\n")
    (root / "empty").mkdir()
    out = assemble(str(root), str(tmp_path / "BENCHMARKS.md"))
    text = open(out).read()
    order = [text.index(s) for s in ("## Published figures", "## gpu", "| gpu memory |", "## laptop", "Laptop: 4",
                                     "| laptop memory |", "| laptop accuracy |", "| laptop extra |")]
    assert order == sorted(order), text
    assert "## empty" not in text  # a machine folder without reports adds nothing
    # links resolve from BENCHMARKS.md's folder
    assert "![memory.png](benchmarks/gpu/memory/memory.png)" in text
    assert "[memory](benchmarks/laptop/memory/README.md)" in text


def test_report_and_assembly_on_a_full_disk_keep_the_earlier_files(tmp_path, request):
    root = tmp_path / "b"
    run = _results(root / "m" / "memory", text="earlier")
    report = write_suite_report(str(root), "m", "memory", run)
    out = assemble(str(root), str(tmp_path / "BENCHMARKS.md"))
    before = {p: open(p).read() for p in (report, out)}
    request.getfixturevalue("full_disk")
    with pytest.raises(WriteError, match="could not write .*: no space left on device"):
        write_suite_report(str(root), "m", "memory", {**run, "command": "new"})
    with pytest.raises(WriteError, match=f"could not write {out}: no space left on device"):
        assemble(str(root), out)
    assert {p: open(p).read() for p in before} == before
    assert sorted(os.listdir(tmp_path)) == ["BENCHMARKS.md", "b"]
    assert sorted(os.listdir(root / "m" / "memory")) == ["README.md", "rows.jsonl", "runs.json"]


def test_the_repository_benchmarks_md_is_the_assembly_of_benchmarks():
    """BENCHMARKS.md is generated: it equals what `dgl-exact bench report --benchmarks-md BENCHMARKS.md`
    assembles from benchmarks/, every suite's README.md is what its runs.json and result files render, and every
    link in it resolves."""
    repo = Path(__file__).resolve().parents[2]
    text = render(str(repo / "benchmarks"), str(repo))
    assert text == (repo / "BENCHMARKS.md").read_text(), (
        "BENCHMARKS.md is not the assembly of benchmarks/*/*/README.md: rebuild it with "
        "dgl-exact bench report --label MACHINE --benchmarks-md BENCHMARKS.md")
    for machine in sorted(p for p in (repo / "benchmarks").iterdir() if p.is_dir()):
        for folder in sorted(p for p in machine.iterdir() if p.is_dir()):
            assert (folder / "runs.json").is_file(), f"{folder}: no runs.json (its README.md is not generated)"
            assert (folder / "README.md").read_text() == render_suite(str(folder), folder.name, SUITES[folder.name]), (
                f"{folder}/README.md is not generated from its runs.json: dgl-exact bench report --label "
                f"{machine.name}")
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if "://" not in target:
            assert (repo / target).exists(), target
