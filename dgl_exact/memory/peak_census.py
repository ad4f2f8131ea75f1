"""Which tensors hold a training step's peak, and which lines made them: :func:`census`.

The census runs the user's whole step (forward, backward, optimizer step) under a ``TorchDispatchMode`` and
follows every tensor storage of at least ``min_bytes`` that the step creates, from the operator that creates
it until its last reference dies (a weak reference to the storage, checked at every operator). The largest
total of live storages in each phase is that phase's peak, and the storages alive then are listed with:

* their size, dtype and shape;
* ``data``: ``compressed`` for what dgl_exact's compressor made (packed codes, their scales, sign masks,
  projected rows: anything created while a dgl_exact function that compresses or packs was running), else
  the dtype (``fp32``, ``int64``, ...);
* ``role``: ``saved for backward`` (seen by a saved-tensor observer, or compressed), ``forward value``
  (created in the forward and still referenced: a layer output, a tensor the user keeps), ``backward``
  (gradients and temporaries of the backward), ``optimizer`` (after the backward);
* ``line``: the innermost frame outside torch, DGL and dgl_exact (the user's line; dgl_exact's benchmark
  models in ``dgl_exact/bench`` count as user code). A tensor made in the backward is charged to the line
  whose forward created the autograd node that made it (torch's anomaly mode records that line; it runs
  here without its NaN check);
* ``op``: the dgl_exact op that made it, if any (``ops/graph.py:gspmm``: the outermost frame in
  ``dgl_exact/ops``, else the outermost dgl_exact frame), and the torch operator (or the autograd node in
  the backward).

Rows are grouped by (line, op, data, role), largest first: the lines at the top are the ones to change.

What it cannot see: storages created before the step (the model, the graph, the data, the optimizer state
of earlier steps: a warm-up step runs first by default), and tensors smaller than ``min_bytes``. Tensors that
DGL's C++ kernels allocate outside torch (DGL 2.1.0 on modern torch) are found when a torch operator first
reads them and are charged to the line running then (``data`` says ``outside torch``), so a plain DGL model's
peak here can be below :func:`dgl_exact.memory.measure_step`'s resident step peak. The sparse formats (CSR,
CSC) that DGL holds for the graphs alive before the step are memory from before it, however often the step
reads them (DGL hands ``update_all`` a new graph object of the same formats at every call). While any
dispatch mode is active, torch never sums a tensor's gradients in place (it treats every tensor as a subclass
then): a backward peak can show one extra ``add`` of the tensor's size, per tensor several ops read, that a
run without the census does not allocate (rule 9 of :mod:`dgl_exact.ops.keep` is what makes those sums in
place). For the number that decides whether a step fits, use :func:`dgl_exact.memory.measure_step`; the census
says where it goes.

Usage::

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(g, x)[train], y[train]).backward()
        opt.step()

    report = dgl_exact.memory.census(step)
    print(report)              # forward and backward peak tables, grouped by source line
    report.to_dict()           # or report.to_json()
"""
from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import linecache
import os
import re
import sys
import sysconfig
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..ops.structure import format_arrays


__all__ = ["census", "CensusReport", "PhasePeak", "CensusRow", "CensusTensor", "PHASES"]

PHASES = ("forward", "backward", "optimizer")
_MIB = 2**20


def _package_dir(name: str) -> Optional[str]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.realpath(list(spec.submodule_search_locations)[0]) + os.sep


_DGL_EXACT = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
# dgl_exact's benchmark models and their step functions are written as a user writes them: user code here
_DGL_EXACT_USER = (_DGL_EXACT + "bench" + os.sep,)
_OPS = _DGL_EXACT + "ops" + os.sep
_THIS = os.path.realpath(os.path.abspath(__file__))
# decorators and saved-tensor plumbing: never the op a user called
_PLUMBING = tuple(_OPS + name for name in ("keep.py", "saved.py"))
_WRAPPERS = frozenset({"wrapper", "inner", "decorated", "forward", "backward", "apply", "pack", "unpack"})
_INTERNAL = tuple(p for p in (_package_dir("torch"), _package_dir("dgl"), _package_dir("numba"),
                              os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep,
                              os.path.realpath(sysconfig.get_paths()["platstdlib"]) + os.sep) if p)
