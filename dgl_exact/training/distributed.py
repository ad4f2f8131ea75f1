"""Data-parallel training with ``torch.distributed``: one process per GPU (NCCL) or per CPU share (gloo),
each stepping on its own mini-batches, gradients averaged by :class:`~torch.nn.parallel.DistributedDataParallel`.

Launching
    ``dgl-exact train --nproc N ...`` starts N worker processes on this machine (:func:`launch`);
    ``torchrun --nproc-per-node N [--nnodes ...] -m dgl_exact train ...`` works too: ``train`` sees
    ``WORLD_SIZE > 1`` in its environment and runs as one worker (:class:`DistributedTrainer`).
    Only the mini-batch samplers (``saint``, ``cluster``) are supported: full-graph training would need
    the graph itself split across ranks.

What one global step is
    Every sampler yields an epoch's batches as a pure function of ``(seed, epoch)``; rank ``r`` of ``W``
    takes global batches ``r, r + W, ...`` (``even=True``: the same number of steps on every rank, the
    ``B mod W`` left-over batches are skipped, so the collectives of all ranks match). In step ``k`` the
    ranks process global batches ``kW .. kW + W - 1`` at once and DDP averages their gradients: the step
    descends ``(1/W) sum_r loss_r``, each rank's batch loss (GraphSAINT: a sum of normalised node losses,
    an unbiased estimate of the full-graph mean training loss; ClusterGCN: the mean over the batch's
    training nodes) weighted ``1/W``. An epoch therefore makes ``B // W`` optimiser steps instead of
    ``B``. :class:`GlobalBatchTrainer` performs exactly these steps in one process (``W`` micro-batches
    per step, losses averaged), which is what the tests compare a distributed run against.

Randomness
    Model initialisation is identical on all ranks (same seed; DDP also broadcasts rank 0's parameters).
    The streams that differ per rank (dropout masks, stochastic rounding and random projections of the
    compression, all drawn from torch's default generator) are re-seeded at the start of every epoch
    from ``(run seed, rank, epoch)`` (:func:`rank_seed`), so a run resumed from a checkpoint continues bit
    for bit without per-rank RNG files.

Rank 0 only
    Evaluation (on the full graph), checkpoints, logging, the ``--json`` file. The other ranks wait at a
    barrier of a separate gloo group with a long timeout (``setup_timeout``) meanwhile; the run's result
    is broadcast from rank 0 so that every rank's :meth:`~DistributedTrainer.fit` returns the same.
    Dataset loading and the sampler caches are prepared by rank 0 first (GraphSAINT's normalisation cache
    is then loaded by the others, or recomputed identically where the folder is not shared; ClusterGCN's
    METIS partition, which is not deterministic, is broadcast from rank 0).

Failures
    The default process group has a short timeout (``--dist-timeout``, default 60 s): a rank that dies
    or hangs makes the others' next collective fail (at once when the peer's connection closes, after
    the timeout otherwise) and they exit with status 1 and an ``error: ...`` line
    (:class:`DistributedError`). :func:`launch` also watches its workers and terminates the rest when
    one exits non-zero. ``--checkpoint`` / ``--resume`` continue the job from the last finished epoch.
"""
from __future__ import annotations

import copy
import dataclasses
import datetime
import hashlib
import inspect
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .checkpoint import load_checkpoint
from .config import TrainConfig
from .trainer import RunResult, Trainer, TrainResults, resolve_device

__all__ = ["DistributedTrainer", "GlobalBatchTrainer", "DistributedError", "DistContext", "init_distributed",
           "shutdown", "exit_worker", "launch", "in_distributed_env", "is_launched_child", "rank_seed",
           "device_for_rank",
           "DEFAULT_TIMEOUT", "DEFAULT_SETUP_TIMEOUT", "FULL_GRAPH_ERROR", "OVERSUBSCRIBE_ENV", "cpu_cores"]

