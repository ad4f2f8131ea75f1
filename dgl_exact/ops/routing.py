"""DGL's message-passing API on dgl_exact's compressed graph ops, inside a scope.

``with dgl_exact.ops.message_passing(): ...`` (entered around the forward of every model converted by
:func:`dgl_exact.compress_model`) makes ``g.update_all``, ``g.apply_edges``, ``g.send_and_recv`` and ``g.pull``
with DGL's built-in message and reduce functions (``fn.copy_u``, ``fn.copy_e``, ``fn.u_mul_e``, ``fn.u_add_v``,
``fn.e_dot_v``, ..., ``fn.sum``/``mean``/``max``/``min``) run :mod:`dgl_exact.ops`' ops: the same results as
DGL's (zero-in-degree nodes, broadcasting, blocks), what each op keeps compressed at the configuration in force
(a converted model's own: :func:`dgl_exact.set_model_config`). So do ``edge_softmax`` calls, however the name
was reached (``dgl.ops``, ``dgl.nn.functional``, ``dgl.nn``, ``dgl.nn.pytorch``, or bound at import).
Elementwise products of activations in the scope (an attention layer's ``ft * self.attn_l``) keep their operands
compressed (:func:`~.products.compressed_products`). User-defined (Python) message and reduce functions run as
DGL runs them (what they save is compressed by ``compress_model(..., saved_tensors=True)``), and graphs with
several edge types run DGL's ops.

How: DGL's ``dgl.core`` looks each built-in up as ``ops.<name>`` when it runs (``ops.u_mul_e_sum``,
``ops.u_add_v``, ``ops.copy_e_max``). On the first scope, ``dgl.core``'s ``ops`` becomes a namespace that answers
dgl_exact's op while a scope is active in the current context and ``dgl.ops``'s own otherwise (so another
thread or asyncio task outside a scope sees DGL's ops, and leaving the scope restores them); the ``edge_softmax``
names above get the same switch. DGL's ``edge_softmax`` function itself looks its kernel up at call time
(``edge_softmax_internal``, a global of ``dgl.ops.edge_softmax``'s module): that name gets the switch too, so a
name bound before the first scope was entered (``from dgl.nn.functional import edge_softmax`` at import) runs
dgl_exact's op inside a scope as well. dgl_exact's ops run DGL's kernels bound once (:mod:`.dgl_originals`), so
no routing recurses. ``message_passing(False)`` turns it off inside an active scope.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import threading
from typing import Iterator

import torch

from . import dgl_ops
from .dgl_originals import named, originals
from .products import compressed_products

__all__ = ["message_passing", "message_passing_active"]

_active: contextvars.ContextVar = contextvars.ContextVar("dgl_exact_message_passing", default=False)
_install_lock = threading.Lock()
_installed = False
#: the namespaces whose ``edge_softmax`` DGL's code and users reach at call time
_SOFTMAX_HOMES = ("dgl.ops", "dgl.nn.functional", "dgl.nn.pytorch.softmax", "dgl.nn.pytorch", "dgl.nn")


def message_passing_active() -> bool:
    """Whether DGL's message passing runs on dgl_exact's ops in the current context."""
    return _active.get()


@contextlib.contextmanager
def message_passing(enabled: bool = True) -> Iterator[None]:
    """Run DGL's built-in message passing (``update_all``, ``apply_edges``, ``send_and_recv``, ``pull``) and
    ``edge_softmax`` on dgl_exact's compressed ops inside this block (see the module doc); nestable, local to
    the current thread or asyncio task. ``enabled=False``: DGL's own ops inside this block."""
    if not isinstance(enabled, bool):
        raise TypeError(f"message_passing(enabled) takes True or False, got {enabled!r}")
    if enabled:
        _install()
    token = _active.set(enabled)
    try:
        with compressed_products(enabled):
            yield
    finally:
        try:
            _active.reset(token)
        except ValueError:  # left in another context than entered (a generator resumed elsewhere)
            _active.set(False)


def _all_tensors(data) -> bool:
    return all(d is None or isinstance(d, torch.Tensor) for d in data)


