"""Helpers shared by the command-line tests: run ``dgl-exact`` in-process and check its one-line errors."""
import signal

import pytest

from dgl_exact.cli import main

TINY = "synthetic:num_nodes=60,num_features=8,num_classes=3,avg_degree=4"


@pytest.fixture(autouse=True)
def _in_tmp_and_signals_restored(tmp_path, monkeypatch):
    """Every command runs in a fresh folder; ``train`` installs SIGINT/SIGTERM handlers, put them back."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DGL_EXACT_DATA", raising=False)
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def run(args, capsys):
    """(exit status, stdout, stderr) of ``dgl-exact ARGS``."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(result, *needles):
    code, out, err = result
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
