"""dgl_exact/_files.py: atomic writes (a failure leaves the previous file and one WriteError), temporary files
that are their writer's own, and one writer per output (an OS lock, taken over from a dead holder)."""
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from dgl_exact import _files
from dgl_exact._files import OutputLock, atomic_write, lock_output, remove_stale_temporaries
from dgl_exact.errors import OutputInUseError, UserError, WriteError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _previous(tmp_path, name="out.bin"):
    path = tmp_path / name
    path.write_bytes(b"the previous content")
    return path


def _only(tmp_path, *names):
    assert sorted(os.listdir(tmp_path)) == sorted(names)  # no temporary or lock file left


def _writers():
    return {
        "bytes": ("wb", lambda f: f.write(os.urandom(100_000))),
        "text": ("w", lambda f: json.dump({"rows": list(range(10))}, f)),
        "torch.save": ("wb", lambda f: torch.save({"w": torch.randn(1000)}, f)),
        "torch.save small": ("wb", lambda f: torch.save({"epoch": 1}, f)),
        "np.savez": ("wb", lambda f: np.savez(f, a=np.arange(100_000))),
    }


@pytest.mark.parametrize("writer", list(_writers()))
def test_full_disk_leaves_the_previous_file_and_one_error(tmp_path, full_disk, writer):
    mode, write = _writers()[writer]
    path = _previous(tmp_path)
    with pytest.raises(WriteError) as info:
        with atomic_write(str(path), mode) as f:
            write(f)
    assert str(info.value).startswith(f"could not write {path}: no space left on device")
    assert "\n" not in str(info.value) and info.value.errno == errno.ENOSPC
    assert isinstance(info.value, OSError) and isinstance(info.value, UserError) and info.value.exit_code == 2
    assert path.read_bytes() == b"the previous content"
    _only(tmp_path, "out.bin")


def test_full_disk_with_a_new_file_leaves_nothing(tmp_path, full_disk):
    with pytest.raises(WriteError, match="no space left on device"):
        with atomic_write(str(tmp_path / "sub" / "new.json"), "w") as f:
            f.write("{}")
    assert os.listdir(tmp_path / "sub") == []


@pytest.mark.parametrize("step, code", [("fsync", errno.EDQUOT), ("replace", errno.EROFS), ("mkstemp", errno.EACCES)])
def test_failure_around_the_writes_is_the_same_one_error(tmp_path, monkeypatch, step, code):
    path = _previous(tmp_path)

    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(_files.tempfile if step == "mkstemp" else _files.os, step, fail)
    with pytest.raises(WriteError) as info:
        with atomic_write(str(path)) as f:
            f.write(b"new")
    cause = os.strerror(code)
    assert str(info.value).startswith(f"could not write {path}: {cause[:1].lower()}{cause[1:]}")
    assert info.value.errno == code
    assert path.read_bytes() == b"the previous content"
    _only(tmp_path, "out.bin")


def test_other_errors_of_the_block_propagate_as_they_are(tmp_path):
    """A network error (an OSError too) or a bug in the block is not a write failure; nothing is written."""
    path = _previous(tmp_path)
    for error in (ConnectionResetError(errno.ECONNRESET, "reset"), TypeError("not serialisable")):
        with pytest.raises(type(error)) as info:
            with atomic_write(str(path)) as f:
                f.write(b"half")
                raise error
        assert info.value is error and not isinstance(info.value, WriteError)
    assert path.read_bytes() == b"the previous content"
    _only(tmp_path, "out.bin")


@pytest.mark.parametrize("free, reason", [(0, "no space left on device"), (1 << 40, "the disk may be full")])
def test_torch_writer_error_without_its_cause_names_the_file(tmp_path, monkeypatch, free, reason):
    """torch.save's zip writer reports a failed write as ``RuntimeError ... unexpected pos``; where the cause
    is not chained to it, the folder's free space decides what the line says."""
    path = _previous(tmp_path)
    monkeypatch.setattr(_files.os, "statvfs", lambda folder: type("S", (), {"f_bavail": free, "f_frsize": 1})())
    with pytest.raises(WriteError) as info:
        with atomic_write(str(path)):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert str(info.value).startswith(f"could not write {path}: ") and reason in str(info.value)
    assert path.read_bytes() == b"the previous content"


def test_text_mode_options_and_permissions(tmp_path):
    with atomic_write(str(tmp_path / "a.csv"), "w", encoding="utf-8", newline="") as f:
        f.write("x,é\r\n")
    assert (tmp_path / "a.csv").read_bytes() == "x,é\r\n".encode()
    assert (tmp_path / "a.csv").stat().st_mode & 0o777 == 0o600
    with atomic_write(str(tmp_path / "b"), shared=True) as f:
        f.write(b"")
    assert (tmp_path / "b").stat().st_mode & 0o777 == 0o644
    with pytest.raises(ValueError, match="mode"):
        with atomic_write(str(tmp_path / "c"), "a"):
            pass


# ------------------------------------------------------------------------------------------------
# Temporary files are their writer's own
# ------------------------------------------------------------------------------------------------
# the child imports dgl_exact._files (and its errors) alone, without the package's torch and DGL: a second
# writer in a fraction of a second
_BARE_PACKAGE = f"""
    import sys, types
    package = types.ModuleType("dgl_exact")
    package.__path__ = [{os.path.join(REPO, "dgl_exact")!r}]
    sys.modules["dgl_exact"] = package
"""


