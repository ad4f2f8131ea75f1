"""Mini-batch samplers: each one yields, per epoch, the subgraphs a trainer steps on.

Two samplers share one interface (:class:`BatchSampler`; full-graph training uses no sampler):

- :class:`SAINTSampler`: GraphSAINT node / edge / random-walk subgraphs (Zeng et al., ICLR 2020) with
  the paper's loss and aggregation normalisations, estimated by pre-sampling.
- :class:`ClusterGCNSampler`: Cluster-GCN (Chiang et al., KDD 2019): METIS partitions, several per
  batch, the batch being the subgraph induced by their union.

Sampling runs on the CPU (PyPI's DGL is CPU-only); :meth:`Batch.to` moves a batch's node data and
normalisations to the training device and leaves the graph structure where DGL can hold it.

Reproducibility. Every random draw comes from a ``torch.Generator`` seeded from
``(seed, stream, epoch, batch index)``, never from global RNG state. An epoch's batches are therefore
a pure function of ``(seed, epoch)``: a resumed run (``set_epoch`` plus ``start=``) sees exactly the
batches of an uninterrupted one, and ranks of a distributed run agree on the global batch order
without communicating; rank ``r`` of ``W`` takes global batches ``r, r + W, r + 2W, ...``.

Applying the normalisations (what a trainer must do). For a batch with per-node losses ``l_v``::

    loss = (l * batch.node_norm)[train_mask].sum()   # SAINT: an unbiased full-graph loss estimate
    loss = l[train_mask].mean()                      # others

and, where ``batch.edge_norm`` is not ``None``, every aggregation scales the message of edge
``e = (u -> v)`` (``e`` a subgraph edge id) by ``edge_norm[e]`` on top of the *full-graph*
normalisation of the layer::

    h_v = sum_{u in N_S(v)} edge_norm[u->v] * A_norm[v, u] * x_u

with ``A_norm`` computed from full-graph degrees (mean: ``1 / deg_G(v)``; GCN:
``1 / sqrt(deg_G(u) deg_G(v))``), e.g. from degrees stored in ``g.ndata`` before sampling (node data is
carried into every batch). Using the subgraph's own degrees instead gives a biased estimator.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch

from .._compat import dgl_supports_device, import_dgl
from .sampler_cache import CacheWarning, cache_key, graph_fingerprint, read_cache, write_cache

dgl = import_dgl()

__all__ = ["Batch", "BatchSampler", "SAINTSampler", "ClusterGCNSampler", "with_degrees",
           "CacheWarning", "graph_fingerprint"]

# Independent random streams derived from one seed.
_STREAM_EPOCH = 0      # per-epoch, per-batch draws
_STREAM_PRESAMPLE = 1  # GraphSAINT pre-sampling for the normalisation estimate


def _generator(seed: int, *keys: int) -> torch.Generator:
    """A CPU generator seeded from ``(seed, *keys)``, statistically independent across distinct keys."""
    state = np.random.SeedSequence([seed, *keys]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def structure_only(g):
    """A view of ``g`` without node/edge data (shares the structure; ``g`` itself is untouched)."""
    view = g.local_var()
    for key in list(view.ndata.keys()):
        view.ndata.pop(key)
    for key in list(view.edata.keys()):
        view.edata.pop(key)
    return view


def _sample_categorical(cdf: torch.Tensor, num: int, gen: torch.Generator) -> torch.Tensor:
    """``num`` i.i.d. draws from the distribution with cumulative weights ``cdf`` (float64).

    Inverse-CDF sampling: unlike ``torch.multinomial`` it has no 2**24 category limit (edge sampling on
    ogbn-products draws from 1.2e8 edges).
    """
    u = torch.rand(num, generator=gen, dtype=torch.float64) * cdf[-1]
    return torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.numel() - 1)


# ------------------------------------------------------------------------------------------------
# Batch
# ------------------------------------------------------------------------------------------------
@dataclass
class Batch:
    """One training step's subgraph.

    Attributes
    ----------
    graph : DGLGraph
        The (sub)graph, on the CPU unless DGL could move it. Its ``ndata`` holds the parent graph's node
        data sliced to the batch (``feat``, ``label``, ``train_mask``, ...) and ``dgl.NID`` (parent node
        ids); subgraphs also hold ``dgl.EID`` (parent edge ids) in ``edata``.
    node_norm : Tensor or None
        GraphSAINT loss weight per batch node, ``(num_nodes,)``; ``None`` for unweighted samplers.
        See the module docstring.
    edge_norm : Tensor or None
        GraphSAINT aggregation weight per batch edge, ``(num_edges,)`` indexed by subgraph edge id;
        multiply message ``u -> v`` by it (see the module docstring). ``None`` where not applicable.
    node_data : dict
        Node tensors of the batch (initially ``graph.ndata``'s, on the CPU; after :meth:`to` the moved
        copies). Read them through :attr:`feat`, :attr:`label`, :attr:`train_mask` or ``node_data[k]``.
    epoch, index : int
        The epoch and the *global* batch index within it (the same on every rank).
    """

    graph: Any
    node_norm: Optional[torch.Tensor] = None
    edge_norm: Optional[torch.Tensor] = None
    epoch: int = 0
    index: int = 0
    node_data: Optional[Dict[str, torch.Tensor]] = None

    def __post_init__(self):
        if self.node_data is None:
            self.node_data = dict(self.graph.ndata.items())

    @property
    def feat(self) -> torch.Tensor:
        return self.node_data["feat"]

    @property
    def label(self) -> torch.Tensor:
        return self.node_data["label"]

    @property
    def train_mask(self) -> Optional[torch.Tensor]:
        return self.node_data.get("train_mask")

    @property
    def node_ids(self) -> torch.Tensor:
        """Parent-graph ids of the batch nodes."""
        return self.node_data[dgl.NID]

    def to(self, device, keys: Optional[Sequence[str]] = None, non_blocking: bool = False) -> "Batch":
        """A copy with node data (``keys``, default all) and norms on ``device``.

        The graph moves too where DGL supports the device (always for CPU); PyPI's CPU-only DGL keeps it
        on the CPU, and dgl_exact's ops export its structure to the features' device themselves.
        """
        device = torch.device(device)
        keys = list(self.node_data) if keys is None else list(keys)
        graph = self.graph
        if graph.device != device and dgl_supports_device(device):
            graph = graph.to(device)

        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return replace(self, graph=graph, node_norm=move(self.node_norm), edge_norm=move(self.edge_norm),
                       node_data={k: move(self.node_data[k]) for k in keys})


# ------------------------------------------------------------------------------------------------
# Common sampler machinery
# ------------------------------------------------------------------------------------------------
class BatchSampler(ABC):
    """An iterable over one epoch's :class:`Batch` es, reproducible from ``(seed, epoch)``.

    Parameters
    ----------
    g : DGLGraph
        The graph to sample from (homogeneous, on the CPU). Node data is carried into batches.
    seed : int, default 0
        Non-negative base seed; batch ``i`` of epoch ``e`` depends on ``(seed, e, i)`` only.
    rank, world_size : int, default 0, 1
        Distributed share: this process yields global batches ``rank, rank + world_size, ...``.
    even : bool, default False
        If True every rank yields ``num_global_batches // world_size`` batches (the remainder is
        dropped; equal step counts, as DDP needs); if False, shares differ by at most one batch and their
        union is exactly the single-process epoch.

    Usage::

        for epoch in range(start_epoch, epochs):
            sampler.set_epoch(epoch)
            for batch in sampler:            # or sampler.iter_epoch(epoch, start=k) to resume mid-epoch
                batch = batch.to(device)
                ...
    """

    def __init__(self, g, *, seed: int = 0, rank: int = 0, world_size: int = 1, even: bool = False):
        if g.device.type != "cpu":
            raise ValueError("sample from a CPU graph; move batches to the device with Batch.to(device)")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.g = g
        self.seed = int(seed)
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.even = bool(even)
        self.epoch = 0

    # -- to implement ------------------------------------------------------------------------------
    @property
    @abstractmethod
    def num_global_batches(self) -> int:
        """Batches per epoch over all ranks."""

    def _plan_epoch(self, epoch: int, gen: torch.Generator) -> Any:
        """Randomness shared by all batches of an epoch (e.g. a permutation); None by default."""
        return None

    @abstractmethod
    def _make_batch(self, plan: Any, index: int, gen: torch.Generator) -> Batch:
        """Build global batch ``index`` from the epoch plan and the batch's own generator."""

    # -- shared ------------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration yields (as ``DistributedSampler.set_epoch``)."""
        self.epoch = int(epoch)

    def batch_indices(self) -> range:
        """Global indices of the batches this rank yields each epoch."""
        total = self.num_global_batches
        if self.even:
            total -= total % self.world_size
        return range(self.rank, total, self.world_size)

    def __len__(self) -> int:
        return len(self.batch_indices())

    def epoch_plan(self, epoch: int) -> Any:
        """The randomness shared by the batches of ``epoch`` (:meth:`_plan_epoch` with the epoch's generator)."""
        return self._plan_epoch(epoch, _generator(self.seed, _STREAM_EPOCH, epoch))

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This rank's batches of ``epoch``, skipping the first ``start`` of them without sampling."""
        plan = self.epoch_plan(epoch)
        for index in self.batch_indices()[start:]:
            batch = self._make_batch(plan, index, _generator(self.seed, _STREAM_EPOCH, epoch, index))
            batch.epoch, batch.index = epoch, index
            yield batch

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_epoch(self.epoch)

    def _induced_batch(self, nodes: torch.Tensor, node_norm=None, edge_norm=None) -> Batch:
        """The node-induced subgraph on ``nodes`` (parent ids), with the norms sliced to it."""
        sg = dgl.node_subgraph(self.g, nodes.to(self.g.idtype))
        nid, eid = sg.ndata[dgl.NID], sg.edata[dgl.EID]
        return Batch(sg, None if node_norm is None else node_norm[nid],
                     None if edge_norm is None else edge_norm[eid])


