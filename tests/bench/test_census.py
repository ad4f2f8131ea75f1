"""``bench/census.py``: the census of a benchmarked model's step, and its CLI form ``dgl-exact bench census``."""
import json
import os
import subprocess
import sys

import pytest

from dgl_exact.bench.census import model_census
from dgl_exact.bench.runner import Workload
from dgl_exact.data import load_dataset
from dgl_exact.planning.settings import select

pytestmark = pytest.mark.usefixtures("one_thread")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = "synthetic-small:num_nodes=3000,num_features=64,num_classes=4"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return Workload(load_dataset(TINY, str(tmp_path_factory.mktemp("data")), quiet=True), "cpu", hidden=64,
                    layers=2)


def test_a_user_models_lines_are_named_and_int2_keeps_compressed_data(work):
    report = model_census(work, "arxiv-gcn-user", select("INT2")[0], min_bytes=16 * 1024)
    assert [p.phase for p in report.peaks][:2] == ["forward", "backward"]
    lines = {t.line for p in report.peaks for t in p.tensors}
    # the user's own lines in bench/user_models.py, not the benchmark's model(g, x) call
    assert any("user_models.py" in line and "self.convs[i](graph, h)" in line for line in lines)
    kept = [t for t in report.peak("backward").tensors if t.role == "saved for backward"]
    assert any(t.compressed for t in kept)
    fp32 = select("DGL fp32")[0]
    assert not any(t.compressed for p in model_census(work, "arxiv-gcn-user", fp32, min_bytes=16 * 1024).peaks
                   for t in p.tensors)


def cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DGL_EXACT_ALLOW_DIRTY="1")
    return subprocess.run([sys.executable, "-m", "dgl_exact", "bench", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_bench_census_cli_prints_tables_and_writes_json(tmp_path):
    out = tmp_path / "census.json"
    proc = cli("census", "--dataset", TINY, "--model", "arxiv-gat-user", "--hidden", "16", "--layers", "2",
               "--settings", "INT2", "--top", "3", "--min-kib", "32", "--json", str(out), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "forward peak" in proc.stdout and "backward peak" in proc.stdout and "| MiB | data |" in proc.stdout
    records = json.loads(out.read_text())
    assert [r["model"] for r in records] == ["arxiv-gat-user"] and records[0]["setting"] == "INT2"
    assert records[0]["peaks"][0]["peak_bytes"] == sum(t["bytes"] for t in records[0]["peaks"][0]["tensors"])


@pytest.mark.slow
def test_bench_census_cli_refuses_several_settings(tmp_path):
    proc = cli("census", "--dataset", TINY, "--model", "gcn", "--settings", "INT2,INT4", cwd=str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("error:") and "one setting" in proc.stderr
    assert "Traceback" not in proc.stderr
