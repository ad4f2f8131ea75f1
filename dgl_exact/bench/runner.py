"""Benchmark grids: activation memory, epoch time, kernel throughput and accuracy, each setting measured
side by side in one process so that ratios are comparable on a noisy machine."""
from __future__ import annotations

import contextlib
import gc
import os
import statistics
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from .. import kernels, memory, ops
from .._compat import dgl_supports_device, import_dgl
from .._files import atomic_write
from .._progress import progress_bar
from ..compression import compress, decompress
from ..compression_config import CompressionConfig
from ..compression_config import config as compression_scope
from ..training.models import build_model
from ..training.workloads import MODEL_TRAITS, prepare_graph
from .graph_kernels import best_ms
from .pyg_models import PYG_MODEL_TRAITS, PYG_MODELS, build_pyg_model
from .user_models import USER_MODEL_TRAITS, USER_MODELS, build_user_model
from . import provenance
from .results import ResultSink
from ..planning.settings import Setting

dgl = import_dgl()

#: every benchmarked model's workload facts: the trainer's models, the user models and the PyG models
WORKLOAD_TRAITS = {**MODEL_TRAITS, **USER_MODEL_TRAITS, **PYG_MODEL_TRAITS}

MEMORY_COLUMNS = ["model", "setting", "activation_MiB", "ratio_vs_baseline", "step_peak_MiB", "peak_ratio_vs_baseline",
                  "device"]
SPEED_COLUMNS = ["model", "setting", "epoch_ms", "epoch_ms_std", "ratio_vs_baseline", "device"]
PROFILE_COLUMNS = ["model", "setting", "wall_ms", "gpu_kernel_ms", "launches", "syncs", "device", "table"]
KERNEL_COLUMNS = ["backend", "op", "setting", "shape", "ms", "GB_per_s", "device"]


def workload_traits(model: str):
    """The :class:`~dgl_exact.training.workloads.ModelTraits` of a benchmarked model (``ValueError`` naming
    the known ones)."""
    if model not in WORKLOAD_TRAITS:
        raise ValueError(f"unknown model {model!r}; use one of {', '.join(WORKLOAD_TRAITS)}")
    return WORKLOAD_TRAITS[model]


