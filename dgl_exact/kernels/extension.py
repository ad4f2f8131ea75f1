"""The compiled extension backend (``ext``, any device): ``torch.ops.dgl_exact.*`` built from the sources in ``cuda/``.

:func:`load` makes the operators available, trying in order:

1. a prebuilt ``dgl_exact._C`` module (``setup.py`` builds it when CUDA is available or
   ``DGL_EXACT_BUILD_CUDA=1``);
2. a just-in-time build with :func:`torch.utils.cpp_extension.load`, only when ``torch.cuda.is_available()``
   and nvcc is found; it is cached in torch's per-user extension directory (``TORCH_EXTENSIONS_DIR``,
   default ``~/.cache/torch_extensions``), so only the first use pays for the compile;
3. with ``DGL_EXACT_BUILD_CPU_EXT=1``: a just-in-time build of the CPU part only (the ``.cpp`` files),
   to test the C++ kernels against the reference on machines without a GPU.

It returns ``None`` when the operators are available (and registers them with :mod:`dgl_exact.kernels`),
else the reason. A failed build warns once and never raises. ``DGL_EXACT_VERBOSE_BUILD=1`` shows the
compiler output.

The Python wrappers have the reference signatures (:mod:`dgl_exact.kernels.reference`) and follow its
contract bit for bit. They and the fake implementations for ``torch.compile`` are derived from the one list
of ops (:data:`dgl_exact.kernels.spec.OPS`): a wrapper converts each argument as the op's schema types it
(``int``, ``float``, ``bool``, ``str``; ``int seed`` as the int64 with the seed's low 64 bits). An op whose
schema differs from its Python signature (``rademacher``) has its wrapper written below.
"""
from __future__ import annotations

import glob
import inspect
import logging
import os
import shutil
import sys
import threading
import warnings
from typing import Optional

import torch

from .. import _environment
from . import register
from .spec import OPS as _SPEC
from .spec import implemented

__all__ = ["load", "load_library", "library_info", "OPS", "source_dir", "wrapper"]

OPS = implemented("ext")  # from the one list of ops (spec.py)

ENV_CPU_EXT = "DGL_EXACT_BUILD_CPU_EXT"
ENV_VERBOSE = "DGL_EXACT_VERBOSE_BUILD"
_JIT_NAMES = {"cuda": "dgl_exact_ext_cuda", "cpu": "dgl_exact_ext_cpu"}
_CXX_FLAGS = ["-O3", "-ffp-contract=off"]
_NVCC_FLAGS = ["-O3", "-lineinfo"]  # no --use_fast_math: it would break the bit-exact contract

_log = logging.getLogger(__name__)
_lock = threading.Lock()
_state = {"kind": None, "path": None}  # kind: "prebuilt" | "jit-cuda" | "jit-cpu" once loaded
_failed = {}  # build kind -> reason, so a failed build is not retried (and warned about) again
_registered_devices: Optional[tuple] = None
_fakes_done = False


def _env_flag(name: str) -> bool:
    return _environment.read(name)


def source_dir() -> Optional[str]:
    """Directory holding the C++/CUDA sources: the repository's ``cuda/`` (source checkouts, editable
    installs), else the copy shipped in the package (``dgl_exact/_cuda_src``); ``None`` if neither."""
    here = os.path.dirname(os.path.abspath(__file__))
    package = os.path.dirname(here)
    root = os.path.dirname(package)
    candidates = []
    if os.path.exists(os.path.join(root, "setup.py")):
        candidates.append(os.path.join(root, "cuda"))
    candidates.append(os.path.join(package, "_cuda_src"))
    for cand in candidates:
        if os.path.isfile(os.path.join(cand, "dgl_exact.cpp")) and os.path.isfile(os.path.join(cand, "common.h")):
            return cand
    return None


def _ops_present() -> bool:
    try:
        return hasattr(torch.ops.dgl_exact, "quantize_pack") and torch._C._dispatch_has_kernel_for_dispatch_key(
            "dgl_exact::quantize_pack", "CPU")
    except Exception:
        return False


def _has_cuda_kernels() -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key("dgl_exact::quantize_pack", "CUDA"))
    except Exception:
        return False


def _nvcc() -> Optional[str]:
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:
        CUDA_HOME = None
    if CUDA_HOME:
        path = os.path.join(CUDA_HOME, "bin", "nvcc")
        if os.path.exists(path):
            return path
    return shutil.which("nvcc")


