"""Measure the activation memory of a training forward pass, the same way on CPU and CUDA.

Activation memory is what autograd keeps alive for the backward pass. Following the EXACT benchmark
protocol it excludes the model, the data and the graph (alive anyway) and the step's outputs (the logits
and loss are needed by any method):

* **CUDA** (the EXACT protocol): ``memory_allocated`` after the forward minus before it, minus the bytes
  of the returned tensors. Peak = ``max_memory_allocated`` during the step minus the memory before.
* **CPU**: torch has no allocator statistics on CPU, so every tensor saved for backward is recorded
  through :func:`torch.autograd.graph.saved_tensors_hooks` and the unique storages are summed, excluding
  parameters and buffers of ``modules``, the tensors in ``exclude``, dgl_exact's cached graph structure and
  the returned tensors. dgl_exact's ops keep everything through ``save_for_backward``, so nothing escapes.

Usage::

    report = dgl_exact.memory.measure(lambda: loss_fn(model(g, x), y), modules=[model], exclude=[x])
    print(report)  # activation memory 12.3 MiB (cpu, saved-tensor hooks)
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Optional

import torch

from .ops.structure import cached_static_tensors

__all__ = ["MemoryReport", "measure", "tensor_bytes", "format_bytes"]


def format_bytes(n: Optional[float]) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


@dataclasses.dataclass
class MemoryReport:
    """Result of :func:`measure`. Bytes; ``peak_bytes`` is None where it cannot be measured (CPU)."""

    activation_bytes: int
    peak_bytes: Optional[int]
    output_bytes: int
    method: str
    device: str
    result: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def activation_mib(self) -> float:
        return self.activation_bytes / 2**20

    def __str__(self) -> str:
        peak = f", peak {format_bytes(self.peak_bytes)}" if self.peak_bytes is not None else ""
        return f"activation memory {format_bytes(self.activation_bytes)}{peak} ({self.device}, {self.method})"


def _tensors_in(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors_in(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors_in(v)]
    return []


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
        out_bytes = tensor_bytes(_tensors_in(result))
        return MemoryReport(after - before - out_bytes, peak, out_bytes, "allocated-memory delta (EXACT protocol)",
                            str(device), result)

    saved = {}

    def pack(t):
        key, n = _storage_key(t)
        saved[key] = n
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        result = step()
    static = [p for m in modules for p in m.parameters()] + [b for m in modules for b in m.buffers()]
    static += list(exclude) + cached_static_tensors()
    for t in static:
        saved.pop(_storage_key(t)[0], None)
    outputs = _tensors_in(result)
    out_bytes = tensor_bytes(outputs)
    for t in outputs:
        saved.pop(_storage_key(t)[0], None)
    return MemoryReport(sum(saved.values()), None, out_bytes, "saved-tensor hooks", str(device), result)