class Workload:
    """A graph, its features/labels on a device, and the model hyperparameters to benchmark (``hidden``,
    ``layers``: None for each model's default, from :data:`WORKLOAD_TRAITS`). The graph is given to every
    implementation as loaded (ids and formats as they are), with one self loop per node for the models that
    need them (:func:`~dgl_exact.training.workloads.prepare_graph`, layout ``as_given``)."""

    def __init__(self, dataset, device, hidden=None, layers=None, dropout=0.5, batch_norm=True, heads=3):
        self.dataset, self.device = dataset, torch.device(device)
        self.layers_given = layers
        layers = 3 if layers is None else layers
        self.hidden, self.layers, self.dropout, self.batch_norm, self.heads = hidden, layers, dropout, batch_norm, heads
        g = dataset.graph
        prepared = {}  # the graph as_given depends on the self loops alone: one copy each
        for traits in WORKLOAD_TRAITS.values():
            if traits.self_loops not in prepared:
                prepared[traits.self_loops] = prepare_graph(g, traits, layout="as_given")
        self.graph_sl, self.graph_raw = prepared[True], prepared[False]
        self._edge_index = None  # the PyG models' graph (graph_for), made on first use
        self.feat = g.ndata["feat"].to(self.device)
        self.train_idx = dataset.train_idx.to(self.device)
        self.train_label = g.ndata["label"].to(self.device)[self.train_idx]

    def graph_for(self, model: str):
        """The graph ``model`` is called on: a DGL graph, or for a PyG model the ``edge_index`` of the graph as
        loaded (PyG's convs add their own self loops)."""
        if model in PYG_MODELS:
            if self._edge_index is None:
                src, dst = self.graph_raw.edges()
                self._edge_index = torch.stack([src, dst]).to(self.device, torch.int64)
            return self._edge_index
        return self.graph_sl if workload_traits(model).self_loops else self.graph_raw

    def hidden_for(self, model: str) -> int:
        """The hidden size benchmarked: ``hidden`` if given, else the EXACT benchmark's per model."""
        return self.hidden or workload_traits(model).hidden

    def layers_for(self, model: str) -> int:
        """The number of layers (blocks) benchmarked: ``layers`` if given, else the model's default."""
        return self.layers_given or workload_traits(model).layers

    def build(self, model: str, impl: str, seed: int = 0, recompute=None):
        """The benchmarked model (``recompute``: GCNII's segment length, see ``models.GCNII``)."""
        torch.manual_seed(seed)
        hidden = self.hidden_for(model)
        if model in PYG_MODELS:
            return build_pyg_model(model, self.dataset.num_features, hidden, self.dataset.num_classes,
                                   self.layers_for(model), self.dropout, self.batch_norm, impl).to(self.device)
        if impl == "pyg":
            return _pyg_model(model, self.dataset.num_features, hidden, self.dataset.num_classes, self.layers,
                              self.dropout, self.batch_norm, self.graph_for(model), self.device)
        if model in USER_MODELS:
            return build_user_model(model, self.dataset.num_features, hidden, self.dataset.num_classes,
                                    self.layers_for(model),
                                    self.dropout, self.batch_norm, impl).to(self.device)
        return build_model(model, self.dataset.num_features, self.dataset.num_classes, hidden=hidden,
                           layers=self.layers, dropout=self.dropout, batch_norm=self.batch_norm, heads=self.heads,
                           impl=impl, recompute=recompute).to(self.device)

    def step_fn(self, model_name: str, model, impl: str) -> Callable:
        """A training forward returning ``(loss, logits)``: what users write for the baselines, the
        activation-free loss for dgl_exact."""
        g, x, idx, y = self.graph_for(model_name), self.feat, self.train_idx, self.train_label
        multilabel = self.dataset.multilabel

        def step():
            logits = model(x, g) if model_name in PYG_MODELS else model(g, x)
            if impl == "exact" and model_name not in USER_MODELS and model_name not in PYG_MODELS:
                loss = (ops.binary_cross_entropy_with_logits if multilabel else ops.cross_entropy)(logits, y, idx)
            else:
                z = logits[idx]
                loss = F.binary_cross_entropy_with_logits(z, y.float()) if multilabel else F.cross_entropy(z, y)
            return loss, logits

        return step

    def runnable(self, impl: str, model: Optional[str] = None, recompute=None) -> Optional[str]:
        """None if ``impl`` (of ``model``, with GCNII's ``recompute`` option) can run here, else why not."""
        if recompute and model is not None and model != "gcn2":
            return f"n/a: recompute is a GCNII (gcn2) option, not {model}'s"
        if impl == "dgl" and self.device.type == "cuda" and not dgl_supports_device(torch.device("cuda")):
            return "n/a: this DGL build is CPU-only (dgl.nn cannot run on CUDA features)"
        if model in PYG_MODELS and impl == "dgl":
            return "n/a: a PyG model (its baseline: PyG fp32)"
        if impl == "pyg" and model is not None and model not in ("gcn", "sage") + PYG_MODELS:
            return f"n/a: no PyG baseline for {model}"
        if model in PYG_MODELS and impl != "pyg":
            try:
                import torch_geometric  # noqa: F401
            except ImportError:
                return "n/a: torch_geometric not installed"
        if impl == "pyg":
            try:
                import torch_geometric  # noqa: F401
            except ImportError:
                return "n/a: torch_geometric not installed"
        return None


