"""Compatibility shims that make dgl_exact's dependencies importable where they are not by themselves.

Three known breakages are handled here, and nowhere else:

1. **DGL 2.1.0 on a torch it was not built for.** PyPI's only Linux DGL (2.1.0) ships its native
   ``graphbolt`` library for torch 2.0.0 to 2.2.1 only, and ``import dgl`` imports graphbolt
   unconditionally (through ``dgl.distributed``), so on any newer torch it raises
   ``FileNotFoundError: Cannot find DGL C++ graphbolt library``. When (and only when) the library for
   the running torch is missing, we register a placeholder module as ``dgl.graphbolt`` *before* DGL is
   imported. Everything dgl_exact uses (graphs, ``dgl.ops``, ``dgl.nn``, samplers, METIS, datasets)
   works without graphbolt; touching the placeholder raises an ``ImportError`` that explains why.
   A working DGL install (library present, or dgl already imported by the user) is never touched.
   The placeholder stays registered, so a later ``import dgl`` by the user keeps working.

2. **ogb's update check.** ``import dgl`` imports ogb, which starts a network request without timeout in a
   non-daemon thread; it is suppressed for that import (see :func:`_import_dgl_without_update_check`).

3. **numba-cuda with numpy >= 2.5.** numba-cuda 0.30 references ``numpy.row_stack``, which numpy 2.5
   removed, and fails to compile any kernel. :func:`patch_numpy_for_numba` restores the alias
   (``numpy.vstack`` is what ``row_stack`` always was) right before ``numba.cuda`` is imported.

One torch behaviour is worked around here too: :func:`storage_ptr` (where a tensor's storage begins) without
``Tensor.untyped_storage()``, whose Python storage object outlives the call and keeps the storage's use count
above one, so that autograd no longer sums a gradient into that tensor in place (rule 9 of
:mod:`dgl_exact.ops.keep`).
"""
from __future__ import annotations

import contextlib
import functools
import random
import sys

__all__ = ["import_dgl", "DGL_MISSING", "graphbolt_stubbed", "dgl_supports_device", "patch_numpy_for_numba",
           "storage_ptr"]

from _dgl_exact_import_hook import GRAPHBOLT as _GRAPHBOLT
from _dgl_exact_import_hook import STUB_FLAG as _STUB_FLAG
from _dgl_exact_import_hook import GraphboltUnavailable as _GraphboltUnavailable  # noqa: F401
from _dgl_exact_import_hook import graphbolt_library_present as _graphbolt_library_present  # noqa: F401
from _dgl_exact_import_hook import install_placeholder as _install_placeholder


def graphbolt_stubbed() -> bool:
    """Whether ``dgl.graphbolt`` is dgl_exact's placeholder (True) or DGL's own module (False)."""
    return getattr(sys.modules.get(_GRAPHBOLT), _STUB_FLAG, False)


#: what :func:`import_dgl` says when DGL is not installed (the core and ``dgl_exact.pyg`` work without it)
DGL_MISSING = ("this part of dgl_exact (its DGL front end: dgl_exact.nn, data, training, the CLI's DGL models) "
               "needs DGL, which is not installed: pip install dgl==2.1.0 (or pip install dgl-exact with its "
               "dependencies); dgl_exact's core (compression, kernels, ops on index tensors) and dgl_exact.pyg "
               "work without it")


def import_dgl():
    """Import and return ``dgl``, installing the graphbolt placeholder first if (and only if) needed. Without
    DGL installed: ``ModuleNotFoundError`` (``name == "dgl"``) saying what needs it and how to install it."""
    try:
        _install_placeholder()
        if "dgl" not in sys.modules:
            _import_dgl_without_update_check()
            import dgl

            _number_this_thread_first(dgl)
        import dgl
    except ModuleNotFoundError as exc:
        if exc.name != "dgl":  # DGL is there but one of its own dependencies is not: DGL's message says which
            raise
        raise ModuleNotFoundError(DGL_MISSING, name="dgl") from exc

    stub = sys.modules.get(_GRAPHBOLT)
    if graphbolt_stubbed() and "graphbolt" not in vars(dgl):
        # a submodule found in sys.modules is not bound on its parent: bind it, so ``dgl.graphbolt.X``
        # raises the explanatory ImportError instead of "module 'dgl' has no attribute 'graphbolt'"
        dgl.graphbolt = stub
    return dgl


