"""Kernel registry: one reference implementation per op, several backends behind it, one selector.

The ops, their signatures and which backend implements each on which device are listed once, in
:data:`dgl_exact.kernels.spec.OPS`. Backends:

* ``torch``: the pure-torch reference (:mod:`.reference`), any device. It *is* the contract.
* ``ext``: the compiled extension (``cuda/``, ``torch.ops.dgl_exact``; :mod:`.extension`): CUDA kernels,
  and C++ CPU kernels when built with ``DGL_EXACT_BUILD_CPU_EXT=1``.
* ``numba``: Numba kernels (:mod:`.numba_kernels`): CPU kernels, and CUDA kernels where a real GPU works.
* ``dgl``: DGL's own multithreaded CPU graph kernels (:mod:`.dgl_graph`): graph ops on CPU tensors. Its
  functions take DGL's graph index in place of the CSR triple ``(indptr, indices, eids)``
  (:class:`dgl_exact.ops.structure.GraphStructure` passes whichever the chosen backend takes).

The fast path per device, tried in order (the first backend that is available and implements the op on
that device serves it):

* CUDA tensors: ``ext`` -> ``numba`` -> ``torch``. ``ext`` is the fast path; ``numba`` serves a GPU when
  the extension could not be built (no nvcc) at Numba-JIT speed; ``torch`` always works.
* CPU tensors: ``dgl`` -> ``numba`` -> ``torch``. DGL's C kernels serve graph ops but the weighted sum, the
  Numba CPU kernels the compression, mask and dropout ops (INT2 compress about 6x, decompress about 3x the
  reference's speed on a 2-core CPU; no compiler needed) and ``spmm_weighted_sum`` (DGL's kernel broadcasts
  the weight per element: 2-4x slower than Numba's on an arxiv-sized graph, so the spec lists no DGL
  implementation of it);
  ``ext``'s C++ CPU kernels are used on the CPU only when asked for (they exist to test the CUDA kernels'
  shared logic on machines without a GPU).

Choosing: ``DGL_EXACT_BACKEND=ext|numba|dgl|torch`` (or :func:`use_backend`) puts that backend first for
every op it implements on the device (the rest keep the chain above); ``DGL_EXACT_BACKEND=cuda`` is the
old name of ``ext`` (deprecated). :func:`exclude` removes backends within a scope:
``exclude("dgl")`` is how tests and the step counter take, on the CPU, the code path CUDA tensors take
(:func:`dgl_exact.ops.structure.device_kernels_only`). There is no other switch: a backend never falls
back on its own.

The one path from an op call to a backend::

    kernels.get("quantize_pack", x.device)(x, lo, step, ...)
      -> _choose(op, device type, forced, excluded)   # cached per key
      -> the first backend of the chain that registered the op for that device
      -> its function: reference.quantize_pack / extension wrapper / numba_kernels ops / dgl_graph

How to add an op (the steps ``rademacher`` was added with):

1. ``spec.py``: an :class:`~.spec.Op` entry: name, Python signature, the extension's schema (``None`` if
   its wrapper is written by hand), the devices of each backend or the reason it has none, a fake.
2. ``reference.py``: the torch implementation, ``@register(name, "torch")``; its docstring is the contract.
3. ``cuda/``: ``m.def`` of the schema in ``dgl_exact.cpp``, the declaration in ``dgl_exact.h``
   (``DGL_EXACT_DECLARE_OPS``), the CPU kernel in ``*_cpu.cpp`` and the CUDA kernel in ``*_cuda.cu`` with
   their ``m.impl`` (per-element math shared through ``common.h``). ``extension.py`` derives the wrapper
   and registers the fake from the spec; only an op whose schema differs from its signature needs a
   handwritten wrapper (``_HANDWRITTEN``), its schema in ``SCHEMAS`` and its fake.
   ``JOBS=2 scripts/compile_check_cuda.sh`` compile-checks the CUDA sources without a GPU.
4. Numba: the array kernel in ``_numba_cpu.py`` and ``_numba_gpu.py`` (same arguments, the CPU one ends with
   ``start, end``), and a ``_TorchOps`` method in ``numba_kernels.py``; it is registered from the spec.
5. Tests: ``tests/kernels/test_spec.py`` checks every backend registered the op or the spec gives a reason;
   add a bit-exact comparison with the reference per backend (``tests/kernels/test_numba_kernels.py`` with
   ``NUMBA_ENABLE_CUDASIM=1`` for the CUDA kernels, ``tests/kernels/test_extension.py`` for the extension).
6. Call it: ``kernels.get(name, device)(...)``.

All backends implement the same contract bit for bit, including the random numbers: stochastic
rounding and dropout draw their uniforms from :func:`dgl_exact.kernels.reference.hash_uniform`, a
counter-based hash of (seed, element index), so every backend produces identical codes and masks
for the same seed, and tests compare them exactly (graph ops: up to summation order).
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch

from .. import _environment
from .spec import BACKENDS, OPS

__all__ = ["register", "get", "chosen", "backend", "use_backend", "exclude", "BACKENDS", "OPS", "BackendReport",
           "available_backends"]

_CHAIN = {"cuda": ("ext", "numba", "torch"), "cpu": ("dgl", "numba", "torch")}
ENV_VAR = "DGL_EXACT_BACKEND"
_ALIASES = {"cuda": "ext"}  # old names, accepted with a DeprecationWarning

# op name -> backend name -> (function, devices it supports)
_REGISTRY: Dict[str, Dict[str, tuple]] = {}
_local = threading.local()
_loaded = False
_load_lock = threading.Lock()
_status: Dict[str, str] = {}  # backend -> "available" or the reason it is not
_MODULES = (("ext", "extension"), ("numba", "numba_kernels"), ("dgl", "dgl_graph"))


def register(op: str, backend: str, devices=("cpu", "cuda")):
    """Decorator: register ``fn`` as ``backend``'s implementation of ``op`` for ``devices`` (which the
    spec must list for that backend)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")
    if op not in OPS:
        raise KeyError(f"op {op!r} is not in dgl_exact.kernels.spec.OPS: add it there first")
    extra = set(devices) - set(OPS[op].devices(backend))
    if extra:
        raise ValueError(f"spec.OPS[{op!r}] does not list {backend!r} on {sorted(extra)}")

    def wrap(fn):
        _REGISTRY.setdefault(op, {})[backend] = (fn, tuple(devices))
        _chosen.clear()
        return fn

    return wrap