# ------------------------------------------------------------------------------------------------
# GraphSAINT
# ------------------------------------------------------------------------------------------------
class SAINTSampler(BatchSampler):
    r"""GraphSAINT subgraph sampler with its normalisations (Zeng et al., ICLR 2020).

    A batch is the subgraph induced by a random node set :math:`S`:

    - ``mode="node"``: ``budget`` draws, with replacement, of nodes with
      :math:`P(v) \propto \max(\deg^{out}_v, 1)` (as DGL's GraphSAINT sampler).
    - ``mode="edge"``: ``budget`` draws of edges with
      :math:`P(u \to v) \propto 1/\deg^{in}_v + 1/\deg^{out}_u`; :math:`S` = their endpoints.
    - ``mode="walk"``: ``budget`` roots drawn uniformly, each followed by a uniform random walk of
      ``walk_length`` steps along out-edges (a walk stops at a node without out-edges); :math:`S` = all
      visited nodes.

    Normalisation. ``N`` subgraphs are pre-sampled (until ``sample_coverage * num_nodes`` nodes were
    drawn in total, as GraphSAINT and PyG do), counting :math:`C_v` (subgraphs containing node
    :math:`v`) and :math:`C_{uv}` (containing edge :math:`u \to v`). With
    :math:`\lambda_v = C_v / N \approx P(v \in S)` and :math:`\alpha_{uv} = C_{uv} / C_v \approx
    P(u \to v \in S \mid v \in S)`:

    - loss: ``node_norm[v] = 1 / (lambda_v * n_ref) = N / (C_v * n_ref)``, so that
      :math:`E[\sum_{v \in S \cap T} \text{node\_norm}_v\, l_v] = \frac{1}{n_{ref}} \sum_{v \in T} l_v`
      for the training set :math:`T`. ``n_ref`` is the number of training nodes (``g.ndata
      ["train_mask"]``; GraphSAINT's choice: the estimate is the full-graph mean training loss) or, with
      ``loss_norm="all"`` or no mask, ``num_nodes`` (PyG's ``node_norm``).
    - aggregation: ``edge_norm[u -> v] = 1 / alpha_uv = C_v / C_uv`` (``v`` the destination, i.e. the
      aggregating node), so that :math:`E[\sum_{u \in N_S(v)} \text{edge\_norm}_{uv} \tilde A_{vu} x_u
      \mid v \in S] = \sum_{u \in N(v)} \tilde A_{vu} x_u`.

    Counts of zero (never seen while pre-sampling) follow GraphSAINT for nodes (``C_v := 0.1``); an
    edge never co-sampled gets ``edge_norm = 1`` (GraphSAINT and PyG give 1e4 or 0.1 there, which
    blows up a message the first time such an edge is seen). Values are clipped to ``[0, 1e4]``.
    ``sample_coverage=0`` skips pre-sampling: ``node_norm`` and ``edge_norm`` are then ``None``.

    Parameters
    ----------
    g : DGLGraph
        Graph to sample from (CPU). For the inductive setting pass the training subgraph.
    mode : {"node", "edge", "walk"}
    budget : int
        Node draws, edge draws or walk roots per subgraph.
    walk_length : int, optional
        Steps per walk; required for ``mode="walk"``.
    num_batches : int, optional
        Subgraphs per epoch; default ``ceil(num_nodes / nominal size)`` with nominal size ``budget``,
        ``2 budget`` or ``budget (walk_length + 1)`` for node, edge and walk mode.
    sample_coverage : float, default 50
        Pre-sampling budget, in multiples of ``num_nodes`` sampled nodes.
    loss_norm : {"train", "all"}, default "train"
        ``n_ref`` above.
    cache_dir, dataset : str, optional
        If ``cache_dir`` is given, the pre-sampled counts are stored in / loaded from
        ``<cache_dir>/<dataset>_saint_<mode>_<params>_n<N>_e<E>_<fingerprint>.npz`` (plain arrays, validated
        when read: see :class:`CacheWarning`).
    progress : bool, default False
        Show a tqdm bar while pre-sampling.
    seed, rank, world_size, even
        See :class:`BatchSampler`. Pre-sampling uses its own stream of ``seed``.
    """

    MODES = ("node", "edge", "walk")

    def __init__(self, g, mode: str, budget: int, walk_length: Optional[int] = None, *,
                 num_batches: Optional[int] = None, sample_coverage: float = 50,
                 loss_norm: str = "train", cache_dir: Optional[str] = None, dataset: str = "graph",
                 progress: bool = False, **kwargs):
        super().__init__(g, **kwargs)
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        if mode == "walk" and (walk_length is None or walk_length < 1):
            raise ValueError("mode='walk' needs walk_length >= 1")
        if budget < 1:
            raise ValueError(f"budget must be positive, got {budget}")
        if loss_norm not in ("train", "all"):
            raise ValueError(f"loss_norm must be 'train' or 'all', got {loss_norm!r}")
        self.mode, self.budget, self.walk_length = mode, int(budget), walk_length
        self.sample_coverage, self.loss_norm = sample_coverage, loss_norm
        self._structure = structure_only(g)
        self._prepare_sampling()

        nominal = {"node": budget, "edge": 2 * budget, "walk": budget * ((walk_length or 0) + 1)}[mode]
        self._num_batches = num_batches or max(1, math.ceil(g.num_nodes() / nominal))

        self.num_presamples = 0
        self.node_count = self.edge_count = None
        self.node_norm = self.edge_norm = None
        if sample_coverage > 0:
            self._load_or_count(cache_dir, dataset, progress)
            self.node_norm, self.edge_norm = self._norms()

    @property
    def num_global_batches(self) -> int:
        return self._num_batches

    # -- node-set samplers -------------------------------------------------------------------------
    def _prepare_sampling(self) -> None:
        """Precompute what each draw needs: a CDF (node/edge mode) or the out-edge CSR (walk mode)."""
        g = self.g
        if self.mode == "node":
            self._cdf = g.out_degrees().double().clamp_(min=1).cumsum_(0)
        elif self.mode == "edge":
            src, dst = g.edges(order="eid")
            self._src, self._dst = src, dst
            w = (1.0 / g.in_degrees().double().clamp(min=1))[dst.long()]
            w += (1.0 / g.out_degrees().double().clamp(min=1))[src.long()]
            self._cdf = w.cumsum_(0)
        else:
            indptr, indices, _ = g.adj_tensors("csr")
            self._indptr, self._indices = indptr.long(), indices.long()

    def sample_nodes(self, gen: torch.Generator) -> torch.Tensor:
        """One subgraph's node set (sorted parent ids), drawn with ``gen``."""
        if self.mode == "node":
            nodes = _sample_categorical(self._cdf, self.budget, gen)
        elif self.mode == "edge":
            edges = _sample_categorical(self._cdf, self.budget, gen)
            nodes = torch.cat([self._src[edges], self._dst[edges]])
        else:
            nodes = self._random_walk_nodes(gen)
        return torch.unique(nodes)

    def _random_walk_nodes(self, gen: torch.Generator) -> torch.Tensor:
        """All nodes visited by ``budget`` uniform random walks (vectorised over walks)."""
        indptr, indices = self._indptr, self._indices
        cur = torch.randint(0, self.g.num_nodes(), (self.budget,), generator=gen)
        visited = [cur]
        for _ in range(self.walk_length):
            start = indptr[cur]
            deg = indptr[cur + 1] - start
            offset = (torch.rand(cur.numel(), generator=gen, dtype=torch.float64) * deg).long()
            moving = deg > 0  # walkers at a node without out-edges stay (their walk has ended)
            cur = cur.clone()
            cur[moving] = indices[start[moving] + torch.minimum(offset[moving], deg[moving] - 1)]
            visited.append(cur)
        return torch.cat(visited)

    # -- normalisation -----------------------------------------------------------------------------
    def _cache_params(self) -> List[Any]:
        params = [self.mode, f"b{self.budget}"]
        if self.mode == "walk":
            params.append(f"l{self.walk_length}")
        return params + [f"cov{self.sample_coverage:g}", f"s{self.seed}"]

    def _load_or_count(self, cache_dir: Optional[str], dataset: str, progress: bool) -> None:
        """The pre-sampling counts from the cache (validated, see :func:`read_cache`) or computed (and cached)."""
        key = None if cache_dir is None else cache_key(cache_dir, dataset, "saint", self._cache_params(), self.g)
        spec = {"num_samples": (np.int64, ()), "node_count": (np.int32, (self.g.num_nodes(),)),
                "edge_count": (np.int32, (self.g.num_edges(),))}
        cached = None if key is None else read_cache(key, spec, self._check_counts)
        if cached is not None:
            state = {"num_samples": int(cached["num_samples"]), "node_count": torch.from_numpy(cached["node_count"]),
                     "edge_count": torch.from_numpy(cached["edge_count"])}
        else:
            state = self._count(progress)
            if key is not None:
                write_cache(key, {"num_samples": np.array(state["num_samples"], dtype=np.int64),
                                   "node_count": state["node_count"].numpy(),
                                   "edge_count": state["edge_count"].numpy()})
        self.cache_path = None if key is None else key.path
        self.num_presamples = int(state["num_samples"])
        self.node_count, self.edge_count = state["node_count"], state["edge_count"]

    def _check_counts(self, a: Dict[str, np.ndarray]) -> Optional[str]:
        """What is impossible about cached counts (``None`` if nothing): counts outside ``[0, N]``; an edge
        counted in more subgraphs than either endpoint; fewer node draws than the coverage target."""
        n_samples, c_v, c_uv = int(a["num_samples"]), a["node_count"], a["edge_count"]
        if n_samples < 1:
            return f"num_samples is {n_samples}"
        if c_v.size and (c_v.min() < 0 or c_v.max() > n_samples):
            return f"node counts outside [0, num_samples={n_samples}]"
        if c_uv.size:
            if c_uv.min() < 0 or c_uv.max() > n_samples:
                return f"edge counts outside [0, num_samples={n_samples}]"
            src, dst = (t.long().numpy() for t in self.g.edges(order="eid"))
            if (c_uv > np.minimum(c_v[src], c_v[dst])).any():
                return "an edge is counted more often than one of its endpoints"
        if int(c_v.sum(dtype=np.int64)) < self.sample_coverage * self.g.num_nodes():
            return f"fewer node draws than sample_coverage={self.sample_coverage:g} x num_nodes"
        return None

    def _count(self, progress: bool) -> Dict[str, Any]:
        """Pre-sample subgraphs until ``sample_coverage * num_nodes`` nodes were drawn; count C_v, C_uv."""
        n = self.g.num_nodes()
        node_count = torch.zeros(n, dtype=torch.int32)
        edge_count = torch.zeros(self.g.num_edges(), dtype=torch.int32)
        target = self.sample_coverage * n
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=int(target), desc=f"GraphSAINT {self.mode} pre-sampling", unit="node")
        drawn = num_samples = 0
        while drawn < target:
            nodes = self.sample_nodes(_generator(self.seed, _STREAM_PRESAMPLE, num_samples))
            eids = dgl.node_subgraph(self._structure, nodes.to(self.g.idtype)).edata[dgl.EID]
            node_count[nodes] += 1  # ids are unique: plain indexing is a correct scatter
            edge_count[eids.long()] += 1
            drawn += nodes.numel()
            num_samples += 1
            if bar is not None:
                bar.update(nodes.numel())
        if bar is not None:
            bar.close()
        return {"num_samples": num_samples, "node_count": node_count, "edge_count": edge_count}

    def _norms(self):
        """``node_norm = N / (C_v n_ref)`` and ``edge_norm = C_v / C_uv`` (see the class docstring)."""
        c_v = self.node_count.double()
        c_uv = self.edge_count.double()
        train = self.g.ndata.get("train_mask")
        n_ref = int(train.sum()) if (self.loss_norm == "train" and train is not None) else self.g.num_nodes()
        node_norm = self.num_presamples / (c_v.where(c_v > 0, torch.full_like(c_v, 0.1)) * max(n_ref, 1))

        dst = self.g.edges(order="eid")[1].long()
        edge_norm = torch.where(c_uv > 0, c_v[dst] / c_uv.clamp(min=1), torch.ones_like(c_uv))
        return node_norm.clamp_(0, 1e4).float(), edge_norm.clamp_(0, 1e4).float()

    def _make_batch(self, plan, index, gen) -> Batch:
        return self._induced_batch(self.sample_nodes(gen), self.node_norm, self.edge_norm)


