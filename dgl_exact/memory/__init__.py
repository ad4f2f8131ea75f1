"""Measure the activation memory of a training forward pass and the peak memory of a whole training step,
the same way on CPU and CUDA.

Activation memory is what autograd keeps alive for the backward pass. Following the EXACT benchmark
protocol it excludes the model, the data and the graph (alive anyway) and the step's outputs (the logits
and loss are needed by any method):

* **CUDA** (the EXACT protocol): ``memory_allocated`` after the forward minus before it, minus the bytes
  of the returned tensors. Peak = ``max_memory_allocated`` during the step minus the memory before.
* **CPU**: torch has no allocator statistics on CPU, so every tensor saved for backward is recorded
  through :func:`torch.autograd.graph.saved_tensors_hooks` and the unique storages are summed, excluding
  parameters and buffers of ``modules``, the tensors in ``exclude``, dgl_exact's cached graph structure and
  the returned tensors. dgl_exact's ops keep everything through ``save_for_backward``, so nothing escapes.

Whether a graph fits is decided by the **step peak**: the highest memory of a whole training step
(forward, loss, backward, optimizer step) above the memory in use just before it. It holds the
activations plus every transient (layer outputs, aggregation buffers, decompressed inputs, gradients,
optimizer temporaries). :func:`measure_step` reports it beside the activation memory:

* **CUDA**: ``max_memory_allocated`` over the step after ``reset_peak_memory_stats``, minus
  ``memory_allocated`` before it (the caching allocator's own slack is not counted).
* **CPU** (Linux): the resident high-water mark. ``5`` written to ``/proc/self/clear_refs`` resets
  ``VmHWM`` to the current resident size; after the step, ``VmHWM`` minus ``VmRSS`` before it is the
  peak. glibc is first told to serve every allocation of 128 KiB or more with its own ``mmap`` (fixed
  ``M_MMAP_THRESHOLD``, which also stops its dynamic threshold from growing), so the pages of a freed
  tensor leave the process and a later tensor cannot reuse them unseen. Heap grown before that (glibc
  serves a request of any size from a free heap chunk before it maps memory) is handled at each step's
  start: ``malloc_trim(0)`` returns the free chunks' pages, so reusing them counts, and a heap with more
  than 4 MiB free is named in ``peak_method`` (refaulted fragments can overstate the peak; measured on a
  20k-node GCN: 38 MiB in a fresh process, 30 MiB after other runs without the trim, 80 MiB after a plan's
  probe steps grew the heap, 40 MiB with :func:`prepare_cpu_peak` first). This counts every allocation,
  torch's and DGL's own C++ kernels' alike (DGL 2.1.0 on modern torch allocates outside torch's
  allocator). Pages are counted once touched; the kernel updates the
  per-thread RSS counters lazily, an error well under 1 MiB.

``torch.profiler(profile_memory=True)`` was evaluated as an allocator-level count and rejected: on torch
2.13 (CPU) its ``[memory]`` events record the frees of large tensors but not their allocations (a
16 MiB ``torch.ones`` shows only as ``-16 MiB``), and DGL 2.1.0's C++ kernels allocate outside torch's
allocator on modern torch; a running sum of the events measures nothing.

Usage::

    report = dgl_exact.memory.measure(lambda: loss_fn(model(g, x), y), modules=[model], exclude=[x])
    print(report)  # activation memory 12.3 MiB (cpu, saved-tensor hooks)

    opt = torch.optim.Adam(model.parameters())
    report = dgl_exact.memory.measure_step(lambda: loss_fn(model(g, x), y), opt, modules=[model], exclude=[x])
    print(report)  # activation memory 12.3 MiB, step peak 80.1 MiB (cpu, saved-tensor hooks; peak: ...)
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import sys
from typing import Any, Callable, Iterable, Optional

import torch

from ..ops.saved import observe_saved, tensors_in
from ..ops.structure import cached_static_tensors
from ..units import format_bytes  # the package's one printer of sizes, here for its users
from .peak_census import CensusReport, census

__all__ = ["MemoryReport", "measure", "measure_step", "tensor_bytes", "format_bytes", "CPU_PEAK_METHODS",
           "prepare_cpu_peak", "vmhwm_available", "census", "CensusReport"]


@dataclasses.dataclass
class MemoryReport:
    """Result of :func:`measure` and :func:`measure_step`. Bytes.

    ``peak_bytes``: :func:`measure`: the CUDA peak of the forward only (None on CPU); :func:`measure_step`:
    the step peak (forward, backward, optimizer step) above the memory before the step, None where it
    cannot be measured. ``peak_method`` says how the peak was measured."""

    activation_bytes: int
    peak_bytes: Optional[int]
    output_bytes: int
    method: str
    device: str
    result: Any = dataclasses.field(default=None, repr=False, compare=False)
    peak_method: Optional[str] = None
    step: bool = False   # True: peak_bytes covers the whole step (measure_step)

    @property
    def activation_mib(self) -> float:
        return self.activation_bytes / 2**20

    @property
    def peak_mib(self) -> Optional[float]:
        return None if self.peak_bytes is None else self.peak_bytes / 2**20

    def __str__(self) -> str:
        label = "step peak" if self.step else "peak"
        peak = f", {label} {format_bytes(self.peak_bytes)}" if self.peak_bytes is not None else ""
        how = f"; peak: {self.peak_method}" if self.peak_method and self.peak_bytes is not None else ""
        return f"activation memory {format_bytes(self.activation_bytes)}{peak} ({self.device}, {self.method}{how})"


def _storage_key(t: torch.Tensor):
    s = t.untyped_storage()
    return (t.device.type, t.device.index, s.data_ptr()), s.nbytes()


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the unique storages behind ``tensors``."""
    seen = {}
    for t in tensors:
        key, n = _storage_key(t)
        seen[key] = n
    return sum(seen.values())