def _load_backends() -> None:
    """Import the optional backends once; each records why it is unavailable instead of raising."""
    global _loaded
    if _loaded:
        return
    with _load_lock:
        if _loaded:
            return
        from . import reference  # noqa: F401  (registers the torch ops)

        _status["torch"] = "available"
        for name, module in _MODULES:
            try:
                mod = __import__(f"{__name__}.{module}", fromlist=["load"])
                reason = mod.load()  # returns None when available, else a reason string
            except Exception as exc:  # a broken optional backend must never break the package
                reason = f"failed to load: {type(exc).__name__}: {exc}"
            _status[name] = "available" if reason is None else reason
        _loaded = True


def _canonical(name: Optional[str], what: str) -> Optional[str]:
    if name is None:
        return None
    if name in _ALIASES:
        new = _ALIASES[name]
        warnings.warn(f"{what}={name!r} is deprecated: the compiled extension's backend is now called {new!r}",
                      DeprecationWarning, stacklevel=4)
        return new
    if name not in BACKENDS:
        raise ValueError(f"{what}={name!r} is not a backend; use one of {', '.join(BACKENDS)}")
    return name


_env_seen: Dict[str, str] = {}  # DGL_EXACT_BACKEND value -> backend (an old name warns once)


def _forced() -> Optional[str]:
    forced = getattr(_local, "forced", None)
    if forced is None:
        env = os.environ.get(ENV_VAR) or None
        if env is None or env in BACKENDS:
            return env
        if env not in _env_seen:
            _environment.read(ENV_VAR)  # the one line every reader of the environment gives
            _env_seen[env] = _canonical(env, ENV_VAR)
        forced = _env_seen[env]
    return forced


def _excluded() -> frozenset:
    return getattr(_local, "excluded", frozenset())


