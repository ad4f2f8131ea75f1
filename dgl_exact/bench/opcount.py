"""Count what a training step asks of a GPU, on any machine: operator calls, host synchronisations, bytes.

A GPU step is launch- and bandwidth-bound: every operator call is (at least) one kernel launch, every
host synchronisation drains the launch queue, and every byte an operator reads or writes costs memory
bandwidth. None of that needs a GPU to be *counted*: this module runs one training step on the CPU along
the code path CUDA features take (dgl_exact's own graph kernels instead of DGL's CPU kernels,
:func:`dgl_exact.ops.structure.device_kernels_only`) and records, below autograd, every operator the step
dispatches (forward, backward and optimizer).

Counting rules (what :class:`StepCounts` holds):

* ``ops``: operator calls that launch work. View and metadata operators (``view``, ``t``, ``expand``,
  ``detach``, ``empty``, ...) launch nothing and are not counted, nor are calls whose tensor inputs all stay
  on the host in a GPU run (see residency below). A call of a dgl_exact kernel-registry op
  (``quantize_pack``, ``spmm_sum``, ...) counts as **one** call whatever backend serves it here (the CUDA
  extension implements each as one launch; the torch reference would take several aten calls, Numba's CPU
  kernels none that torch sees), and the aten calls it makes inside are not counted again.
* Residency: on a GPU some tensors stay on the host (seeds from torch's CPU generator, Python scalars made
  tensors, Adam's ``step`` counters, DGL's CPU graph). The roots of a step (parameters, gradients, buffers,
  optimizer state, features, labels, indices, dgl_exact's cached graph structure; :func:`device_roots`) are
  on the device, and so is every output of a call with a device input. Factory calls (``zeros``,
  ``arange``, ``randint``: no tensor input) are taken to allocate on the device, except those made by
  dgl_exact's host-side helpers (``draw_seed``, ``meta_factor``): the CPU cannot tell which device a factory
  call would target on a GPU, so this errs towards more ops and more syncs, never fewer.
* ``syncs``: calls on device tensors that make the host wait for the device on a GPU:
  ``_local_scalar_dense`` (``.item()``,
  ``bool(t)``, ``int(t)``), ``is_nonzero``, ``nonzero``, ``masked_select``, ``unique``, boolean-mask
  indexing, ``repeat_interleave`` without ``output_size``, ``equal``, ``bincount`` (needs the maximum) and
  ``allclose``. The call site of each is recorded in ``sync_sites``.
* ``host_reads``: ``Tensor.tolist()`` / ``Tensor.numpy()`` calls; on a GPU they are synchronising copies if
  the tensor lives on the device (graph structure that stays on the CPU is fine), so they are reported with
  their call sites rather than counted as syncs.
* ``bytes``: for every counted call, the bytes of its tensor inputs plus its tensor outputs (logical
  ``numel * element_size``; a broadcast input counts at its expanded size). For a registry op, its arguments
  and results. This is the traffic a kernel that reads each input once and writes each output once moves.

These are **counts, not times**: the ratio of two settings' counts says how much more launching,
synchronising and memory traffic one needs than the other on a GPU, independent of this machine's speed.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import traceback
import weakref
from typing import Any, Callable, Dict, Iterable, Iterator, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .._files import atomic_write
from .._progress import progress_bar
from . import provenance

__all__ = ["StepCounts", "count_step", "count_grid", "device_roots", "emulate_gpu_path", "COLUMNS"]

COLUMNS = ["model", "setting", "ops", "ops_ratio", "syncs", "MiB", "bytes_ratio", "host_reads", "note"]

_aten = torch.ops.aten

# Operators that allocate or re-describe memory without running a kernel.
_FREE = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "lift_fresh", "alias",
    "_reshape_alias", "set_", "resize_", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "stride",
    "size", "numel", "dim", "is_contiguous", "_nested_tensor_size", "record_stream",
    "_has_compatible_shallow_copy_type",
    "_unsafe_view", "_record_function_enter", "_record_function_enter_new", "_record_function_exit",
    "promote_types", "result_type", "can_cast",
}
# Operators that make the host wait for the device.
_SYNC = {"_local_scalar_dense", "is_nonzero", "nonzero", "masked_select", "unique", "_unique", "_unique2",
         "unique_dim", "unique_consecutive", "equal", "bincount", "allclose"}


@dataclasses.dataclass
class StepCounts:
    """What one training step dispatched (see the module docstring for the counting rules)."""

    ops: int = 0
    syncs: int = 0
    bytes: int = 0
    host_reads: int = 0
    per_op: Dict[str, int] = dataclasses.field(default_factory=collections.Counter)
    bytes_per_op: Dict[str, int] = dataclasses.field(default_factory=collections.Counter)
    sync_sites: Dict[str, int] = dataclasses.field(default_factory=collections.Counter)
    host_read_sites: Dict[str, int] = dataclasses.field(default_factory=collections.Counter)

    def to_dict(self) -> Dict[str, Any]:
        return {"ops": self.ops, "syncs": self.syncs, "bytes": self.bytes, "host_reads": self.host_reads,
                "per_op": dict(self.per_op), "bytes_per_op": dict(self.bytes_per_op),
                "sync_sites": dict(self.sync_sites), "host_read_sites": dict(self.host_read_sites)}

    def table(self, limit: int = 40) -> str:
        """Per-op calls and bytes, most bytes first; then the sync and host-read call sites."""
        lines = [f"{'op':44s} {'calls':>7s} {'MiB':>11s}"]
        for name, n in sorted(self.bytes_per_op.items(), key=lambda kv: -kv[1])[:limit]:
            lines.append(f"{name:44s} {self.per_op[name]:7d} {n / 2**20:11.2f}")
        lines.append(f"{'total':44s} {self.ops:7d} {self.bytes / 2**20:11.2f}")
        lines.append(f"host synchronisations: {self.syncs}")
        lines += [f"  {site} x{n}" for site, n in sorted(self.sync_sites.items(), key=lambda kv: -kv[1])]
        lines.append(f"host reads (tolist/numpy): {self.host_reads}")
        lines += [f"  {site} x{n}" for site, n in sorted(self.host_read_sites.items(), key=lambda kv: -kv[1])]
        return "\n".join(lines) + "\n"


def _tensor_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(o) for o in obj.values())
    return 0


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_THIS_FILE = os.path.abspath(__file__)


def _call_site() -> str:
    """``file:line`` of the innermost frame outside this module and torch, preferring dgl_exact's own frames
    (where a fix would go)."""
    frames = [f for f in traceback.extract_stack()[:-2] if f.filename != _THIS_FILE]
    outside_torch = [f for f in frames if not f.filename.startswith(_TORCH_DIR)]
    ours = [f for f in outside_torch if f.filename.startswith(_PACKAGE_DIR)]
    frame = (ours or outside_torch or frames or [None])[-1]
    if frame is None:
        return "?"
    try:
        name = os.path.relpath(frame.filename)
    except ValueError:
        name = frame.filename
    return f"{name}:{frame.lineno}"


# Functions whose tensors stay on the host in a GPU run: seed draws from torch's CPU generator and Python
# scalars rounded through a CPU tensor (``file suffix, function name``).
_HOST_FUNCTIONS = {(os.path.join("compression", "core.py"), "draw_seed"),
                   (os.path.join("kernels", "reference.py"), "meta_factor")}


def _host_intent() -> bool:
    """Whether the factory call being dispatched comes from one of :data:`_HOST_FUNCTIONS`."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(_PACKAGE_DIR) and any(
                code.co_filename.endswith(f) and code.co_name == n for f, n in _HOST_FUNCTIONS):
            return True
        frame = frame.f_back
    return False


