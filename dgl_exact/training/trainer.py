"""Training loops for full-graph, GraphSAINT, ClusterGCN and neighbour-sampled training, with evaluation,
activation-memory measurement, speed tests and bit-for-bit resumable checkpoints.

The trainer is the only training loop of the package: the CLI (``dgl-exact train``), the examples and
the benchmarks all call :func:`train` / :class:`Trainer`.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch

from .. import memory
from .._compat import import_dgl
from .._files import OutputLock
from .._progress import progress_bar
from ..compression_config import config as compression_scope
from ..data import GraphDataset, load_dataset
from ..data.compact import allow_all_formats, describe_structure
from .checkpoint import RunState, remove_stale_temporaries
from .config import TrainConfig
from .memory_breakdown import step_breakdown
from .models import build_model, layerwise_inference
from .neighbor import DEFAULT_BATCH_SIZE, DEFAULT_EVAL_BATCH_SIZE, NeighborSampler
from .recipes import LabelInputs, StepInputs, autocast, loss_function, sampled_inputs
from .results import RunResult, TrainResults, environment_info, run_line
from .resume import (ResumeMismatchWarning, check_resume, data_record, refuse_existing_checkpoint, resume_line,
                     resume_plan)
from .samplers import ClusterGCNSampler, SAINTSampler, with_degrees
from .workloads import model_traits, prepare_graph

dgl = import_dgl()

__all__ = ["Trainer", "RunResult", "RunState", "TrainResults", "train", "resolve_device", "unwrap_model"]

SPEED_WARMUP = 3  # epochs run before timing with --test-speed


def _one_writer(fit):
    """``fit`` holding its checkpoint's lock (:class:`~dgl_exact._files.OutputLock`), so that a second process
    on the same path stops at once instead of passing the "never overwrite" check too and mixing the two runs.
    With several processes (``world_size > 1``) the command line holds it: the ``--nproc`` launcher, or
    torchrun's rank 0."""

    @functools.wraps(fit)
    def locked(self, *args, checkpoint: Optional[str] = None, **kwargs):
        if not checkpoint or self.world_size > 1:
            return fit(self, *args, checkpoint=checkpoint, **kwargs)
        with OutputLock(checkpoint, "--checkpoint"):
            return fit(self, *args, checkpoint=checkpoint, **kwargs)

    return locked


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


