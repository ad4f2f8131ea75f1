"""Benchmark provenance: the commit of the measured code (or "no git checkout"), a dirty tree refused unless
--allow-dirty, and every output file naming the code."""
import subprocess

import pytest

from dgl_exact.bench import provenance as P
from tests.cli._helpers import assert_one_line_error, run  # noqa: F401


def _git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin:/usr/local/bin"})


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "repo"
    (repo / "dgl_exact").mkdir(parents=True)
    (repo / "dgl_exact" / "__init__.py").write_text("x = 1\n")
    (repo / "setup.py").write_text("")
    (repo / "notes.txt").write_text("")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    return repo


def test_clean_checkout_records_its_commit(checkout):
    head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    prov = P.provenance(str(checkout / "dgl_exact"))
    assert prov["commit"] == head and not prov["dirty"]
    assert head in prov["code"] and "dirty" not in prov["code"]


def test_uncommitted_changes_to_measured_code_make_it_dirty(checkout):
    (checkout / "notes.txt").write_text("not measured code\n")
    (checkout / "untracked.py").write_text("")
    assert not P.provenance(str(checkout / "dgl_exact"))["dirty"]
    (checkout / "dgl_exact" / "__init__.py").write_text("x = 2\n")
    (checkout / "setup.py").write_text("# changed\n")
    prov = P.provenance(str(checkout / "dgl_exact"))
    assert prov["dirty"] and prov["dirty_paths"] == ["dgl_exact/__init__.py", "setup.py"]
    assert "dirty tree: uncommitted changes to dgl_exact/__init__.py, setup.py" in prov["code"]


def test_no_git_checkout_records_the_version(tmp_path, monkeypatch):
    pkg = tmp_path / "site-packages" / "dgl_exact"
    pkg.mkdir(parents=True)
    prov = P.provenance(str(pkg))
    assert prov["commit"] is None and not prov["dirty"] and "no git checkout" in prov["code"]
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all: the same, no crash
    assert P.provenance(str(pkg))["commit"] is None


def test_package_inside_another_repository_is_not_a_checkout(checkout):
    inner = checkout / "venv" / "site-packages" / "dgl_exact"
    inner.mkdir(parents=True)
    assert "no git checkout" in P.provenance(str(inner))["code"]


DIRTY = {"version": "0", "commit": "abc", "dirty": True, "dirty_paths": ["dgl_exact/x.py"],
         "code": "dgl_exact 0, git commit abc; dirty tree: uncommitted changes to dgl_exact/x.py"}


def test_bench_refuses_a_dirty_tree_in_one_line(capsys, monkeypatch):
    monkeypatch.delenv("DGL_EXACT_ALLOW_DIRTY", raising=False)
    monkeypatch.setattr(P, "_current", DIRTY)
    for cmd in (["bench", "kernels"], ["bench", "memory"], ["bench", "plan"], ["bench", "budget"]):
        assert_one_line_error(run([*cmd, "--out", "/nonexistent/never-written"], capsys),
                              "uncommitted changes to dgl_exact/x.py", "--allow-dirty")


def test_allow_dirty_runs_and_every_file_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DGL_EXACT_ALLOW_DIRTY", raising=False)
    monkeypatch.setattr(P, "_current", DIRTY)
    out = tmp_path / "out"
    code, printed, err = run(["bench", "kernels", "--allow-dirty", "--rows", "64", "--cols", "8", "--repeats", "1",
                        "--device", "cpu", "--out", out, "-q"], capsys)
    assert code == 0, err
    assert "dirty tree" in printed  # the table printed says so too
    for name in ("kernels.jsonl", "kernels.csv", "kernels.md"):
        assert "dirty tree: uncommitted changes to dgl_exact/x.py" in (out / name).read_text(), name
    assert "abc" in (out / "kernels.csv").read_text()
