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

Modules
    :mod:`.environment` (process group, devices, per-rank seeds, errors), :mod:`.trainer`
    (:class:`DistributedTrainer`), :mod:`.emulator` (:class:`GlobalBatchTrainer`) and :mod:`.launcher`
    (:func:`launch`). Everything public is importable from this package.
"""
from .emulator import GlobalBatchTrainer
from .environment import (CHILD_ENV, DEFAULT_SETUP_TIMEOUT, DEFAULT_TIMEOUT, FULL_GRAPH_ERROR, SETUP_TIMEOUT_ENV,
                          TIMEOUT_ENV, DistContext, DistributedError, device_for_rank, exit_worker,
                          in_distributed_env, init_distributed, is_launched_child, rank_seed, shutdown)
from .launcher import OVERSUBSCRIBE_ENV, cpu_cores, free_port, launch
from .trainer import DistributedTrainer

__all__ = ["DistributedTrainer", "GlobalBatchTrainer", "DistributedError", "DistContext", "init_distributed",
           "shutdown", "exit_worker", "launch", "in_distributed_env", "is_launched_child", "rank_seed",
           "device_for_rank", "free_port", "cpu_cores", "DEFAULT_TIMEOUT", "DEFAULT_SETUP_TIMEOUT", "TIMEOUT_ENV",
           "SETUP_TIMEOUT_ENV", "CHILD_ENV", "FULL_GRAPH_ERROR", "OVERSUBSCRIBE_ENV"]