def _pyg_model(model, in_feats, hidden, classes, layers, dropout, batch_norm, g, device):
    """The same architecture on PyG layers (``GCNConv(cached=True)``, ``SAGEConv``) for a second baseline."""
    import torch_geometric.nn as pyg

    src, dst = g.edges()
    edge_index = torch.stack([src, dst]).to(device)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            dims = [in_feats] + [hidden] * (layers - 1) + [classes]
            if model == "gcn":
                make = lambda a, b: pyg.GCNConv(a, b, cached=True, add_self_loops=False)  # noqa: E731
            elif model == "sage":
                make = lambda a, b: pyg.SAGEConv(a, b, aggr="mean")  # noqa: E731
            else:
                raise ValueError(f"no PyG baseline for {model}")
            self.convs = torch.nn.ModuleList([make(a, b) for a, b in zip(dims[:-1], dims[1:])])
            self.norms = torch.nn.ModuleList([torch.nn.BatchNorm1d(hidden) for _ in range(layers - 1)]) \
                if batch_norm else None

        def forward(self, _g, x):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    if self.norms is not None:
                        x = self.norms[i](x)
                    x = F.dropout(F.relu(x), dropout, self.training)
            return x

    return Net().to(device)


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _free(device):
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def memory_grid(work: Workload, models: Sequence[str], settings: Sequence[Setting], sink: ResultSink,
                progress: bool = True, cpu_method: str = "auto", isolate: Optional[bool] = None) -> List[Dict]:
    """Activation memory and step peak of one training step per (model, setting).

    Per setting: a fresh model and Adam, one warm-up step (Adam's state, code pages, structure caches),
    then :func:`dgl_exact.memory.measure_step` on the second step: the activations its forward keeps
    (EXACT protocol) and the peak of forward + loss + backward + Adam step above the memory before it
    (the method is in each row's ``peak_method``). Both ratios are against DGL fp32 (a PyG model's: PyG fp32)
    measured in the same command (``ratio_vs_baseline``: activations; ``peak_ratio_vs_baseline``: step peak).

    ``isolate`` (default: on the CPU) measures each setting in a fresh process: the CPU peak is a resident
    high-water mark, and the heap an earlier setting leaves behind (DGL's C++ kernels keep theirs resident
    after the step) would otherwise hide part of the next setting's peak."""
    if isolate is None:
        isolate = work.device.type == "cpu"
    rows = []
    grid = [(m, s) for m in models for s in settings]
    for model_name, setting in progress_bar(grid, progress, desc="memory", unit="setting"):
        why = work.runnable(setting.impl, model_name, recompute=setting.recompute)
        if why:
            row = {"kind": "memory", "model": model_name, "setting": setting.name, "device": str(work.device),
                   "layers": work.layers_for(model_name), "hidden": work.hidden_for(model_name), "note": why}
        elif isolate:
            row = in_fresh_process(memory_row, work, model_name, setting, cpu_method)
        else:
            row = memory_row(work, model_name, setting, cpu_method)
        rows.append(row)
    _add_ratios(rows, "activation_bytes", baseline_over_value=True)
    _add_ratios(rows, "step_peak_bytes", baseline_over_value=True, out="peak_ratio_vs_baseline")
    for r in rows:
        sink.add(r)
    return rows


def memory_row(work: Workload, model_name: str, setting: Setting, cpu_method: str = "auto") -> Dict:
    row = {"kind": "memory", "model": model_name, "setting": setting.name, "device": str(work.device),
           "layers": work.layers_for(model_name), "hidden": work.hidden_for(model_name)}
    plan_scope = contextlib.nullcontext()
    if setting.budget_of:  # planned before the CPU high-water mark is reset: planning is not the step
        plan = _budget_plan(work, model_name, setting.budget_of)
        plan_scope = plan.active()
        row.update(budget_bytes=plan.budget, plan_peak_pred_MiB=plan.record.step_peak_bytes / 2**20,
                   note=f"per-tensor plan: {plan.record.note}")
    if work.device.type == "cpu" and cpu_method != "none":
        memory.prepare_cpu_peak()  # before the warm-up step: its freed heap must not stay resident
    model = work.build(model_name, setting.impl, recompute=setting.recompute)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = work.step_fn(model_name, model, setting.impl)
    scope = compression_scope(setting.compression) if setting.compression else contextlib.nullcontext()
    with scope, plan_scope:
        for warm in (True, False):
            opt.zero_grad(set_to_none=True)
            _free(work.device)
            report = memory.measure_step(step, opt, modules=[model], device=work.device,
                                         exclude=[work.feat, work.train_idx, work.train_label],
                                         cpu_method="none" if warm else cpu_method)
            report.result = None
    row.update(activation_bytes=report.activation_bytes, activation_MiB=report.activation_bytes / 2**20,
               step_peak_bytes=report.peak_bytes, step_peak_MiB=report.peak_mib,
               method=report.method, peak_method=report.peak_method)
    if report.peak_bytes is not None and work.device.type == "cpu":
        row["peak_method"] += "; fresh process per setting" if _IN_CHILD else ""
    del model, opt, step, report
    _free(work.device)
    return row


