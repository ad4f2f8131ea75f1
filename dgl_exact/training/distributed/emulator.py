"""One process performing the global steps of a ``W``-process data-parallel run (what the tests compare a
distributed run against): :class:`GlobalBatchTrainer`."""
from __future__ import annotations

import copy
import math
from typing import Callable, Optional

import torch

from ..config import TrainConfig
from ..trainer import Trainer
from .environment import FULL_GRAPH_ERROR, rank_seed, seed_all

__all__ = ["GlobalBatchTrainer"]


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
        super().__init__(config, dataset, progress, log)

    def make_sampler(self, assignment=None):
        """The sampler of rank 0; ``shares``: the same sampler seen as each rank ``r`` of ``W``."""
        base = super().make_sampler(assignment)
        self.shares = []
        for r in range(self.global_batch):  # the same sampler (partition, norms) seen as rank r of W
            share = copy.copy(base)
            share.rank, share.world_size, share.even = r, self.global_batch, True
            self.shares.append(share)
        if len(self.shares[0]) < 1:
            raise ValueError(f"{base.num_global_batches} batch(es) per epoch cannot make a global batch of "
                             f"{self.global_batch}")
        return self.shares[0]

    def recorded(self):
        """The checkpoint's record of this run: that of a ``global_batch``-process run (its steps are theirs)."""
        return {**super().recorded(), "world_size": self.global_batch}

    def _rng_state(self):
        return (torch.get_rng_state(), torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None)

    def _set_rng_state(self, state):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    def train_epoch(self, model, optimizer, scaler, epoch, measure=False):
        """The epoch's global steps: per step, each rank's batch with its random stream, backpropagated
        with weight ``1/W``, then one :meth:`optimizer_step`. No memory report."""
        W = self.global_batch
        states = []
        for r in range(W):
            seed_all(rank_seed(self.run_seed, r, epoch))
            states.append(self._rng_state())
        streams = [share.iter_epoch(epoch) for share in self.shares]
        losses = []
        for _ in range(len(self.shares[0])):
            optimizer.zero_grad(set_to_none=True)
            for r in range(W):
                self._set_rng_state(states[r])
                loss, _ = self._forward_loss(model, self._batch_inputs(next(streams[r])))
                losses.append(self.backward(loss, scaler, parts=W))
                states[r] = self._rng_state()
            self.optimizer_step(model, optimizer, scaler)
        return (math.fsum(losses) / len(losses) if losses else float("nan")), None
