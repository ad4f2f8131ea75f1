"""A graph as dynamo sees it while compiling: a :class:`CapturedStructure` (counts, flags and index tensors
the compiled graph holds as constants) named by a handle that the captured custom ops (:mod:`.captured`)
resolve to the real :class:`~.structure.GraphStructure` when they run. :func:`~.structure.structure_of`
returns one while dynamo traces; this module knows structures only by handle (it imports neither the
structure module nor the captured ops)."""
from __future__ import annotations

import itertools
import threading
from typing import Any, Dict, Tuple

import torch

from ..tracing import assume_constant

__all__ = ["CapturedStructure", "handle_of", "structure_by_handle", "structure_tensor", "structure_tensor_meta"]

_lock = threading.Lock()
_counter = itertools.count()
_STRUCTURES: Dict[str, Any] = {}


def handle_of(st) -> str:
    """The handle of the eager structure ``st`` (registered on first use; the counts in the handle: compiled
    code cached on disk is only ever reused for a graph of the same shape)."""
    with _lock:
        key = getattr(st, "_capture_key", None)
        if key is None:
            key = f"g{next(_counter)}:{st.num_src}:{st.num_dst}:{st.num_edges}:{st.device}"
            st._capture_key = key
            _STRUCTURES[key] = st
    return key


def structure_by_handle(key: str):
    """The eager structure registered under ``key`` (:func:`handle_of`)."""
    return _STRUCTURES[key]


@assume_constant
def _graph_value(key: str, name: str):
    return getattr(_STRUCTURES[key], name)


def structure_tensor(key: str, name: str) -> torch.Tensor:
    """An index or degree tensor of the structure registered under ``key``."""
    st = _STRUCTURES[key]
    return getattr(st, name)() if name.endswith("degrees") else getattr(st, name)


_META_OF: Dict[Tuple[str, str], Tuple] = {}


@assume_constant
def _graph_tensor_meta(key: str, name: str) -> bool:
    t = structure_tensor(key, name)
    _META_OF[key, name] = (tuple(t.shape), t.dtype, t.device)
    return True


def structure_tensor_meta(key: str, name: str) -> Tuple:
    """``(shape, dtype, device)`` of :func:`structure_tensor` as recorded at trace time (the fake's)."""
    return _META_OF[key, name]


def _graph_tensor(key: str, name: str) -> torch.Tensor:
    """A cached index/degree tensor of the graph, as a graph op (a constant per graph handle; the op is
    registered by :mod:`.captured`, which every op that runs while compiling goes through)."""
    _graph_tensor_meta(key, name)  # registers the fake's metadata at trace time
    return torch.ops.dgl_exact_capture.graph_tensor(key, name)


class CapturedStructure:
    """What dynamo sees of a graph: counts, flags and index tensors (constants of the compiled graph), and a
    handle the custom ops resolve to the real :class:`~.structure.GraphStructure` when they run."""

    def __init__(self, key: str):
        self.key = key
        self.num_src = _graph_value(key, "num_src")
        self.num_dst = _graph_value(key, "num_dst")
        self.num_edges = _graph_value(key, "num_edges")
        self.is_block = _graph_value(key, "is_block")
        self.has_zero_in_degree = _graph_value(key, "has_zero_in_degree")

    def in_degrees(self) -> torch.Tensor:
        return _graph_tensor(self.key, "in_degrees")

    def out_degrees(self) -> torch.Tensor:
        return _graph_tensor(self.key, "out_degrees")

    @property
    def src(self) -> torch.Tensor:
        return _graph_tensor(self.key, "src")

    @property
    def dst(self) -> torch.Tensor:
        return _graph_tensor(self.key, "dst")

    def edge_sum_to(self, e: torch.Tensor, side: str) -> torch.Tensor:
        n = self.num_dst if side == "dst" else self.num_src
        index = self.dst if side == "dst" else self.src
        return e.new_zeros((n,) + tuple(e.shape[1:])).index_add_(0, index, e)
