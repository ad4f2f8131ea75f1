"""Atomic checkpoints: a run interrupted at any moment loses at most the epoch in progress."""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict

import torch

FORMAT_VERSION = 1


def save_checkpoint(state: Dict[str, Any], path: str) -> None:
    """Write ``state`` to ``path`` atomically (temporary file in the same folder, fsync, rename)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
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