def measure(step: Callable[[], Any], *, modules: Iterable[torch.nn.Module] = (), exclude: Iterable[torch.Tensor] = (),
            device=None) -> MemoryReport:
    """Run ``step()`` (a training forward returning its outputs, e.g. the loss) and measure what it keeps
    for backward. The returned outputs are in ``report.result`` (call ``.backward()`` on them afterwards
    if you want to train on). ``device`` defaults to the device of the first parameter of ``modules``."""
    modules = list(modules)
    if device is None:
        params = [p for m in modules for p in m.parameters()]
        device = params[0].device if params else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        result = step()
        torch.cuda.synchronize(device)
        after = torch.cuda.memory_allocated(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        out_bytes = tensor_bytes(tensors_in(result))
        return MemoryReport(after - before - out_bytes, peak, out_bytes, "allocated-memory delta (EXACT protocol)",
                            str(device), result)

    with saved_storages() as saved:
        result = step()
    act, out_bytes = activation_bytes(saved, modules, exclude, result)
    return MemoryReport(act, None, out_bytes, "saved-tensor hooks", str(device), result)


@contextlib.contextmanager
def saved_storages():
    """Records ``{storage key: bytes}`` of every tensor saved for backward inside the block."""
    saved = {}

    def record(t):
        key, n = _storage_key(t)
        saved[key] = n

    # an observer (ops.saved; ops.keep, rule 8): what a fused op holds privately is shown to it, and the step runs as
    # it does in training (a plain saved-tensor hook would make such ops keep everything to the end)
    with observe_saved(record):
        yield saved


def activation_bytes(saved: dict, modules, exclude, result):
    """(activation bytes, output bytes): saved storages minus parameters, buffers, ``exclude``, the cached
    graph structure and the returned tensors."""
    static = [p for m in modules for p in m.parameters()] + [b for m in modules for b in m.buffers()]
    static += list(exclude) + cached_static_tensors()
    for t in static:
        saved.pop(_storage_key(t)[0], None)
    outputs = tensors_in(result)
    out_bytes = tensor_bytes(outputs)
    for t in outputs:
        saved.pop(_storage_key(t)[0], None)
    return sum(saved.values()), out_bytes


# --- step peak ------------------------------------------------------------------------------------------
CPU_PEAK_METHODS = ("auto", "vmhwm", "none")
_VMHWM = "resident high-water mark (VmHWM after clear_refs; mmap threshold 128 KiB)"
_MMAP_THRESHOLD = 128 * 1024
_mallopt_done = False
_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024  # kB
    raise OSError(f"{key} not in /proc/self/status")


def prepare_cpu_peak() -> None:
    """Make the CPU step peak measurable: from now on every glibc allocation of 128 KiB or more gets its
    own mapping, unmapped on free (see the module doc). Call it before the warm-up step (the first
    :func:`measure_step` does, but a heap grown before it stays resident and hides reuse). No effect
    outside Linux."""
    _fix_mmap_threshold()


def _fix_mmap_threshold() -> None:
    global _mallopt_done
    if _mallopt_done or _LIBC is None:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    _LIBC.mallopt(m_mmap_threshold, _MMAP_THRESHOLD)
    _LIBC.mallopt(m_trim_threshold, _MMAP_THRESHOLD)
    _mallopt_done = True


def _release_free_heap() -> None:
    """Return the free pages of glibc's heaps to the kernel (``malloc_trim(0)``: the top of each heap and,
    with ``madvise(MADV_DONTNEED)``, every whole free page inside it). glibc serves a request from a free
    heap chunk before it considers ``mmap``, whatever its size, so in a long-lived process a step could
    otherwise reuse resident heap pages freed by earlier work and its high-water mark would miss them
    (measured: a 20k-node GCN step read 38 MiB in a fresh process and 30 MiB after other training runs)."""
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]