def _budget_plan(work: Workload, model_name: str, ref: str):
    """The per-tensor plan (:func:`dgl_exact.planning.budget.budget_plan`) of ``model_name`` on the workload
    within uniform ``ref``'s predicted total, sensitivities from probe steps on the workload's graph."""
    from ..planning.budget import budget_plan
    from ..planning.predict import plan as predict_plan
    from ..planning.predict import spec_from_graph

    ds = work.dataset
    spec = spec_from_graph(ds.graph, ds.num_features, ds.num_classes, int(work.train_idx.numel()), model_name,
                           name=ds.name, hidden=work.hidden_for(model_name), layers=work.layers,
                           dropout=work.dropout, batch_norm=work.batch_norm, heads=work.heads)
    gpu = work.device.type == "cuda"
    uniform = {r.setting: r for r in predict_plan(spec, "cuda" if gpu else "cpu", [ref])}
    data = (work.graph_for(model_name), work.feat, work.train_label, work.train_idx)
    return budget_plan(spec, uniform[ref].total_bytes, data=data, gpu=gpu, uniform=uniform)


_IN_CHILD = False


def _child(fn, threads, args):
    global _IN_CHILD
    _IN_CHILD = True
    torch.set_num_threads(threads)
    return fn(*args)


def in_fresh_process(fn, *args):
    """``fn(*args)`` in a fresh Python process (same torch thread count), its return value (a JSON-able row).
    A plain subprocess, not multiprocessing: no re-import of the caller's ``__main__``. Nothing passes
    through files: the task goes to the child's stdin, the row comes back as JSON through a pipe, so the
    parent never unpickles anything."""
    import json
    import pickle
    import subprocess
    import sys
    import tempfile
    import threading

    payload = pickle.dumps((fn, torch.get_num_threads(), args), protocol=pickle.HIGHEST_PROTOCOL)
    read_fd, write_fd = os.pipe()
    code = f"from dgl_exact.bench.runner import _child_main; _child_main({write_fd})"
    with tempfile.TemporaryFile(mode="w+") as err:
        try:
            proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=err, pass_fds=(write_fd,))
        finally:
            os.close(write_fd)

        def feed():
            try:
                proc.stdin.write(payload)
                proc.stdin.close()
            except BrokenPipeError:  # the child died early: its stderr says why
                pass

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        with os.fdopen(read_fd, "rb") as r:
            data = r.read()
        proc.wait()
        feeder.join()
        if proc.returncode != 0 or not data:
            err.seek(0)
            raise RuntimeError(f"the measurement process failed (exit {proc.returncode}):\n{err.read()[-3000:]}")
    return json.loads(data)


def _child_main(result_fd: int) -> None:
    import json
    import pickle
    import sys

    memory.prepare_cpu_peak()  # first thing: the task's tensors must not grow a heap the step could reuse
    fn, threads, args = pickle.load(sys.stdin.buffer)  # from the parent's pipe, never from a file
    out = _child(fn, threads, args)
    with os.fdopen(result_fd, "w") as f:
        json.dump(out, f)


