"""One worker of a data-parallel run: :class:`DistributedTrainer` (see :mod:`dgl_exact.training.distributed`)."""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Dict, List, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..checkpoint import RunState
from ..config import TrainConfig
from ..trainer import RunResult, Trainer, TrainResults, unwrap_model
from .environment import (FULL_GRAPH_ERROR, DistributedError, first_line, init_distributed, is_comm_error, rank_seed,
                          seed_all)

__all__ = ["DistributedTrainer"]


def _param_hash(module: torch.nn.Module) -> str:
    h = hashlib.blake2b(digest_size=8)
    for name, p in module.named_parameters():
        h.update(name.encode())
        h.update(p.detach().to("cpu", copy=True).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


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
        self.replica_hashes: List[List[str]] = []
        if dataset is None:  # one loader per machine first: loaders may process raw files on first use
            from ...data import load_dataset

            dataset = self._staged(lambda: load_dataset(config.dataset, config.data_root, seed=config.seed,
                                                        standardize=config.standardize, compact=True),
                                   first=ctx.local_rank == 0, what="loading the dataset")
        super().__init__(config.replace(device=str(ctx.device)), dataset, progress, log, rank=ctx.rank,
                         world_size=ctx.world_size)

    # --- collectives on the control group -----------------------------------------------------------
    def _barrier(self) -> None:
        dist.barrier(group=self.ctx.control)

    def _agree(self, error: Optional[BaseException], what: str) -> None:
        """Raise on every rank if ``what`` failed on any: the failing rank re-raises its own error."""
        gathered: List[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, None if error is None else f"{type(error).__name__}: {first_line(error)}",
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
    def make_sampler(self, assignment=None):
        """Every rank gets the same sampler: ClusterGCN with rank 0's METIS partition (METIS is not
        deterministic); GraphSAINT's normalisation is computed (and cached) by rank 0 first."""
        cfg = self.cfg
        if cfg.sampler == "cluster":  # METIS is not deterministic: everyone uses rank 0's partition
            sampler = error = None
            if self.rank == 0:
                try:
                    sampler = super().make_sampler()
                except Exception as e:  # noqa: BLE001
                    error = e
            self._agree(error, "partitioning the graph (METIS)")
            assignment = self._broadcast(sampler.assignment if self.rank == 0 else None)
            if self.rank != 0:
                sampler = super().make_sampler(assignment=assignment)
        else:  # GraphSAINT pre-sampling is a pure function of the seed: rank 0 writes the cache, others read it
            # (neighbour sampling prepares nothing: every rank builds the same sampler)
            sampler = self._staged(super().make_sampler, first=self.rank == 0,
                                   what="preparing the GraphSAINT normalisation" if cfg.sampler == "saint"
                                   else "preparing the sampler")
        if len(sampler) < 1:
            raise ValueError(f"{sampler.num_global_batches} batch(es) per epoch cannot feed {self.world_size} "
                             "processes: use fewer processes or smaller batches (--saint-budget, --num-parts, "
                             "--parts-per-batch, --batch-size)")
        return sampler

    def wrap_model(self, model):
        """DDP around the model, which :meth:`build` initialised from the same seed on every rank."""
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # Every parameter of every model gets a gradient in every step (the loss depends on all of them,
        # even for a batch without training nodes): no need for find_unused_parameters.
        return DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=False)

    def read_checkpoint(self, checkpoint: str) -> RunState:
        """Rank 0 reads the checkpoint and sends it to the others (no shared file system needed)."""
        state = error = None
        if self.rank == 0:
            try:
                state = RunState.load(checkpoint)
            except Exception as e:  # noqa: BLE001
                error = e
        self._agree(error, f"reading the checkpoint {checkpoint}")
        return self._broadcast(state)

    def check_new_checkpoint(self, checkpoint: str) -> None:
        """Rank 0, the only writer, checks the path; if it refuses, every rank stops."""
        error = None
        if self.rank == 0:
            try:
                super().check_new_checkpoint(checkpoint)
            except ValueError as e:
                error = e
        self._agree(error, f"checking the checkpoint path {checkpoint}")

    def train_epoch(self, model, optimizer, scaler, epoch, measure=False):
        """This rank's share of the epoch's global batches, from this rank's random stream of the epoch
        (:func:`rank_seed`); returns the loss averaged over all ranks."""
        self._barrier()  # rank 0 may still be evaluating / checkpointing the previous epoch
        seed_all(rank_seed(self.run_seed, self.rank, epoch))
        loss, report = super().train_epoch(model, optimizer, scaler, epoch, measure=measure)
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
                metrics = super().evaluate(unwrap_model(model))
            except Exception as e:  # noqa: BLE001
                error = e
        self._agree(error, "evaluating")
        return self._broadcast(metrics)

    def finish_run(self, model, result: RunResult) -> RunResult:
        """Check that the replicas of every rank agree bit for bit; every rank returns rank 0's result."""
        self._barrier()
        hashes: List[Any] = [None] * self.world_size
        dist.all_gather_object(hashes, _param_hash(unwrap_model(model)), group=self.ctx.control)
        self.replica_hashes.append(hashes)
        if len(set(hashes)) != 1:
            raise DistributedError(f"run {result.run + 1}: the model replicas differ across ranks after training "
                                   f"(parameter hashes {hashes})")
        return self._broadcast(result if self.rank == 0 else None)

    def fit(self, **kwargs) -> TrainResults:
        try:
            results = super().fit(**kwargs)
        except Exception as e:
            if is_comm_error(e) and not isinstance(e, DistributedError):
                raise DistributedError(f"rank {self.rank}: a collective operation failed, another rank has "
                                       f"probably exited or hangs ({first_line(e)}); resume from the last "
                                       "checkpoint") from e
            raise
        results.environment["distributed"] = {"world_size": self.world_size, "backend": self.ctx.backend,
                                              "timeout_s": self.ctx.timeout, "replica_hashes": self.replica_hashes}
        return results