def _python(code, **kwargs):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = textwrap.dedent(_BARE_PACKAGE) + textwrap.dedent(code)
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kwargs)


def _dead_pid():
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def test_sweep_removes_dead_writers_files_only(tmp_path):
    target = tmp_path / "c.pt"
    dead = [f".c.pt.partial-{_dead_pid()}-ab12cd34", ".c.pt.partial-ab12cd34"]  # the second: earlier versions
    live = [f".c.pt.partial-{os.getpid()}-ab12cd34", f".c.pt.partial-{os.getppid()}-zz12cd34"]
    others = [".d.pt.partial-ab12cd34", ".c.pt.partial-1-abc", "c.pt"]
    for name in dead + live + others:
        (tmp_path / name).write_bytes(b"x")
    remove_stale_temporaries(str(target))
    _only(tmp_path, *live, *others)


_WRITER = """
    import sys
    from dgl_exact._files import atomic_write
    with atomic_write(sys.argv[1]) as f:
        f.write(b"second writer")
        f.flush()
        print("writing", flush=True)
        sys.stdin.readline()  # hold the temporary file until told to finish
    print("done", flush=True)
"""


def test_a_live_writers_temporary_file_survives_another_writers_sweep(tmp_path):
    """Two writers of one checkpoint: the one saving (which sweeps stale temporaries first) leaves the other's
    file alone, and the other's write still completes."""
    from dgl_exact.training.checkpoint import save_checkpoint

    target = tmp_path / "ck.pt"
    proc = _python(_WRITER.replace("sys.argv[1]", repr(str(target))))
    try:
        assert proc.stdout.readline().strip() == "writing", proc.stderr.read()
        theirs = [n for n in os.listdir(tmp_path) if n.startswith(".ck.pt.partial-")]
        assert len(theirs) == 1 and theirs[0].startswith(f".ck.pt.partial-{proc.pid}-")
        save_checkpoint({"epoch": 1}, str(target))
        remove_stale_temporaries(str(target))
        assert os.path.exists(tmp_path / theirs[0])
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done", proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    assert target.read_bytes() == b"second writer"
    _only(tmp_path, "ck.pt")


# ------------------------------------------------------------------------------------------------
# One writer per output
# ------------------------------------------------------------------------------------------------
_HOLDER = """
    import sys, time
    from dgl_exact._files import lock_output
    lock_output(sys.argv[1], "--checkpoint")
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_second_process_is_refused_while_the_first_holds_the_lock_then_takes_it_over(tmp_path):
    target = tmp_path / "ck.pt"
    proc = _python(_HOLDER.replace("sys.argv[1]", repr(str(target))))
    try:
        assert proc.stdout.readline().strip() == "locked", proc.stderr.read()
        with pytest.raises(OutputInUseError) as info:
            lock_output(str(target), "--checkpoint")
        message = str(info.value)
        assert message.startswith(f"--checkpoint {target} is in use by another dgl-exact run (pid {proc.pid})")
        assert info.value.pid == proc.pid and info.value.exit_code == 2 and "\n" not in message
    finally:
        proc.send_signal(signal.SIGKILL)  # dies holding it: no clean-up ran
        proc.wait()
    assert (tmp_path / ".ck.pt.lock").exists()  # a stale lock file, free for the next run
    with lock_output(str(target)):
        assert (tmp_path / ".ck.pt.lock").read_text().strip() == str(os.getpid())
    _only(tmp_path)


def test_the_lock_is_taken_again_in_the_same_process_and_released_by_the_last(tmp_path):
    target = str(tmp_path / "ck.pt")
    outer = lock_output(target)
    with OutputLock(target, "--checkpoint"):
        assert os.path.exists(tmp_path / ".ck.pt.lock")
    assert os.path.exists(tmp_path / ".ck.pt.lock")  # the outer holder still has it
    outer.release()
    outer.release()  # twice: nothing more
    _only(tmp_path)


def test_taking_the_lock_sweeps_dead_writers_temporaries(tmp_path):
    stale = tmp_path / f".ck.pt.partial-{_dead_pid()}-ab12cd34"
    stale.write_bytes(b"x")
    with lock_output(str(tmp_path / "ck.pt")):
        assert not stale.exists()


def test_an_unwritable_lock_folder_is_a_write_error(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(_files.os, "open", refuse)
    with pytest.raises(WriteError, match=r"could not write .*\.ck\.pt\.lock: read-only file system"):
        lock_output(str(tmp_path / "ck.pt"))


def test_without_fcntl_outputs_are_not_locked(tmp_path, monkeypatch):
    monkeypatch.setattr(_files, "fcntl", None)
    with lock_output(str(tmp_path / "ck.pt")), lock_output(str(tmp_path / "ck.pt")):
        _only(tmp_path)


def test_a_full_disk_does_not_keep_the_lock_from_being_taken(tmp_path, monkeypatch):
    """Creating the lock file takes an inode, no data block; its pid only informs a second run (which then
    says "pid unknown"): the output's own write is the one that reports the full disk."""
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_files.os, "pwrite", full)
    with lock_output(str(tmp_path / "ck.pt")):
        assert (tmp_path / ".ck.pt.lock").read_bytes() == b""
    _only(tmp_path)
    assert "(pid unknown)" in str(OutputInUseError("x", None))