def _free_heap_bytes() -> Optional[int]:
    """Bytes in free glibc heap chunks (``mallinfo2().fordblks``, all arenas); None where unavailable."""
    fn = getattr(_LIBC, "mallinfo2", None) if _LIBC is not None else None
    if fn is None:
        return None
    fn.restype = _MallInfo2
    return int(fn().fordblks)


#: free heap chunks at a step's start above which its CPU peak is flagged (see :func:`measure_step`)
_HEAP_SLACK = 4 * 2**20


def vmhwm_available() -> Optional[str]:
    """None if the CPU resident high-water mark can be reset and read here, else why not."""
    if not sys.platform.startswith("linux"):
        return f"the resident high-water mark needs Linux /proc (this is {sys.platform})"
    try:
        _status_bytes("VmHWM:")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError as e:
        return f"cannot reset the resident high-water mark ({e})"
    return None


class _VmHWMPeak:
    def __enter__(self):
        _fix_mmap_threshold()
        gc.collect()
        _release_free_heap()
        self.heap_free = _free_heap_bytes()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.before = _status_bytes("VmRSS:")
        return self

    def __exit__(self, *exc):
        self.peak = max(0, _status_bytes("VmHWM:") - self.before)
        return False


class _CudaPeak:
    def __init__(self, device):
        self.device = device

    def __enter__(self):
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self.before = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device) - self.before
        return False


def _peak_meter(device: torch.device, cpu_method: str):
    """(context manager with ``.peak`` after exit, method description) or (None, why not)."""
    if device.type == "cuda":
        return _CudaPeak(device), "CUDA max_memory_allocated over the step minus allocated before"
    if cpu_method not in CPU_PEAK_METHODS:
        raise ValueError(f"cpu_method must be one of {CPU_PEAK_METHODS}, got {cpu_method!r}")
    if cpu_method == "none":
        return None, "not measured"
    why = vmhwm_available()
    if why is None:
        return _VmHWMPeak(), _VMHWM
    if cpu_method == "vmhwm":
        raise RuntimeError(f"cpu_method='vmhwm': {why}; pass cpu_method='auto' to measure activations only")
    return None, f"not measured: {why}"


def _default_backward(result) -> None:
    loss = result[0] if isinstance(result, (tuple, list)) else result
    if not isinstance(loss, torch.Tensor):
        raise TypeError("measure_step: forward() must return the loss or a tuple (loss, ...); "
                        "or pass backward=callable(result)")
    loss.backward()