DEFAULT_TIMEOUT = 60.0           # s: collectives of a training step (a dead / hung rank is noticed within this)
DEFAULT_SETUP_TIMEOUT = 1800.0   # s: waits for rank-0-only work (caches, METIS, evaluation, checkpoints)
TIMEOUT_ENV = "DGL_EXACT_DIST_TIMEOUT"
SETUP_TIMEOUT_ENV = "DGL_EXACT_DIST_SETUP_TIMEOUT"
CHILD_ENV = "DGL_EXACT_NPROC_CHILD"      # set by `launch` in its workers
OVERSUBSCRIBE_ENV = "DGL_EXACT_OVERSUBSCRIBE"  # "1": `launch` may start more CPU workers than there are cores
FAIL_ENV = "DGL_EXACT_TEST_FAIL_AT"      # tests: "RANK:EPOCH[:hang]": that rank exits (status 1) / hangs at that epoch
FULL_GRAPH_ERROR = ("multi-process training needs a mini-batch sampler (--sampler saint or cluster); "
                    "full-graph training runs in one process")
_RNG_STREAM = 0x5EED  # keeps rank_seed's streams apart from the samplers'
_DistError = getattr(dist, "DistError", RuntimeError)  # torch >= 2.1; plain RuntimeError before


class DistributedError(RuntimeError):
    """A collective failed or another rank failed: the run cannot continue (resume from the checkpoint)."""


# ------------------------------------------------------------------------------------------------
# Environment, process group, devices, seeds
# ------------------------------------------------------------------------------------------------
def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def in_distributed_env() -> bool:
    """Whether this process is one of several workers (torchrun or ``--nproc`` set ``WORLD_SIZE > 1``)."""
    return _env_int("WORLD_SIZE", 1) > 1


def is_launched_child() -> bool:
    """Whether this process was started by :func:`launch` (``dgl-exact train --nproc``)."""
    return os.environ.get(CHILD_ENV) == "1"


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not a number of seconds") from None


def rank_seed(seed: int, rank: int, epoch: int) -> int:
    """The seed of torch's default generator on ``rank`` at the start of ``epoch`` (non-negative, 63 bit).

    Distinct ranks and epochs get statistically independent streams; the same ``(seed, rank, epoch)``
    always gets the same one (what makes a resumed run continue bit for bit).
    """
    state = np.random.SeedSequence([int(seed), _RNG_STREAM, int(rank), int(epoch)]).generate_state(1, np.uint64)[0]
    return int(state >> np.uint64(1))


def device_for_rank(spec: Optional[str], local_rank: int, local_world_size: int) -> torch.device:
    """The device of the worker with ``local_rank`` on its machine: ``cuda:LOCAL_RANK`` for ``auto`` (when
    CUDA is available) or ``cuda``; ``cpu`` for ``cpu``; ``cuda:N`` only with one worker per machine."""
    spec = (spec or "auto").strip()
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device 'cuda' requested but torch sees no CUDA GPU (torch {torch.__version__})")
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"local rank {local_rank} has no GPU of its own: torch sees "
                             f"{torch.cuda.device_count()} CUDA device(s); start at most that many processes "
                             "per machine")
        return torch.device("cuda", local_rank)
    device = resolve_device(spec)
    if device.type == "cuda" and local_world_size > 1:
        raise ValueError(f"--device {spec} with {local_world_size} processes per machine: use --device cuda "
                         "(or auto): each process takes the GPU of its local rank")
    return device


