"""Atomic file writes, shared by every layer of the package that writes files (checkpoints, sampler and
dataset caches); imports nothing from dgl_exact."""
from __future__ import annotations

import contextlib
import os
import re
import tempfile
from typing import IO, Iterator

__all__ = ["atomic_write", "remove_stale_temporaries"]


def _temporary_prefix(path: str) -> str:
    return f".{os.path.basename(path)}.partial-"


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb", *, encoding: str = None, shared: bool = False) -> Iterator[IO]:
    """Write ``path`` so that readers see its old content or the whole new one, never a partial file.

    Yields a file open on ``.<name>.partial-XXXXXXXX`` in the same folder (created if missing): a rename
    within one file system is atomic. When the block ends, the file is flushed, fsynced and renamed onto
    ``path``; if it raises, the temporary file is removed and the error propagates. The file is readable
    by its owner only (``mkstemp``) unless ``shared`` (then 0644, as a data cache others may read).
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(path), dir=folder)
    try:
        if shared:
            os.chmod(tmp, 0o644)
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_stale_temporaries(path: str) -> None:
    """Delete temporary files of ``path`` that an earlier writer, killed mid-write, left behind.

    :func:`atomic_write` writes ``.<name>.partial-XXXXXXXX`` beside ``<name>``; only this exact pattern is
    removed, so another target's files are never touched.
    """
    folder = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(rf"^{re.escape(_temporary_prefix(path))}[a-z0-9_]{{8}}$")
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if pattern.match(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))