def _is_sync(func, args, kwargs) -> bool:
    name = func.overloadpacket.__name__
    if name in _SYNC:
        return True
    if name == "repeat_interleave" and isinstance(args[0], torch.Tensor) and "output_size" not in (kwargs or {}):
        return len(args) < 2 or isinstance(args[1], torch.Tensor)
    if name in ("index", "index_put", "index_put_", "_index_put_impl_"):
        indices = args[1] if len(args) > 1 else ()
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())
    return False


def _tensors(obj) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


class _Counter(TorchDispatchMode):
    """Counts dispatched calls and tracks which tensors would live on the GPU.

    On a GPU run some tensors stay on the host: torch's CPU generator output (seeds), Python scalars made
    tensors, Adam's ``step`` counters, DGL's CPU graph. Reading those is no synchronisation. So device
    residency is tracked: the roots (parameters, buffers, optimizer state, features, labels, index tensors,
    dgl_exact's cached graph structure) are on the device, and so is every output of a call with a device
    input. A sync-forcing call counts only if one of its inputs is on the device.
    """

    def __init__(self, counts: StepCounts, roots: Iterable[torch.Tensor] = ()):
        super().__init__()
        self.counts = counts
        self.inside_registry_op = 0
        self._device: Dict[int, Any] = {}
        for t in roots:
            self.mark(t)

    def mark(self, t: torch.Tensor) -> None:
        key = id(t)
        self._device[key] = weakref.ref(t, lambda _ref, key=key: self._device.pop(key, None))

    def on_device(self, t: torch.Tensor) -> bool:
        ref = self._device.get(id(t))
        return ref is not None and ref() is t

    def any_on_device(self, *objs) -> bool:
        return any(self.on_device(t) for o in objs for t in _tensors(o))

    def mark_outputs(self, out) -> None:
        for t in _tensors(out):
            self.mark(t)

    def record(self, name: str, nbytes: int) -> None:
        c = self.counts
        c.ops += 1
        c.bytes += nbytes
        c.per_op[name] += 1
        c.bytes_per_op[name] += nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        has_tensors = any(True for _ in _tensors((args, kwargs)))
        on_device = self.any_on_device(args, kwargs) or (not has_tensors and not _host_intent())
        if on_device:
            self.mark_outputs(out)
        name = func.overloadpacket.__name__
        if on_device and _is_sync(func, args, kwargs):
            self.counts.syncs += 1
            self.counts.sync_sites[f"{name} at {_call_site()}"] += 1
        if self.inside_registry_op or func.is_view or name in _FREE or not on_device:
            return out
        self.record(f"aten::{name}", _tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(out))
        return out