@dataclasses.dataclass
class DistContext:
    """This worker's place in the job and the groups it talks through."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str                     # of the default group: "nccl" (CUDA) or "gloo" (CPU)
    timeout: float                   # s, default group (training collectives)
    setup_timeout: float             # s, control group
    control: Any = None              # gloo group for barriers / small objects around rank-0-only work

    def describe(self) -> str:
        return f"{self.world_size} processes ({self.backend}, rank {self.rank}, timeout {self.timeout:g} s)"


_CONTEXT: Optional[DistContext] = None


def init_distributed(device: Optional[str] = "auto", timeout: Optional[float] = None,
                     setup_timeout: Optional[float] = None) -> DistContext:
    """Join the job described by torchrun's environment variables (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and return its context.

    The default group uses NCCL when this worker's device is a GPU, gloo otherwise, with ``timeout``
    seconds (default ``$DGL_EXACT_DIST_TIMEOUT`` or 60; also bounds the rendezvous). A second gloo group
    with ``setup_timeout`` seconds (default ``$DGL_EXACT_DIST_SETUP_TIMEOUT`` or 1800) carries the waits
    for rank-0-only work. Calling it again returns the same context.
    """
    global _CONTEXT
    if _CONTEXT is not None and dist.is_initialized():
        return _CONTEXT
    if not dist.is_available():
        raise DistributedError("this torch build has no torch.distributed")
    timeout = _env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT) if timeout is None else float(timeout)
    setup_timeout = (_env_seconds(SETUP_TIMEOUT_ENV, DEFAULT_SETUP_TIMEOUT) if setup_timeout is None
                     else float(setup_timeout))
    if timeout <= 0 or setup_timeout <= 0:
        raise ValueError("distributed timeouts must be > 0 seconds")
    setup_timeout = max(setup_timeout, timeout)
    if dist.is_initialized():  # the caller set up the process group itself
        rank, world_size = dist.get_rank(), dist.get_world_size()
    else:
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
        if missing:
            raise ValueError(f"distributed training needs the environment variables {', '.join(missing)} "
                             "(set by torchrun or dgl-exact train --nproc)")
        rank, world_size = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", rank)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    dev = device_for_rank(device, local_rank, local_world_size)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        kwargs = {}
        if backend == "nccl" and "device_id" in inspect.signature(dist.init_process_group).parameters:
            kwargs["device_id"] = dev  # torch >= 2.3: bind the communicator to this GPU eagerly
        try:
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout), **kwargs)
        except (RuntimeError, _DistError) as e:
            raise DistributedError(f"rank {rank}: could not join the process group at "
                                   f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} within "
                                   f"{timeout:g} s: {_first_line(e)}") from e
    backend = dist.get_backend()
    control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=setup_timeout))
    _CONTEXT = DistContext(rank, world_size, local_rank, local_world_size, dev, backend, timeout, setup_timeout,
                           control)
    return _CONTEXT


def _quiesce() -> None:
    """Barriers on the control and the main group: every rank is done, and the gloo worker threads have let
    go of the last collectives' tensors (they need the GIL for that; see :func:`shutdown`)."""
    if _CONTEXT is not None:
        dist.barrier(group=_CONTEXT.control)
    dist.barrier()


def shutdown() -> None:
    """Leave the process group (after a successful run; a failed one just exits).

    On torch before 2.8 (pytorch/pytorch#56297, fixed by #154976) destroying a gloo process group holds the
    GIL while it joins gloo's worker threads, and a worker thread dropping the last reference to a tensor
    of a Python-level collective (``all_gather_object`` and friends) needs the GIL: a deadlock, seen at the
    end of runs. Barriers first (they wait with the GIL released) make that very unlikely; the command line
    does not destroy at all (:func:`exit_worker`).
    """
    global _CONTEXT
    if dist.is_available() and dist.is_initialized():
        _quiesce()
        dist.destroy_process_group()
    _CONTEXT = None


def exit_worker(code: int) -> None:
    """End a ``dgl-exact train`` worker process: barriers, flush, and exit without tearing down the process
    group or the interpreter, which on older torch can deadlock or abort in gloo's destructor
    (:func:`shutdown`). Nothing is left to clean up: results and checkpoints are written and closed."""
    global _CONTEXT
    try:
        if code == 0 and dist.is_available() and dist.is_initialized():
            _quiesce()
    except Exception as e:  # noqa: BLE001 - another rank failed after this one finished
        rank = _CONTEXT.rank if _CONTEXT is not None else "?"
        print(f"error: rank {rank}: the final barrier failed: {_first_line(e)}", file=sys.stderr)
        code = 1
    finally:
        _CONTEXT = None
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe must not change the exit status
                pass
        os._exit(code)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


_COMM_MARKERS = ("gloo", "nccl", "c10d", "connection", "timed out", "timeout", "processgroup", "socket",
                 "broken pipe", "peer")


def _is_comm_error(e: BaseException) -> bool:
    if isinstance(e, DistributedError) or (_DistError is not RuntimeError and isinstance(e, _DistError)):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e).lower() for m in _COMM_MARKERS)


