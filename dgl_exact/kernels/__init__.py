"""Kernel registry: one reference implementation per op, several backends behind it.

Every op has a pure-torch reference (``torch``, any device). Faster backends register the same op
under their name: ``cuda`` (the compiled extension in ``cuda/``, loaded through ``torch.ops``) and
``numba`` (Numba CUDA kernels). For each call the registry picks, by the tensors' device:

* the backend forced by ``DGL_EXACT_BACKEND=cuda|numba|torch`` (or :func:`use_backend`), if it
  implements the op for that device, else the next one in the chain;
* on CUDA tensors: ``cuda`` -> ``numba`` -> ``torch``; on CPU tensors: ``numba`` (its CPU kernels) ->
  ``torch``.

All backends implement the same contract bit for bit, including the random numbers: stochastic
rounding and dropout draw their uniforms from :func:`dgl_exact.kernels.reference.hash_uniform`, a
counter-based hash of (seed, element index), so every backend produces identical codes and masks
for the same seed, and tests compare them exactly.
"""
from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import torch

__all__ = ["register", "get", "backend", "use_backend", "BACKENDS", "BackendReport", "available_backends"]

BACKENDS = ("cuda", "numba", "torch")
_CHAIN = {"cuda": ("cuda", "numba", "torch"), "cpu": ("numba", "torch")}
ENV_VAR = "DGL_EXACT_BACKEND"

# op name -> backend name -> (function, devices it supports)
_REGISTRY: Dict[str, Dict[str, tuple]] = {}
_local = threading.local()
_loaded = False
_load_lock = threading.Lock()
_status: Dict[str, str] = {}  # backend -> "available" or the reason it is not


def register(op: str, backend: str, devices=("cpu", "cuda")):
    """Decorator: register ``fn`` as ``backend``'s implementation of ``op`` for ``devices``."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")

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
        for name, module in (("cuda", "extension"), ("numba", "numba_cuda")):
            try:
                mod = __import__(f"{__name__}.{module}", fromlist=["load"])
                reason = mod.load()  # returns None when available, else a reason string
            except Exception as exc:  # a broken optional backend must never break the package
                reason = f"failed to load: {type(exc).__name__}: {exc}"
            _status[name] = "available" if reason is None else reason
        _loaded = True


def _forced() -> Optional[str]:
    forced = getattr(_local, "forced", None)
    if forced is None:
        forced = os.environ.get(ENV_VAR) or None
    if forced is not None and forced not in BACKENDS:
        raise ValueError(f"{ENV_VAR}={forced!r} is not a backend; use one of {', '.join(BACKENDS)}")
    return forced


_warned_forced = set()
# (op, device type, forced backend) -> (backend, function): the choice is made once per key (it runs on
# every compress / decompress, where Python overhead competes with kernel launches); register() resets it.
_chosen: Dict[tuple, tuple] = {}


def _choose(op: str, device_type: str) -> tuple:
    _load_backends()
    forced = _forced()
    key = (op, device_type, forced)
    choice = _chosen.get(key)
    if choice is None:
        choice = _chosen[key] = _choose_uncached(op, device_type, forced)
    return choice


def _choose_uncached(op: str, device_type: str, forced: Optional[str]) -> tuple:
    impls = _REGISTRY.get(op)
    if not impls:
        raise KeyError(f"no kernel registered for op {op!r}")
    chain = list(_CHAIN.get(device_type, ("torch",)))
    if forced is not None:
        chain = [forced] + [b for b in chain if b != forced and BACKENDS.index(b) > BACKENDS.index(forced)]
    for name in chain:
        if name not in impls or _status.get(name) != "available":
            continue
        fn, devices = impls[name]
        if device_type in devices:
            if forced is not None and name != forced and (forced, op) not in _warned_forced:
                _warned_forced.add((forced, op))
                warnings.warn(f"{ENV_VAR}={forced}: backend {forced!r} cannot serve {op!r} on {device_type} "
                              f"({_status.get(forced, 'no implementation')}); using {name!r}", stacklevel=3)
            return name, fn
    return "torch", impls["torch"][0]


def get(op: str, device) -> Callable:
    """The implementation of ``op`` that serves tensors on ``device``."""
    if isinstance(device, torch.device):
        device_type = device.type
    else:
        device_type = torch.device(device).type if not isinstance(device, str) or ":" in device else device
    return _choose(op, device_type)[1]


@contextlib.contextmanager
def use_backend(name: Optional[str]):
    """Force a backend for the current thread (like ``DGL_EXACT_BACKEND``); ``None`` restores auto."""
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; expected one of {BACKENDS}")
    previous = getattr(_local, "forced", None)
    _local.forced = name
    try:
        yield
    finally:
        _local.forced = previous


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
        lines = [f"kernel backend on {self.device}: {self.primary}"]
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