def _number_this_thread_first(dgl) -> None:
    """Make the thread importing DGL (the main thread) the first to seed DGL's random engine.

    DGL gives each OS thread its own engine; ``dgl.seed(s)`` seeds it from ``s`` and a number DGL gives the
    thread, in the order threads first seed one, process-wide. Whenever an OpenMP worker or any other thread
    gets there first (a multi-threaded ``dgl.seed``: a race that load decides), the main thread draws
    another stream under the same seed, and seeded neighbour sampling (:mod:`dgl_exact.training.neighbor`)
    differs between processes. One seed here, in this thread alone, numbers it first: from fresh entropy,
    so that DGL stays unseeded until someone seeds it. Only where dgl_exact imports DGL: a process that
    imported DGL before dgl_exact keeps whatever seed and numbering it has."""
    if not hasattr(dgl, "seed") or not hasattr(getattr(dgl, "utils", None), "set_num_threads"):
        return  # not DGL's runtime (a stand-in package)
    before = dgl.utils.get_num_threads()
    dgl.utils.set_num_threads(1)
    try:
        dgl.seed(random.SystemRandom().randrange(2**31))
    finally:
        dgl.utils.set_num_threads(before)


@functools.lru_cache(maxsize=None)
def dgl_supports_device(device) -> bool:
    """Whether this DGL build can hold a graph on ``device`` (PyPI's CPU-only build: CPU only; moving a
    graph raises ``DGLError`` there, or an ``AssertionError`` from a CPU-only torch)."""
    dgl = import_dgl()
    try:
        dgl.graph(([0], [0])).to(device)
    except Exception:  # noqa: BLE001  (any failure means: keep graphs on the CPU)
        return False
    return True


def _import_dgl_without_update_check() -> None:
    """``import dgl`` imports ogb, whose import starts a non-daemon thread asking PyPI whether ogb is
    outdated, with no timeout: offline or behind a firewall that drops packets, the process could not
    exit. Blocking the ``outdated`` module for that one import makes ogb skip the check."""
    blocked = "outdated" not in sys.modules
    if blocked:
        sys.modules["outdated"] = None  # ImportError inside ogb's optional check
    try:
        import dgl  # noqa: F401
    finally:
        if blocked and sys.modules.get("outdated", 0) is None:
            del sys.modules["outdated"]


def patch_numpy_for_numba() -> None:
    """Restore ``numpy.row_stack`` (removed in numpy 2.5) which numba-cuda still references."""
    import numpy

    if not hasattr(numpy, "row_stack"):
        numpy.row_stack = numpy.vstack


# a plain global, not a ContextVar: dynamo cannot trace ``ContextVar.get`` (only dynamo's own tracing,
# which holds a global compile lock, ever sets it)
_eager_depth = 0


def compiling() -> bool:
    """Whether dynamo is tracing the caller (``torch.compiler.is_compiling``; False on a torch without it,
    and within :func:`eager_during_trace`)."""
    import torch

    fn = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return fn is not None and bool(fn()) and _eager_depth == 0


@contextlib.contextmanager
def eager_during_trace():
    """Code dynamo runs for real while it traces (``assume_constant_result`` functions) is eager code:
    within this scope :func:`compiling` is False."""
    global _eager_depth
    _eager_depth += 1
    try:
        yield
    finally:
        _eager_depth -= 1


def autocast_dtype(device_type: str):
    """The autocast dtype for ``device_type`` if autocast is active there, else None."""
    import torch

    try:
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    except TypeError:  # torch < 2.4: no device argument
        if device_type == "cuda" and torch.is_autocast_enabled():
            return torch.get_autocast_gpu_dtype()
        if device_type == "cpu" and torch.is_autocast_cpu_enabled():
            return torch.get_autocast_cpu_dtype()
    return None



def storage_ptr(t) -> int:
    """Where ``t``'s storage begins (``t.untyped_storage().data_ptr()``) without creating the storage's Python
    object: once created, it stays alive with the storage (torch preserves it), its reference keeps the
    storage's use count above one, and autograd then refuses to sum another gradient into ``t`` in place (one
    more buffer of ``t``'s size at a backward's peak). Tensors without data (fake, meta): the storage's own."""
    try:
        return t.data_ptr() - t.storage_offset() * t.element_size()
    except (RuntimeError, NotImplementedError):
        return t.untyped_storage().data_ptr()