def _param_hash(module: torch.nn.Module) -> str:
    h = hashlib.blake2b(digest_size=8)
    for name, p in module.named_parameters():
        h.update(name.encode())
        h.update(p.detach().to("cpu", copy=True).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _unwrap(model):
    return model.module if isinstance(model, DistributedDataParallel) else model


def _seed_all(seed: int) -> None:
    torch.manual_seed(seed)  # CPU and every CUDA device


# ------------------------------------------------------------------------------------------------
# The distributed trainer
# ------------------------------------------------------------------------------------------------
class DistributedTrainer(Trainer):
    """One worker of a data-parallel run (see the module docstring); use it as :class:`Trainer`.

    Joins the process group (:func:`init_distributed`) first; ``timeout`` / ``setup_timeout`` are in
    seconds. ``config.device`` is resolved per local rank (:func:`device_for_rank`).
    """

    def __init__(self, config: TrainConfig, dataset=None, progress: Optional[bool] = None,
                 log: Callable[[str], None] = print, *, timeout: Optional[float] = None,
                 setup_timeout: Optional[float] = None):
        if config.sampler == "full":
            raise ValueError(FULL_GRAPH_ERROR)
        self.ctx = ctx = init_distributed(config.device, timeout, setup_timeout)
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self._fail_at = _parse_fail_at()
        self._run_seed = config.seed
        self.replica_hashes: List[List[str]] = []
        if dataset is None:  # one loader per machine first: loaders may process raw files on first use
            from ..data import load_dataset

            dataset = self._staged(lambda: load_dataset(config.dataset, config.data_root, seed=config.seed,
                                                        standardize=config.standardize),
                                   first=ctx.local_rank == 0, what="loading the dataset")
        super().__init__(config.replace(device=str(ctx.device)), dataset, progress, log, rank=ctx.rank,
                         world_size=ctx.world_size)

    # --- collectives on the control group -----------------------------------------------------------
    def _barrier(self) -> None:
        dist.barrier(group=self.ctx.control)

    def _agree(self, error: Optional[BaseException], what: str) -> None:
        """Raise on every rank if ``what`` failed on any: the failing rank re-raises its own error."""
        gathered: List[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, None if error is None else f"{type(error).__name__}: {_first_line(error)}",
                               group=self.ctx.control)
        if error is not None:
            raise error
        failed = [(r, m) for r, m in enumerate(gathered) if m is not None]
        if failed:
            r, m = failed[0]
            raise DistributedError(f"rank {r} failed while {what}: {m}")

    def _staged(self, fn: Callable[[], Any], first: bool, what: str) -> Any:
        """``fn()`` on the ``first`` ranks, then, once they all succeeded, on the others."""
        result = error = None
        if first:
            try:
                result = fn()
            except Exception as e:  # noqa: BLE001 - re-raised by _agree on every rank
                error = e
        self._agree(error, what)
        if not first:
            try:
                result = fn()
            except Exception as e:  # noqa: BLE001
                error = e
        self._agree(error, what)
        return result

    def _broadcast(self, obj: Any) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.ctx.control)
        return box[0]

    # --- hooks of Trainer ---------------------------------------------------------------------------
    def _make_sampler(self, **kwargs):
        cfg = self.cfg
        if cfg.sampler == "cluster":  # METIS is not deterministic: everyone uses rank 0's partition
            sampler = error = None
            if self.rank == 0:
                try:
                    sampler = super()._make_sampler()
                except Exception as e:  # noqa: BLE001
                    error = e
            self._agree(error, "partitioning the graph (METIS)")
            assignment = self._broadcast(sampler.assignment if self.rank == 0 else None)
            if self.rank != 0:
                sampler = super()._make_sampler(assignment=assignment)
        else:  # GraphSAINT pre-sampling is a pure function of the seed: rank 0 writes the cache, others read it
            sampler = self._staged(super()._make_sampler, first=self.rank == 0,
                                   what="preparing the GraphSAINT normalisation")
        if len(sampler) < 1:
            raise ValueError(f"{sampler.num_global_batches} batch(es) per epoch cannot feed {self.world_size} "
                             "processes: use fewer processes or smaller batches (--saint-budget, --num-parts, "
                             "--parts-per-batch)")
        return sampler

    def build(self, seed: int):
        self._run_seed = seed
        return super().build(seed)  # same seed on every rank: identical initial models

    def wrap_model(self, model):
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # Every parameter of every model gets a gradient in every step (the loss depends on all of them,
        # even for a batch without training nodes): no need for find_unused_parameters.
        return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=False)

    def _load_resume_state(self, checkpoint: str) -> Dict[str, Any]:
        """Rank 0 reads the checkpoint and sends it to the others (no shared file system needed)."""
        state = error = None
        if self.rank == 0:
            try:
                state = load_checkpoint(checkpoint)
            except Exception as e:  # noqa: BLE001
                error = e
        self._agree(error, f"reading the checkpoint {checkpoint}")
        return self._broadcast(state)

    def _check_new_checkpoint(self, checkpoint: str) -> None:
        """Rank 0, the only writer, checks the path; if it refuses, every rank stops."""
        error = None
        if self.rank == 0:
            try:
                super()._check_new_checkpoint(checkpoint)
            except ValueError as e:
                error = e
        self._agree(error, f"checking the checkpoint path {checkpoint}")

    def _train_epoch(self, model, optimizer, scaler, epoch, measure=False):
        self._barrier()  # rank 0 may still be evaluating / checkpointing the previous epoch
        if self._fail_at is not None and self._fail_at[:2] == (self.rank, epoch):
            hang = self._fail_at[2]
            print(f"rank {self.rank}: {FAIL_ENV} says {'hang' if hang else 'exit'} at epoch {epoch}",
                  file=sys.stderr, flush=True)
            if hang:
                time.sleep(24 * 3600)
            os._exit(1)
        _seed_all(rank_seed(self._run_seed, self.rank, epoch))
        loss, report = super()._train_epoch(model, optimizer, scaler, epoch, measure=measure)
        total = torch.tensor([loss], dtype=torch.float64)
        dist.all_reduce(total, group=self.ctx.control)  # every rank made the same number of steps
        return float(total.item()) / self.world_size, report

    @torch.no_grad()
    def evaluate(self, model) -> Dict[str, float]:
        """Rank 0 evaluates (the plain module: no DDP collectives on one rank) and sends the metrics to the
        others, which wait meanwhile (control group: the long timeout)."""
        metrics = error = None
        if self.rank == 0:
            try:
                metrics = super().evaluate(_unwrap(model))
            except Exception as e:  # noqa: BLE001
                error = e
        self._agree(error, "evaluating")
        return self._broadcast(metrics)

    def run(self, run: int, **kwargs) -> RunResult:
        result = super().run(run, **kwargs)
        self._barrier()
        hashes: List[Any] = [None] * self.world_size
        dist.all_gather_object(hashes, _param_hash(_unwrap(self.model)), group=self.ctx.control)
        self.replica_hashes.append(hashes)
        if len(set(hashes)) != 1:
            raise DistributedError(f"run {run + 1}: the model replicas differ across ranks after training "
                                   f"(parameter hashes {hashes})")
        return self._broadcast(result if self.rank == 0 else None)

    def fit(self, **kwargs) -> TrainResults:
        try:
            results = super().fit(**kwargs)
        except Exception as e:
            if _is_comm_error(e) and not isinstance(e, DistributedError):
                raise DistributedError(f"rank {self.rank}: a collective operation failed, another rank has "
                                       f"probably exited or hangs ({_first_line(e)}); resume from the last "
                                       "checkpoint") from e
            raise
        results.environment["distributed"] = {"world_size": self.world_size, "backend": self.ctx.backend,
                                              "timeout_s": self.ctx.timeout, "replica_hashes": self.replica_hashes}
        return results


