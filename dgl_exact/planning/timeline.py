"""The planner's step timeline: live bytes of the storages torch operators create, after every operator.

:class:`Timeline` is a ``TorchDispatchMode`` memory meter: on the CPU it counts a storage's pages once they
are written, as the resident high-water mark that :func:`dgl_exact.memory.measure_step` reads does; on a GPU
whole at allocation, as the caching allocator does. :mod:`dgl_exact.planning.predict` records one training
step under it on two small graphs and extrapolates every point of the timeline to the full graph.
"""
from __future__ import annotations

import weakref
from typing import Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary


def _tensors(tree, out=None) -> list:
    """The strided tensors in an operator's arguments or results: nested tuples, lists and dicts (what aten
    passes), without ``_pytree``'s generality (a third of the planner's time went to flattening). A sparse tensor
    (the reference kernels' CSR view of a graph) has no storage of its own: its index and value tensors do."""
    out = [] if out is None else out
    if isinstance(tree, torch.Tensor):
        if tree.layout == torch.strided:
            out.append(tree)
    elif isinstance(tree, (tuple, list)):
        for t in tree:
            if isinstance(t, torch.Tensor):
                if t.layout == torch.strided:
                    out.append(t)
            elif isinstance(t, (tuple, list, dict)):
                _tensors(t, out)
    elif isinstance(tree, dict):
        for t in tree.values():
            _tensors(t, out)
    return out


#: operators that allocate without writing: on the CPU their pages count only once written (see Timeline)
_ALLOCATING = frozenset({"empty.memory_format", "empty_strided.default", "new_empty.default",
                         "new_empty_strided.default", "empty_like.default"})
_PAGE = 4096


_SCHEMA: Dict = {}


def _schema(func) -> tuple:
    """``(mutable arguments as (position, name), returns a view)`` of an operator, cached per operator."""
    info = _SCHEMA.get(func)
    if info is None:
        sch = func._schema
        writes = tuple((i, a.name) for i, a in enumerate(sch.arguments)
                       if a.alias_info is not None and a.alias_info.is_write)
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in sch.returns)
        info = _SCHEMA[func] = (writes, view)
    return info


def _written(func, args, kwargs) -> list:
    """The tensors ``func`` writes: its schema's mutable arguments (``self`` of ``copy_``, ``out=``)."""
    out = []
    for i, name in _schema(func)[0]:
        value = args[i] if i < len(args) else (kwargs or {}).get(name)
        _tensors(value, out)
    return out


def _is_view(func) -> bool:
    return _schema(func)[1]


def _page_span(t: torch.Tensor) -> tuple:
    """The page-aligned byte range of its storage that ``t`` covers."""
    if t.numel() == 0:
        return 0, 0
    es = t.element_size()
    start = t.storage_offset() * es
    extent = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    end = start + extent * es
    return start // _PAGE * _PAGE, -(-end // _PAGE) * _PAGE


