"""Errors shared across layers, each printed by the command line as one line (exit status 2):
:class:`UserError`, an error caused by the user's input; :class:`WriteError`, an output file that could not
be written (disk full, no permission, ...); :class:`OutputInUseError`, an output another live run writes."""
from __future__ import annotations

import errno as _errno
import os
from typing import Optional

import click

__all__ = ["UserError", "WriteError", "OutputInUseError", "did_you_mean"]


class UserError(click.ClickException):
    """An error caused by the user's input: printed as one line, exit status 2."""

    exit_code = 2


# what to do about the causes a user can act on
_FULL = "free space there or give a path on another disk"
_READ_ONLY = "give a path in a writable folder"
_HINTS = {_errno.ENOSPC: _FULL, getattr(_errno, "EDQUOT", -1): _FULL, _errno.EFBIG: _FULL,
          _errno.EACCES: _READ_ONLY, _errno.EPERM: _READ_ONLY, _errno.EROFS: _READ_ONLY}


class WriteError(UserError, OSError):
    """``path`` could not be written: one line naming the file and the cause (``could not write /x/ck.pt: no
    space left on device; ...``), exit status 2. An ``OSError`` too, with the cause's ``errno``, so code that
    handles ``OSError`` (e.g. an optional cache) keeps doing so. Raised by :func:`dgl_exact._files.atomic_write`,
    which leaves the previous file as it was."""

    def __init__(self, path: str, cause: Optional[BaseException] = None, reason: Optional[str] = None,
                 code: Optional[int] = None):
        code = code if code is not None else getattr(cause, "errno", None)
        if reason is None:
            if code:
                reason = os.strerror(code)
            else:
                reason = (str(cause).strip().splitlines() or [""])[0] if cause is not None else ""
                reason = reason or (type(cause).__name__ if cause is not None else "unknown cause")
            reason = reason[:1].lower() + reason[1:]
        hint = _HINTS.get(code)
        super().__init__(f"could not write {path}: {reason}" + (f"; {hint}" if hint else ""))
        self.errno, self.strerror, self.filename = code, reason, path
        self.path, self.reason = path, reason

    def __reduce__(self):
        return type(self), (self.path, None, self.reason, self.errno)


class OutputInUseError(UserError):
    """Another live process holds the lock of an output file (:class:`dgl_exact._files.OutputLock`): one line
    naming the file and the holder's pid, exit status 2."""

    def __init__(self, path: str, pid: Optional[int], option: Optional[str] = None):
        who = f"pid {pid}" if pid else "pid unknown"
        what = f"{option} {path}" if option else path
        super().__init__(f"{what} is in use by another dgl-exact run ({who}): wait for that run to end, or give "
                         "another path")
        self.path, self.pid = path, pid


def did_you_mean(value: str, known, what: str = "known") -> str:
    """The tail of an "unknown name" message: ``"; did you mean 'cora'?"`` for the names of ``known`` close to
    ``value`` (difflib, case-insensitive), else ``"; known: a, b, c"`` (``what`` names that list)."""
    import difflib

    names = [str(k) for k in known]
    lower = {n.lower(): n for n in names}
    close = [lower[m] for m in difflib.get_close_matches(str(value).strip().lower(), list(lower), n=3, cutoff=0.6)]
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    return f"; {what}: {', '.join(names)}"
