"""dgl_exact/bench/suites.py: a suite folder's README.md generated from its result files and runs.json (the
command, machine and code of each run), and ``dgl-exact bench report``, which regenerates a machine's suites."""
import json

import pytest

from dgl_exact.bench import suites
from dgl_exact.bench.report import assemble, report_machine
from tests.cli._helpers import _in_tmp_and_signals_restored, run  # noqa: F401


def _plan_folder(folder):
    folder.mkdir(parents=True)
    rows = [{"kind": "plan", "model": "gcn", "setting": s, "act_pred_MiB": a, "act_meas_MiB": a,
             "act_err_pct": 0.0, "peak_pred_MiB": p, "peak_meas_MiB": m, "peak_err_pct": 100 * (p - m) / m,
             "commit": "abc1234", "code": "dgl_exact 0.2.0, git commit abc1234"}
            for s, a, p, m in (("dgl_exact fp32", 766.6, 972.9, 972.7), ("INT8", 211.7, 541.3, 521.0),
                               ("INT2", 72.2, 432.9, 412.8))]
    (folder / "arxiv.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "arxiv.md").write_text("table\n")
    (folder / "arxiv.jsonl.previous").write_text("")
    return rows


def test_a_suite_readme_is_rendered_from_its_result_files(tmp_path):
    folder = tmp_path / "m" / "plan"
    _plan_folder(folder)
    (folder / "cuda_tests.txt").write_text("PASSED a\nSKIPPED [1] b: no GPU\n"
                                           "240 passed, 3 skipped, 1823 deselected, 51 warnings in 28.75s\n")
    suites.record_run(str(folder), {"results": "arxiv.jsonl", "command": "dgl-exact bench plan --model gcn",
                                    "machine": "Xeon, 2 threads", "code": "abc1234", "date": "2026-12-01",
                                    "rows": {"setting": ["INT2", "dgl_exact fp32"]}, "note": "Every row: the file."})
    suites.record_run(str(folder), {"results": "cuda_tests.txt", "command": "pytest -m cuda", "machine": "H200",
                                    "code": "6a22c0d", "columns": ["summary"]})
    text = suites.render_suite(str(folder), "plan", "Plan: predicted against measured memory")
    assert text.startswith("### Plan: predicted against measured memory\n\n" + suites.ABOUT["plan"])
    assert ("Command: `dgl-exact bench plan --model gcn`\n\nMachine: Xeon, 2 threads; 2026-12-01. Code: abc1234. "
            "Results: [arxiv.jsonl](arxiv.jsonl), [arxiv.md](arxiv.md).") in text
    # the suite's columns, the chosen rows in the order asked, figures as the file holds them (4 significant)
    assert ("| model | setting | act_pred_MiB | act_meas_MiB | act_err_pct | peak_pred_MiB | peak_meas_MiB | "
            "peak_err_pct |\n|---|---|---|---|---|---|---|---|\n"
            "| gcn | INT2 | 72.20 | 72.20 | 0.0000 | 432.9 | 412.8 | 4.87 |\n"
            "| gcn | dgl_exact fp32 | 766.6 | 766.6 | 0.0000 | 972.9 | 972.7 | 0.0206 |\n\n"
            "Every row: the file.") in text
    assert "INT8" not in text
    assert "| summary |\n|---|\n| 240 passed, 3 skipped, 1823 deselected, 51 warnings |" in text
    # a rerun of the same result file replaces its run, keeping the order of the others
    suites.record_run(str(folder), {"results": "arxiv.jsonl", "command": "dgl-exact bench plan --model sage",
                                    "machine": "EPYC", "code": "def5678"})
    runs = suites.read_manifest(str(folder))
    assert [r["results"] for r in runs] == ["cuda_tests.txt", "arxiv.jsonl"] and runs[1]["code"] == "def5678"
    assert "| gcn | INT8 |" in suites.render_suite(str(folder), "plan", "Plan")


@pytest.mark.parametrize("content,message", [
    ("{", "not JSON"),
    ('{"results": "a.jsonl"}', "expected a list of runs"),
    ('[{"results": "a.jsonl", "command": "c", "machine": "m"}]', r"run 0 lacks \['code'\]"),
    ('[{"results": "a.jsonl", "command": "c", "machine": "m", "code": "x", "figure": 1}]', "unknown keys"),
])
def test_a_malformed_manifest_is_refused_by_name(tmp_path, content, message):
    (tmp_path / "runs.json").write_text(content)
    with pytest.raises(ValueError, match=f"runs.json: .*{message}"):
        suites.read_manifest(str(tmp_path))


def test_a_log_without_a_pytest_summary_is_refused(tmp_path):
    (tmp_path / "log.txt").write_text("built\n")
    with pytest.raises(ValueError, match="no pytest summary line"):
        suites.load_results(str(tmp_path / "log.txt"))


def test_bench_report_regenerates_a_machine_and_benchmarks_md(tmp_path, capsys):
    root = tmp_path / "benchmarks"
    _plan_folder(root / "box" / "plan")
    suites.record_run(str(root / "box" / "plan"), {"results": "arxiv.jsonl", "command": "dgl-exact bench plan",
                                                   "machine": "Xeon", "code": "abc1234"})
    (root / "box" / "notes").mkdir()
    (root / "box" / "notes" / "README.md").write_text("### Notes\n\nby hand\n")
    code, out, err = run(["bench", "report", "--label", "box", "--out", str(root), "--benchmarks-md", "B.md"], capsys)
    assert code == 0, err
    assert f"report: {root}/box/plan/README.md" in out and "left as written (no runs.json): notes" in err
    text = (tmp_path / "B.md").read_text()
    assert text.index("### Plan: predicted against measured memory") < text.index("| gcn | INT8 | 211.7 |")
    assert "Results: [arxiv.jsonl](benchmarks/box/plan/arxiv.jsonl)" in text and "by hand" in text
    code, out, err = run(["bench", "report", "--label", "nobox", "--out", str(root)], capsys)
    assert code == 2 and err.startswith("error: no folder ") and "nobox" in err


def test_report_machine_leaves_suites_without_a_manifest(tmp_path):
    root = tmp_path / "b"
    _plan_folder(root / "m" / "plan")
    assert report_machine(str(root), "m") == ([], ["plan"])
    assert not (root / "m" / "plan" / "README.md").exists()
    assert open(assemble(str(root), str(tmp_path / "B.md"))).read().count("## m") == 0


def test_a_bench_command_records_its_run_and_report_renders_it(tmp_path, capsys):
    """`dgl-exact bench kernels --out F` writes its run (the command as given, this machine, the code) to
    F/runs.json beside kernels.jsonl; `bench report` then renders F's README.md from them."""
    out = tmp_path / "box" / "kernels"
    code, _, err = run(["bench", "kernels", "--rows", "64", "--cols", "8", "--repeats", "1", "--device", "cpu",
                        "--out", out, "--allow-dirty", "-q"], capsys)
    assert code == 0, err
    (entry,) = suites.read_manifest(str(out))
    assert entry["results"] == "kernels.jsonl" and entry["command"] == (
        f"dgl-exact bench kernels --allow-dirty --rows 64 --cols 8 --repeats 1 --device cpu --out {out}")
    assert entry["machine"].startswith("CPU ") and "dgl_exact" in entry["code"]
    code, out_text, err = run(["bench", "report", "--label", "box", "--out", tmp_path], capsys)
    assert code == 0, err
    text = (out / "README.md").read_text()
    assert text.startswith("### Kernel throughput\n") and f"Command: `{entry['command']}`" in text
    rows = suites.load_results(str(out / "kernels.jsonl"))
    assert len(rows) > 1
    assert all(f"| {r['backend']} | {r['op']} | {r['setting']} | {r['shape']} |" in text for r in rows)
