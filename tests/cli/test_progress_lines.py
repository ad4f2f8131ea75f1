"""Without a terminal (the bars hidden), `train` prints one line per epoch, `plan` one per planned setting, and
`--resume` says where it continues; `--quiet` prints none of them."""
import re

from tests.cli._helpers import TINY, _in_tmp_and_signals_restored, run  # noqa: F401

EPOCH = re.compile(r"run 1/1: epoch (\d+)/(\d+), loss=\d+\.\d{4}, val=\d\.\d{4}, test=\d\.\d{4} \(\d+\.\d\d s\)")


def _epoch_lines(out):
    return [tuple(map(int, m.groups())) for m in map(EPOCH.fullmatch, out.splitlines()) if m]


def test_train_prints_one_line_per_epoch_and_resume_says_where_it_continues(capsys):
    code, out, err = run(["train", "--dataset", TINY, "--epochs", "2", "--checkpoint", "ck.pt"], capsys)
    assert code == 0, err
    assert _epoch_lines(out) == [(1, 2), (2, 2)], out
    code, out, err = run(["train", "--dataset", TINY, "--epochs", "3", "--checkpoint", "ck.pt", "--resume"], capsys)
    assert code == 0, err
    assert "resuming from ck.pt: epoch 2 of 3 done" in out
    assert _epoch_lines(out) == [(3, 3)], out


def test_train_quiet_prints_no_epoch_lines(capsys):
    code, out, err = run(["train", "--dataset", TINY, "--epochs", "2", "-q"], capsys)
    assert code == 0, err
    assert _epoch_lines(out) == [] and "test acc:" in out


def test_plan_prints_one_line_per_setting_before_the_table(capsys):
    code, out, err = run(["plan", "--nodes", "600", "--edges", "3000", "--features", "8", "--classes", "3",
                          "--hidden", "8", "--layers", "2", "--settings", "INT2,INT8"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    planned = [i for i, line in enumerate(lines) if line.startswith("planned ")]
    assert [lines[i].split(":")[0] for i in planned] == ["planned INT2", "planned INT8"]
    assert re.fullmatch(r"planned INT2: step peak .+, total .+, fits \(\d+\.\d s\)", lines[planned[0]])
    assert planned[-1] < next(i for i, line in enumerate(lines) if line.startswith("| setting"))
