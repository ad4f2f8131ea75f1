"""Every file the package writes (checkpoints, results, benchmark tables and figures, sampler and dataset
caches) goes through :func:`atomic_write`; an output a run owns is held with :class:`OutputLock`. Imports
nothing from dgl_exact but its errors.

Rules:

1. A write is atomic: readers see the old content or the whole new one, never a partial file. A failure
   (disk full, no permission, read-only file system, ...) leaves the previous file as it was, removes the
   temporary file and raises one :class:`~dgl_exact.errors.WriteError` naming the path and the cause.
2. Temporary files are their writer's own: ``.<name>.partial-<pid>-XXXXXXXX`` carries the writer's process
   id, and :func:`remove_stale_temporaries` removes only those of processes that no longer run.
3. One writer per output: :class:`OutputLock` holds an OS file lock (``flock``) on ``.<name>.lock`` beside
   the output, with the holder's pid written in it, for as long as the run owns the output. The kernel
   releases it when the process ends however it ends, so a lock file left by a killed run is simply taken
   over; a live holder makes a second run stop at once with :class:`~dgl_exact.errors.OutputInUseError`.
   Where there is no ``fcntl`` (Windows) or the file system refuses locks, outputs are not locked (and rule
   2 keeps every temporary file whose writer cannot be known to be gone).
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import tempfile
import threading
import time
import warnings
from typing import IO, Dict, Iterator, List, Optional

from .errors import OutputInUseError, WriteError

try:
    import fcntl
except ImportError:  # not POSIX (Windows): outputs are not locked
    fcntl = None

__all__ = ["atomic_write", "remove_stale_temporaries", "OutputLock", "lock_output"]


def _temporary_prefix(path: str) -> str:
    return f".{os.path.basename(path)}.partial-"


class _CheckedFile(io.FileIO):
    """The temporary file's raw file: an ``OSError`` of its own writes (and close) becomes the
    :class:`WriteError` of the target, so that it can be told apart from the other errors of the block
    writing it (a download's network errors are ``OSError`` too) and found again when a writer wraps it
    in its own error (``torch.save``'s zip writer raises ``RuntimeError: ... unexpected pos`` from it)."""

    def __init__(self, fd: int, target: str):
        super().__init__(fd, "wb", closefd=True)
        self._target = target

    def write(self, data):
        try:
            return super().write(data)
        except OSError as e:
            raise WriteError(self._target, e) from None

    def close(self):
        try:
            super().close()
        except OSError as e:  # e.g. a network file system reporting ENOSPC only when the file is closed
            raise WriteError(self._target, e) from None


def _failure_of(exc: BaseException, path: str) -> Optional[WriteError]:
    """The :class:`WriteError` of ``path`` behind ``exc`` (itself, or one it was raised from or while
    handling), else None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, WriteError) and exc.path == path:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


# torch.save's zip writer reports any failure of the file under it as one of these
_TORCH_WRITER = re.compile(r"PytorchStreamWriter|unexpected pos|file write failed")


def _torch_writer_failure(exc: BaseException, path: str, folder: str) -> Optional[WriteError]:
    """A ``RuntimeError`` of ``torch.save``'s zip writer whose cause is lost: a :class:`WriteError` saying
    so (``no space left on device`` when the folder's file system has no space left)."""
    if not isinstance(exc, RuntimeError) or not _TORCH_WRITER.search(str(exc)):
        return None
    with contextlib.suppress(OSError, AttributeError):
        st = os.statvfs(folder)
        if st.f_bavail * st.f_frsize < 1 << 20:
            return WriteError(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    first = (str(exc).strip().splitlines() or [""])[0][:160]
    return WriteError(path, reason=f"torch's file writer failed ({first}); the disk may be full")


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb", *, encoding: Optional[str] = None, newline: Optional[str] = None,
                 shared: bool = False) -> Iterator[IO]:
    """Write ``path`` so that readers see its old content or the whole new one, never a partial file.

    Yields a file (``mode`` ``"wb"``, or ``"w"`` for text with ``encoding`` and ``newline`` as :func:`open`)
    open on ``.<name>.partial-<pid>-XXXXXXXX`` in the same folder (created if missing): a rename within one
    file system is atomic. When the block ends, the file is flushed, fsynced and renamed onto ``path``. If
    anything fails, the temporary file is removed and ``path`` is left as it was; a failure to write (of the
    file's writes, flush, fsync, close or rename, or of creating the folder or the temporary file) is raised
    as one :class:`~dgl_exact.errors.WriteError` naming ``path`` and the cause (also when a writer wrapped it
    in its own error, as ``torch.save`` does); other errors of the block propagate as they are. The file is
    readable by its owner only (``mkstemp``) unless ``shared`` (then 0644, as a data cache others may read).
    """
    if mode not in ("w", "wt", "wb"):
        raise ValueError(f"atomic_write writes whole files: mode 'w' or 'wb', not {mode!r}")
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{_temporary_prefix(path)}{os.getpid()}-", dir=folder)
    except OSError as e:
        raise WriteError(path, e) from None
    raw = None
    try:
        raw = _CheckedFile(fd, path)
        if shared:
            try:
                os.chmod(tmp, 0o644)
            except OSError as e:
                raise WriteError(path, e) from None
        f = io.BufferedWriter(raw)
        if "b" not in mode:
            f = io.TextIOWrapper(f, encoding=encoding, newline=newline)
        yield f
        f.flush()
        try:
            os.fsync(raw.fileno())
        except OSError as e:
            raise WriteError(path, e) from None
        f.close()
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise WriteError(path, e) from None
    except BaseException as exc:
        with contextlib.suppress(OSError):
            if raw is None:
                os.close(fd)
            elif not raw.closed:
                io.FileIO.close(raw)  # without flushing what the failed block left buffered
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        failure = _failure_of(exc, path) or _torch_writer_failure(exc, path, folder)
        if failure is not None and failure is not exc:
            raise failure from None
        raise


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (True when that cannot be known: nothing is removed on a guess)."""
    if pid == os.getpid():
        return True
    if os.name != "posix":  # os.kill(pid, 0) would end the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it runs, as another user
        return True
    return True


def remove_stale_temporaries(path: str) -> None:
    """Delete temporary files of ``path`` that writers killed mid-write left behind.

    :func:`atomic_write` writes ``.<name>.partial-<pid>-XXXXXXXX`` beside ``<name>``; only this pattern
    (and ``.<name>.partial-XXXXXXXX`` of earlier versions) is considered, so another target's files are never
    touched, and a file whose writer still runs is kept: a concurrent writer's file is its own.
    """
    folder = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(rf"^{re.escape(_temporary_prefix(path))}(?:(\d+)-)?[a-z0-9_]{{8}}$")
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        match = pattern.match(name)
        if match and not (match.group(1) and _pid_alive(int(match.group(1)))):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))


def lock_path(path: str) -> str:
    """The lock file of output ``path``: ``.<name>.lock`` beside it."""
    path = os.path.abspath(os.fspath(path))
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")


# The locks this process holds: lock file -> [fd, count]. flock belongs to an open file, so a second
# open in the same process would be refused like another process; a run takes the lock in the command
# line and again in Trainer.fit, so the same process may take it any number of times.
_HELD: Dict[str, List[int]] = {}
_HELD_GUARD = threading.Lock()


def _holder_pid(fd: int) -> Optional[int]:
    """The pid the holder wrote in the lock file (it writes it just after taking the lock: wait a moment)."""
    for _ in range(20):
        with contextlib.suppress(OSError, ValueError):
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            if text:
                return int(text.split()[0])
        time.sleep(0.05)
    return None


class OutputLock:
    """The lock of one output file, held while a run owns it (rule 3 of this module).

    ``OutputLock(path, option).acquire()`` (or ``with OutputLock(path):``) takes an exclusive ``flock`` on
    ``.<name>.lock`` and writes this process's pid in it; if another live process holds it, raises
    :class:`~dgl_exact.errors.OutputInUseError` naming ``option path`` and the holder's pid. Taking it again
    in the same process is allowed (counted). :meth:`release` removes the lock file and unlocks; a lock file
    left by a process that died is taken over. Once taken, the dead writers' temporary files of ``path`` are
    removed (:func:`remove_stale_temporaries`)."""

    def __init__(self, path, option: Optional[str] = None):
        self.path, self.option = os.fspath(path), option
        self.lock_file = lock_path(self.path)
        self.held = False

    def acquire(self) -> "OutputLock":
        if self.held:
            return self
        with _HELD_GUARD:
            held = _HELD.get(self.lock_file)
            if held is not None:
                held[1] += 1
            elif fcntl is not None:
                fd = self._lock()
                if fd is not None:
                    _HELD[self.lock_file] = [fd, 1]
        self.held = True
        remove_stale_temporaries(self.path)
        return self

    def _lock(self) -> Optional[int]:
        folder = os.path.dirname(self.lock_file)
        while True:
            try:
                os.makedirs(folder, exist_ok=True)
                fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            except OSError as e:
                raise WriteError(self.lock_file, e) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _holder_pid(fd)
                os.close(fd)
                raise OutputInUseError(self.path, pid, self.option) from None
            except OSError as e:  # a file system without locks (some network mounts): go on unlocked
                os.close(fd)
                warnings.warn(f"{self.path} is not locked against a second run ({self.lock_file}: "
                              f"{e.strerror or e})", RuntimeWarning, stacklevel=3)
                return None
            # the holder we waited for may have removed the file: lock the file that is there now
            try:
                current = os.stat(self.lock_file)
            except FileNotFoundError:
                current = None
            mine = os.fstat(fd)
            if current is None or (current.st_dev, current.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)
                continue
            with contextlib.suppress(OSError):  # the pid only informs the next run (a full disk: "pid unknown")
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        with _HELD_GUARD:
            held = _HELD.get(self.lock_file)
            if held is None:
                return
            held[1] -= 1
            if held[1] > 0:
                return
            del _HELD[self.lock_file]
            with contextlib.suppress(OSError):  # removed while locked: a waiting process retries on the new file
                os.unlink(self.lock_file)
            os.close(held[0])

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_output(path, option: Optional[str] = None) -> OutputLock:
    """:class:`OutputLock` of ``path``, taken (``OutputInUseError`` if another live run holds it)."""
    return OutputLock(path, option).acquire()