class Trainer:
    """Trains ``config.runs`` runs of one configuration. ``dataset`` may be given pre-loaded.

    :meth:`fit` trains every run; :meth:`run` trains one, in four phases: :meth:`restore` (a new model,
    optimizer and scaler, with a checkpoint's :class:`RunState` loaded into them when resuming), then per
    epoch :meth:`train_epoch` and :meth:`evaluate`, and :meth:`save` (the checkpoint); at its end
    :meth:`finish_run`.

    Hooks for subclasses (the distributed trainer and its one-process emulator override these, and only
    these): :meth:`make_sampler`, :meth:`build`, :meth:`wrap_model`, :meth:`train_epoch` (one epoch of
    steps), :meth:`optimizer_step` (apply the accumulated gradients: AMP unscaling, clipping, step),
    :meth:`evaluate`, :meth:`finish_run`, :meth:`read_checkpoint`, :meth:`check_new_checkpoint` and
    :meth:`recorded`.

    Attributes: ``cfg``, ``device``, ``dataset`` (the dataset over the graph trained on: with one self loop
    per node for GCN, GAT and GCNII, int32 ids when the counts allow, sharing ``graph``'s structure; the
    dataset given or loaded is not kept, nor changed), ``dataset_summary`` (the given dataset's
    :meth:`~dgl_exact.data.GraphDataset.summary`), ``graph`` and its ``feat`` / ``label`` / ``split`` on
    the device, ``sampler`` (None for full-graph training), ``rank`` / ``world_size``; ``run_seed``: the
    seed of the run in progress (``cfg.seed + run``); ``model``: the model trained by the last :meth:`run`
    (as :meth:`wrap_model` returned it).
    """

    #: ``torch.compile`` mode of the model (``dgl-exact train --compile``; :mod:`.compiled`); None: eager
    compile_mode: Optional[str] = None
    #: :func:`~.models.build_model`'s ``impl``: ``exact`` (dgl_exact's layers; framework pyg: PyG's converted by
    #: ``compress_model``), or ``pyg`` for framework pyg's model as written (``dgl-exact bench accuracy``'s
    #: ``PyG fp32`` baseline)
    impl: str = "exact"
    #: with a checkpoint, also save it every this many batches inside an epoch (``--checkpoint-batches``);
    #: a resumed run continues at the next batch of that epoch with the same batches. None: after epochs only
    checkpoint_batches: Optional[int] = None
    #: the memory budget (bytes) and the per-tensor plan it resolved to (``BudgetPlan.choices()``) that this
    #: run's training forwards apply (``dgl-exact train --memory-budget``; the caller enters the plan): recorded
    #: in the checkpoint and checked on resume (:mod:`.resume`). None: none, uniform compression
    memory_budget: Optional[int] = None
    memory_plan: Optional[List[List[Any]]] = None
    #: where a resume allowed to differ from its checkpoint (``fit(resume_mismatch_ok=True)``) says how, one
    #: line per difference; None: a :class:`~.resume.ResumeMismatchWarning`
    warn: Optional[Callable[[str], None]] = None

    def __init__(self, config: TrainConfig, dataset: Optional[GraphDataset] = None, progress: Optional[bool] = None,
                 log: Callable[[str], None] = print, rank: int = 0, world_size: int = 1):
        self.cfg = config
        self.device = resolve_device(config.device)
        self.log = log
        self.rank, self.world_size = rank, world_size
        self.run_seed = config.seed
        self.model = None
        self.checkpoint_saved = False
        self._partial = None          # (epoch, batches done, their losses) a resumed run continues inside
        self._batch_done = None       # called after each batch of an epoch (mid-epoch checkpoints)
        self.progress = (sys.stderr.isatty() if progress is None else progress) and rank == 0
        self.dataset = dataset if dataset is not None else load_dataset(
            config.dataset, config.data_root, seed=config.seed, standardize=config.standardize,
            quiet=progress is False, compact=True)
        self._prepare_graph()

    # --- data ---------------------------------------------------------------------------------------
    def _prepare_graph(self):
        cfg, ds = self.cfg, self.dataset
        #: the run header's line on the dataset as given (its own edges: before self loops are added)
        self.dataset_summary = ds.summary()
        #: the data's fingerprint a checkpoint records (:func:`~.resume.data_record`), of the dataset as given
        self.data_record = data_record(ds)
        # int32 ids when the counts allow, one self loop per node for the models that need one; full-graph
        # training without layer-wise evaluation needs CSC and CSR only (samplers and layer-wise inference read
        # the COO); on a symmetric graph, for models whose backward has no edge-weighted transposed aggregation,
        # the CSC alone without edge ids (edge dropping and the inductive subgraph read a COO): :mod:`.workloads`
        full = cfg.sampler == "full" and cfg.eval_batch_size is None
        loops = model_traits(cfg.model).self_loops
        g = prepare_graph(ds.graph, cfg.model, layout="training" if full else "sampled",
                          has_self_loops=bool(ds.info.get("self_loop")),
                          csc_only=not cfg.edge_drop and not cfg.inductive)
        #: the run header's line on the graph structure (id type, formats, bytes)
        self.structure_note = describe_structure(g)
        # The graph once: the trainer keeps no reference to the dataset's own graph (the structure it was
        # built from: a second edge list, in int64 ids as DGL loads it). ``dataset`` becomes the same
        # dataset over the graph trained on (its structure shared, every format allowed so that code
        # needing a COO, e.g. a second Trainer's sampler, gets one on demand); a dataset passed in is not
        # changed, and is freed with its graph once its owner drops it.
        self.dataset = ds = dataclasses.replace(
            ds, graph=allow_all_formats(g), info={**ds.info, "self_loop": True} if loops else ds.info)
        self.graph = g = with_degrees(g)
        self.feat = g.ndata["feat"].to(self.device)
        self.label = g.ndata["label"].to(self.device)
        self.split = {s: ds.idx(s).to(self.device) for s in ("train", "val", "test")}
        empty = [s for s, idx in self.split.items() if idx.numel() == 0]
        if empty:  # nothing to learn from, no epoch to select, or no score to report
            are = "s are" if len(empty) > 1 else " is"
            raise ValueError(f"dataset {ds.name}: the {' and '.join(empty)} split{are} "
                             f"empty (0 of {g.num_nodes():,} nodes); training needs train, val and test nodes")
        self.train_label = self.label[self.split["train"]]
        if cfg.use_labels and (ds.multilabel or cfg.sampler != "full"):
            raise ValueError("use_labels (label inputs, EXACT's arxiv GAT) needs a single-label dataset and full-graph "
                             "training (--sampler full)")
        #: EXACT's label inputs (``use_labels``; :class:`~.recipes.LabelInputs`), else None
        self.label_inputs = LabelInputs(ds.num_classes, cfg.mask_rate) if cfg.use_labels else None
        # what training sees: the whole graph, or (inductive) the subgraph induced by the training nodes
        self.train_graph, self.train_feat, self.train_index = g, self.feat, self.split["train"]
        if cfg.inductive:
            self.train_graph = self._induced_training_graph(g)
            self.train_feat = self.train_graph.ndata["feat"].to(self.device)
            self.train_index = torch.arange(self.train_graph.num_nodes(), device=self.device)
        self.sampler = self.make_sampler()

    def _induced_training_graph(self, g):
        """EXACT's ``--inductive``: the subgraph induced by the training nodes (in the order of the train
        split, so its labels are ``train_label``), with its own degrees; validation and test nodes and all
        their edges are unseen until evaluation, which runs on the full graph."""
        sub = dgl.node_subgraph(g, self.split["train"].cpu().to(g.idtype))
        sub.ndata.pop(dgl.NID)
        sub.edata.pop(dgl.EID)
        return with_degrees(sub)

    def make_sampler(self, assignment=None):
        """Hook: the training sampler (None for full-graph); ``assignment``: a given ClusterGCN partition."""
        cfg = self.cfg
        common = dict(seed=cfg.seed, rank=self.rank, world_size=self.world_size, even=self.world_size > 1)
        if cfg.sampler == "full":
            return None
        if cfg.sampler == "neighbor":  # seeds: the training nodes (the whole training graph with --inductive)
            seeds = self.train_index.cpu() if cfg.inductive else self.split["train"].cpu()
            return NeighborSampler(self.train_graph, cfg.neighbor_fanouts(), cfg.batch_size or DEFAULT_BATCH_SIZE,
                                   train_nodes=seeds, **common)
        cache_dir = os.path.join(cfg.data_root, "cache")
        graph, suffix = self.train_graph, "-inductive" if cfg.inductive else ""  # caches per graph sampled
        if cfg.sampler == "saint":
            walk = cfg.walk_length if cfg.saint_mode == "walk" else None
            return SAINTSampler(graph, cfg.saint_mode, cfg.saint_budget, walk, sample_coverage=cfg.sample_coverage,
                                num_batches=cfg.saint_steps, cache_dir=cache_dir, dataset=self.dataset.key + suffix,
                                progress=self.progress, **common)
        num_parts = min(cfg.num_parts, graph.num_nodes())
        return ClusterGCNSampler(graph, num_parts, min(cfg.parts_per_batch, num_parts), cache_dir=cache_dir,
                                 dataset=self.dataset.name + suffix, assignment=assignment, **common)

    # --- one step: its inputs and loss follow EXACT's recipes (:mod:`.recipes`) ----------------------------
    def _loss(self, logits, label_rows, index, weight=None):
        return loss_function(self.dataset.multilabel, self.cfg.loss)(logits, label_rows, index, weight)

    def _batch_inputs(self, batch) -> StepInputs:
        """One step's :class:`~.recipes.StepInputs`: of the full (training) graph, with ``use_labels``'s label
        inputs, or of a sampled ``batch`` (GraphSAINT's weights)."""
        if batch is not None:
            return sampled_inputs(batch, self.cfg.model, self.device)
        if self.label_inputs is not None:
            return self.label_inputs.step_inputs(self.train_graph, self.train_feat, self.train_index,
                                                 self.train_label)
        return StepInputs(self.train_graph, self.train_feat, self.train_index, self.train_label)

    def _forward_loss(self, model, inputs):
        graph, feat, index, labels, weight, edge_weight = inputs
        with self._autocast():
            logits = model(graph, feat, edge_weight=edge_weight)
            loss = self._loss(logits, labels, index, weight)
        return loss, logits

    def _autocast(self):
        return autocast(self.cfg.amp, self.device)

    def backward(self, loss: torch.Tensor, scaler, parts: int = 1) -> float:
        """Backpropagate one batch's ``loss`` (scaled for AMP), divided by ``parts`` when a step averages
        that many batches; returns the loss. ``FloatingPointError`` if it is not finite."""
        if not torch.isfinite(loss):
            raise FloatingPointError(f"training loss became {loss.item()}; lower --lr or set --grad-norm")
        value = float(loss.detach())
        if parts > 1:
            loss = loss / parts
        (scaler.scale(loss) if scaler is not None else loss).backward()
        return value

    def optimizer_step(self, model, optimizer, scaler) -> None:
        """Hook: apply the gradients the step's :meth:`backward` calls accumulated: unscale them (AMP),
        clip their norm to ``grad_norm``, step the optimizer and update the scaler. Called once per step."""
        if scaler is not None:
            scaler.unscale_(optimizer)
        if self.cfg.grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), self.cfg.grad_norm)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()

    def _step(self, model, optimizer, scaler, inputs, measure=False):
        """One training step; with ``measure``, also its memory (:func:`dgl_exact.memory.measure_step`:
        activations of the forward, step peak over forward + backward + optimizer step) and EXACT's
        breakdown in ``report.breakdown`` (see :meth:`_memory_breakdown`)."""
        optimizer.zero_grad(set_to_none=True)
        losses = []

        def backward(result):
            losses.append(self.backward(result[0], scaler))

        def optimizer_step():
            self.optimizer_step(model, optimizer, scaler)

        report = None
        if measure:
            report = memory.measure_step(lambda: self._forward_loss(model, inputs), optimizer_step, backward=backward,
                                         modules=[model], device=self.device,
                                         exclude=[t for t in inputs[1:] if isinstance(t, torch.Tensor)] + [self.feat])
            report.result = None
            report.breakdown = self._memory_breakdown(model, optimizer, inputs, report)
        else:
            backward(self._forward_loss(model, inputs))
            optimizer_step()
        return losses[0], report

    def _memory_breakdown(self, model, optimizer, inputs, report) -> Dict[str, Any]:
        """EXACT's ``--debug-mem`` breakdown, bytes (:func:`~.memory_breakdown.step_breakdown`): model
        (parameters, buffers, optimizer state), data on the device (graph structure, cached structure tensors,
        features, labels, split indices), step peak (forward + backward + optimizer step, above the memory
        before the step) and total = model + data + step peak."""
        batch_graphs = inputs[0] if isinstance(inputs[0], (list, tuple)) else [inputs[0]]  # blocks: a list
        graphs = [self.graph] + [g for g in batch_graphs if g is not self.graph]
        data = [self.feat, self.label, self.train_label, *self.split.values(), *inputs]
        return step_breakdown(unwrap_model(model), optimizer, self.device, data, graphs, report)

    # --- evaluation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model) -> Dict[str, float]:
        """Train/val/test metrics of ``model`` on the full graph; with ``eval_batch_size`` (the neighbour
        sampler: by default 4096, as DGL's GraphSAGE example), computed layer by layer in batches of destination
        nodes (:func:`~dgl_exact.training.models.layerwise_inference`: the same logits up to float rounding, one
        layer's activations alive at a time)."""
        from ..data.base import compute_metric

        model.eval()
        feat = self.feat
        if self.label_inputs is not None:
            feat = self.label_inputs.eval_features(feat, self.split["train"], self.train_label)
        eval_batch_size = self.cfg.eval_batch_size
        if eval_batch_size is None and self.cfg.sampler == "neighbor" and self.cfg.framework != "pyg":
            # large graphs: one layer at a time (PyG's models: the whole graph, as PyG evaluates them)
            eval_batch_size = DEFAULT_EVAL_BATCH_SIZE
        with self._autocast():
            if eval_batch_size is None:
                logits = model(self.graph, feat).float()
            else:
                logits = layerwise_inference(model, self.graph, feat, eval_batch_size,
                                             progress=self.progress).float()
        model.train()
        return {s: compute_metric(self.dataset.metric, logits[idx], self.label[idx]) for s, idx in self.split.items()}

    # --- model and optimiser ------------------------------------------------------------------------
    def build(self, seed: int):
        """Hook: a new model (initialised from ``seed``), its optimizer and its AMP scaler (None)."""
        cfg = self.cfg
        torch.manual_seed(seed)
        in_feats = self.dataset.num_features + (self.dataset.num_classes if cfg.use_labels else 0)
        model = build_model(cfg.model, in_feats, self.dataset.num_classes, hidden=cfg.hidden,
                            layers=cfg.layers, dropout=cfg.dropout, batch_norm=cfg.batch_norm, heads=cfg.heads,
                            alpha=cfg.alpha, lambda_=cfg.lambda_, input_dropout=cfg.input_dropout,
                            shared_weights=cfg.shared_weights, residual=cfg.residual,
                            identity_mapping=cfg.identity_mapping, dropout2=cfg.dropout2, edge_drop=cfg.edge_drop,
                            use_attn_dst=cfg.use_attn_dst, recompute=cfg.recompute, impl=self.impl,
                            framework=cfg.framework).to(self.device)
        opt_cls = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop, "sgd": torch.optim.SGD}[cfg.optimizer]
        optimizer = opt_cls(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        scaler = None
        if cfg.amp and self.device.type == "cuda":
            scaler = torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler()
        return model, optimizer, scaler

    def wrap_model(self, model):
        """Hook for distributed training (DDP); identity here."""
        return model

    # --- a run: restore, then per epoch train, evaluate, save -------------------------------------------
    def restore(self, run: int, state: Optional[RunState] = None, completed: Optional[list] = None):
        """The start of ``run``: ``(model, optimizer, scaler, run state)``, the model built from seed
        ``cfg.seed + run`` and wrapped (:meth:`wrap_model`). With ``state`` (resuming), its weights,
        optimizer and scaler state and random state are loaded and its progress continues; ``completed``:
        the finished runs the checkpoint will hold."""
        self.run_seed = self.cfg.seed + run
        model, optimizer, scaler = self.build(self.run_seed)
        model = self.wrap_model(model)
        if state is None:
            state = RunState(config=self.cfg.to_dict(), run=run, recorded=self.recorded())
        else:
            state = dataclasses.replace(state, config=self.cfg.to_dict(), recorded=self.recorded())
            unwrap_model(model).load_state_dict(state.model)
            optimizer.load_state_dict(state.optimizer)
            if scaler is not None and state.scaler:
                scaler.load_state_dict(state.scaler)
            torch.set_rng_state(state.rng_cpu)
            if self.device.type == "cuda" and state.rng_cuda is not None:
                torch.cuda.set_rng_state(state.rng_cuda, self.device)
        state.completed = list(completed or [])
        if self.compile_mode is not None:  # after loading: the compiled wrapper's state_dict keys are prefixed
            from .compiled import compile_model

            model = compile_model(model, self.compile_mode)
        return model, optimizer, scaler, state

    def save(self, path: str, state: RunState, model, optimizer, scaler) -> None:
        """Checkpoint ``state`` with the current weights, optimizer and scaler state and random state
        (written by rank 0 alone)."""
        if self.rank == 0:
            state.model = unwrap_model(model).state_dict()
            state.optimizer = optimizer.state_dict()
            state.scaler = scaler.state_dict() if scaler is not None else None
            state.rng_cpu = torch.get_rng_state()
            state.rng_cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
            state.save(path)
        self.checkpoint_saved = True

    def run(self, run: int, *, checkpoint: Optional[str] = None, resume: Optional[RunState] = None,
            debug_mem: bool = False, test_speed: Optional[int] = None, completed: Optional[list] = None) -> RunResult:
        """Train run ``run`` (from ``resume`` when given) and return its result (see :meth:`fit`)."""
        cfg = self.cfg
        if debug_mem and self.device.type == "cpu":
            memory.prepare_cpu_peak()  # before any step: the CPU step peak is a resident high-water mark
        model, optimizer, scaler, state = self.restore(run, resume, completed)
        mem_detail = {}
        start_epoch = state.epoch + 1
        self._partial = (start_epoch, state.batch, list(state.batch_losses)) if state.batch else None
        self._batch_done = None
        if checkpoint and self.checkpoint_batches and self.sampler is not None:
            def batch_done(epoch, done, losses):  # inside the epoch: where it stands, to resume at the next batch
                if done % self.checkpoint_batches == 0 and done < len(self.sampler):
                    state.batch, state.batch_losses = done, list(losses)
                    self.save(checkpoint, state, model, optimizer, scaler)

            self._batch_done = batch_done
        warmup = SPEED_WARMUP if test_speed is not None else 0
        epochs = cfg.epochs if test_speed is None else warmup + test_speed
        train_time, t_run = 0.0, time.perf_counter()
        bar = progress_bar(range(start_epoch, epochs), self.progress, desc=f"run {run + 1}/{cfg.runs}", unit="epoch",
                           initial=start_epoch, total=epochs, leave=False)
        loss = float("nan")
        with compression_scope(cfg.compression):
            for epoch in bar:
                model.train()
                if epoch < cfg.lr_warmup:  # EXACT's adjust_lr: lr * e / N in its 1-based epoch e <= N
                    for group in optimizer.param_groups:
                        group["lr"] = cfg.lr * (epoch + 1) / cfg.lr_warmup
                t0 = time.perf_counter()
                measure = debug_mem and state.activation_bytes is None and epoch == min(start_epoch + 1, epochs - 1)
                loss, report = self.train_epoch(model, optimizer, scaler, epoch, measure=measure)
                if report is not None:
                    state.activation_bytes, state.peak_bytes = report.activation_bytes, report.peak_bytes
                    mem_detail = report.breakdown
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                train_time += time.perf_counter() - t0
                record = {"epoch": epoch, "loss": loss, "time": time.perf_counter() - t0}
                if test_speed is None and ((epoch + 1) % cfg.eval_every == 0 or epoch == epochs - 1):
                    metrics = self.evaluate(model)
                    record.update(metrics)
                    if metrics["val"] > state.best["val"]:
                        state.best = {"val": metrics["val"], "epoch": epoch, "train": metrics["train"],
                                      "test": metrics["test"]}
                    bar.set_postfix(loss=f"{loss:.4f}", val=f"{metrics['val']:.4f}", test=f"{state.best['test']:.4f}")
                state.history.append(record)
                state.epoch, state.batch, state.batch_losses = epoch, 0, []
                if checkpoint and epoch < epochs - 1:  # the last epoch's is written with the run's result, below
                    self.save(checkpoint, state, model, optimizer, scaler)
        bar.close()
        best, history = state.best, state.history
        n_epochs = max(1, epochs - start_epoch)
        result = RunResult(run=run, seed=self.run_seed, best_epoch=best.get("epoch", -1),
                           train=best.get("train", float("nan")), val=best.get("val", float("nan")),
                           test=best.get("test", float("nan")), final_loss=loss, epoch_time=train_time / n_epochs,
                           total_time=time.perf_counter() - t_run, activation_bytes=state.activation_bytes,
                           peak_bytes=state.peak_bytes, history=history, **mem_detail)
        if test_speed is not None:
            timed = [h["time"] for h in history[warmup:]]
            result.epochs_per_second = len(timed) / sum(timed) if timed and sum(timed) > 0 else None
            result.epoch_time = statistics.fmean(timed) if timed else result.epoch_time
        if checkpoint:  # the state after the run's last epoch, with its result: one write, nothing read back
            state.completed.append(dataclasses.asdict(result))
            self.save(checkpoint, state, model, optimizer, scaler)
        self.model = model
        return self.finish_run(model, result)

    def finish_run(self, model, result: RunResult) -> RunResult:
        """Hook: the result :meth:`run` returns, once ``model`` is trained and checkpointed."""
        return result

    def train_epoch(self, model, optimizer, scaler, epoch: int, measure: bool = False):
        """Hook: train one epoch; returns (mean loss, memory report of the first step if ``measure``)."""
        if self.sampler is None:
            return self._step(model, optimizer, scaler, self._batch_inputs(None), measure=measure)
        report = None
        start, losses = 0, []
        if self._partial is not None and self._partial[0] == epoch:  # resumed inside this epoch
            _, start, losses = self._partial
            self._partial = None
        batches = self.sampler.iter_epoch(epoch, start=start)
        for i, batch in enumerate(progress_bar(batches, self.progress, total=len(self.sampler), desc=f"epoch {epoch}",
                                               unit="batch", leave=False, initial=start), start):
            loss, r = self._step(model, optimizer, scaler, self._batch_inputs(batch), measure=measure and i == start)
            report = report or r
            losses.append(loss)
            if self._batch_done is not None:
                self._batch_done(epoch, i + 1, losses)
        return (statistics.fmean(losses) if losses else float("nan")), report

    # --- all runs -----------------------------------------------------------------------------------
    def read_checkpoint(self, checkpoint: str) -> RunState:
        """Hook: the run state ``--resume`` continues from (distributed: read by rank 0, broadcast)."""
        return RunState.load(checkpoint)

    def check_new_checkpoint(self, checkpoint: str) -> None:
        """Hook: refuse to start a new checkpoint over an existing file (distributed: rank 0 decides)."""
        refuse_existing_checkpoint(checkpoint)

    def recorded(self) -> Dict[str, Any]:
        """Hook: this run's values of :data:`~.resume.RUN_FIELDS` (its checkpoint's ``recorded``; what
        ``--resume`` compares besides the config): world size, memory budget and plan, data fingerprint."""
        plan = None if self.memory_plan is None else [list(slot) for slot in self.memory_plan]
        return {"world_size": self.world_size, "memory_budget": self.memory_budget, "memory_plan": plan,
                **self.data_record}

    def check_resume(self, state: RunState, checkpoint: str, mismatch_ok: bool = False, skip=()) -> None:
        """``ValueError`` in one line unless ``state`` (read from ``checkpoint``) was written with this run's
        config and :meth:`recorded` values, those :data:`~.resume.MAY_CHANGE` and ``skip`` aside
        (:func:`~.resume.check_resume`); with ``mismatch_ok``, one warning line per difference instead
        (:attr:`warn`; rank 0)."""
        warn = self.warn or (lambda message: warnings.warn(message, ResumeMismatchWarning, stacklevel=4))
        check_resume(state.config, state.recorded, {**self.cfg.to_dict(), **self.recorded()}, checkpoint,
                     mismatch_ok=mismatch_ok, warn=warn if self.rank == 0 else None, skip=skip)

    @_one_writer
    def fit(self, *, checkpoint: Optional[str] = None, resume: bool = False, debug_mem: bool = False,
            test_speed: Optional[int] = None, resume_mismatch_ok: bool = False) -> TrainResults:
        """Train runs ``0 .. runs - 1`` (seeds ``seed + run``) and return their results.

        ``checkpoint``: after every epoch the run's state (model, optimizer, random state, history) is written
        there atomically, and at the end of each run the same state with the run's result added to the finished
        runs (``completed``); nothing is read back while training. A new checkpoint never replaces an existing
        file (``ValueError``: continue it with ``resume=True`` / ``--resume``, or choose another path).

        ``resume``: continue from ``checkpoint``. It holds the finished runs and the state of the last run
        after its epoch ``E`` (1-based). Finished runs are reported as they are, never trained or counted
        again. The checkpoint's run continues to ``epochs``; if it had finished with fewer epochs it is
        *extended* (its result is replaced, not added): the model then equals an uninterrupted run of
        ``epochs`` epochs (the extra evaluation at the old last epoch can only change which epoch is best).
        With ``epochs == E`` a finished run stays as it is and the next run starts. ``ValueError`` (and no
        training) if ``epochs < E``, if other finished runs were trained for a different number of epochs
        (their models are not in the checkpoint, and runs of different lengths would be averaged together),
        if ``runs`` is below the number of runs the checkpoint holds, if the file is not a checkpoint, or if it
        was written with other settings (:mod:`.resume`: the config, the world size, memory budget and plan,
        the data's fingerprint; one line naming each field and both values) unless ``resume_mismatch_ok``
        (then one warning line per difference: :attr:`warn`). The log gets one line saying where the resumed
        training continues.
        """
        cfg = self.cfg
        epochs = cfg.epochs if test_speed is None else SPEED_WARMUP + test_speed
        results: List[RunResult] = []
        state: Optional[RunState] = None
        first_run = 0
        self.checkpoint_saved = False
        if resume and not checkpoint:
            raise ValueError("--resume needs --checkpoint PATH")
        if checkpoint and not resume:
            self.check_new_checkpoint(checkpoint)
        if checkpoint and self.rank == 0:
            remove_stale_temporaries(checkpoint)
        if resume:
            state = self.read_checkpoint(checkpoint)
            self.check_resume(state, checkpoint, resume_mismatch_ok)
            saved = state
            results, first_run, state = resume_plan(state, checkpoint, epochs, cfg.runs)
            if self.log and self.rank == 0:
                self.log(resume_line(checkpoint, saved, results, first_run, epochs, cfg.runs))
        for run in range(first_run, cfg.runs):
            resume_state = state if (state is not None and run == state.run) else None
            result = self.run(run, checkpoint=checkpoint, resume=resume_state, debug_mem=debug_mem,
                              test_speed=test_speed, completed=[dataclasses.asdict(r) for r in results])
            results.append(result)
            if self.log and self.rank == 0:
                self.log(run_line(result, self.dataset.metric))
        return TrainResults(config=cfg.to_dict(), metric=self.dataset.metric, runs=results,
                            environment=environment_info(self.device))


def unwrap_model(model):
    """The module inside a (torch.compile and/or DDP) wrapper, else ``model``."""
    model = getattr(model, "_orig_mod", model)
    return model.module if hasattr(model, "module") else model


def train(config: Optional[TrainConfig] = None, **kwargs) -> TrainResults:
    """Train with ``config`` (or ``TrainConfig(**kwargs)``) and return the results of all runs."""
    cfg = config if config is not None else TrainConfig(**{k: v for k, v in kwargs.items()
                                                           if k in TrainConfig.fields()})
    extra = {k: v for k, v in kwargs.items() if k not in TrainConfig.fields()}
    trainer = Trainer(cfg, progress=extra.pop("progress", None), log=extra.pop("log", print))
    return trainer.fit(**extra)