def _jit_build(kind: str) -> Optional[str]:
    """Build and load the extension (``kind`` "cuda": all sources, "cpu": the .cpp files); None or reason."""
    if kind in _failed:
        return _failed[kind]
    src = source_dir()
    if src is None:
        reason = "no prebuilt dgl_exact._C and the C++/CUDA sources are not shipped with this installation"
        _failed[kind] = reason
        return reason
    patterns = ("*.cpp", "*.cu") if kind == "cuda" else ("*.cpp",)
    sources = sorted(p for pat in patterns for p in glob.glob(os.path.join(src, pat)))
    name = _JIT_NAMES[kind]
    verbose = _env_flag(ENV_VERBOSE)
    try:
        from torch.utils import cpp_extension

        try:
            build_dir = cpp_extension._get_build_directory(name, verbose=False)
            fresh = not glob.glob(os.path.join(build_dir, name + "*.so"))
        except Exception:
            build_dir, fresh = "torch's extension cache", True
        if fresh:
            print(f"dgl_exact: compiling the {'CUDA' if kind == 'cuda' else 'C++ (CPU only)'} extension on first "
                  f"use (a few minutes; cached in {build_dir})", file=sys.stderr, flush=True)
        path = cpp_extension.load(
            name=name,
            sources=sources,
            extra_include_paths=[src],
            extra_cflags=list(_CXX_FLAGS),
            extra_cuda_cflags=list(_NVCC_FLAGS) if kind == "cuda" else None,
            with_cuda=(kind == "cuda"),
            is_python_module=False,
            verbose=verbose,
        )
    except BaseException as exc:  # compiler errors are RuntimeError; a missing ninja/compiler may be anything
        if isinstance(exc, KeyboardInterrupt):
            raise
        first = str(exc).strip().splitlines()
        detail = first[0] if first else ""
        reason = f"JIT build of the {kind} extension failed: {type(exc).__name__}: {detail}"
        _failed[kind] = reason
        warnings.warn(f"dgl_exact: {reason}. Falling back to the other kernel backends. Set {ENV_VERBOSE}=1 to "
                      "see the compiler output.", RuntimeWarning, stacklevel=3)
        return reason
    if not _ops_present():
        reason = f"the {kind} extension built ({path}) but registered no dgl_exact operators"
        _failed[kind] = reason
        warnings.warn(f"dgl_exact: {reason}", RuntimeWarning, stacklevel=3)
        return reason
    _state.update(kind=f"jit-{kind}", path=str(path))
    return None


def load_library(allow_cpu_jit: bool = False) -> Optional[str]:
    """Make ``torch.ops.dgl_exact`` available (prebuilt, else JIT as described in the module docstring).

    ``allow_cpu_jit``: build the CPU-only part when no GPU/nvcc allows the full build. Returns None on
    success, else the reason. Never raises.
    """
    with _lock:
        if _state["kind"] is not None:
            return None
        if _ops_present():  # loaded by someone else (e.g. torch.ops.load_library)
            _state.update(kind="external", path=None)
            return None
        try:
            import dgl_exact._C as _C  # noqa: F401  (registers the operators)

            if _ops_present():
                _state.update(kind="prebuilt", path=getattr(_C, "__file__", None))
                return None
        except ImportError as exc:
            prebuilt_error = exc
        except Exception as exc:  # a broken binary (ABI mismatch, missing CUDA libraries, ...)
            prebuilt_error = exc
            _log.debug("dgl_exact._C failed to import: %s", exc)
        else:
            prebuilt_error = None
        if torch.cuda.is_available() and _nvcc() is not None:
            return _jit_build("cuda")
        if allow_cpu_jit:
            return _jit_build("cpu")
        why = "no GPU visible to torch" if not torch.cuda.is_available() else "nvcc not found"
        if isinstance(prebuilt_error, ImportError) and "No module named" in str(prebuilt_error):
            return f"not built (no prebuilt dgl_exact._C; {why} for a JIT build)"
        return f"prebuilt dgl_exact._C unusable ({prebuilt_error}); {why} for a JIT build"


def library_info() -> dict:
    """How the operators were obtained: ``kind`` (prebuilt / jit-cuda / jit-cpu / external / None), the library
    ``path``, whether CUDA kernels are present, and the failed build attempts."""
    return {"kind": _state["kind"], "path": _state["path"], "cuda_kernels": _has_cuda_kernels() if _state["kind"]
            else False, "failed": dict(_failed)}


def load() -> Optional[str]:
    """Registry entry point: None when the backend is available (wrappers registered), else the reason."""
    global _registered_devices
    allow_cpu = _env_flag(ENV_CPU_EXT)
    reason = load_library(allow_cpu_jit=allow_cpu)
    if reason is not None:
        return reason
    has_cuda = _has_cuda_kernels()
    if not has_cuda and not allow_cpu:
        return f"only the CPU part of the extension is loaded (set {ENV_CPU_EXT}=1 to use it)"
    _register_fakes()
    devices = ("cpu", "cuda") if has_cuda else ("cpu",)
    if _registered_devices != devices:
        for op in OPS:
            if _has_op(_SCHEMA_NAME.get(op, op)):  # a library built from older sources may lack newer ops
                register(op, "ext", devices=devices)(wrapper(op))
        _registered_devices = devices
    return None