@contextlib.contextmanager
def _count_registry_ops(counter: _Counter) -> Iterator[None]:
    """Every kernel-registry op called in the block counts as one op (its inner aten calls do not)."""
    from .. import kernels

    original = kernels.get

    def counted_get(op: str, device):
        fn = original(op, device)

        def call(*args, **kwargs):
            counter.inside_registry_op += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                counter.inside_registry_op -= 1
            # an op without tensor inputs (rademacher) allocates on the device it is asked for
            if counter.any_on_device(args, kwargs) or not any(True for _ in _tensors((args, kwargs))):
                counter.mark_outputs(out)
            if not counter.inside_registry_op:
                counter.record(f"dgl_exact::{op}", _tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(out))
            return out

        return call

    kernels.get = counted_get
    try:
        yield
    finally:
        kernels.get = original


@contextlib.contextmanager
def _count_host_reads(counter: _Counter) -> Iterator[None]:
    counts = counter.counts
    patched = {}
    for method in ("tolist", "numpy"):
        original = getattr(torch.Tensor, method)

        def wrapper(self, *args, __original=original, __method=method, **kwargs):
            if counter.on_device(self) and not counter.inside_registry_op:
                counts.host_reads += 1
                counts.host_read_sites[f"{__method} at {_call_site()}"] += 1
            return __original(self, *args, **kwargs)

        patched[method] = original
        setattr(torch.Tensor, method, wrapper)
    try:
        yield
    finally:
        for method, original in patched.items():
            setattr(torch.Tensor, method, original)


@contextlib.contextmanager
def emulate_gpu_path() -> Iterator[None]:
    """Within this block, CPU tensors take the code path CUDA tensors take: dgl_exact's graph kernels
    instead of DGL's CPU kernels, and the GPU's row-chunk policy in chunked backwards."""
    from ..ops.chunks import gpu_chunk_policy
    from ..ops.structure import device_kernels_only

    with device_kernels_only(), gpu_chunk_policy():
        yield