def measure_step(forward: Callable[[], Any], optimizer=None, *, backward: Optional[Callable[[Any], None]] = None,
                 modules: Iterable[torch.nn.Module] = (), exclude: Iterable[torch.Tensor] = (), device=None,
                 cpu_method: str = "auto") -> MemoryReport:
    """Run one whole training step and measure its activation memory and its peak.

    ``forward()`` computes the training forward and returns the loss, or a tuple whose first element is
    the loss (what it returns counts as output, not activation). ``backward(result)`` runs the backward
    (default: ``loss.backward()``; pass one for a GradScaler or gradient clipping). ``optimizer`` is an
    optimizer (its ``step()`` is called) or any callable run after the backward, or None.

    * ``activation_bytes``: what the forward keeps for backward, as :func:`measure` measures it.
    * ``peak_bytes``: the highest memory of forward + backward + optimizer step above the memory in use
      just before the step (see the module docstring for the method per device; ``peak_method`` names it).
      The optimizer's state is part of the step where the step creates it (the first step of Adam):
      measure after a warm-up step for the steady state. Gradients freed by ``zero_grad(set_to_none=True)``
      before the step count in it; gradients kept across steps do not.

    ``cpu_method``: ``"auto"`` (VmHWM where Linux allows it, else no CPU peak: ``peak_bytes`` None and
    ``peak_method`` says why), ``"vmhwm"`` (raise where it is not available) or ``"none"``.
    The step's result is in ``report.result``; its graph has been freed by the backward.
    """
    modules = list(modules)
    if device is None:
        params = [p for m in modules for p in m.parameters()]
        device = params[0].device if params else torch.device("cpu")
    device = torch.device(device)
    backward = backward or _default_backward
    if optimizer is None:
        opt_step = None
    else:
        opt_step = optimizer.step if hasattr(optimizer, "step") else optimizer
        if not callable(opt_step):
            raise TypeError("measure_step: optimizer must be an optimizer or a callable, "
                            f"got {type(optimizer).__name__}")
    meter, peak_method = _peak_meter(device, cpu_method)
    with (meter if meter is not None else contextlib.nullcontext()):
        if device.type == "cuda":
            before = meter.before
            result = forward()
            torch.cuda.synchronize(device)
            out_bytes = tensor_bytes(tensors_in(result))
            act = torch.cuda.memory_allocated(device) - before - out_bytes
            method = "allocated-memory delta (EXACT protocol)"
        else:
            with saved_storages() as saved:
                result = forward()
            act, out_bytes = activation_bytes(saved, modules, exclude, result)
            method = "saved-tensor hooks"
        backward(result)
        if opt_step is not None:
            opt_step()
    peak = None if meter is None else int(meter.peak)
    if peak is not None and device.type != "cuda" and peak < act:
        # Every activation is alive at the end of the forward, so a true step peak holds them all. A
        # resident high-water mark below them means the step reused pages the process already had (a heap
        # grown before prepare_cpu_peak(), in a long-lived process): no number rather than a wrong one.
        peak = None
        peak_method = (f"not measured: the resident high-water mark ({format_bytes(int(meter.peak))}) missed "
                       f"allocations (below the {format_bytes(act)} of activations: memory the process already "
                       "held was reused); call dgl_exact.memory.prepare_cpu_peak() first thing in a fresh "
                       "process, as dgl-exact bench memory and train --debug-mem do")
    slack = getattr(meter, "heap_free", None)
    if peak is not None and slack is not None and slack > _HEAP_SLACK:
        # The step's allocations may have landed in these chunks (glibc serves any size from them before it
        # maps new memory): their pages, released before the step, come back one by one and stay resident
        # when freed again, so a fragmented heap can add up to its free bytes to the mark.
        peak_method += (f"; {format_bytes(slack)} of free heap chunks before the step (the heap grew before "
                        "prepare_cpu_peak()): the peak may be overstated by up to that much; call "
                        "dgl_exact.memory.prepare_cpu_peak() first thing in a fresh process")
    return MemoryReport(act, peak, out_bytes, method, str(device), result, peak_method=peak_method, step=True)
