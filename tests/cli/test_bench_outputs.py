"""``dgl-exact bench``'s outputs have one writer: each suite locks its results in ``--out`` (``<suite>.jsonl``,
standing for all its files there) and its ``--json``/``--benchmarks-md`` for the command's life. A second run of
the same suite into the same folder is refused before any work in one line naming the holder's pid; another
suite may write into the same folder at the same time; a lock left by a killed run is taken over."""
import os

import pytest

from tests.cli._helpers import (TINY, _in_tmp_and_signals_restored, assert_one_line_error,  # noqa: F401
                                held_by_another_process, run)

BENCH = ["--dataset", TINY, "--model", "gcn", "--hidden", "8", "--layers", "2", "--settings", "INT2", "--device",
         "cpu", "-q"]
KERNELS = ["bench", "kernels", "--rows", "64", "--cols", "8", "--repeats", "1", "--device", "cpu", "-q"]


@pytest.fixture(autouse=True)
def _dirty_tree_allowed(monkeypatch):
    """The suites refuse a checkout with uncommitted changes unless --allow-dirty (not what these tests check)."""
    monkeypatch.setenv("DGL_EXACT_ALLOW_DIRTY", "1")


def _no_work(*args, **kwargs):
    raise AssertionError("the command started its work before locking its outputs")


@pytest.fixture
def no_work(monkeypatch):
    """Every suite's first step of work (resolving the device, loading a dataset) fails the test."""
    import dgl_exact.data as D
    import dgl_exact.training.trainer as T

    monkeypatch.setattr(D, "load_dataset", _no_work)
    monkeypatch.setattr(T, "resolve_device", _no_work)


# (command, the output a live run holds, the option named in the refusal)
CASES = [
    (["bench", "memory", *BENCH, "--out", "res"], "res/memory.jsonl", "--out"),
    (["bench", "speed", *BENCH, "--out", "res"], "res/speed.jsonl", "--out"),
    (["bench", "profile", *BENCH, "--out", "res"], "res/profile.jsonl", "--out"),
    (["bench", "profile", *BENCH, "--emulate-gpu", "--out", "res"], "res/opcount.jsonl", "--out"),
    (["bench", "profile", *BENCH, "--emulate-gpu", "--json", "counts.json"], "counts.json", "--json"),
    (["bench", "census", *BENCH, "--json", "census.json"], "census.json", "--json"),
    ([*KERNELS, "--out", "res"], "res/kernels.jsonl", "--out"),
    (["bench", "accuracy", "--dataset", TINY, "--model", "gcn", "--runs", "1", "--epochs", "1", "--settings", "INT2",
      "--device", "cpu", "-q", "--out", "res"], "res/accuracy.jsonl", "--out"),
    (["bench", "minibatch", "--dataset", TINY, "--fanouts", "2,2", "--settings", "INT2", "--hidden", "8", "-q",
      "--out", "res"], "res/minibatch.jsonl", "--out"),
    (["bench", "plan", *BENCH, "--out", "res"], "res/plan.jsonl", "--out"),
    (["bench", "budget", "--dataset", TINY, "--epochs", "1", "--runs", "1", "--out", "res"], "res/budget.jsonl",
     "--out"),
    (["bench", "all", "--dataset", TINY, "--accuracy-dataset", TINY, "--model", "gcn", "--runs", "1", "--device",
      "cpu", "-q", "--out", "res", "--label", "m"], "res/m/speed/speed.jsonl", "--out/--label"),
    (["bench", "all", "--dataset", TINY, "--accuracy-dataset", TINY, "--model", "gcn", "--runs", "1", "--device",
      "cpu", "-q", "--out", "res", "--benchmarks-md", "B.md"], "B.md", "--benchmarks-md"),
]


@pytest.mark.parametrize("args, held, option", CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_an_output_a_live_run_holds_is_refused_before_any_work(tmp_path, capsys, no_work, args, held, option):
    with held_by_another_process(tmp_path / held) as holder:
        assert_one_line_error(run(args, capsys),
                              f"error: {option} {held} is in use by another dgl-exact run (pid {holder.pid})")
    assert not (tmp_path / held).exists()


def test_two_suites_share_a_folder_one_suite_runs_once_and_a_dead_runs_lock_is_taken_over(tmp_path, capsys,
                                                                                          monkeypatch):
    res = tmp_path / "res"
    with held_by_another_process(res / "memory.jsonl"):  # `bench memory --out res` is running
        code, out, err = run([*KERNELS, "--out", res], capsys)  # another suite: its own files, not refused
        assert code == 0, err
        assert (res / "kernels.jsonl").exists() and not (res / "memory.jsonl").exists()
        with held_by_another_process(res / "kernels.jsonl") as holder:
            with monkeypatch.context() as m:
                m.setattr("dgl_exact.training.trainer.resolve_device", _no_work)
                assert_one_line_error(run([*KERNELS, "--out", res], capsys),
                                      f"--out {res}/kernels.jsonl is in use by another dgl-exact run "
                                      f"(pid {holder.pid})")
        assert (res / ".kernels.jsonl.lock").exists()  # killed: the lock file stays, with its dead pid
        code, out, err = run([*KERNELS, "--out", res], capsys)
        assert code == 0, err
    assert sorted(os.listdir(res)) == [".memory.jsonl.lock", "kernels.csv", "kernels.jsonl", "kernels.jsonl.previous",
                                       "kernels.md", "runs.json"]