def memory_note(rows: Sequence[Dict]) -> str:
    """How the memory rows were measured, for the table header."""
    act = sorted({r["method"] for r in rows if r.get("method")})
    peak = sorted({r["peak_method"] for r in rows if r.get("peak_method")})
    return (f". Activations: {', '.join(act) or 'n/a'}; step peak: forward + loss + backward + Adam step of the "
            f"second step above the memory before it, {', '.join(peak) or 'n/a'}. ratio_vs_baseline (activations) "
            "and peak_ratio_vs_baseline (step peak): DGL fp32 (a PyG model's: PyG fp32) / setting, measured in the "
            "same command")


def _add_ratios(rows, key, baseline_over_value, out="ratio_vs_baseline"):
    """``ratio_vs_baseline`` per model against DGL fp32 (a PyG model's: PyG fp32; else the first measured
    setting): baseline / value (memory: how many times smaller) or value / baseline (time: how many times
    slower)."""
    by_model = {}
    for r in rows:
        by_model.setdefault(r["model"], []).append(r)
    for model, group in by_model.items():
        ref = "PyG fp32" if model in PYG_MODELS else "DGL fp32"
        base = next((r[key] for r in group if r.get(key) and r["setting"] == ref), None)
        if base is None:
            base = next((r[key] for r in group if r.get(key)), None)
        for r in group:
            if r.get(key) and base:
                r[out] = (base / r[key]) if baseline_over_value else (r[key] / base)
                r["baseline"] = next(x["setting"] for x in group if x.get(key) == base)


def training_step(work: Workload, model_name: str, setting: Setting):
    """``(model, run_one_step, scope)``: one full training step (forward, backward, Adam) for a setting;
    the optimizer is ``run_one_step.optimizer``."""
    model = work.build(model_name, setting.impl, recompute=setting.recompute)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    step = work.step_fn(model_name, model, setting.impl)

    def one_step():
        opt.zero_grad(set_to_none=True)
        loss = step()[0]  # the logits are not kept alive through backward (bench/census.py reports this step)
        loss.backward()
        opt.step()

    one_step.optimizer = opt
    scope = compression_scope(setting.compression) if setting.compression else contextlib.nullcontext()
    return model, one_step, scope


def speed_grid(work: Workload, models: Sequence[str], settings: Sequence[Setting], sink: ResultSink,
               epochs: int = 5, warmup: int = 2, progress: bool = True) -> List[Dict]:
    """Epoch time (forward, backward, Adam step) per (model, setting), after warm-up; mean and std."""
    rows = []
    grid = [(m, s) for m in models for s in settings]
    for model_name, setting in progress_bar(grid, progress, desc="speed", unit="setting"):
        row = {"kind": "speed", "model": model_name, "setting": setting.name, "device": str(work.device)}
        why = work.runnable(setting.impl, model_name, recompute=setting.recompute)
        if why:
            row["note"] = why
            rows.append(row)
            continue
        model, one_step, scope = training_step(work, model_name, setting)
        times = []
        with scope:
            for i in range(warmup + epochs):
                _sync(work.device)
                t0 = time.perf_counter()
                one_step()
                _sync(work.device)
                if i >= warmup:
                    times.append(time.perf_counter() - t0)
        row.update(epoch_s=statistics.fmean(times), epoch_ms=1000 * statistics.fmean(times),
                   epoch_ms_std=1000 * (statistics.stdev(times) if len(times) > 1 else 0.0), epochs=len(times))
        rows.append(row)
        del model, one_step
        _free(work.device)
    _add_ratios(rows, "epoch_s", baseline_over_value=False)
    for r in rows:
        sink.add(r)
    return rows


