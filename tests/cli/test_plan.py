"""``dgl-exact plan``'s ``--json`` is written atomically: on a full disk, one line naming the file (exit 2) and
the earlier file as it was."""
import os

from tests.cli._helpers import _in_tmp_and_signals_restored, assert_one_line_error, run  # noqa: F401

PLAN = ["plan", "--nodes", "600", "--edges", "3000", "--features", "16", "--classes", "4", "--model", "sage",
        "--hidden", "16", "--layers", "2", "--settings", "INT2"]


def test_plan_json_on_a_full_disk_keeps_the_earlier_file(tmp_path, capsys, full_disk):
    path = tmp_path / "plan.json"
    path.write_text("[]")
    assert_one_line_error(run([*PLAN, "--json", path], capsys), f"error: could not write {path}: no space left")
    assert path.read_text() == "[]" and os.listdir(tmp_path) == ["plan.json"]