_warned_forced = set()
# (op, device type, forced backend, excluded) -> (backend, function): the choice is made once per key (it runs
# on every compress / decompress, where Python overhead competes with kernel launches); register() resets it.
_chosen: Dict[tuple, tuple] = {}


def _choose(op: str, device_type: str) -> tuple:
    _load_backends()
    key = (op, device_type, _forced(), _excluded())
    choice = _chosen.get(key)
    if choice is None:
        choice = _chosen[key] = _choose_uncached(*key)
    return choice


def _choose_uncached(op: str, device_type: str, forced: Optional[str], excluded: frozenset) -> tuple:
    impls = _REGISTRY.get(op)
    if not impls:
        raise KeyError(f"no kernel registered for op {op!r}")
    chain = [b for b in _CHAIN.get(device_type, ("torch",)) if b not in excluded]
    if forced in excluded:
        forced = None  # an excluded backend serves nothing, forced or not
    if forced is not None:
        chain = [forced] + [b for b in chain if b != forced]
    for name in chain:
        if name not in impls or _status.get(name) != "available":
            continue
        fn, devices = impls[name]
        if device_type in devices:
            if (forced is not None and name != forced and OPS[op].devices(forced)
                    and (forced, op) not in _warned_forced):
                _warned_forced.add((forced, op))
                warnings.warn(f"{ENV_VAR}={forced}: backend {forced!r} cannot serve {op!r} on {device_type} "
                              f"({_status.get(forced, 'no implementation')}); using {name!r}", stacklevel=4)
            return name, fn
    return "torch", impls["torch"][0]


def _device_type(device) -> str:
    if isinstance(device, torch.device):
        return device.type
    return torch.device(device).type if not isinstance(device, str) or ":" in device else device


def get(op: str, device) -> Callable:
    """The implementation of ``op`` that serves tensors on ``device``."""
    return _choose(op, _device_type(device))[1]


def chosen(op: str, device) -> str:
    """The name of the backend :func:`get` picks for ``op`` on ``device`` (for callers whose arguments depend
    on it: the ``dgl`` graph ops take DGL's graph index in place of the CSR triple)."""
    return _choose(op, _device_type(device))[0]


@contextlib.contextmanager
def use_backend(name: Optional[str]):
    """Force a backend for the current thread (like ``DGL_EXACT_BACKEND``); ``None`` restores auto."""
    name = _canonical(name, "use_backend")
    previous = getattr(_local, "forced", None)
    _local.forced = name
    try:
        yield
    finally:
        _local.forced = previous


@contextlib.contextmanager
def exclude(*names: str):
    """Within this scope (this thread), the named backends serve nothing: the chain skips them."""
    names = frozenset(_canonical(n, "exclude") for n in names)
    previous = _excluded()
    _local.excluded = previous | names
    try:
        yield
    finally:
        _local.excluded = previous


@dataclass
class BackendReport:
    """Which backend serves each op on a device, and why the others do not."""

    device: str
    ops: Dict[str, str] = field(default_factory=dict)
    status: Dict[str, str] = field(default_factory=dict)

    @property
    def primary(self) -> str:
        """The backend serving the compression ops (what users usually ask about)."""
        return self.ops.get("quantize_pack", "torch")

    def __str__(self) -> str:
        graph = self.ops.get("spmm_sum", "torch")
        weighted = self.ops.get("spmm_weighted_sum", graph)
        graph += "" if weighted == graph else f", weighted sums: {weighted}"
        lines = [f"kernel backend on {self.device}: {self.primary} (graph ops: {graph})"]
        for name in BACKENDS:
            lines.append(f"  {name:6s} {self.status.get(name, 'not loaded')}")
        return "\n".join(lines)


def available_backends() -> Dict[str, str]:
    """Backend name -> "available" or the reason it is not."""
    _load_backends()
    return dict(_status)


def backend(device=None) -> BackendReport:
    """Report which backend serves each op on ``device`` (default: CUDA if present, else CPU)."""
    _load_backends()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = torch.device(device).type
    report = BackendReport(device=str(device), status=dict(_status))
    for op in sorted(_REGISTRY):
        report.ops[op] = _choose(op, device_type)[0]
    return report