# Runtime calls that block the host until the GPU catches up: each one empties the launch queue.
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def profile_grid(work: Workload, models: Sequence[str], settings: Sequence[Setting], sink: ResultSink, out_dir: str,
                 steps: int = 3, warmup: int = 2, row_limit: int = 30, progress: bool = True) -> List[Dict]:
    """Where a training step's time goes, per (model, setting), from ``torch.profiler``.

    Per step: wall time, GPU kernel time (CUDA), kernel launches and host-blocking synchronisations; the
    per-op table (sorted by self device time on CUDA, self CPU time otherwise) goes to
    ``out_dir/profile_<model>_<setting>.txt``. Wall time well above kernel time means the step is
    launch- or sync-bound rather than bandwidth-bound.
    """
    from torch.profiler import ProfilerActivity, profile

    os.makedirs(out_dir, exist_ok=True)
    cuda = work.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    rows = []
    for model_name, setting in progress_bar([(m, s) for m in models for s in settings], progress, desc="profile",
                                         unit="setting"):
        row = {"kind": "profile", "model": model_name, "setting": setting.name, "device": str(work.device)}
        why = work.runnable(setting.impl, model_name, recompute=setting.recompute)
        if why:
            rows.append(dict(row, note=why))
            continue
        model, one_step, scope = training_step(work, model_name, setting)
        with scope:
            for _ in range(warmup):
                one_step()
            _sync(work.device)
            with profile(activities=activities) as prof:
                t0 = time.perf_counter()
                for _ in range(steps):
                    one_step()
                _sync(work.device)
                wall = (time.perf_counter() - t0) / steps
            sites = _sync_sites(one_step) if cuda else []
        averages = prof.key_averages()
        calls = {e.key: e.count for e in averages}
        row["wall_ms"] = 1000 * wall
        if cuda:
            row["gpu_kernel_ms"] = sum(_self_device_us(e) for e in averages if _is_kernel(e)) / 1000 / steps
            row["launches"] = sum(calls.get(k, 0) for k in _LAUNCH_CALLS) / steps
            row["syncs"] = sum(calls.get(k, 0) for k in _SYNC_CALLS) / steps
        sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        table = averages.table(sort_by=sort, row_limit=row_limit)
        safe = "".join(ch if ch.isalnum() else "_" for ch in setting.name).strip("_")
        path = os.path.join(out_dir, f"profile_{model_name}_{safe}.txt")
        with atomic_write(path, "w", encoding="utf-8", shared=True) as f:
            f.write(f"{model_name} / {setting.name} on {work.device}, {steps} profiled steps after {warmup} warm-up\n"
                    f"code: {provenance.stamp()['code']}\n")
            f.write(table)
            if cuda:
                f.write("\nhost-GPU synchronisations of one more step (torch.cuda.set_sync_debug_mode), "
                        "by call site:\n")
                f.write("".join(f"  {site}\n" for site in sites) or "  none\n")
        row["table"] = os.path.basename(path)
        rows.append(row)
        del model, one_step, prof
        _free(work.device)
    for r in rows:
        sink.add(r)
    return rows


def _sync_sites(one_step: Callable[[], None]) -> List[str]:
    """``"file:line xN"`` for every call site that synchronises the host with the GPU during one step,
    most frequent first (torch's sync debug mode warns at each; the step itself still runs normally)."""
    import collections

    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            one_step()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()
    sites = collections.Counter(f"{os.path.relpath(w.filename)}:{w.lineno}" for w in caught
                                if "synchroniz" in str(w.message))
    return [f"{site} x{count}" for site, count in sites.most_common()]


def _self_device_us(event) -> float:
    return float(getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0.0)) or 0.0)


def _is_kernel(event) -> bool:
    """A GPU kernel / memcpy / memset entry (device activity), not a host-side op that launched one."""
    device_type = getattr(event, "device_type", None)
    return device_type is not None and "CUDA" in str(device_type) and _self_device_us(event) > 0


KERNEL_CONFIGS = [CompressionConfig(bits=8), CompressionConfig(bits=4), CompressionConfig(bits=2),
                  CompressionConfig(bits=1), CompressionConfig(bits=2, block_rows=64, levels="optimal")]


