"""dgl_exact/bench/report.py: REPORT.md and the assembled BENCHMARKS.md are written atomically (a full disk
leaves the earlier files as they were)."""
import os

import pytest

from dgl_exact.bench.report import assemble, write_report
from dgl_exact.errors import WriteError


def test_report_and_assembly(tmp_path):
    report = write_report(str(tmp_path / "run"), "label", "dgl-exact bench all", ["### section"], [])
    assert open(report).read().startswith("## label\n") and "### section" in open(report).read()
    out = assemble(str(tmp_path), str(tmp_path / "BENCHMARKS.md"))
    assert "### section" in open(out).read()


def test_report_and_assembly_on_a_full_disk_keep_the_earlier_files(tmp_path, request):
    report = write_report(str(tmp_path / "run"), "label", "cmd", ["### earlier"], [])
    out = assemble(str(tmp_path), str(tmp_path / "BENCHMARKS.md"))
    before = {p: open(p).read() for p in (report, out)}
    request.getfixturevalue("full_disk")
    with pytest.raises(WriteError, match=f"could not write {report}: no space left on device"):
        write_report(str(tmp_path / "run"), "label", "cmd", ["### new"], [])
    with pytest.raises(WriteError, match=f"could not write {out}: no space left on device"):
        assemble(str(tmp_path), out)
    assert {p: open(p).read() for p in before} == before
    assert sorted(os.listdir(tmp_path)) == ["BENCHMARKS.md", "run"] and os.listdir(tmp_path / "run") == ["REPORT.md"]
