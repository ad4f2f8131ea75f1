"""``dgl.ops``, every public function, with DGL's signatures, broadcasting rules and results.

``from dgl_exact import ops`` is a drop-in for ``import dgl.ops as ops``: each of DGL's 64 callables
(``gspmm``/``gsddmm`` and the named ops generated from them, ``copy_*``, ``edge_softmax``, the segment
ops and ``gather_mm``) takes the same positional arguments and returns the same values; dgl_exact's own
option, ``config`` (a :class:`~dgl_exact.compression_config.CompressionConfig`), is keyword-only.

What each op keeps for backward:

=============================================  =========================================================
op                                             kept
=============================================  =========================================================
``*_mul_*``, ``*_dot_*`` (SDDMM),               each operand the other's gradient needs, compressed
``segment_mm``, ``gather_mm``                   (a leaf, e.g. a weight, by reference); backward decodes
                                               them and re-runs DGL's op for its vector-Jacobian product
``u_{add,sub,mul,div}_e_{sum,mean}`` (SpMM)     ``mul``/``div``: ``x`` compressed, ``y`` exactly (a divisor
                                               enters its gradients nonlinearly); ``add``/``sub``: nothing.
                                               Any broadcast DGL accepts; the backward forms nothing
                                               larger than the inputs and output (:mod:`.spmm_broadcast`)
``u_mul_e_sum`` of the fused kernel's shapes,   see :mod:`.graph` (``copy_u_max``/``min`` as DGL's:
``copy_u_*``, ``u_add_v``, ``edge_softmax``       ``-inf``/``+inf`` without in-edges, where :mod:`.graph`'s
                                               give 0)
``*_add_*``, ``*_sub_*`` (SDDMM), ``copy_*``,   nothing: DGL's op (it keeps nothing either)
``segment_reduce`` sum/mean
``*_div_*`` (SDDMM), max/min reducers,         DGL's op, exactly what DGL keeps: a divisor enters its
``segment_softmax``, ``segment_reduce``         gradients nonlinearly (a compressed copy would bias
max/min                                        them); max/min keep argument indices
=============================================  =========================================================

The general ops run DGL's kernels, so the graph must be on the features' device (the fused ops of
:mod:`.graph` also take a CPU graph with GPU features). They are not captured under ``torch.compile``.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch

from ..compression_config import CompressionConfig
from .dgl_originals import originals
from .keep import fresh_outputs
from .dgl_general import bilinear, readable
from . import graph as _graph
from .spmm_broadcast import BROADCAST_OPS, BROADCAST_REDUCERS, gspmm_broadcast
from .structure import structure_of

__all__ = ["gspmm", "gsddmm", "copy_u", "copy_v", "copy_e", "segment_reduce", "segment_softmax", "segment_mm",
           "gather_mm", "edge_softmax"]

_TARGETS = {"u": "u", "v": "v", "e": "e"}
#: binary ops whose gradient for each operand is linear in the other alone (its own value unused)
_BILINEAR = ("mul", "dot")


# --- SpMM --------------------------------------------------------------------------------------------
_SPMM_OPS = ("add", "sub", "mul", "div", "copy_lhs", "copy_rhs")
_REDUCERS = ("sum", "max", "min", "mean")


@fresh_outputs
def gspmm(g, op: str, reduce_op: str, lhs_data, rhs_data, *, config: Optional[CompressionConfig] = None):
    """DGL's ``gspmm``: ``out[v] = reduce_op_{(u, e, v)} op(lhs[u], rhs[e])``; see the module docstring for
    what is kept."""
    if op not in _SPMM_OPS:
        raise ValueError(f"gspmm: op must be one of {_SPMM_OPS}, got {op!r}")
    if reduce_op not in _REDUCERS:
        raise ValueError(f"gspmm: reduce_op must be one of {_REDUCERS}, got {reduce_op!r}")
    homogeneous = isinstance(lhs_data, torch.Tensor) or isinstance(rhs_data, torch.Tensor)
    if homogeneous and op == "copy_lhs":
        out = getattr(_graph, "copy_u_" + reduce_op)(g, lhs_data)
        return _fill_empty(g, out, reduce_op) if reduce_op in ("max", "min") else out
    both = isinstance(lhs_data, torch.Tensor) and isinstance(rhs_data, torch.Tensor)
    if both and op == "mul" and reduce_op == "sum":
        return _graph.u_mul_e_sum(g, lhs_data, rhs_data, config=config)
    if both and op in BROADCAST_OPS and reduce_op in BROADCAST_REDUCERS:
        return gspmm_broadcast(g, op, reduce_op, lhs_data, rhs_data, config)
    return originals().gspmm(readable(g), op, reduce_op, lhs_data, rhs_data)


def _fill_empty(g, out: torch.Tensor, reduce_op: str) -> torch.Tensor:
    """DGL's max/min give destinations without in-edges ``-inf``/``+inf`` (:mod:`.graph`'s give 0)."""
    empty = structure_of(g, out.device).in_degrees() == 0
    if not bool(empty.any()):
        return out
    fill = float("-inf") if reduce_op == "max" else float("inf")
    return out.masked_fill(empty.view((-1,) + (1,) * (out.dim() - 1)), fill)


def _make_spmm(op: str, reduce_op: str):
    name = f"u_{op}_e_{reduce_op}"

    def fn(g, x, y, *, config: Optional[CompressionConfig] = None):
        return gspmm(g, op, reduce_op, x, y, config=config)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"DGL's ``{name}``: ``out[v] = {reduce_op}_(u, e, v) x[u] {op} y[e]``, DGL's broadcasting of the "
                  "feature shapes" + ("; its backward forms nothing larger than the inputs and output "
                                      "(:mod:`dgl_exact.ops.spmm_broadcast`)." if reduce_op in BROADCAST_REDUCERS
                                      else "."))
    return name, fn


def _make_copy_reduce(target: str, reduce_op: str):
    name = f"copy_{target}_{reduce_op}"
    op = "copy_lhs" if target == "u" else "copy_rhs"

    def fn(g, x):
        return gspmm(g, op, reduce_op, x, None) if target == "u" else gspmm(g, op, reduce_op, None, x)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"DGL's ``{name}``: ``out[v] = {reduce_op}_(u, e, v) x[{target}]``; keeps what DGL's op does."
    return name, fn


# --- SDDMM -------------------------------------------------------------------------------------------
_SDDMM_OPS = ("add", "sub", "mul", "div", "dot", "copy_lhs", "copy_rhs")


@fresh_outputs
def gsddmm(g, op: str, lhs_data, rhs_data, lhs_target: str = "u", rhs_target: str = "v", *,
           config: Optional[CompressionConfig] = None):
    """DGL's ``gsddmm``: ``out[e] = op(lhs[lhs_target], rhs[rhs_target])`` per edge; ``mul`` and ``dot`` keep
    their operands compressed, the rest run DGL's op."""
    if op not in _SDDMM_OPS:
        raise ValueError(f"gsddmm: op must be one of {_SDDMM_OPS}, got {op!r}")
    dgl_gsddmm = originals().gsddmm
    if op in _BILINEAR and isinstance(lhs_data, torch.Tensor) and isinstance(rhs_data, torch.Tensor):
        dg = readable(g)
        return bilinear(lambda a, b: dgl_gsddmm(dg, op, a, b, lhs_target, rhs_target),
                         f"{lhs_target}_{op}_{rhs_target}", lhs_data, rhs_data, config)
    return dgl_gsddmm(readable(g), op, lhs_data, rhs_data, lhs_target, rhs_target)