class Timeline(TorchDispatchMode):
    """Live bytes of the storages operators create, after every operator.

    ``touched`` (the CPU): memory counts as a resident high-water mark counts it, once its pages are
    written. A storage an allocating operator (``empty``) creates and whose first use writes only part of
    it (a chunked loop filling an output row block by row block) counts the pages written or read so far
    (what an operator reads was written, perhaps by a kernel outside the dispatcher); any other first use
    (a read, a whole write, or none before it dies: a kernel outside the dispatcher may have filled it)
    counts it whole from its allocation, as without ``touched`` (a GPU allocator's
    ``max_memory_allocated`` counts the allocation)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch >= 2.5 wraps a mode's __torch_dispatch__ in torch._disable_dynamo, whose first call imports
        # torch._dynamo (2.4 s here) and whose wrapper runs on every operator; nothing is compiled under
        # this mode, so there is nothing to skip
        return False

    def __init__(self, touched: bool = False):
        super().__init__()
        self.live, self.total, self.totals, self.names = {}, 0, [], []
        self.touched = touched
        self.pending = {}   # storage -> (bytes, index of the operator that allocated it): not used yet
        self.partial = {}   # storage -> (bytes, written page ranges): filled piece by piece
        self.refs = WeakIdKeyDictionary()  # tensor -> [(storage, its finalizer)]: what set_ takes away

    def _count_whole(self, key, upto: int) -> int:
        """A pending storage counted whole from its allocation up to operator ``upto`` (exclusive)."""
        n, created = self.pending.pop(key)
        for j in range(created, upto):
            self.totals[j] += n
        return n

    def _drop(self, key):
        entry = self.live.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self.live[key]
            if key in self.pending:  # never used by an operator: counted whole while it lived
                self._count_whole(key, len(self.totals))
            self.partial.pop(key, None)
            self.total -= entry[0]

    def _use(self, func, args, kwargs) -> None:
        """Resolve the pending and partial storages this operator uses (``touched`` only)."""
        written = {id(t) for t in _written(func, args, kwargs)}
        if not written and _is_view(func):
            return
        for t in _tensors((args, kwargs)):
            key = t.untyped_storage().data_ptr()
            if key in self.pending:
                n = self.pending[key][0]
                lo, hi = _page_span(t)
                if id(t) in written and hi - lo < n:
                    del self.pending[key]
                    self.partial[key] = (n, [])
                else:
                    self._count_whole(key, len(self.totals))
                    self.live[key][0] = n
                    self.total += n
                    continue
            if key in self.partial:  # a write, or a read: what is read was written before (maybe by a kernel
                n, spans = self.partial[key]  # outside the dispatcher), so it counts from now on
                spans.append(_page_span(t))
                spans.sort()
                covered, end = 0, 0
                for lo, hi in spans:
                    lo = max(lo, end)
                    if hi > lo:
                        covered, end = covered + hi - lo, hi
                covered = min(covered, n)
                self.total += covered - self.live[key][0]
                self.live[key][0] = covered

    def _unref(self, t: torch.Tensor) -> None:
        """``t`` no longer holds the storage it held (``set_``: :func:`dgl_exact.ops.donation.release` frees a
        donated tensor's memory this way while the tensor object lives on)."""
        key = t.untyped_storage().data_ptr()
        held = self.refs.get(t, [])
        for k, fin in [(k, fin) for k, fin in held if k == key]:
            if fin.detach() is not None:
                self._drop(k)
        self.refs[t] = [(k, fin) for k, fin in held if k != key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.set_ and args and isinstance(args[0], torch.Tensor):
            self._unref(args[0])
        out = func(*args, **(kwargs or {}))
        if self.touched and (self.pending or self.partial):
            self._use(func, args, kwargs)
        inputs = None
        for t in _tensors(out):
            storage = t.untyped_storage()
            n = storage.nbytes()
            if n == 0:
                continue
            key = storage.data_ptr()
            if key in self.live:
                self.live[key][1] += 1
            else:
                if inputs is None:  # an output sharing an input's storage is a view or in place: no new memory
                    inputs = {a.untyped_storage().data_ptr() for a in _tensors((args, kwargs))}
                if key in inputs:
                    continue
                if self.touched and func.__name__ in _ALLOCATING and n >= _PAGE:
                    self.live[key] = [0, 1]
                    self.pending[key] = (n, len(self.totals))
                else:
                    self.live[key] = [n, 1]
                    self.total += n
            fin = weakref.finalize(t, self._drop, key)
            held = self.refs.get(t)
            if held is None:
                self.refs[t] = [(key, fin)]
            else:
                held.append((key, fin))
        self.totals.append(self.total)
        self.names.append(func.__name__)
        return out

    def __exit__(self, *exc):
        for key in list(self.pending):  # still unused at the end of the step: counted whole
            self._count_whole(key, len(self.totals))
        return super().__exit__(*exc)