# dgl_exact functions that make compressed data (and only those: decompress/unpack/dequantize make plain data)
_COMPRESSING = re.compile(r"(^|_)(compress|quantize|pack)")
_DECOMPRESSING = re.compile(r"decompress|unpack|dequantize")
_TRACE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)')

Frame = Tuple[str, int, str]   # (real path, line number, function name), outermost first in lists


def _real(path: str, cache: Dict[str, str] = {}) -> str:  # noqa: B006 - a deliberate memo
    real = cache.get(path)
    if real is None:
        real = cache[path] = os.path.realpath(path) if not path.startswith("<") else path
    return real


def _is_dgl_exact(path: str) -> bool:
    return path.startswith(_DGL_EXACT) and not path.startswith(_DGL_EXACT_USER)


def _is_user(path: str) -> bool:
    if path.startswith("<") and path not in ("<stdin>", "<string>") and not path.startswith("<ipython"):
        return False   # <frozen importlib...> and the like
    return not _is_dgl_exact(path) and not path.startswith(_INTERNAL)


def _live_frames() -> List[Frame]:
    frames = []
    f = sys._getframe(1)
    while f is not None:
        path = _real(f.f_code.co_filename)
        if path != _THIS:   # the census's own frames
            frames.append((path, f.f_lineno, f.f_code.co_name))
        f = f.f_back
    frames.reverse()
    return frames


def _node_frames(node) -> Optional[List[Frame]]:
    """The forward stack that created autograd ``node`` (anomaly mode's record), outermost first."""
    try:
        trace = node.metadata.get("traceback_")
    except (AttributeError, RuntimeError):
        return None
    if not trace:
        return None
    frames = []
    for entry in trace:
        m = _TRACE_LINE.search(entry)
        if m:
            frames.append((_real(m["file"]), int(m["line"]), m["name"].strip()))
    return frames or None


def _short(path: str) -> str:
    if path.startswith(_DGL_EXACT):
        return path[len(_DGL_EXACT):]
    return "/".join(path.split(os.sep)[-2:])


def _describe(frames: List[Frame]) -> Tuple[str, str, bool]:
    """(user line, dgl_exact op, made by the compressor) for a stack, outermost first."""
    line, inner = "", frames
    for i in range(len(frames) - 1, -1, -1):
        path, lineno, name = frames[i]
        if _is_user(path):
            code = linecache.getline(path, lineno).strip()
            line = f"{_short(path)}:{lineno} {name}" + (f": {code[:80]}" if code else "")
            inner = frames[i + 1:]   # what the user's line called (not the CLI or loop around it)
            break
    op = ""
    # (a torch-function mode's handler passes torch's calls on: not the op that made anything)
    own = [(p, n) for p, _, n in inner if _is_dgl_exact(p) and p != _THIS and n != "__torch_function__"]
    named = [(p, n) for p, n in own if not p.startswith(_PLUMBING) and n not in _WRAPPERS and not n.startswith("_")]
    in_ops = [(p, n) for p, n in named if p.startswith(_OPS)]
    pick = (in_ops or named or own)[:1]
    if pick:
        op = f"{_short(pick[0][0])}:{pick[0][1]}"
    compressing = any(_COMPRESSING.search(n) and not _DECOMPRESSING.search(n) for _, n in own)
    return line or "?", op, compressing


@dataclasses.dataclass
class CensusTensor:
    """One storage alive at a peak."""
    bytes: int
    shape: Tuple[int, ...]
    dtype: str
    data: str        # "compressed", or the dtype ("fp32", "int64", ...), "... outside torch" for DGL's own
    role: str        # "saved for backward", "forward value", "backward", "optimizer"
    line: str        # the user's line: "path:lineno function: code"
    op: str          # the dgl_exact op ("ops/graph.py:gspmm"), "" if none
    operator: str    # the torch operator that made it, or the autograd node in the backward
    phase: str       # the phase that created it

    @property
    def compressed(self) -> bool:
        return self.data == "compressed"