def _routed(name: str, ours):
    """dgl_exact's ``ours`` where DGL's core passes tensors (one edge type); DGL's own op for a heterograph's
    per-type lists."""

    @functools.wraps(ours)
    def run(g, *data):
        if _all_tensors(data):
            return ours(g, *data)
        return named(name)(g, *data)

    return run


class _Namespace:
    """What ``dgl.core`` sees as ``ops``: dgl_exact's graph ops while a scope is active, ``dgl.ops`` otherwise
    (looked up there at each call, so names a user replaced in ``dgl.ops`` keep working)."""

    def __init__(self, dgl_ops_module, routed: dict):
        self._dgl_ops = dgl_ops_module
        self._routed = routed

    def __getattr__(self, name):
        if _active.get():
            fn = self._routed.get(name)
            if fn is not None:
                return fn
        return getattr(self._dgl_ops, name)

    def __dir__(self):
        return dir(self._dgl_ops)

    def __repr__(self):
        return f"<dgl_exact message-passing switch over {self._dgl_ops!r}>"


def _softmax_switch(dgl_softmax):
    @functools.wraps(dgl_softmax)
    def edge_softmax(graph, logits, eids="__ALL__", norm_by="dst"):
        if _active.get():
            return dgl_ops.edge_softmax(graph, logits, eids, norm_by)
        return dgl_softmax(graph, logits, eids, norm_by)

    edge_softmax.dgl_exact_switch = True
    return edge_softmax


def _graph_of(gidx):
    """A DGL graph on the graph index ``gidx`` of one edge type (shared, not copied: dgl_exact's cached structure
    of the graph it came from serves it, :func:`~.structure.structure_of` keys on the index)."""
    import dgl

    if gidx.number_of_ntypes() == 1:
        return dgl.DGLGraph(gidx, ["_N"], ["_E"])
    return dgl.DGLGraph(gidx, (["_N"], ["_N"]), ["_E"])


def _internal_switch(dgl_internal):
    """DGL's ``edge_softmax_internal(gidx, logits, eids, norm_by)``, which DGL's ``edge_softmax`` calls for one
    edge type: dgl_exact's op inside a scope (all edges, a tensor of scores), DGL's kernel otherwise (and for
    what dgl_exact's op hands back to DGL's: a subset of edges)."""

    @functools.wraps(dgl_internal)
    def edge_softmax_internal(gidx, logits, eids="__ALL__", norm_by="dst"):
        if _active.get() and isinstance(logits, torch.Tensor) and isinstance(eids, str) and eids == "__ALL__":
            return dgl_ops.edge_softmax(_graph_of(gidx), logits, eids, norm_by)
        return dgl_internal(gidx, logits, eids=eids, norm_by=norm_by)

    edge_softmax_internal.dgl_exact_switch = True
    return edge_softmax_internal


def _graph_op_names() -> list:
    """DGL's SpMM/SDDMM ops by name (``gspmm``/``gsddmm`` themselves are not what ``dgl.core`` calls)."""
    names = []
    for module_name in ("dgl.ops.spmm", "dgl.ops.sddmm"):
        module = importlib.import_module(module_name)
        names += [n for n in module.__all__ if n not in ("gspmm", "gsddmm")]
    return names


def _install() -> None:
    global _installed
    if _installed:
        return
    with _install_lock:
        if _installed:
            return
        import dgl.core
        import dgl.ops

        bound = originals()  # DGL's kernels, bound before any name is switched
        routed = {name: _routed(name, getattr(dgl_ops, name)) for name in _graph_op_names()}
        if not isinstance(dgl.core.ops, _Namespace):
            dgl.core.ops = _Namespace(dgl.ops, routed)
        kernel_home = importlib.import_module("dgl.ops.edge_softmax")
        if not getattr(kernel_home.edge_softmax_internal, "dgl_exact_switch", False):
            kernel_home.edge_softmax_internal = _internal_switch(kernel_home.edge_softmax_internal)
        switch = _softmax_switch(bound.edge_softmax)
        for module_name in _SOFTMAX_HOMES:
            module = importlib.import_module(module_name)
            if getattr(module, "edge_softmax", None) is bound.edge_softmax:  # a user's replacement is kept
                module.edge_softmax = switch
        _installed = True
