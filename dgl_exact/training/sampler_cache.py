"""The samplers' cache files: results that are expensive to compute and a pure function of the graph and the
sampler's parameters (ClusterGCN's partition, GraphSAINT's pre-sampled counts), stored as ``.npz`` of plain
arrays under the data root's ``cache`` folder and trusted only when they prove they are what was asked for
(:func:`read_cache`): the right kind, parameters and graph (:func:`graph_fingerprint`), arrays and checksum.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np
import torch

from .._files import atomic_write

__all__ = ["CacheWarning", "CACHE_FORMAT", "CacheKey", "cache_key", "checksum", "graph_fingerprint", "read_cache",
           "write_cache"]


def graph_fingerprint(g) -> str:
    """A short hash of a graph's structure: node count, edge count and the edge list in edge-id order.

    Two graphs share a fingerprint only if they have the same edges with the same ids, which is what
    cached per-node (partitions) and per-edge (GraphSAINT edge counts) results depend on.
    """
    src, dst = g.edges(order="eid")
    h = hashlib.blake2b(digest_size=8)
    h.update(np.array([g.num_nodes(), g.num_edges()], dtype=np.int64).tobytes())
    for ids in (src, dst):  # hashed in place (no copy of an int64 edge list: resume checks it on every graph)
        h.update(memoryview(np.ascontiguousarray(ids.to(torch.int64).numpy())).cast("B"))
    return h.hexdigest()


class CacheWarning(UserWarning):
    """A sampler cache file was unusable (it is recomputed and overwritten) or could not be written (the
    result is computed in memory and computed again next time)."""


CACHE_FORMAT = 1


@dataclass(frozen=True)
class CacheKey:
    """Where a cached result lives and what it must describe: ``meta`` (kind, parameters, graph size and
    fingerprint) is stored inside the file too, so a renamed or copied file is recognised as foreign."""

    path: str
    meta: str


def cache_key(cache_dir: str, dataset: str, kind: str, params: Sequence[Any], g) -> CacheKey:
    """``<cache_dir>/<dataset>_<kind>_<params>_n<N>_e<E>_<fingerprint>.npz``."""
    tag = "_".join(str(p) for p in params)
    graph = f"n{g.num_nodes()}_e{g.num_edges()}_{graph_fingerprint(g)}"
    return CacheKey(os.path.join(cache_dir, f"{dataset}_{kind}_{tag}_{graph}.npz"),
                     f"dgl_exact {kind} cache v{CACHE_FORMAT}: {tag}; graph {graph}")


def checksum(meta: str, arrays: Dict[str, np.ndarray]) -> str:
    """A hash of ``meta`` and every array's name, dtype, shape and bytes (detects edited or damaged files)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(meta.encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def write_cache(key: CacheKey, arrays: Dict[str, np.ndarray]) -> None:
    """Store ``arrays`` (plain numeric arrays, no pickles) with ``key.meta`` and their checksum as ``.npz``,
    atomically (readers, e.g. other ranks, never see a partial file). A folder that cannot be written costs
    a :class:`CacheWarning`, not the run."""
    try:
        with atomic_write(key.path) as f:
            np.savez(f, meta=np.array(key.meta), checksum=np.array(checksum(key.meta, arrays)), **arrays)
    except OSError as e:
        warnings.warn(f"could not write the sampler cache {key.path} ({e.strerror or e}); using the result "
                      "computed in memory, it will be computed again next time (make the folder writable or "
                      "pick another --data-root)", CacheWarning, stacklevel=3)


def read_cache(key: CacheKey, spec: Dict[str, Any],
                check: Callable[[Dict[str, np.ndarray]], Optional[str]]) -> Optional[Dict[str, np.ndarray]]:
    """The arrays of a valid cache file, or ``None`` if there is none or it is unusable.

    Read with ``numpy.load(allow_pickle=False)`` (nothing in the file can run code). Valid means: exactly the
    arrays of ``spec`` (``name -> (dtype, shape)``), the expected ``meta``, a matching checksum, and
    ``check(arrays)`` returns ``None`` (else the problem). An unusable file (foreign, stale, empty, truncated,
    random bytes, a pickle, edited values) gives one :class:`CacheWarning` naming it; the caller recomputes
    and overwrites it.
    """
    if not os.path.exists(key.path):
        return None
    try:
        with np.load(key.path, allow_pickle=False) as z:
            data = {name: z[name] for name in z.files}
        problem = None
        if set(data) != set(spec) | {"meta", "checksum"}:
            problem = f"holds {sorted(data)}, expected {sorted(set(spec) | {'meta', 'checksum'})}"
        elif data["meta"].shape != () or data["meta"].dtype.kind != "U" or str(data["meta"]) != key.meta:
            problem = f"was made for something else ({str(data['meta'])[:200]!r}, expected {key.meta!r})"
        else:
            arrays = {name: data[name] for name in spec}
            for name, (dtype, shape) in spec.items():
                if arrays[name].dtype != np.dtype(dtype) or arrays[name].shape != tuple(shape):
                    problem = (f"{name} is {arrays[name].dtype}{list(arrays[name].shape)}, expected "
                               f"{np.dtype(dtype)}{list(shape)}")
                    break
            if problem is None and str(data["checksum"]) != checksum(key.meta, arrays):
                problem = "its checksum does not match its contents (edited or damaged)"
            if problem is None:
                problem = check(arrays)
    except Exception as e:  # noqa: BLE001 - whatever is wrong with the file, the remedy is to recompute it
        problem = f"unreadable ({type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]})"
    if problem is not None:
        warnings.warn(f"ignoring the sampler cache {key.path}: {problem}; recomputing it", CacheWarning,
                      stacklevel=3)
        return None
    return arrays