def _parse_fail_at():
    value = os.environ.get(FAIL_ENV)
    if not value:
        return None
    parts = value.split(":")
    try:
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "hang"):
            raise ValueError
        return int(parts[0]), int(parts[1]), len(parts) == 3
    except ValueError:
        raise ValueError(f"{FAIL_ENV} must be RANK:EPOCH or RANK:EPOCH:hang, got {value!r}") from None


# ------------------------------------------------------------------------------------------------
# One process doing the global steps of a W-process run
# ------------------------------------------------------------------------------------------------
class GlobalBatchTrainer(Trainer):
    """Single-process emulation of a ``global_batch``-process :class:`DistributedTrainer` run.

    Each optimiser step takes the ``W = global_batch`` batches that ranks ``0 .. W-1`` would take in that
    step, runs them one after the other, each with rank ``r``'s random stream (:func:`rank_seed`, carried
    from step to step as each rank's would be), and backpropagates ``loss_r / W``: the gradient DDP's
    averaging gives. The reported epoch loss is the mean over all batches, as the distributed run reports.
    (Models with BatchNorm: training-mode statistics match; the running statistics used for evaluation do
    not, since DDP keeps rank 0's.)
    """

    def __init__(self, config: TrainConfig, global_batch: int, dataset=None, progress: Optional[bool] = None,
                 log: Callable[[str], None] = print):
        if config.sampler == "full":
            raise ValueError(FULL_GRAPH_ERROR)
        if global_batch < 1:
            raise ValueError(f"global_batch must be >= 1, got {global_batch}")
        self.global_batch = int(global_batch)
        self._run_seed = config.seed
        super().__init__(config, dataset, progress, log)

    def _make_sampler(self, **kwargs):
        base = super()._make_sampler(**kwargs)
        self.shares = []
        for r in range(self.global_batch):  # the same sampler (partition, norms) seen as rank r of W
            share = copy.copy(base)
            share.rank, share.world_size, share.even = r, self.global_batch, True
            self.shares.append(share)
        if len(self.shares[0]) < 1:
            raise ValueError(f"{base.num_global_batches} batch(es) per epoch cannot make a global batch of "
                             f"{self.global_batch}")
        return self.shares[0]

    def build(self, seed: int):
        self._run_seed = seed
        return super().build(seed)

    def _rng_state(self):
        return (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None)

    def _set_rng_state(self, state):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    def _train_epoch(self, model, optimizer, scaler, epoch, measure=False):
        cfg, W = self.cfg, self.global_batch
        states = []
        for r in range(W):
            _seed_all(rank_seed(self._run_seed, r, epoch))
            states.append(self._rng_state())
        streams = [share.iter_epoch(epoch) for share in self.shares]
        losses = []
        for _ in range(len(self.shares[0])):
            optimizer.zero_grad(set_to_none=True)
            for r in range(W):
                self._set_rng_state(states[r])
                loss, _ = self._forward_loss(model, self._batch_inputs(next(streams[r])))
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"training loss became {loss.item()}; lower --lr or set --grad-norm")
                part = loss / W
                (scaler.scale(part) if scaler is not None else part).backward()
                states[r] = self._rng_state()
                losses.append(float(loss.detach()))
            if scaler is not None:
                scaler.unscale_(optimizer)
            if cfg.grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
        return (math.fsum(losses) / len(losses) if losses else float("nan")), None