# ------------------------------------------------------------------------------------------------
# Cluster-GCN
# ------------------------------------------------------------------------------------------------
class ClusterGCNSampler(BatchSampler):
    """Cluster-GCN sampler (Chiang et al., KDD 2019).

    The graph is split into ``num_parts`` METIS partitions (``dgl.metis_partition_assignment``, which
    symmetrises the graph first). Each epoch the partitions are shuffled with the epoch's generator and
    cut into groups of ``batch_size``; a batch is the subgraph induced by the union of one group's
    nodes (so edges between the group's partitions are kept). Every node is in exactly one batch per
    epoch. No normalisation (``node_norm = edge_norm = None``).

    Parameters
    ----------
    g : DGLGraph
        Graph to partition (CPU).
    num_parts : int
        Number of METIS partitions.
    batch_size : int, default 1
        Partitions per batch; the last batch of an epoch may hold fewer.
    cache_dir : str, optional
        Directory for the partition file
        ``<dataset>_clustergcn_k<num_parts>_<options>_n<N>_e<E>_<fingerprint>.npz`` (plain arrays, validated
        when read; an unusable file is recomputed with a :class:`CacheWarning`); the fingerprint
        hashes the edge list, so a changed graph never reuses a stale partition. Without it METIS runs
        on every construction.
    assignment : Tensor, optional
        A precomputed partition id per node, ``(num_nodes,)`` in ``[0, num_parts)``; skips METIS and the
        cache.
    dataset : str, default "graph"
        Name used in the cache file name.
    balance_edges : bool, default False
        Passed to METIS.
    seed, rank, world_size, even
        See :class:`BatchSampler`.

    Distributed training: METIS (as called by DGL 2.1) is *not* deterministic, even within one process,
    so ranks must share one partition: create the cache file on one rank (then barrier) and construct
    the samplers of all ranks from the same ``cache_dir``, or broadcast ``assignment``.
    """

    def __init__(self, g, num_parts: int, batch_size: int = 1, *, cache_dir: Optional[str] = None,
                 dataset: str = "graph", balance_edges: bool = False,
                 assignment: Optional[torch.Tensor] = None, **kwargs):
        super().__init__(g, **kwargs)
        if not 1 <= num_parts <= max(g.num_nodes(), 1):
            raise ValueError(f"num_parts must be in [1, num_nodes={g.num_nodes()}], got {num_parts}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.num_parts, self.batch_size = int(num_parts), int(batch_size)
        self.cache_path = None
        if assignment is not None:
            assignment = torch.as_tensor(assignment).to(torch.int64)
            if assignment.shape != (g.num_nodes(),) or not 0 <= int(assignment.min()) <= int(
                    assignment.max()) < num_parts:
                raise ValueError(f"assignment must hold one partition id in [0, {num_parts}) per node")
        else:
            key = None
            if cache_dir is not None:
                params = [f"k{num_parts}"] + (["baledges"] if balance_edges else [])
                key = cache_key(cache_dir, dataset, "clustergcn", params, g)
                self.cache_path = key.path
            spec = {"assignment": (np.int64, (g.num_nodes(),))}
            cached = None if key is None else read_cache(key, spec, self._check_assignment)
            if cached is not None:
                assignment = torch.from_numpy(cached["assignment"])
            else:
                assignment = self._partition(balance_edges)
                if key is not None:
                    write_cache(key, {"assignment": assignment.numpy()})
        self.assignment = assignment
        # Nodes grouped by partition: partition p holds part_nodes[part_offset[p]:part_offset[p + 1]].
        self.part_nodes = torch.argsort(assignment, stable=True)
        counts = torch.bincount(assignment, minlength=num_parts)
        self.part_offset = torch.cat([counts.new_zeros(1), counts.cumsum(0)])

    def _check_assignment(self, a: Dict[str, np.ndarray]) -> Optional[str]:
        parts = a["assignment"]
        if parts.size and (parts.min() < 0 or parts.max() >= self.num_parts):
            return f"partition ids outside [0, num_parts={self.num_parts})"
        return None

    def _partition(self, balance_edges: bool) -> torch.Tensor:
        if self.num_parts == 1:  # METIS rejects k = 1
            return torch.zeros(self.g.num_nodes(), dtype=torch.int64)
        # DGL's METIS takes int64 ids only: an int32 graph is widened for the call (the same partition)
        parts = dgl.metis_partition_assignment(structure_only(self.g).long(), self.num_parts,
                                               balance_edges=balance_edges)
        return parts.to(torch.int64)

    @property
    def num_global_batches(self) -> int:
        return math.ceil(self.num_parts / self.batch_size)

    def _plan_epoch(self, epoch, gen) -> torch.Tensor:
        return torch.randperm(self.num_parts, generator=gen)

    def partition_nodes(self, parts: torch.Tensor) -> torch.Tensor:
        """Sorted parent ids of the nodes in partitions ``parts``."""
        chunks = [self.part_nodes[self.part_offset[p]:self.part_offset[p + 1]] for p in parts.tolist()]
        return torch.sort(torch.cat(chunks)).values

    def _make_batch(self, plan, index, gen) -> Batch:
        parts = plan[index * self.batch_size:(index + 1) * self.batch_size]
        return self._induced_batch(self.partition_nodes(parts))


def with_degrees(g):
    """``g`` with its in- and out-degrees as node data (``_deg_in``, ``_deg_out``: GraphSAINT's aggregation
    normalisation needs the full graph's inside every batch), on a local view: DGL's format and id-type
    conversions share the node-data frame, so writing on ``g`` itself could change a caller's graph."""
    from ..ops import structure_of

    g = g.local_var()
    st = structure_of(g, "cpu")  # out-degrees also of a graph holding its CSC alone (DGL needs a COO or CSR)
    g.ndata["_deg_in"] = st.in_degrees().float()
    g.ndata["_deg_out"] = st.out_degrees().float()
    return g
