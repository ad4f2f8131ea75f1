"""Training loops for full-graph, GraphSAINT and ClusterGCN training, with evaluation, activation-memory
measurement, speed tests and bit-for-bit resumable checkpoints.

The trainer is the only training loop of the package: the CLI (``dgl-exact train``), the examples and
the benchmarks all call :func:`train` / :class:`Trainer`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from .. import memory, ops
from .._compat import import_dgl
from ..config import config as compression_scope
from ..data import GraphDataset, load_dataset
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig
from .models import build_model
from .samplers import ClusterGCNSampler, SAINTSampler

dgl = import_dgl()

__all__ = ["Trainer", "RunResult", "TrainResults", "train", "resolve_device"]

SPEED_WARMUP = 3  # epochs run before timing with --test-speed

# Fields that may differ between a checkpoint and the run resuming it.
_RESUMABLE_CHANGES = {"epochs", "runs", "device", "data_root"}


def resolve_device(spec: str) -> torch.device:
    """``auto`` -> CUDA if available else CPU; validates that a requested CUDA device exists."""
    if spec in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ValueError(f"invalid device {spec!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r} requested but torch sees no CUDA GPU (torch {torch.__version__})")
        index = device.index if device.index is not None else 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r} does not exist: torch sees {torch.cuda.device_count()} CUDA device(s)")
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise ValueError(f"unsupported device {spec!r}; use cpu, cuda or cuda:N")
    return device


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
    peak_bytes: Optional[int] = None
    epochs_per_second: Optional[float] = None
    history: List[Dict[str, float]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class TrainResults:
    config: Dict[str, Any]
    metric: str
    runs: List[RunResult]
    environment: Dict[str, Any]

    def summary(self) -> Dict[str, Any]:
        out = {}
        for key in ("train", "val", "test", "epoch_time", "total_time"):
            values = [getattr(r, key) for r in self.runs]
            out[key] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}
        mem = [r.activation_bytes for r in self.runs if r.activation_bytes is not None]
        if mem:
            out["activation_bytes"] = mem[0]
        peak = [r.peak_bytes for r in self.runs if r.peak_bytes is not None]
        if peak:
            out["peak_bytes"] = peak[0]
        speed = [r.epochs_per_second for r in self.runs if r.epochs_per_second is not None]
        if speed:
            out["epochs_per_second"] = {"mean": statistics.fmean(speed),
                                        "std": statistics.stdev(speed) if len(speed) > 1 else 0.0}
        return out

    def to_dict(self) -> Dict[str, Any]:
        return {"config": self.config, "metric": self.metric, "summary": self.summary(),
                "runs": [dataclasses.asdict(r) for r in self.runs], "environment": self.environment}


def environment_info(device: torch.device) -> Dict[str, Any]:
    import platform

    from .. import __version__, backend

    info = {"dgl_exact": __version__, "torch": torch.__version__, "dgl": dgl.__version__,
            "python": platform.python_version(), "device": str(device), "backend": backend(device).primary,
            "machine": platform.machine(), "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def _progress(iterable=None, enabled=True, **kwargs):
    from tqdm.auto import tqdm

    return tqdm(iterable, disable=not enabled, dynamic_ncols=True, **kwargs)


class Trainer:
    """Trains ``config.runs`` runs of one configuration. ``dataset`` may be given pre-loaded."""

    def __init__(self, config: TrainConfig, dataset: Optional[GraphDataset] = None, progress: Optional[bool] = None,
                 log: Callable[[str], None] = print, rank: int = 0, world_size: int = 1):
        self.cfg = config
        self.device = resolve_device(config.device)
        self.log = log
        self.rank, self.world_size = rank, world_size
        self.progress = (sys.stderr.isatty() if progress is None else progress) and rank == 0
        self.dataset = dataset if dataset is not None else load_dataset(config.dataset, config.data_root,
                                                                         seed=config.seed)
        self._prepare_graph()

    # --- data ---------------------------------------------------------------------------------------
    def _prepare_graph(self):
        cfg, ds = self.cfg, self.dataset
        g = ds.graph
        if cfg.model in ("gcn", "gat", "gcn2"):
            g = dgl.add_self_loop(dgl.remove_self_loop(g))
        # full-graph degrees: GraphSAINT's aggregation normalisation needs them inside every batch
        g.ndata["_deg_in"] = g.in_degrees().float()
        g.ndata["_deg_out"] = g.out_degrees().float()
        self.graph = g
        self.feat = g.ndata["feat"].to(self.device)
        self.label = g.ndata["label"].to(self.device)
        self.split = {s: ds.idx(s).to(self.device) for s in ("train", "val", "test")}
        self.train_label = self.label[self.split["train"]]
        self.sampler = self._make_sampler()

    def _make_sampler(self, assignment=None):
        """The training sampler (None for full-graph); ``assignment``: a given ClusterGCN partition."""
        cfg = self.cfg
        common = dict(seed=cfg.seed, rank=self.rank, world_size=self.world_size, even=self.world_size > 1)
        if cfg.sampler == "full":
            return None
        cache_dir = os.path.join(cfg.data_root, "cache")
        if cfg.sampler == "saint":
            walk = cfg.walk_length if cfg.saint_mode == "walk" else None
            return SAINTSampler(self.graph, cfg.saint_mode, cfg.saint_budget, walk, sample_coverage=cfg.sample_coverage,
                                cache_dir=cache_dir, dataset=self.dataset.key, progress=self.progress, **common)
        num_parts = min(cfg.num_parts, self.graph.num_nodes())
        return ClusterGCNSampler(self.graph, num_parts, min(cfg.parts_per_batch, num_parts), cache_dir=cache_dir,
                                 dataset=self.dataset.name, assignment=assignment, **common)

    # --- one step -----------------------------------------------------------------------------------
    def _loss(self, logits, label_rows, index, weight=None):
        if self.dataset.multilabel:
            return ops.binary_cross_entropy_with_logits(logits, label_rows, index, weight)
        return ops.cross_entropy(logits, label_rows, index, weight)

    def _saint_edge_weight(self, batch):
        """GraphSAINT's per-edge weight, folded so each conv's own normalisation becomes the full-graph one."""
        g, norm = batch.graph, batch.edge_norm.float()
        src, dst = g.edges(order="eid")
        if self.cfg.model == "sage":  # mean: sum_u w h_u / deg_S(v) should be sum_u a h_u / deg_G(v)
            w = norm * g.in_degrees()[dst].float() / g.ndata["_deg_in"][dst]
        elif self.cfg.model == "gcn":  # both: 1/sqrt(deg_S(u) deg_S(v)) -> 1/sqrt(deg_G(u) deg_G(v))
            sub = g.out_degrees()[src].float().clamp(min=1) * g.in_degrees()[dst].float().clamp(min=1)
            full = g.ndata["_deg_out"][src].clamp(min=1) * g.ndata["_deg_in"][dst].clamp(min=1)
            w = norm * (sub / full).sqrt()
        else:
            w = norm
        return w.to(self.device)

    def _batch_inputs(self, batch):
        """(graph, features, train-row index, labels of those rows, loss weights, edge weights)."""
        if batch is None:
            return self.graph, self.feat, self.split["train"], self.train_label, None, None
        moved = batch.to(self.device)
        mask = moved.train_mask
        index = torch.nonzero(mask, as_tuple=True)[0]
        weight = moved.node_norm[index] if moved.node_norm is not None else None
        edge_weight = self._saint_edge_weight(batch) if batch.edge_norm is not None else None
        return batch.graph, moved.feat, index, moved.label[index], weight, edge_weight

    def _forward_loss(self, model, inputs):
        graph, feat, index, labels, weight, edge_weight = inputs
        with self._autocast():
            logits = model(graph, feat, edge_weight=edge_weight)
            loss = self._loss(logits, labels, index, weight)
        return loss, logits

    def _autocast(self):
        if not self.cfg.amp:
            return contextlib.nullcontext()
        dtype = torch.float16 if self.device.type == "cuda" else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype)

    def _step(self, model, optimizer, scaler, inputs, measure=False):
        optimizer.zero_grad(set_to_none=True)
        report = None
        if measure:
            report = memory.measure(lambda: self._forward_loss(model, inputs), modules=[model],
                                    exclude=[t for t in inputs[1:] if isinstance(t, torch.Tensor)] + [self.feat],
                                    device=self.device)
            loss, _ = report.result
            report.result = None
        else:
            loss, _ = self._forward_loss(model, inputs)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"training loss became {loss.item()}; lower --lr or set --grad-norm")
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
        else:
            loss.backward()
        if self.cfg.grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.grad_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        return float(loss.detach()), report

    # --- evaluation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model) -> Dict[str, float]:
        from ..data.base import compute_metric

        model.eval()
        with self._autocast():
            logits = model(self.graph, self.feat).float()
        model.train()
        return {s: compute_metric(self.dataset.metric, logits[idx], self.label[idx]) for s, idx in self.split.items()}

    # --- model and optimiser ------------------------------------------------------------------------
    def build(self, seed: int):
        cfg = self.cfg
        torch.manual_seed(seed)
        model = build_model(cfg.model, self.dataset.num_features, self.dataset.num_classes, hidden=cfg.hidden,
                            layers=cfg.layers, dropout=cfg.dropout, batch_norm=cfg.batch_norm, heads=cfg.heads,
                            alpha=cfg.alpha, lambda_=cfg.lambda_, input_dropout=cfg.input_dropout).to(self.device)
        opt_cls = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop, "sgd": torch.optim.SGD}[cfg.optimizer]
        optimizer = opt_cls(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        scaler = None
        if cfg.amp and self.device.type == "cuda":
            scaler = torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()
        return model, optimizer, scaler

    def wrap_model(self, model):
        """Hook for distributed training (DDP); identity here."""
        return model

    # --- a run --------------------------------------------------------------------------------------
    def run(self, run: int, *, checkpoint: Optional[str] = None, resume: Optional[Dict[str, Any]] = None,
            debug_mem: bool = False, test_speed: Optional[int] = None, completed: Optional[list] = None) -> RunResult:
        cfg = self.cfg
        seed = cfg.seed + run
        model, optimizer, scaler = self.build(seed)
        model = self.wrap_model(model)
        start_epoch, best, history = 0, {"val": -math.inf, "epoch": -1}, []
        act_bytes = peak_bytes = None
        if resume is not None:
            model_state = resume["model"]
            target = model.module if hasattr(model, "module") else model
            target.load_state_dict(model_state)
            optimizer.load_state_dict(resume["optimizer"])
            if scaler is not None and resume.get("scaler"):
                scaler.load_state_dict(resume["scaler"])
            start_epoch = resume["epoch"] + 1
            best, history = resume["best"], resume["history"]
            act_bytes, peak_bytes = resume.get("activation_bytes"), resume.get("peak_bytes")
            torch.set_rng_state(resume["rng_cpu"])
            if self.device.type == "cuda" and resume.get("rng_cuda") is not None:
                torch.cuda.set_rng_state(resume["rng_cuda"], self.device)
        warmup = SPEED_WARMUP if test_speed is not None else 0
        epochs = cfg.epochs if test_speed is None else warmup + test_speed
        train_time, t_run = 0.0, time.perf_counter()
        bar = _progress(range(start_epoch, epochs), self.progress, desc=f"run {run + 1}/{cfg.runs}", unit="epoch",
                        initial=start_epoch, total=epochs, leave=False)
        loss = float("nan")
        with compression_scope(cfg.compression):
            for epoch in bar:
                model.train()
                t0 = time.perf_counter()
                loss, report = self._train_epoch(model, optimizer, scaler, epoch,
                                                 measure=debug_mem and act_bytes is None and epoch == start_epoch)
                if report is not None:
                    act_bytes, peak_bytes = report.activation_bytes, report.peak_bytes
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                train_time += time.perf_counter() - t0
                record = {"epoch": epoch, "loss": loss, "time": time.perf_counter() - t0}
                if test_speed is None and ((epoch + 1) % cfg.eval_every == 0 or epoch == epochs - 1):
                    metrics = self.evaluate(model)
                    record.update(metrics)
                    if metrics["val"] > best["val"]:
                        best = {"val": metrics["val"], "epoch": epoch, "train": metrics["train"],
                                "test": metrics["test"]}
                    bar.set_postfix(loss=f"{loss:.4f}", val=f"{metrics['val']:.4f}", test=f"{best['test']:.4f}")
                history.append(record)
                if checkpoint and self.rank == 0:
                    target = model.module if hasattr(model, "module") else model
                    save_checkpoint({"config": cfg.to_dict(), "run": run, "epoch": epoch, "model": target.state_dict(),
                                     "optimizer": optimizer.state_dict(),
                                     "scaler": scaler.state_dict() if scaler is not None else None,
                                     "rng_cpu": torch.get_rng_state(),
                                     "rng_cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
                                     "best": best, "history": history, "completed": completed or [],
                                     "activation_bytes": act_bytes, "peak_bytes": peak_bytes}, checkpoint)
        bar.close()
        n_epochs = max(1, epochs - start_epoch)
        result = RunResult(run=run, seed=seed, best_epoch=best.get("epoch", -1), train=best.get("train", float("nan")),
                           val=best.get("val", float("nan")), test=best.get("test", float("nan")), final_loss=loss,
                           epoch_time=train_time / n_epochs, total_time=time.perf_counter() - t_run,
                           activation_bytes=act_bytes, peak_bytes=peak_bytes, history=history)
        if test_speed is not None:
            timed = [h["time"] for h in history[warmup:]]
            result.epochs_per_second = len(timed) / sum(timed) if timed and sum(timed) > 0 else None
            result.epoch_time = statistics.fmean(timed) if timed else result.epoch_time
        self.model = model
        return result

    def _train_epoch(self, model, optimizer, scaler, epoch, measure=False):
        """Train one epoch; returns (mean loss, memory report of the first step if ``measure``)."""
        if self.sampler is None:
            return self._step(model, optimizer, scaler, self._batch_inputs(None), measure=measure)
        report = None
        losses = []
        batches = self.sampler.iter_epoch(epoch)
        for i, batch in enumerate(_progress(batches, self.progress, total=len(self.sampler), desc=f"epoch {epoch}",
                                            unit="batch", leave=False)):
            loss, r = self._step(model, optimizer, scaler, self._batch_inputs(batch), measure=measure and i == 0)
            report = report or r
            losses.append(loss)
        return (statistics.fmean(losses) if losses else float("nan")), report

    # --- all runs -----------------------------------------------------------------------------------
    def _load_resume_state(self, checkpoint: str) -> Dict[str, Any]:
        """Hook: the checkpoint ``--resume`` continues from (distributed: read by rank 0, broadcast)."""
        return load_checkpoint(checkpoint)

    def fit(self, *, checkpoint: Optional[str] = None, resume: bool = False, debug_mem: bool = False,
            test_speed: Optional[int] = None) -> TrainResults:
        cfg = self.cfg
        results: List[RunResult] = []
        state, first_run = None, 0
        if resume:
            if not checkpoint:
                raise ValueError("--resume needs --checkpoint PATH")
            state = self._load_resume_state(checkpoint)
            _check_resumable(state["config"], cfg)
            results = [RunResult(**r) for r in state["completed"]]
            first_run = state["run"]
            if state["epoch"] + 1 >= cfg.epochs:  # that run had finished; start the next one
                state, first_run = None, first_run + 1
        for run in range(first_run, cfg.runs):
            resume_state = state if (state is not None and run == state["run"]) else None
            result = self.run(run, checkpoint=checkpoint, resume=resume_state, debug_mem=debug_mem,
                              test_speed=test_speed, completed=[dataclasses.asdict(r) for r in results])
            results.append(result)
            if self.log and self.rank == 0:
                self.log(_run_line(result, self.dataset.metric))
            if checkpoint and self.rank == 0:
                ckpt = load_checkpoint(checkpoint)
                ckpt["completed"] = [dataclasses.asdict(r) for r in results]
                save_checkpoint({k: v for k, v in ckpt.items() if k != "format"}, checkpoint)
        return TrainResults(config=cfg.to_dict(), metric=self.dataset.metric, runs=results,
                            environment=environment_info(self.device))


def _check_resumable(saved: Dict[str, Any], cfg: TrainConfig) -> None:
    current = cfg.to_dict()
    diff = [k for k in current if k not in _RESUMABLE_CHANGES and saved.get(k) != current[k]]
    if diff:
        details = ", ".join(f"{k}: checkpoint {saved.get(k)!r} vs now {current[k]!r}" for k in diff)
        raise ValueError(f"the checkpoint was made with different settings ({details}); resume with the same "
                         "options or start a new checkpoint")


def _run_line(r: RunResult, metric: str) -> str:
    mem = f", activation memory {memory.format_bytes(r.activation_bytes)}" if r.activation_bytes is not None else ""
    speed = f", {r.epochs_per_second:.2f} epochs/s" if r.epochs_per_second is not None else ""
    return (f"run {r.run + 1}: best epoch {r.best_epoch}, train {metric} {r.train:.4f}, val {r.val:.4f}, "
            f"test {r.test:.4f}, {r.epoch_time * 1000:.1f} ms/epoch{mem}{speed}")


def train(config: Optional[TrainConfig] = None, **kwargs) -> TrainResults:
    """Train with ``config`` (or ``TrainConfig(**kwargs)``) and return the results of all runs."""
    cfg = config if config is not None else TrainConfig(**{k: v for k, v in kwargs.items()
                                                           if k in TrainConfig.fields()})
    extra = {k: v for k, v in kwargs.items() if k not in TrainConfig.fields()}
    trainer = Trainer(cfg, progress=extra.pop("progress", None), log=extra.pop("log", print))
    return trainer.fit(**extra)