def kernel_grid(sink: ResultSink, device, rows: int = 169343, cols: int = 128, repeats: int = 5,
                progress: bool = True) -> List[Dict]:
    """compress / decompress throughput (GB/s of fp32 input) per available backend on ``device``."""
    device = torch.device(device)
    x = torch.randn(rows, cols, device=device)
    nbytes = x.numel() * 4
    out = []
    backends = [b for b, status in kernels.available_backends().items() if status == "available"]
    grid = [(b, c) for b in backends for c in KERNEL_CONFIGS]
    for backend_name, cfg in progress_bar(grid, progress, desc="kernels", unit="setting"):
        with kernels.use_backend(backend_name), warnings.catch_warnings():
            # a forced backend warns about the graph ops it cannot serve; only the codec is timed here
            warnings.simplefilter("ignore", UserWarning)
            served = kernels.backend(device).ops.get("quantize_pack")
            if served != backend_name:
                continue  # this backend cannot serve this device
            c = compress(x, cfg)
            decompress(c)
            for op, fn in (("compress", lambda: compress(x, cfg)), ("decompress", lambda: decompress(c))):
                ms = best_ms(fn, device, repeats)
                row = {"kind": "kernel", "backend": backend_name, "op": op, "setting": cfg.describe(),
                       "shape": f"{rows}x{cols}", "ms": ms, "GB_per_s": nbytes / (ms / 1000) / 1e9,
                       "device": str(device)}
                out.append(row)
                sink.add(row)
    return out


def accuracy_grid(dataset, base_config, settings: Sequence[Setting], runs: int, sink: ResultSink,
                  progress: bool = True) -> List[Dict]:
    """Test metric over ``runs`` seeds per setting (same seeds for every setting), its difference to the fp32
    baseline and whether that is within noise (:func:`~dgl_exact.bench.accuracy.compare_to_baseline`).
    ``framework: pyg`` (rows ``pyg-<model>``): ``PyG fp32`` trains the PyG model as written, dgl_exact's settings
    the one ``compress_model`` converts; DGL fp32 is skipped (PyG fp32 for DGL models)."""
    from ..training.trainer import Trainer
    from .accuracy import compare_to_baseline

    rows, pyg = [], base_config.framework == "pyg"
    for setting in progress_bar(settings, progress, desc="accuracy", unit="setting"):
        if setting.impl != "exact" and (setting.impl == "pyg") != pyg:  # the other framework's baseline
            continue
        compression = (setting.compression if setting.compression is not None  # (disabled with kept_frac < 1:
                       else base_config.compression.replace(enabled=False, kept_frac=1.0))  # projection alone)
        cfg = base_config.replace(compression=compression, runs=runs)
        if setting.recompute:
            if cfg.model != "gcn2":
                continue
            cfg = cfg.replace(recompute=str(setting.recompute))
        trainer = Trainer(cfg, dataset=dataset, progress=False, log=None)
        trainer.impl = "pyg" if setting.impl == "pyg" else "exact"
        res = trainer.fit()
        tests = [r.test for r in res.runs]
        row = {"kind": "accuracy", "dataset": dataset.name, "model": f"pyg-{cfg.model}" if pyg else cfg.model,
               "setting": setting.name, "runs": runs, "metric": res.metric, "test_mean": statistics.fmean(tests),
               "test_std": statistics.stdev(tests) if len(tests) > 1 else 0.0, "tests": tests,
               "epoch_ms": 1000 * statistics.fmean(r.epoch_time for r in res.runs)}
        rows.append(row)
        sink.add(row)  # as it comes: a run cut short keeps what it measured
    compare_to_baseline(rows)
    sink.replace_rows(sink.rows)  # the same rows, completed
    return rows


def published_rows() -> List[Dict]:
    """EXACT's and i-EXACT's published figures (from their papers), for context; not measured here."""
    return [
        {"source": "EXACT (ICLR 2022), published", "setting": "INT2",
         "claim": "~14x activation memory (arxiv SAGE estimate: 786 -> 57 MiB)"},
        {"source": "EXACT (ICLR 2022), published", "setting": "INT2 + RP(0.125)",
         "claim": "~26x (786 -> 30 MiB); up to 32x overall; 10-25% time overhead"},
        {"source": "i-EXACT (ICASSP 2024), published", "setting": "INT2 + RP + blocks",
         "claim": ">95% reduction vs fp32 (~31x, 25.6 MB); >15% below EXACT; ~5% faster than EXACT"},
    ]
