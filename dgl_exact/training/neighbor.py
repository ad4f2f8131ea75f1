"""Neighbour-sampled mini-batches (GraphSAGE, Hamilton et al., NeurIPS 2017) through DGL's own sampler.

A batch is ``batch_size`` seed nodes (training nodes) with one DGL block per layer, sampled by
``dgl.dataloading.NeighborSampler(fanouts)``: block ``l`` holds up to ``fanouts[l]`` sampled in-edges of
every destination node of layer ``l`` (``-1``: all of them), as in DGL's GraphSAGE example
(``examples/pytorch/graphsage/node_classification.py``). The model runs on the blocks
(``model(blocks, feat)``) and its output rows are the seed nodes.

Reproducibility and resume, as every :class:`~dgl_exact.training.samplers.BatchSampler`: the seed nodes
of an epoch are one permutation of the training nodes drawn from ``(seed, epoch)``, cut into batches in
order, and DGL's sampling RNG is seeded from ``(seed, epoch, batch index)`` before each batch is sampled
(``dgl.seed``). An epoch's batches are therefore a pure function of ``(seed, epoch)``: ``iter_epoch(epoch,
start=k)`` yields exactly the batches ``k, k + 1, ...`` of an uninterrupted epoch, and the ranks of a
distributed run take global batches ``rank, rank + world_size, ...`` without communicating.

Memory: a batch holds its blocks (structure only: sampling runs on a feature-free view of the graph, so
no node data is copied into blocks), the input nodes' features and the seed nodes' labels; nothing is
cached across batches.

Devices: sampling runs where DGL can hold the graph. PyPI's DGL 2.1 is CPU-only: blocks are sampled on the
CPU and the features moved to the training device (dgl_exact's ops export a CPU block's structure to the
features' device). With a CUDA build of DGL, :meth:`BlockBatch.to` moves the blocks too.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, List, Optional, Sequence

import numpy as np
import torch

from .._compat import dgl_supports_device, import_dgl
from .samplers import Batch, BatchSampler, structure_only

dgl = import_dgl()

__all__ = ["BlockBatch", "NeighborSampler", "parse_fanouts", "format_fanouts", "DEFAULT_FANOUT",
           "DEFAULT_BATCH_SIZE", "DEFAULT_EVAL_BATCH_SIZE"]

#: fan-out per layer when none is given (DGL's GraphSAGE example: 10 per layer)
DEFAULT_FANOUT = 10
#: seed nodes per batch when none is given (DGL's GraphSAGE example)
DEFAULT_BATCH_SIZE = 1024
#: destination nodes per batch of the layer-wise full-neighbour evaluation (DGL's example: 4096)
DEFAULT_EVAL_BATCH_SIZE = 4096

_STREAM_NEIGHBOR = 2  # a stream of the base seed of its own (the samplers module uses 0 and 1)


MAX_FANOUT = 2**31 - 1  # a fan-out above a node's in-degree takes all its in-neighbours; DGL's take int64


def parse_fanouts(text: Any) -> List[int]:
    """Fan-outs from ``"15,10,5"`` (or a list/tuple of ints): one int per layer, each positive or ``-1`` (all
    in-neighbours, as DGL). ValueError saying what to write otherwise."""
    if isinstance(text, (list, tuple)):
        items = list(text)
    elif isinstance(text, str):
        items = [s.strip() for s in text.split(",")]
    else:
        raise ValueError(f"fanouts must be comma-separated ints such as 15,10,5, got {text!r}")
    out = []
    for item in items:
        if isinstance(item, bool):
            value = None
        elif isinstance(item, (int, np.integer)):
            value = int(item)
        else:
            try:
                value = int(str(item))
            except ValueError:
                value = None
        if value is None or not (1 <= value <= MAX_FANOUT or value == -1):
            raise ValueError(f"fanouts must be comma-separated ints, each from 1 to {MAX_FANOUT} or -1 (all "
                             f"neighbours), such as 15,10,5; got {text!r}")
        out.append(value)
    if not out:
        raise ValueError("fanouts must name one fan-out per layer, such as 15,10,5")
    return out


def format_fanouts(fanouts: Sequence[int]) -> str:
    """The canonical text of ``fanouts`` (``15,10,5``), as configs and checkpoints store it."""
    return ",".join(str(int(f)) for f in fanouts)


def _dgl_seed(seed: int, *keys: int) -> int:
    """A seed for ``dgl.seed`` (31 bits: DGL takes a C int) from ``(seed, *keys)``, independent across keys."""
    return int(np.random.SeedSequence([seed, _STREAM_NEIGHBOR, *keys]).generate_state(1, dtype=np.uint32)[0] >> 1)


@contextlib.contextmanager
def _one_sampling_thread(active: bool = True) -> Iterator[None]:
    """DGL's OpenMP sampling in one thread inside the block: DGL seeds one random engine per thread and
    hands nodes to threads in no fixed order, so with several threads ``dgl.seed`` does not fix the
    sample (seen with 2 threads: the same seed, different blocks)."""
    if not active:
        yield
        return
    before = dgl.utils.get_num_threads()
    dgl.utils.set_num_threads(1)
    try:
        yield
    finally:
        dgl.utils.set_num_threads(before)


@dataclass
class BlockBatch(Batch):
    """One neighbour-sampled batch: ``blocks`` (one per layer, first layer first) and the node data the
    step needs.

    ``graph`` is the list of blocks (what a model takes); ``node_data`` holds ``feat`` (rows of the first
    block's source nodes), ``label`` and ``train_mask`` (rows of the last block's destination nodes, the
    seed nodes: all of them are training nodes, so the mask is all true). ``input_nodes`` / ``seeds``:
    parent ids of the first block's sources and of the seeds.
    """

    input_nodes: Optional[torch.Tensor] = None
    seeds: Optional[torch.Tensor] = None
    blocks: List[Any] = field(default_factory=list)

    @property
    def node_ids(self) -> torch.Tensor:
        """Parent-graph ids of the seed nodes (the rows of the model's output)."""
        return self.seeds

    def to(self, device, keys: Optional[Sequence[str]] = None, non_blocking: bool = False) -> "BlockBatch":
        """A copy with node data (``keys``, default all) on ``device``; the blocks move too where DGL supports
        the device (PyPI's CPU-only DGL keeps them on the CPU)."""
        device = torch.device(device)
        keys = list(self.node_data) if keys is None else list(keys)
        blocks = self.blocks
        if blocks and blocks[0].device != device and dgl_supports_device(device):
            blocks = [b.to(device) for b in blocks]
        return replace(self, graph=blocks, blocks=blocks,
                       node_data={k: self.node_data[k].to(device, non_blocking=non_blocking) for k in keys})


class NeighborSampler(BatchSampler):
    """Neighbour-sampled blocks for the seed nodes ``train_nodes``, sampled by DGL's
    ``dgl.dataloading.NeighborSampler`` (see the module docstring).

    Parameters
    ----------
    g : DGLGraph
        The graph (CPU), with ``feat`` and ``label`` in ``ndata``.
    fanouts : sequence of int
        Sampled in-edges per destination node, one per layer, first layer first; ``-1``: all.
    batch_size : int
        Seed nodes per batch; the last batch of an epoch may hold fewer.
    train_nodes : Tensor, optional
        Parent ids of the seed nodes; default the nodes of ``g.ndata["train_mask"]``, else all nodes.
    replace : bool, default False
        Sample neighbours with replacement (DGL's option).
    deterministic : bool, default True
        Sample each batch in one OpenMP thread, so that a batch is a pure function of ``(seed, epoch,
        index)`` (resume, distributed ranks); False: DGL's threads, faster on large graphs, not reproducible.
    seed, rank, world_size, even
        See :class:`~dgl_exact.training.samplers.BatchSampler`.
    """

    def __init__(self, g, fanouts: Sequence[int], batch_size: int = DEFAULT_BATCH_SIZE, *,
                 train_nodes: Optional[torch.Tensor] = None, replace: bool = False, deterministic: bool = True,
                 **kwargs):
        super().__init__(g, **kwargs)
        self.fanouts = parse_fanouts(list(fanouts))
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if train_nodes is None:
            mask = g.ndata.get("train_mask")
            train_nodes = (torch.nonzero(mask, as_tuple=True)[0] if mask is not None
                           else torch.arange(g.num_nodes()))
        train_nodes = torch.as_tensor(train_nodes).to(torch.int64).cpu()
        if train_nodes.numel() == 0:
            raise ValueError("no seed nodes to sample around: the training split is empty")
        if int(train_nodes.min()) < 0 or int(train_nodes.max()) >= g.num_nodes():
            raise ValueError(f"train_nodes must be node ids in [0, {g.num_nodes()})")
        self.train_nodes = train_nodes
        self.batch_size = int(batch_size)
        self.deterministic = bool(deterministic)
        self.sampler = dgl.dataloading.NeighborSampler(self.fanouts, replace=replace)
        self._structure = structure_only(g)  # blocks copy no node data; features are sliced per batch
        self._feat = g.ndata["feat"]
        self._label = g.ndata["label"]

    @property
    def num_global_batches(self) -> int:
        return -(-self.train_nodes.numel() // self.batch_size)

    def _plan_epoch(self, epoch: int, gen: torch.Generator):
        """``(epoch, the epoch's permutation of the seed nodes)``."""
        return int(epoch), self.train_nodes[torch.randperm(self.train_nodes.numel(), generator=gen)]

    def sample_blocks(self, seeds: torch.Tensor, dgl_seed: Optional[int] = None) -> tuple:
        """``(input nodes, seed nodes, blocks)`` of ``seeds`` (parent ids, int64): DGL's neighbour sampling,
        seeded with ``dgl_seed`` if given; no node data is gathered."""
        seeds = seeds.to(self._structure.idtype)
        with _one_sampling_thread(dgl_seed is not None and self.deterministic):
            if dgl_seed is not None:
                dgl.seed(dgl_seed)
            input_nodes, output_nodes, blocks = self.sampler.sample_blocks(self._structure, seeds)
        return input_nodes.long(), output_nodes.long(), blocks

    def blocks_of(self, epoch: int, index: int) -> tuple:
        """``(input nodes, seed nodes, blocks)`` of global batch ``index`` of ``epoch``: the structure of the
        batch :meth:`iter_epoch` yields there (the same seeds, the same sample), without gathering its
        features. What memory planning reads (block sizes) costs sampling only."""
        epoch, perm = self.epoch_plan(epoch)
        seeds = perm[index * self.batch_size:(index + 1) * self.batch_size]
        return self.sample_blocks(seeds, _dgl_seed(self.seed, epoch, index))

    def sample(self, seeds: torch.Tensor, dgl_seed: Optional[int] = None) -> BlockBatch:
        """The batch of ``seeds`` (parent ids): DGL's neighbour sampling, seeded with ``dgl_seed`` if given."""
        inp, out, blocks = self.sample_blocks(seeds, dgl_seed)
        node_data = {"feat": self._feat[inp], "label": self._label[out],
                     "train_mask": torch.ones(out.numel(), dtype=torch.bool)}
        return BlockBatch(graph=blocks, node_data=node_data, input_nodes=inp, seeds=out, blocks=blocks)

    def _make_batch(self, plan, index: int, gen: torch.Generator) -> BlockBatch:
        epoch, perm = plan
        seeds = perm[index * self.batch_size:(index + 1) * self.batch_size]
        return self.sample(seeds, _dgl_seed(self.seed, epoch, index))

    def block_sizes(self, num_batches: int = 4, epoch: int = 0) -> List[dict]:
        """Sizes of the first ``num_batches`` batches of ``epoch`` (what memory planning needs): per batch the
        seed count, input-node count and per-block ``(num_src, num_dst, num_edges)``."""
        out = []
        for index in self.batch_indices()[:num_batches]:
            inp, seeds, blocks = self.blocks_of(epoch, index)
            out.append({"seeds": int(seeds.numel()), "input_nodes": int(inp.numel()),
                        "blocks": [(b.num_src_nodes(), b.num_dst_nodes(), b.num_edges()) for b in blocks]})
        return out