def _make_sddmm(lhs: str, op: str, rhs: str):
    name = f"{lhs}_{op}_{rhs}"

    def fn(g, x, y, *, config: Optional[CompressionConfig] = None):
        return gsddmm(g, op, x, y, lhs, rhs, config=config)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"DGL's ``{name}``: per edge ``x[{lhs}] {op} y[{rhs}]``, DGL's broadcasting of the feature shapes."
    return name, fn


def copy_u(g, x):
    """DGL's ``copy_u``: each edge's source feature ``x[src]``; keeps nothing."""
    return originals().copy_u(readable(g), x)


def copy_v(g, x):
    """DGL's ``copy_v``: each edge's destination feature ``x[dst]``; keeps nothing."""
    return originals().copy_v(readable(g), x)


def copy_e(g, x):
    """DGL's ``copy_e``: the edge features themselves (through DGL's op, as DGL returns them)."""
    return originals().copy_e(readable(g), x)


# --- segment ops, gather_mm, edge_softmax --------------------------------------------------------------
def segment_reduce(seglen, value, reducer: str = "sum"):
    """DGL's ``segment_reduce``; keeps what DGL's op keeps (nothing for sum/mean, indices for max/min)."""
    return originals().segment_reduce(seglen, value, reducer)


def segment_softmax(seglen, value):
    """DGL's ``segment_softmax`` (DGL's op: its output kept exactly)."""
    return originals().segment_softmax(seglen, value)


@fresh_outputs
def segment_mm(a, b, seglen_a, *, config: Optional[CompressionConfig] = None):
    """DGL's ``segment_mm``: ``a[segment i] @ b[i]``; keeps ``a`` compressed for ``b``'s gradient and ``b``
    (a weight: by reference) for ``a``'s."""
    dgl_segment_mm = originals().segment_mm
    return bilinear(lambda x, w: dgl_segment_mm(x, w, seglen_a), "segment_mm", a, b, config)


@fresh_outputs
def gather_mm(a, b, *, idx_b, config: Optional[CompressionConfig] = None):
    """DGL's ``gather_mm``: ``a[i] @ b[idx_b[i]]``; keeps ``a`` compressed for ``b``'s gradient and ``b`` (a
    weight: by reference) for ``a``'s."""
    dgl_gather_mm = originals().gather_mm
    return bilinear(lambda x, w: dgl_gather_mm(x, w, idx_b=idx_b), "gather_mm", a, b, config)


edge_softmax = _graph.edge_softmax


def _generate():
    made = {}
    for op in ("add", "sub", "mul", "div"):
        for reduce_op in _REDUCERS:
            name, fn = _make_spmm(op, reduce_op)
            made[name] = fn
    for target in ("u", "e"):
        for reduce_op in _REDUCERS:
            name, fn = _make_copy_reduce(target, reduce_op)
            made[name] = fn
    for lhs in _TARGETS:
        for rhs in _TARGETS:
            if lhs == rhs:
                continue
            for op in ("add", "sub", "mul", "div", "dot"):
                name, fn = _make_sddmm(lhs, op, rhs)
                made[name] = fn
    # the fused ops of .graph, which take the same arguments
    for name in ("copy_u_sum", "copy_u_mean", "u_mul_e_sum", "u_add_v"):
        made[name] = getattr(_graph, name)
    module = sys.modules[__name__]
    for name, fn in made.items():
        setattr(module, name, fn)
        if name not in __all__:
            __all__.append(name)


_generate()