def device_roots(modules: Iterable[torch.nn.Module] = (), optimizers: Iterable[torch.optim.Optimizer] = (),
                 tensors: Iterable[torch.Tensor] = ()) -> List[torch.Tensor]:
    """The tensors a GPU run keeps on the device before a step: parameters and their gradients, buffers,
    optimizer state except Adam-style ``step`` counters (host tensors unless ``capturable``), ``tensors``
    (features, labels, indices) and dgl_exact's cached graph structure."""
    from ..ops.structure import cached_static_tensors

    roots = list(tensors) + cached_static_tensors()
    for m in modules:
        roots += list(m.parameters()) + [p.grad for p in m.parameters() if p.grad is not None] + list(m.buffers())
    for opt in optimizers:
        for state in opt.state.values():
            roots += [v for k, v in state.items() if isinstance(v, torch.Tensor) and k != "step"]
    return roots


def count_step(step: Callable[[], Any], *, roots: Iterable[torch.Tensor] = (), emulate_gpu: bool = True) -> StepCounts:
    """Run ``step()`` once (a whole training step: forward, loss, backward, optimizer) and count what it
    dispatched. ``roots``: the tensors on the device when the step starts (:func:`device_roots`); only
    reads of device tensors count as synchronisations. ``emulate_gpu``: use the GPU code path for graph
    aggregation (see the module docstring)."""
    counts = StepCounts()
    counter = _Counter(counts, roots)
    path = emulate_gpu_path() if emulate_gpu else contextlib.nullcontext()
    with path, _count_registry_ops(counter), _count_host_reads(counter), counter:
        step()
    return counts


def records_for_json(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The ``--json`` records: one per (model, setting) with ``setting``, ``ops``, ``syncs``, ``bytes``, and the
    code measured (``commit``, ``code``)."""
    keep = ("model", "setting", "ops", "syncs", "bytes", "host_reads", "ops_ratio", "bytes_ratio", "baseline",
            "device", "note")
    return [{**{k: r[k] for k in keep if k in r}, **provenance.stamp()} for r in rows]


def count_grid(work, models, settings, sink=None, out_dir=None, warmup: int = 1, progress: bool = True):
    """:func:`count_step` of one training step (forward, backward, Adam) per (model, setting), after
    ``warmup`` uncounted steps; ``ops_ratio`` / ``bytes_ratio`` against "dgl_exact fp32" of the same model.

    ``DGL fp32`` is skipped: DGL's CPU kernels run outside torch's dispatcher (nothing to count) and
    PyPI's DGL cannot run on a GPU anyway. Per-op tables go to ``out_dir/opcount_<model>_<setting>.txt``.
    """
    from .runner import training_step

    rows = []
    for model_name, setting in progress_bar([(m, s) for m in models for s in settings], progress, desc="count",
                                         unit="setting"):
        row = {"kind": "opcount", "model": model_name, "setting": setting.name, "device": str(work.device)}
        if setting.impl != "exact":
            rows.append(dict(row, note="not counted: runs outside dgl_exact's GPU code path"))
            continue
        model, one_step, scope = training_step(work, model_name, setting)
        opt = one_step.optimizer
        with scope, emulate_gpu_path():
            for _ in range(warmup):
                one_step()
            roots = device_roots([model], [opt], [work.feat, work.train_idx, work.train_label])
            counts = count_step(one_step, roots=roots)
        row.update(ops=counts.ops, syncs=counts.syncs, bytes=counts.bytes, MiB=counts.bytes / 2**20,
                   host_reads=counts.host_reads)
        if out_dir is not None:
            safe = "".join(ch if ch.isalnum() else "_" for ch in setting.name).strip("_")
            path = os.path.join(out_dir, f"opcount_{model_name}_{safe}.txt")
            with atomic_write(path, "w", encoding="utf-8", shared=True) as f:
                f.write(f"{model_name} / {setting.name}: one training step on the GPU code path "
                        f"(counts, not times)\ncode: {provenance.stamp()['code']}\n")
                f.write(counts.table())
            row["table"] = os.path.basename(path)
        rows.append(row)
        del model, one_step, roots  # the closure holds the optimizer: freed with it
    for group in _by_model(rows).values():
        base = next((r for r in group if r["setting"] == "dgl_exact fp32" and "ops" in r), None)
        for r in group:
            if base is not None and "ops" in r:
                r["ops_ratio"] = r["ops"] / max(base["ops"], 1)
                r["bytes_ratio"] = r["bytes"] / max(base["bytes"], 1)
                r["baseline"] = base["setting"]
    if sink is not None:
        for r in rows:
            sink.add(r)
    return rows


def _by_model(rows):
    out: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["model"], []).append(r)
    return out
