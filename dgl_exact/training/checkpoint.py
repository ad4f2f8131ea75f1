"""Atomic checkpoints: a run interrupted at any moment loses at most the epoch in progress."""
from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
from typing import Any, Dict, Iterator

import torch

FORMAT_VERSION = 1


_HELD_SIGNALS = tuple(s for s in (getattr(signal, "SIGINT", None), getattr(signal, "SIGTERM", None)) if s)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold Ctrl-C / SIGTERM inside the block and deliver them when it ends.

    An interrupt raised inside ``torch.save`` surfaces as a ``RuntimeError`` from its C++ writer (not as
    ``KeyboardInterrupt``), so a user pressing Ctrl-C at the wrong millisecond would get a crash instead of a
    clean stop. Writing a checkpoint takes milliseconds; the signal waits that long, then acts as usual.
    Signal handlers can only be changed from the main thread; elsewhere this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending = []
    previous = {}
    try:
        for sig in _HELD_SIGNALS:
            previous[sig] = signal.signal(sig, lambda signum, frame: pending.append(signum))
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if pending:
            signal.raise_signal(pending[0])


def save_checkpoint(state: Dict[str, Any], path: str) -> None:
    """Write ``state`` to ``path`` atomically (temporary file in the same folder, fsync, rename).

    Ctrl-C or SIGTERM arriving meanwhile is delivered once the file is in place (:func:`signals_held`).
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with signals_held():
        fd, tmp = tempfile.mkstemp(prefix=".ckpt-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save({"format": FORMAT_VERSION, **state}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def load_checkpoint(path: str) -> Dict[str, Any]:
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path} (run with --checkpoint {path} first, without --resume)")
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("format") != FORMAT_VERSION:
        raise ValueError(f"{path}: unsupported checkpoint format {state.get('format')!r}")
    return state
