"""``dgl-exact plan``'s ``--json`` is written atomically: on a full disk, one line naming the file (exit 2) and
the earlier file as it was; a second run on a ``--json`` a live run holds is refused before any work, naming the
holder's pid, and a lock left by a killed run is taken over."""
import json
import os

from tests.cli._helpers import (TINY, _in_tmp_and_signals_restored, assert_one_line_error,  # noqa: F401
                                held_by_another_process, run)

PLAN = ["plan", "--nodes", "600", "--edges", "3000", "--features", "16", "--classes", "4", "--model", "sage",
        "--hidden", "16", "--layers", "2", "--settings", "INT2"]


def test_plan_json_on_a_full_disk_keeps_the_earlier_file(tmp_path, capsys, full_disk):
    path = tmp_path / "plan.json"
    path.write_text("[]")
    assert_one_line_error(run([*PLAN, "--json", path], capsys), f"error: could not write {path}: no space left")
    assert path.read_text() == "[]" and os.listdir(tmp_path) == ["plan.json"]


def test_plan_json_held_by_another_run_is_refused_before_planning_then_taken_over(tmp_path, capsys, monkeypatch):
    import dgl_exact.planning.predict as P

    path = tmp_path / "plan.json"
    with held_by_another_process(path) as holder:
        with monkeypatch.context() as m:
            m.setattr(P, "plan", _no_work)
            assert_one_line_error(run([*PLAN, "--json", path], capsys),
                                  f"--json {path} is in use by another dgl-exact run (pid {holder.pid})")
        assert not path.exists()
    assert os.path.exists(tmp_path / ".plan.json.lock")  # the killed holder's, its pid in it
    code, out, err = run([*PLAN, "--json", path], capsys)
    assert code == 0, err
    assert [r["setting"] for r in json.loads(path.read_text())] == ["INT2"]
    assert sorted(os.listdir(tmp_path)) == ["plan.json"]  # lock released, no temporary file left


def test_plan_minibatch_json_held_by_another_run_is_refused_before_sampling(tmp_path, capsys, monkeypatch):
    import dgl_exact.data as D

    path = tmp_path / "plan.json"
    monkeypatch.setattr(D, "load_dataset", _no_work)
    with held_by_another_process(path) as holder:
        assert_one_line_error(run(["plan", "--sampler", "neighbor", "--dataset", TINY, "--model", "sage", "--fanouts",
                                   "2,2", "--batch-size", "8", "--json", path], capsys),
                              f"--json {path} is in use by another dgl-exact run (pid {holder.pid})")


def _no_work(*args, **kwargs):
    raise AssertionError("the command started its work before locking its outputs")
