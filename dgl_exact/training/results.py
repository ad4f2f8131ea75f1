"""What training returns: one :class:`RunResult` per run, the :class:`TrainResults` of all runs with their
summary, the environment they ran in, and the one log line per finished run (:func:`run_line`)."""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Dict, List, Optional

import torch

from .._compat import import_dgl
from ..units import format_bytes

dgl = import_dgl()

__all__ = ["RunResult", "TrainResults", "environment_info", "run_line"]


@dataclasses.dataclass
class RunResult:
    run: int
    seed: int
    best_epoch: int
    train: float
    val: float
    test: float
    final_loss: float
    epoch_time: float               # mean seconds per training epoch (training only, no evaluation)
    total_time: float
    activation_bytes: Optional[int] = None
    peak_bytes: Optional[int] = None   # --debug-mem: step peak (forward + backward + optimizer step) above steady state
    model_bytes: Optional[int] = None  # --debug-mem: parameters, buffers, optimizer state
    data_bytes: Optional[int] = None   # --debug-mem: graph structure, features, labels, split indices on the device
    total_bytes: Optional[int] = None  # --debug-mem: model + data + step peak
    peak_method: Optional[str] = None
    epochs_per_second: Optional[float] = None
    history: List[Dict[str, float]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TrainResults:
    config: Dict[str, Any]
    metric: str
    runs: List[RunResult]
    environment: Dict[str, Any]
    memory_budget: Optional[Dict[str, Any]] = None   # train --memory-budget: the plan against what was measured

    def summary(self) -> Dict[str, Any]:
        out = {}
        for key in ("train", "val", "test", "epoch_time", "total_time"):
            values = [getattr(r, key) for r in self.runs]
            out[key] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}
        mem = [r.activation_bytes for r in self.runs if r.activation_bytes is not None]
        if mem:
            out["activation_bytes"] = mem[0]
        for key in ("peak_bytes", "model_bytes", "data_bytes", "total_bytes", "peak_method"):
            values = [getattr(r, key) for r in self.runs if getattr(r, key) is not None]
            if values:
                out[key] = values[0]
        speed = [r.epochs_per_second for r in self.runs if r.epochs_per_second is not None]
        if speed:
            out["epochs_per_second"] = {"mean": statistics.fmean(speed),
                                        "std": statistics.stdev(speed) if len(speed) > 1 else 0.0}
        return out

    def to_dict(self) -> Dict[str, Any]:
        out = {"config": self.config, "metric": self.metric, "summary": self.summary(),
               "runs": [dataclasses.asdict(r) for r in self.runs], "environment": self.environment}
        if self.memory_budget is not None:
            out["memory_budget"] = self.memory_budget
        return out


def environment_info(device: torch.device) -> Dict[str, Any]:
    import platform

    from .. import __version__, backend

    info = {"dgl_exact": __version__, "torch": torch.__version__, "dgl": dgl.__version__,
            "python": platform.python_version(), "device": str(device), "backend": backend(device).primary,
            "machine": platform.machine(), "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def run_line(r: RunResult, metric: str) -> str:
    """The log line of a finished run: its best epoch, scores, epoch time and, where measured, memory."""
    mem = f", activation memory {format_bytes(r.activation_bytes)}" if r.activation_bytes is not None else ""
    if r.model_bytes is not None:
        fb = format_bytes
        mem += (f"; memory: model {fb(r.model_bytes)}, data {fb(r.data_bytes)}, activations {fb(r.activation_bytes)}, "
                f"step peak incl. backward {fb(r.peak_bytes)}, total {fb(r.total_bytes)}")
        if r.peak_method and "free heap chunks" in r.peak_method:  # measured in a process that grew its heap
            mem += f" ({r.peak_method.split('; ', 1)[-1]})"
    speed = f", {r.epochs_per_second:.2f} epochs/s" if r.epochs_per_second is not None else ""
    return (f"run {r.run + 1}: best epoch {r.best_epoch}, train {metric} {r.train:.4f}, val {r.val:.4f}, "
            f"test {r.test:.4f}, {r.epoch_time * 1000:.1f} ms/epoch{mem}{speed}")