@dataclasses.dataclass
class CensusRow:
    """The storages alive at a peak that one line made, of one data kind and role."""
    line: str
    op: str
    data: str
    role: str
    bytes: int
    count: int
    largest_shape: Tuple[int, ...]
    operators: Tuple[str, ...]


@dataclasses.dataclass
class PhasePeak:
    """The highest total of live storages created by the step, within one phase, and what held it."""
    phase: str
    peak_bytes: int
    operator: str            # the operator after which the peak was reached
    index: int               # its position among the step's operators (1-based)
    tensors: List[CensusTensor]

    @property
    def compressed_bytes(self) -> int:
        return sum(t.bytes for t in self.tensors if t.compressed)

    @property
    def plain_bytes(self) -> int:
        return self.peak_bytes - self.compressed_bytes

    def rows(self) -> List[CensusRow]:
        groups: Dict[tuple, List[CensusTensor]] = {}
        for t in self.tensors:
            groups.setdefault((t.line, t.op, t.data, t.role), []).append(t)
        rows = []
        for (line, op, data, role), ts in groups.items():
            big = max(ts, key=lambda t: t.bytes)
            ops = tuple(dict.fromkeys(t.operator for t in sorted(ts, key=lambda t: -t.bytes)))
            rows.append(CensusRow(line, op, data, role, sum(t.bytes for t in ts), len(ts), big.shape, ops))
        rows.sort(key=lambda r: (-r.bytes, r.line))
        return rows


def _mib(n: int) -> str:
    return f"{n / _MIB:,.1f}"


@dataclasses.dataclass
class CensusReport:
    """Result of :func:`census`: one :class:`PhasePeak` per phase the step ran (forward, backward,
    optimizer). ``print(report)`` shows each peak's table grouped by source line, largest first (``top``
    rows; :meth:`format` takes another number), :meth:`to_dict` / :meth:`to_json` everything."""
    peaks: List[PhasePeak]
    min_bytes: int
    device: str
    operators: int           # torch operators the step ran
    top: int = 20

    def peak(self, phase: str) -> Optional[PhasePeak]:
        return next((p for p in self.peaks if p.phase == phase), None)

    def format(self, top: Optional[int] = None) -> str:
        top = self.top if top is None else top
        out = [f"census of one training step ({self.device}): storages of {self.min_bytes // 1024} KiB or more "
               f"created by the step, {self.operators} torch operators"]
        for p in self.peaks:
            out.append("")
            out.append(f"{p.phase} peak {_mib(p.peak_bytes)} MiB (after operator #{p.index}, {p.operator}): "
                       f"{_mib(p.plain_bytes)} MiB plain, {_mib(p.compressed_bytes)} MiB compressed")
            rows = p.rows()
            if not rows:
                out.append("(no storage of that size alive)")
                continue
            out.append("| MiB | data | role | tensors | largest | line | dgl_exact op | made by |")
            out.append("|---:|---|---|---:|---|---|---|---|")
            for r in rows[:top] if top else rows:
                shape = "x".join(map(str, r.largest_shape)) or "scalar"
                made = ", ".join(r.operators[:2]) + (", ..." if len(r.operators) > 2 else "")
                line = r.line.replace("|", "\\|")
                out.append(f"| {_mib(r.bytes)} | {r.data} | {r.role} | {r.count} | {shape} | {line} | "
                           f"{r.op} | {made} |")
            if top and len(rows) > top:
                rest = sum(r.bytes for r in rows[top:])
                out.append(f"| {_mib(rest)} | | | {sum(r.count for r in rows[top:])} | | "
                           f"({len(rows) - top} more rows) | | |")
        if not self.peaks:
            out.append("(the step created no storage of that size)")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.format()

    def to_dict(self) -> Dict[str, Any]:
        return {
            "device": self.device, "min_bytes": self.min_bytes, "operators": self.operators,
            "peaks": [{
                "phase": p.phase, "peak_bytes": p.peak_bytes, "plain_bytes": p.plain_bytes,
                "compressed_bytes": p.compressed_bytes, "operator": p.operator, "index": p.index,
                "rows": [dataclasses.asdict(r) for r in p.rows()],
                "tensors": [dataclasses.asdict(t) for t in sorted(p.tensors, key=lambda t: -t.bytes)],
            } for p in self.peaks],
        }

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **kwargs)