# ------------------------------------------------------------------------------------------------
# Launcher: dgl-exact train --nproc N
# ------------------------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one, else all)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _check_cpu_workers(nproc: int) -> None:
    """CPU workers are full training processes (each its own copy of the graph, the model, the activations
    and a torch runtime): more of them than cores only multiply memory and contention."""
    cores = cpu_cores()
    if nproc > cores and os.environ.get(OVERSUBSCRIBE_ENV) != "1":
        raise ValueError(f"--nproc {nproc} on the CPU would start {nproc} training processes on {cores} CPU core(s); "
                         f"each holds its own graph, model and activations, so more processes than cores only add "
                         f"memory and contention: use --nproc {cores} or fewer (or set {OVERSUBSCRIBE_ENV}=1 to "
                         "start them anyway)")


def _worker_preexec():
    """In a worker, before exec: its own process group, so that a terminal's Ctrl-C (SIGINT to the
    foreground group) reaches only the launcher, which then stops the workers quietly; and (Linux) SIGTERM
    when the launcher dies, so no worker outlives it."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except Exception:  # noqa: BLE001 - best effort
            pass


def launch(nproc: int, config: TrainConfig, args: Sequence[str] = (), *, grace: float = 10.0,
           timeout: Optional[float] = None, env: Optional[Dict[str, str]] = None,
           log: Callable[[str], None] = None) -> int:
    """Run ``dgl-exact train`` with ``config`` in ``nproc`` worker processes on this machine; return the
    exit status (0, or that of the first worker that failed).

    ``args`` are further ``train`` options for the workers (``--json``, ``--checkpoint``, ...). The
    workers get torchrun's environment (``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``, ``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) and, unless set, ``OMP_NUM_THREADS`` = CPU cores
    / ``nproc``. When a worker exits non-zero the others get ``grace`` seconds to notice and exit by
    themselves, then SIGTERM, then SIGKILL. With ``timeout`` (seconds) all workers are stopped after that
    long and 124 is returned.

    On the CPU at most :func:`cpu_cores` workers are started (``ValueError`` beyond, unless the environment
    sets ``DGL_EXACT_OVERSUBSCRIBE=1``). Workers run in their own process group: a Ctrl-C (or SIGTERM) of
    the launcher reaches the launcher alone, which logs one line, sends every worker SIGTERM (a worker
    still starting up just ends; one that trains stops like an interrupted ``train``, keeping its last
    checkpoint, silently) and returns 130; a second Ctrl-C kills them at once.
    """
    import yaml

    if log is None:
        def log(msg):
            print(msg, file=sys.stderr, flush=True)
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    if config.device in ("auto", "cuda") and torch.cuda.is_available():
        if nproc > torch.cuda.device_count():
            raise ValueError(f"--nproc {nproc} needs {nproc} GPUs (one per process, NCCL), torch sees "
                             f"{torch.cuda.device_count()}: use fewer processes or --device cpu")
    elif not str(config.device).startswith("cuda"):
        _check_cpu_workers(nproc)
    base = dict(os.environ if env is None else env)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    base["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in [base.get("PYTHONPATH")] if p])
    if "OMP_NUM_THREADS" not in base:
        base["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    folder = tempfile.mkdtemp(prefix="dgl-exact-launch-")
    conf = os.path.join(folder, "config.yaml")
    with open(conf, "w") as f:
        yaml.safe_dump(config.to_dict(), f)
    command = [sys.executable, "-m", "dgl_exact", "train", "--conf", conf, *args]
    port = free_port()
    procs: List[subprocess.Popen] = []
    started = time.time()
    try:
        for rank in range(nproc):
            child_env = {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                         "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
                         "GROUP_RANK": "0", "NODE_RANK": "0", CHILD_ENV: "1"}
            procs.append(subprocess.Popen(command, env=child_env,
                                          preexec_fn=_worker_preexec if os.name == "posix" else None))
        return _monitor(procs, grace, log, timeout)
    except KeyboardInterrupt:
        log(_interrupted_line(procs, args, started))
        _stop_interrupted(procs)
        return 130
    finally:
        _stop_interrupted(procs)
        try:
            os.unlink(conf)
            os.rmdir(folder)
        except OSError:
            pass


def _monitor(procs: List[subprocess.Popen], grace: float, log, timeout: Optional[float] = None) -> int:
    failed, deadline, terminated = None, None, False
    reported = set()
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        if end is not None and time.monotonic() > end:
            log(f"error: the workers did not finish within {timeout:g} s: stopping them")
            _stop(procs, signal.SIGTERM, 10.0)
            return 124
        running = 0
        for rank, p in enumerate(procs):
            code = p.poll()
            if code is None:
                running += 1
            elif code != 0 and rank not in reported:
                # Ranks that fail together (one dies, the others' collectives fail at once) may all be seen in
                # one poll: report each, since which one failed first is then unknown.
                reported.add(rank)
                if failed is None:
                    failed = (rank, code)
                    deadline = time.monotonic() + grace
                log(f"error: rank {rank} exited with status {code}"
                    + ("; stopping the other ranks" if failed[0] == rank else ""))
        if running == 0:
            break
        if failed is not None and not terminated and time.monotonic() > deadline:
            log(f"error: {running} rank(s) still running {grace:g} s after rank {failed[0]} failed: terminating them")
            _stop(procs, signal.SIGTERM, 10.0)
            terminated = True
        time.sleep(0.1)
    if failed is None:
        return 0
    return failed[1] if failed[1] > 0 else 1


def _interrupted_line(procs: List[subprocess.Popen], args: Sequence[str], started: float) -> str:
    """The launcher's one line on Ctrl-C (the workers say nothing): what is stopped, what is kept."""
    args = list(args)
    running = sum(p.poll() is None for p in procs)
    line = f"interrupted: stopping {running} worker process(es)"
    if "--checkpoint" in args[:-1]:
        checkpoint = args[args.index("--checkpoint") + 1]
        try:
            saved = os.path.getmtime(checkpoint) >= started or "--resume" in args
        except OSError:
            saved = False
        line += (f"; the last finished epoch is saved in {checkpoint}: rerun with --resume" if saved else
                 f"; no epoch finished: no checkpoint was written to {checkpoint}")
    return line


def _stop_interrupted(procs: List[subprocess.Popen]) -> None:
    """SIGTERM to every worker, SIGKILL after 10 s; another Ctrl-C meanwhile kills them at once."""
    try:
        _stop(procs, signal.SIGTERM, 10.0)
    except KeyboardInterrupt:
        _stop(procs, signal.SIGKILL, 10.0)


def _stop(procs: List[subprocess.Popen], sig, wait: float) -> None:
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        try:
            p.send_signal(sig)
        except OSError:
            pass
    end = time.monotonic() + wait
    for p in alive:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
