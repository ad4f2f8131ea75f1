"""Trustworthy processed caches: a fingerprint of the raw files and of the cache, stored beside the cache.

ogb (``processed/dgl_data_processed``) and DGL (``dgl_graph.bin``) reuse their processed file whenever it
exists, even after the raw files changed (a changed ogbn-arxiv then gets new splits, which ogb reads
from ``split/`` every time, and old labels from the cache), and DGL segfaults on a truncated one. Both
files are DGL's binary graph format (``dgl.save_graphs``: no pickle, nothing in them is executed).

Beside each cache we write ``<cache>.dgl_exact.json``: for the cache and for every raw file it was built
from, ``size``, ``mtime_ns`` and ``sha256``. Before ogb or DGL reads the cache, :func:`cache_verdict` says:

* ``"ok"``: the cache matches its record and no raw file changed (a file whose size and mtime match the
  record is taken as unchanged; otherwise its SHA-256 decides, so a copy or ``touch`` costs one hash
  and no rebuild). A raw file that was deleted after processing is fine: the cache still holds it.
* ``"rebuild"``: raw files changed, or the cache changed or is truncated.
* ``"unrecorded"``: no record while the raw files are there (a cache written outside dgl_exact cannot be
  checked): it is rebuilt once, or, in a read-only folder, used after checking DGL's file header.
* ``"unchecked"``: no record and no raw files: the cache is used after checking DGL's file header.

A cache that must be rebuilt while its raw files are gone, or whose folder is read-only, is an error
(:class:`DatasetFileError`, one line: the file, the problem, the fix).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Sequence

from .._files import atomic_write
from .base import DatasetFileError

__all__ = ["record_path", "fingerprint_file", "cache_verdict", "write_record", "check_dgl_header", "writable",
           "resolve_unrecorded"]

_DGL_MAGIC = bytes.fromhex("3fa1b446f04f2edd")   # dgl.save_graphs' magic number (0xDD2E4FF046B4A13F, LE)
_DGL_HEADER = 24                                 # magic, version, graph count (3 x uint64) at least


def record_path(cache_file: str) -> str:
    return cache_file + ".dgl_exact.json"


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def fingerprint_file(path: str) -> dict:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": _sha256(path)}


def _same(path: str, rec: dict) -> bool:
    """Whether ``path`` still has the content ``rec`` recorded (size+mtime shortcut, else SHA-256)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_size != rec.get("size"):
        return False
    if st.st_mtime_ns == rec.get("mtime_ns"):
        return True
    return _sha256(path) == rec.get("sha256")


def writable(folder: str) -> bool:
    """Whether files can be created in ``folder`` (or in its nearest existing parent)."""
    while folder and not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return os.access(folder or ".", os.W_OK | os.X_OK)


def check_dgl_header(dataset: str, cache_file: str, fix: str) -> None:
    """Raise DatasetFileError unless ``cache_file`` starts like a ``dgl.save_graphs`` file."""
    with open(cache_file, "rb") as f:
        head = f.read(_DGL_HEADER)
    if len(head) < _DGL_HEADER or head[:8] != _DGL_MAGIC:
        raise DatasetFileError(dataset, cache_file, "not a DGL graph file (truncated or overwritten)", fix)


def cache_verdict(cache_file: str, raw_folder: str, raw_files: Sequence[str]) -> tuple[str, str]:
    """``(verdict, reason)`` with verdict ``"ok"``, ``"rebuild"``, ``"unrecorded"``, ``"unchecked"`` or
    ``"missing"`` (no cache). ``raw_files`` are relative to ``raw_folder``."""
    if not os.path.isfile(cache_file):
        return "missing", "no processed file"
    present = [f for f in raw_files if os.path.isfile(os.path.join(raw_folder, f))]
    try:
        with open(record_path(cache_file), encoding="utf-8") as fh:
            record = json.load(fh)
        cache_rec, raw_rec = record["cache"], record["raw"]
    except (OSError, ValueError, KeyError, TypeError):
        if present:
            return "unrecorded", "processed file not made by dgl_exact (no fingerprint), raw files present"
        return "unchecked", "no fingerprint and no raw files"
    if not _same(cache_file, cache_rec):
        return "rebuild", f"{os.path.basename(cache_file)} changed since it was written (truncated or replaced)"
    for f in present:
        if f not in raw_rec or not _same(os.path.join(raw_folder, f), raw_rec[f]):
            return "rebuild", f"raw file {f} changed since the processed file was built"
    return "ok", "fingerprint matches"


def write_record(cache_file: str, raw_folder: str, raw_files: Sequence[str]) -> bool:
    """Record the fingerprints of ``cache_file`` and of the present ``raw_files``; False if the folder
    is read-only (nothing written)."""
    raw = {f: fingerprint_file(os.path.join(raw_folder, f)) for f in raw_files
           if os.path.isfile(os.path.join(raw_folder, f))}
    record = {"cache": fingerprint_file(cache_file), "raw": raw}
    path = record_path(cache_file)
    try:
        with atomic_write(path, "w", encoding="utf-8", shared=True) as fh:
            json.dump(record, fh, indent=1, sort_keys=True)
        return True
    except OSError:
        return False


def resolve_unrecorded(dataset: str, cache_file: str, verdict: str, reason: str) -> tuple[str, str]:
    """``"unrecorded"`` becomes ``"rebuild"`` where the cache's folder is writable, else ``"unchecked"``
    (with a warning: the cache cannot be verified and is used as it is)."""
    if verdict != "unrecorded":
        return verdict, reason
    if writable(os.path.dirname(cache_file)):
        return "rebuild", reason
    import warnings

    warnings.warn(f"dataset {dataset!r}: {cache_file} has no dgl_exact fingerprint and its folder is read-only: "
                  f"used as it is (run once with write access to have it checked)", stacklevel=3)
    return "unchecked", reason