_SHORT_DTYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def _dtype_name(dtype: torch.dtype) -> str:
    return _SHORT_DTYPE.get(dtype, str(dtype).replace("torch.", ""))


class _Entry:
    __slots__ = ("ref", "bytes", "shape", "dtype", "data", "line", "op", "operator", "phase", "device", "saved")


class _CensusMode(TorchDispatchMode):
    def __init__(self, min_bytes: int, existing: Dict[tuple, StorageWeakRef]):
        super().__init__()
        self.min_bytes, self.existing = min_bytes, existing
        self.live: Dict[tuple, _Entry] = {}
        self.total = 0
        self.index = 0
        self.phase = "forward"
        self.best: Dict[str, Tuple[int, str, int, List[_Entry]]] = {}

    def _prune(self) -> None:
        dead = [k for k, e in self.live.items() if e.ref.expired()]
        for k in dead:
            self.total -= self.live.pop(k).bytes

    def _record(self, t: torch.Tensor, operator: str, frames, outside: bool) -> None:
        storage = t.untyped_storage()
        n = storage.nbytes()
        if n < self.min_bytes or t.device.type == "meta":
            return
        key = (t.device.type, t.device.index, storage.data_ptr())
        if key in self.live:
            return
        before = self.existing.get(key)
        if before is not None:
            if not before.expired():
                return       # a view of a storage from before the step
            del self.existing[key]
        if frames is None:
            frames = self._frames()
        line, op, compressing = _describe(frames)
        e = _Entry()
        e.ref, e.bytes, e.shape = StorageWeakRef(storage), n, tuple(t.shape)
        e.dtype = _dtype_name(t.dtype)
        e.data = "compressed" if compressing and self.phase == "forward" and not outside else e.dtype
        if outside:
            e.data += " outside torch"
        e.line, e.op, e.operator, e.phase = line, op, operator, self.phase
        e.device, e.saved = str(t.device), False
        self.live[key] = e
        self.total += n

    def mark_saved(self, t: torch.Tensor) -> None:
        """``t`` is being saved for backward: its storage's entry (made when an operator created it) says so."""
        if t.device.type == "meta":
            return
        storage = t.untyped_storage()
        e = self.live.get((t.device.type, t.device.index, storage.data_ptr()))
        if e is not None and not e.ref.expired():
            e.saved = True

    def _frames(self):
        node = torch._C._current_autograd_node()
        if node is not None:
            frames = _node_frames(node)
            if frames:
                return frames
        return _live_frames()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        node = torch._C._current_autograd_node()
        if node is not None:
            self.phase = "backward"
        elif self.phase == "backward":
            self.phase = "optimizer"
        self._prune()
        operator = node.name() if node is not None else func.overloadpacket.__name__
        frames = None
        # tensors a torch operator reads for the first time that the step made outside torch (DGL's kernels)
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
                if t.untyped_storage().nbytes() >= self.min_bytes:
                    frames = frames or self._frames()
                    self._record(t, operator + " (first read)", frames, outside=True)
        out = func(*args, **(kwargs or {}))
        self.index += 1
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                frames = frames or self._frames()
                self._record(t, operator, frames, outside=False)
        best = self.best.get(self.phase)
        if best is None or self.total > best[0]:
            self.best[self.phase] = (self.total, operator, self.index, list(self.live.items()))
        return out


