"""``dgl-exact train``'s outputs: ``--json`` and ``--checkpoint`` on a full disk end in one line naming the file
(exit 2) and leave the previous file as it was; a second run on an output a live run holds is refused before
any work, naming the holder's pid, and a lock left by a killed run is taken over."""
import os

import pytest

from tests.cli._helpers import (TINY, _in_tmp_and_signals_restored, assert_one_line_error,  # noqa: F401
                               held_by_another_process, run)

TRAIN = ["train", "--dataset", TINY, "--hidden", "8", "--epochs", "1", "-q"]


def _left(folder):
    """What a run left beside its outputs: temporary and lock files."""
    return [n for n in os.listdir(folder) if ".partial-" in n or n.endswith(".lock")]


def test_json_on_a_full_disk_keeps_the_previous_file(tmp_path, capsys, full_disk):
    path = tmp_path / "results.json"
    path.write_text('{"earlier": "results"}')
    line = assert_one_line_error(run([*TRAIN, "--json", path], capsys), f"could not write {path}",
                                 "no space left on device")
    assert line.startswith(f"error: could not write {path}: no space left on device")
    assert path.read_text() == '{"earlier": "results"}' and _left(tmp_path) == []


def test_checkpoint_on_a_full_disk_keeps_the_previous_checkpoint(tmp_path, capsys, request):
    path = tmp_path / "ck.pt"
    code, out, err = run([*TRAIN, "--checkpoint", path], capsys)
    assert code == 0, err
    before = path.read_bytes()
    request.getfixturevalue("full_disk")  # from here on: the first run wrote its checkpoint normally
    args = [a if a != "1" else "2" for a in TRAIN]  # --epochs 2: one more epoch, then its checkpoint
    assert_one_line_error(run([*args, "--checkpoint", path, "--resume"], capsys),
                          f"error: could not write {path}: no space left on device")
    assert path.read_bytes() == before and _left(tmp_path) == []


def test_new_checkpoint_on_a_full_disk_leaves_nothing(tmp_path, capsys, full_disk):
    path = tmp_path / "ck.pt"
    assert_one_line_error(run([*TRAIN, "--checkpoint", path], capsys), f"could not write {path}: no space left")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------------
# One writer per run
# ------------------------------------------------------------------------------------------------
def _no_training(monkeypatch):
    import dgl_exact.training.trainer as T

    def boom(*args, **kwargs):
        raise AssertionError("the run started before its outputs were locked")

    monkeypatch.setattr(T.Trainer, "__init__", boom)


@pytest.mark.parametrize("option, name", [("--checkpoint", "ck.pt"), ("--json", "results.json")])
def test_second_run_on_a_held_output_is_refused_up_front_then_takes_it_over(tmp_path, capsys, monkeypatch, option,
                                                                            name):
    path = tmp_path / name
    with held_by_another_process(path) as proc:  # killed at the end: it releases nothing
        with monkeypatch.context() as m:
            _no_training(m)
            for resume in ([], ["--resume"]) if option == "--checkpoint" else ([],):
                assert_one_line_error(run([*TRAIN, option, path, *resume], capsys),
                                      f"{option} {path} is in use by another dgl-exact run (pid {proc.pid})")
    code, out, err = run([*TRAIN, option, path], capsys)
    assert code == 0, err
    assert path.exists() and _left(tmp_path) == []
