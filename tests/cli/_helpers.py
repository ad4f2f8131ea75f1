"""Helpers shared by the command-line tests: run ``dgl-exact`` in-process and check its one-line errors, and hold
an output's lock from another process."""
import contextlib
import os
import signal
import subprocess
import sys
import textwrap

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


_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_HOLDER = f"""
    import sys, types
    package = types.ModuleType("dgl_exact")  # dgl_exact._files alone: no torch, no DGL
    package.__path__ = [{os.path.join(_REPO, "dgl_exact")!r}]
    sys.modules["dgl_exact"] = package
    from dgl_exact._files import lock_output
    lock_output(sys.argv[1])
    print("locked", flush=True)
    sys.stdin.readline()
"""


@contextlib.contextmanager
def held_by_another_process(path):
    """Yields the process (another, live one) that holds the lock of output ``path``; at the end it is killed
    (SIGKILL: it releases nothing, its lock file stays behind with its pid in it, for the next run to take over)."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_HOLDER), str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked", proc.stderr.read()
        yield proc
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