def _existing_storages() -> Tuple[Dict[tuple, StorageWeakRef], List[torch.Tensor]]:
    """Every storage a Python tensor holds now (the model, the graph, the data, the optimizer state), and
    torch views of the sparse formats DGL holds for the graphs alive now (returned: the caller keeps them
    for the step, so their storages stay what they are)."""
    found, held = {}, []
    dgl = sys.modules.get("dgl")
    graph_types = tuple(t for t in (getattr(dgl, "DGLGraph", None),
                                    getattr(getattr(dgl, "heterograph_index", None), "HeteroGraphIndex", None))
                        if isinstance(t, type))
    indices = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # isinstance on deprecated module proxies warns
        objects = gc.get_objects()
        for obj in objects:
            try:
                if isinstance(obj, torch.Tensor) and obj.layout == torch.strided:
                    s = obj.untyped_storage()
                    found[(obj.device.type, obj.device.index, s.data_ptr())] = StorageWeakRef(s)
                elif graph_types and isinstance(obj, graph_types):
                    gidx = getattr(obj, "_graph", obj)
                    indices[id(gidx)] = gidx
            except (RuntimeError, NotImplementedError, TypeError):   # tensors without a storage (wrappers)
                continue
    for gidx in indices.values():
        held.extend(_sparse_formats(gidx, getattr(dgl, "DGLError", RuntimeError)))
    for t in held:
        s = t.untyped_storage()
        found[(t.device.type, t.device.index, s.data_ptr())] = StorageWeakRef(s)
    return found, held


def _sparse_formats(gidx, dgl_error: type) -> List[torch.Tensor]:
    """The CSR and CSC arrays DGL has created for ``gidx`` (every edge type), as torch views of DGL's memory
    (exporting a created format copies nothing; a format not created yet is not created here)."""
    try:
        created = gidx.formats()["created"]
        return [t for etype in range(gidx.number_of_etypes()) for fmt in ("csr", "csc") if fmt in created
                for t in format_arrays(gidx, fmt, etype) if isinstance(t, torch.Tensor) and t.numel()]
    except (dgl_error, RuntimeError):   # a graph DGL cannot export: its formats are then unknown here
        return []


def census(step: Callable[[], Any], *, warmup: int = 1, min_bytes: int = 256 * 1024, top: int = 20,
           device: Optional[str] = None) -> CensusReport:
    """Run ``step()`` (a whole training step: forward, ``backward()``, optionally the optimizer step) and
    report the tensors alive at its forward peak and its backward peak, grouped by the source line that
    made them (see the module docstring for what each column means and what the census cannot see).

    ``warmup``: steps run first without the census (the first step of Adam creates its state; DGL builds
    graph formats lazily), so the census sees the steady state. They train the model like any step.
    ``min_bytes``: the smallest storage followed. ``top``: rows printed per peak (all are in
    :meth:`CensusReport.to_dict`). ``device``: only a label for the report (default: where the largest
    storage lived).
    """
    if not callable(step):
        raise TypeError(f"census: step must be a callable running one training step, got {type(step).__name__}")
    if int(warmup) < 0 or int(min_bytes) < 1:
        raise ValueError(f"census: warmup must be >= 0 and min_bytes >= 1, got {warmup} and {min_bytes}")
    for _ in range(int(warmup)):
        step()
    gc.collect()
    from . import observe_saved  # the meter's observer (fused ops show it what they hold privately)

    existing, graph_formats = _existing_storages()
    mode = _CensusMode(int(min_bytes), existing)
    record = mode.mark_saved
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Aa]nomaly.*")
        with torch.autograd.set_detect_anomaly(True, check_nan=False), observe_saved(record), mode:
            step()
    del graph_formats   # held through the step (see _existing_storages)
    peaks = []
    for phase in PHASES:
        if phase not in mode.best:
            continue
        total, operator, index, live = mode.best[phase]
        tensors = []
        for key, e in live:
            role = {"backward": "backward", "optimizer": "optimizer"}.get(e.phase)
            if role is None:
                role = "saved for backward" if e.saved or e.data == "compressed" else "forward value"
            tensors.append(CensusTensor(e.bytes, e.shape, e.dtype, e.data, role, e.line, e.op, e.operator,
                                        e.phase))
        peaks.append(PhasePeak(phase, total, operator, index, tensors))
    if device is None:
        biggest = max((e for best in mode.best.values() for _, e in best[3]), key=lambda e: e.bytes, default=None)
        device = "cpu" if biggest is None else biggest.device
    return CensusReport(peaks, int(min_bytes), str(device), mode.index, top)