# ----------------------------------------------------------------------------------------------------
# Python wrappers with the reference signatures.
# ----------------------------------------------------------------------------------------------------

def _has_op(op: str) -> bool:
    try:
        getattr(torch.ops.dgl_exact, op)
        return True
    except (AttributeError, RuntimeError):
        return False


def _seed(seed) -> int:
    """A Python int seed as the int64 with the same low 64 bits (the kernels use them as uint64)."""
    s = int(seed) & 0xFFFFFFFFFFFFFFFF
    return s - (1 << 64) if s >= (1 << 63) else s


def _converter(arg: str):
    """How a wrapper converts one argument of a schema (``"int bits"``, ``"Tensor? w"``, ...)."""
    typ, name = arg.rsplit(" ", 1)
    if typ == "int":
        return _seed if name == "seed" else int
    return {"float": float, "bool": bool, "str": str}.get(typ)


def _schema_args(schema: str):
    return [a.strip() for a in schema[schema.index("(") + 1: schema.index(")")].split(",")]


def _derived_wrapper(op: str):
    convert = [_converter(a) for a in _schema_args(_SPEC[op].schema)]

    def run(*args):
        return getattr(torch.ops.dgl_exact, op)(*[a if c is None else c(a) for c, a in zip(convert, args)])

    from . import reference

    run.__name__ = op
    run.__doc__ = f"``torch.ops.dgl_exact.{_SPEC[op].schema}``"
    run.__signature__ = inspect.signature(getattr(reference, op))
    return run


def rademacher(d, k, seed, device, dtype=torch.float32):
    """``[d, k]`` of ``+-1/sqrt(k)``: the op fills a preallocated tensor (it has no tensor input to dispatch on)."""
    out = torch.empty((int(d), int(k)), dtype=dtype, device=device)
    torch.ops.dgl_exact.rademacher_(out, _seed(seed))
    return out


def spmm_weighted_sum(indptr, indices, eids, x, w, n_dst):
    """``torch.ops.dgl_exact.spmm_sum`` with edge weights (the extension's one sum kernel takes them)."""
    if w is None:
        raise ValueError("spmm_weighted_sum needs edge weights w [E, H]; spmm_sum sums without them")
    return wrapper("spmm_sum")(indptr, indices, eids, x, w, n_dst)


_HANDWRITTEN = {"rademacher": rademacher, "spmm_weighted_sum": spmm_weighted_sum}
#: the ``torch.ops.dgl_exact`` schema of each op (``cuda/dgl_exact.cpp``): the spec's, else the handwritten op's
SCHEMAS = {op: _SPEC[op].schema for op in OPS if _SPEC[op].schema is not None}
SCHEMAS["rademacher"] = "rademacher_(Tensor(a!) out, int seed) -> ()"
SCHEMAS["spmm_weighted_sum"] = SCHEMAS["spmm_sum"]
_SCHEMA_NAME = {op: schema[: schema.index("(")] for op, schema in SCHEMAS.items()}
_wrappers = {}


def wrapper(op: str):
    """The Python function registered for ``op``: derived from its schema, or the handwritten one."""
    if op not in _wrappers:
        _wrappers[op] = _HANDWRITTEN[op] if op in _HANDWRITTEN else _derived_wrapper(op)
    return _wrappers[op]


for _op in OPS:  # module attributes too: extension.quantize_pack, ... (what tests call directly)
    globals()[_op] = wrapper(_op)
del _op


# ----------------------------------------------------------------------------------------------------
# Fake (meta) implementations: output shapes and dtypes only, for torch.compile / FakeTensor.
# ----------------------------------------------------------------------------------------------------

def _register_fakes() -> None:
    global _fakes_done
    if _fakes_done:
        return
    _fakes_done = True
    reg = getattr(torch.library, "register_fake", None) or getattr(torch.library, "impl_abstract", None)
    if reg is None:
        return

    def fake(name):
        def wrap(fn):
            try:
                reg(f"dgl_exact::{name}")(fn)
            except Exception as exc:  # already registered (e.g. a second loader), or an old torch
                _log.debug("dgl_exact: no fake for %s: %s", name, exc)
            return fn
        return wrap

    for op in OPS:
        if _SPEC[op].fake is not None:
            fake(op)(_SPEC[op].fake)

    @fake("rademacher_")
    def _(out, seed):
        return None
