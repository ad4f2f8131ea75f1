"""Predict a training step's memory for a full graph from the model's real operations on two small graphs.

How (no per-model formula, so any model built from dgl_exact's ops or torch ops is covered):

1. Two random graphs with the target's shape scaled down by ``s1 < s2``: ``round(s N)`` nodes, the same
   fraction of the ``E`` edges (uniform random endpoints, no self loops; the model's self loops are added
   as the trainer adds them), random features and labels, the same fraction of training nodes.
2. On each, the real model takes one warm-up training step (Adam's state, structure caches), then one
   recorded step (``forward -> loss -> backward -> Adam step``, the step :func:`dgl_exact.memory.measure_step`
   measures): a ``TorchDispatchMode`` keeps the bytes of every storage an operator creates during the step
   alive until its last tensor dies, giving the live total after every operator (the step's memory
   timeline), and saved-tensor hooks give the activation bytes. On the CPU an output that is allocated
   empty and filled chunk by chunk counts the pages written so far, as the measured resident high-water
   mark does (a GPU allocator counts it whole at allocation; see ``Timeline``). Chunked backward passes
   (row chunks of a fixed element count at full size) are run with chunks scaled by ``s``, so that the
   sample chunks where and as often as the full graph would.
3. Every quantity that grows with the graph is affine in ``s`` (row counts are ``s N`` or ``s E``; weights,
   optimizer state and chunk counts do not change), so each point of the timeline and the activation bytes
   are extrapolated linearly from ``s1`` and ``s2`` to ``s = 1``; the step peak is the largest extrapolated
   point. Nothing is ever allocated at full size.

Static memory (alive before and after a step) is counted from what the sample shows: DGL's sparse formats
the step created (COO ``2E``, CSR / CSC ``N + 1 + 2E`` ids each, ``N + 1 + E`` without an edge-id array;
int32 below ``2**31`` nodes and edges, else int64; the trainer keeps CSC and CSR only, or the CSC alone
without edge ids for a symmetric graph, see :func:`~dgl_exact.data.compact.training_graph`: a spec's
``symmetric`` makes the samples symmetric too), dgl_exact's cached structure tensors
(extrapolated; a PyG model's: the ``edge_index`` and edge ids it reads, and the
:class:`~dgl_exact.pyg.structure.EdgeStructure` dgl_exact.pyg's convs cache for it), features (fp32), labels and
training indices (int64), parameters and the optimizer's state.
Gradients are part of the step peak (the trainer frees them between steps). Only operator-created storages
are seen: memory a C++ library allocates behind torch's back is not (``dgl-exact bench plan`` compares the
prediction with the measured peak).
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import time
import weakref
from fractions import Fraction
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from .. import memory, ops
from ..units import device_bytes, format_bytes, parse_bytes
from .._compat import import_dgl
from .settings import STANDARD, Setting
from .timeline import Timeline
from ..compression import CompressedTensor
from ..compression_config import config as compression_scope
from ..data.compact import held_formats, index_dtype
from ..ops import keep as keeping
from ..ops.chunks import gpu_chunk_policy, sample_chunking
from ..ops.structure import cached_static_tensors
from ..training.pyg_models import PyGModel
from ..training.workloads import PYG_MODELS, model_traits, prepare_graph


__all__ = ["PlanSpec", "PlanRecord", "SampleRun", "plan", "predict", "parse_bytes", "device_bytes", "check_depth",
           "MAX_RECORDED_LAYERS",
           "spec_for_dataset", "DEFAULT_SETTINGS", "SampleGraph", "samples_for", "extrapolated_points"]

#: the uniform settings a plan compares (the names ``dgl-exact bench`` uses)
DEFAULT_SETTINGS = tuple(s.name for s in STANDARD if s.impl == "exact")
# a multiple of 16 chunks x 64-row blocks: both samples run the same chunked loops (ops.chunks.chunk_rows)
SAMPLE_NODES = 3072
#: the most layers x settings one plan records: recording is linear in depth, one training step per layer,
#: setting and sample graph (a GCN layer is about 290 operators; 64 layers of one setting recorded on both
#: samples took 17 s on 2 loaded cores, so 512 take about 2.5 minutes), and a recorded step keeps every layer's
#: sample activations alive (memory linear in depth too)
MAX_RECORDED_LAYERS = 512
MAX_GRAPH_COUNT = 2**63 - 1   # nodes and edges: DGL's int64 ids
MAX_SAMPLE_EDGES = 2**31 - 1  # edges of a sample graph (int32 ids, as the trainer's; torch indexes them in int64)


def check_depth(layers: int, settings: int, what: str = "") -> None:
    """Refuse, before any recording, a plan of ``settings`` settings at ``layers`` layers whose recording would
    exceed :data:`MAX_RECORDED_LAYERS` layer-settings (one line saying the largest depth that is planned).
    ``what``: the plan, where it is not a ``--settings`` list (``"a --memory-budget plan"``)."""
    if layers * max(1, settings) > MAX_RECORDED_LAYERS:
        most = MAX_RECORDED_LAYERS // max(1, settings)
        if what:
            raise ValueError(f"--layers {layers}: {what} records a training step per layer for each of {settings} "
                             f"setting(s) on sample graphs, at most {MAX_RECORDED_LAYERS} layers x settings (a few "
                             f"minutes); it plans at most {most} layers")
        raise ValueError(f"--layers {layers} with {settings} setting(s): the planner records one training step "
                         f"per layer and setting on sample graphs, at most {MAX_RECORDED_LAYERS} layers x settings "
                         f"(a few minutes); plan at most {most} layers with these settings, or name fewer with "
                         f"--settings")


@dataclasses.dataclass(frozen=True)
class PlanSpec:
    """A full-batch training workload: graph shape, model and its hyperparameters.

    ``edges``: directed edges of the dataset graph without self loops (GCN, GAT and GCNII add one per
    node, as the trainer and ``dgl-exact bench`` do). ``train_nodes``: rows the loss reads (default half).
    ``hidden`` defaults to the EXACT benchmark's per model (``dgl-exact bench``'s)."""

    model: str
    nodes: int
    edges: int
    features: int
    classes: int
    train_nodes: Optional[int] = None
    hidden: Optional[int] = None
    layers: int = 3
    dropout: float = 0.5
    batch_norm: bool = True
    heads: int = 3
    name: str = "graph"
    #: the graph equals its transpose (undirected, both directions stored: every dataset here): the samples
    #: are symmetric too, and dgl_exact's GCN, SAGE and GCNII train from the CSC alone as the trainer does
    symmetric: bool = False

    def __post_init__(self):
        if self.nodes < 2 or self.edges < 0 or self.features < 1 or self.classes < 1:
            raise ValueError(f"need nodes >= 2, edges >= 0, features >= 1, classes >= 1: {self}")
        if self.nodes > MAX_GRAPH_COUNT or self.edges > MAX_GRAPH_COUNT:
            raise ValueError(f"nodes and edges must be at most 2**63 - 1 (DGL's int64 ids), got {self.nodes} nodes "
                             f"and {self.edges} edges")
        if self.edges > self.nodes * (self.nodes - 1):
            raise ValueError(f"{self.edges} edges on {self.nodes} nodes: more than nodes x (nodes - 1), the directed "
                             "edges without self loops a graph can have")
        if self.train_nodes is not None and not 0 < self.train_nodes <= self.nodes:
            raise ValueError(f"train_nodes must be in [1, nodes], got {self.train_nodes}")

    @property
    def hidden_size(self) -> int:
        return self.hidden or model_traits(self.model).hidden

    @property
    def train_count(self) -> int:
        return self.train_nodes if self.train_nodes is not None else max(1, self.nodes // 2)

    @property
    def self_loops(self) -> bool:
        return model_traits(self.model).self_loops

    @property
    def model_edges(self) -> int:
        """Edges of the graph the model runs on."""
        return self.edges + (self.nodes if self.self_loops else 0)

    def describe(self) -> str:
        return (f"{self.model} {self.layers}x{self.hidden_size}{' BN' if self.batch_norm else ''} on {self.name}: "
                f"{self.nodes:,} nodes, {self.edges:,} edges, {self.features} features, {self.classes} classes, "
                f"{self.train_count:,} training nodes")


@dataclasses.dataclass
class PlanRecord:
    """One setting's predicted memory (bytes). ``total_bytes = static_bytes + step_peak_bytes``."""

    setting: str
    static_bytes: int
    activation_bytes: int
    step_peak_bytes: int
    total_bytes: int
    fits: Optional[bool]
    device_bytes: Optional[int]
    compression: str = ""
    breakdown: Dict[str, int] = dataclasses.field(default_factory=dict)
    note: str = ""

    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)


def spec_for_dataset(name: str, model: str, data_root: Optional[str] = None, **hyper) -> PlanSpec:
    """A :class:`PlanSpec` for a dataset. Synthetic presets (``synthetic-arxiv``, ``synthetic-products``, ...)
    are not generated: their node count, features, classes and split come from the preset and the edge count
    is the preset's ``num_nodes * avg_degree`` (the generator's de-duplication removes a few percent). Other
    datasets are loaded (cached files) and counted exactly."""
    if name.startswith("synthetic"):
        from ..data.synthetic import parse_synthetic_name

        c = parse_synthetic_name(name)
        return PlanSpec(model=model, nodes=c.num_nodes, edges=int(round(c.num_nodes * c.avg_degree)),
                        features=c.num_features, classes=c.num_classes,
                        train_nodes=max(1, int(round(c.num_nodes * c.train_frac))), name=name,
                        symmetric=True, **hyper)  # the generator stores both directions
    from ..data import load_dataset

    ds = load_dataset(name, data_root)
    return spec_from_graph(ds.graph, ds.num_features, ds.num_classes, len(ds.train_idx), model, name=name, **hyper)


def spec_from_graph(graph, features: int, classes: int, train_nodes: int, model: str, name: str = "graph",
                    **hyper) -> PlanSpec:
    """A :class:`PlanSpec` with the exact counts of ``graph`` (its self loops removed) and whether it is
    symmetric (:func:`~dgl_exact.ops.is_symmetric`). A graph without a COO is read from its CSR (no COO is
    created)."""
    src, dst = graph.edges(order="eid" if "coo" in graph.formats()["created"] else "srcdst")
    loops = int((src == dst).sum())
    del src, dst
    if "symmetric" not in hyper:  # the exact test reads every edge: only where the caller did not say
        hyper["symmetric"] = ops.is_symmetric(graph)
    return PlanSpec(model=model, nodes=graph.num_nodes(), edges=graph.num_edges() - loops, features=features,
                    classes=classes, train_nodes=train_nodes, name=name, **hyper)


# --- one recorded step --------------------------------------------------------------------------------------

@dataclasses.dataclass
class KeptRecord:
    """One activation kept through :func:`dgl_exact.ops.keep.as_kept` during a recorded forward."""

    index: int
    shape: tuple
    dtype: str
    #: "reference" (alive anyway / not compressed), "compressed", "projected", or "shared": the copy an earlier
    #: keeper of the same tensor made (ownership rule 6, :mod:`dgl_exact.ops.keep`), its bytes counted there
    kept: str
    nbytes: int          # bytes kept (0 when kept by reference to a tensor alive anyway, or shared)
    projectable: bool    # the op allows a random projection (batch norm, ReLU outputs do not)
    force: bool
    #: where the kept copy lives in the recorded step's timeline (operator indices): it is counted at the points
    #: ``born <= j < died`` (``died`` None: still alive when the step ended; ``born`` -1: not tracked, e.g.
    #: kept by reference to a tensor whose life it does not decide)
    born: int = -1
    died: Optional[int] = None


@dataclasses.dataclass
class SampleRun:
    """What one recorded step on a sample graph showed."""

    nodes: int
    edges: int
    timeline: List[int]
    names: List[str]
    activation_bytes: int
    keeps: List[KeptRecord]
    parameter_bytes: int
    optimizer_bytes: int
    structure_bytes: int
    formats: List[str]
    seconds: float
    #: a PyG model's ``edge_index`` and edge ids of the graph (PyGModel.graph_tensors), static as the structure
    edge_index_bytes: int = 0


def sample_graph(spec: PlanSpec, n: int, e: int, seed: int = 0, impl: str = "exact"):
    """``(graph, feat, label, train_idx)`` of a random sample graph, the graph prepared as the trainer
    prepares a full graph for dgl_exact's models (int32 ids, CSC and CSR only), or for another ``impl``'s
    (DGL's own modules read a COO) as the benchmarks give it (int32 ids, every format)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, n, (e // 2 if spec.symmetric else e,), generator=gen)
    dst = (src + torch.randint(1, n, src.shape, generator=gen)) % n  # no self loops
    if spec.symmetric:  # both directions of e // 2 pairs
        src, dst = torch.cat([src, dst]), torch.cat([dst, src])
    g = prepare_sample_graph(spec, import_dgl().graph((src, dst), num_nodes=n), impl)  # DGL here, not at import
    feat = torch.randn(n, spec.features, generator=gen)
    label = torch.randint(0, spec.classes, (n,), generator=gen)
    n_train = max(1, min(n, int(round(spec.train_count * n / spec.nodes))))
    idx = torch.randperm(n, generator=gen)[:n_train].sort().values
    return g, feat, label[idx].clone(), idx


def prepare_sample_graph(spec: PlanSpec, graph, impl: str = "exact"):
    """A sample ``graph`` (no self loops) prepared for ``spec``'s model by
    :func:`~dgl_exact.training.workloads.prepare_graph`: for dgl_exact's models as the trainer prepares a full
    graph (its ``training`` layout; the CSC alone only where ``spec`` is symmetric), for another ``impl``'s
    with int32 ids and every format (``sampled``)."""
    if impl == "exact":
        return prepare_graph(graph, spec.model, layout="training", csc_only=spec.symmetric)
    return prepare_graph(graph, spec.model, layout="sampled")


def build_for(spec: PlanSpec, impl: str = "exact", seed: int = 0, recompute=None):
    """The planned model (``recompute``: GCNII's segment length, as the setting names it); a PyG model
    (``pyg-gcn``, ...) on PyG's layers, called as the trainer calls its models."""
    from ..training.models import build_model

    if recompute and spec.model != "gcn2":
        raise ValueError(f"recompute is a GCNII (gcn2) setting; {spec.model} has none (plan another setting)")
    model, framework = spec.model, "dgl"
    if model in PYG_MODELS:  # the trainer's PyG network: as written ('pyg'), or converted by compress_model
        if impl == "dgl":
            raise ValueError(f"{model} is a PyG model: its baseline is 'PyG fp32', not a DGL setting")
        model, framework, impl = model[len("pyg-"):], "pyg", ("exact" if impl == "exact" else "pyg")
    torch.manual_seed(seed)
    return build_model(model, spec.features, spec.classes, hidden=spec.hidden_size, layers=spec.layers,
                       dropout=spec.dropout, batch_norm=spec.batch_norm, heads=spec.heads, impl=impl,
                       recompute=recompute, framework=framework)


def describe_setting(spec: PlanSpec, setting) -> str:
    """What a setting keeps, for a plan's record: its compression and, with recompute, the segment length."""
    from ..training.models import recompute_length

    text = setting.compression.describe() if setting.compression else "none (plain autograd)"
    length = recompute_length(setting.recompute, spec.layers) if setting.recompute else 0
    return text + (f"; recomputed in segments of {length} layers" if length else "")


def loss_fn(impl: str):
    if impl == "exact":
        return lambda logits, y, idx: ops.cross_entropy(logits, y, idx)
    return lambda logits, y, idx: F.cross_entropy(logits[idx], y)


def _keep_recorder(records: List[KeptRecord], timeline: Optional["Timeline"] = None):
    from ..compression_config import get_config

    def hook(x, cfg, force):
        shared = keeping.shared_copy(x, cfg) is not None
        kept = keeping.default_keep(x, cfg, force)
        scope = get_config()
        if isinstance(kept, CompressedTensor) and shared:  # an earlier keeper's copy (rule 6): counted there
            kind, nbytes = "shared", 0
        elif isinstance(kept, CompressedTensor):
            kind = "projected" if kept.raw is not None else "compressed"
            nbytes = kept.nbytes
        else:
            kind, nbytes = "reference", 0
        # an op that forbids projection passes its config with kept_frac=1.0 while the scope projects
        projectable = not (cfg.kept_frac >= 1.0 and scope.kept_frac < 1.0)
        record = KeptRecord(len(records), tuple(x.shape), str(x.dtype)[6:], kind, nbytes, projectable, force)
        records.append(record)
        if timeline is not None and isinstance(kept, CompressedTensor) and not shared:
            _track_life(record, kept, timeline)
        return kept

    return hook


def _track_life(record: KeptRecord, kept: CompressedTensor, timeline: "Timeline") -> None:
    """Note in ``record`` the timeline points at which the compressed copy is alive: from now until its last
    tensor dies (autograd frees saved tensors after their node's backward)."""
    record.born = len(timeline.totals)
    tensors = kept.split()[1]
    left = [len(tensors)]

    def dead():
        left[0] -= 1
        if left[0] == 0:
            record.died = len(timeline.totals)

    for t in tensors:
        weakref.finalize(t, dead)


#: chunked backward loops of a sample run: at most this many chunks per tensor (the full graph may run more,
#: smaller ones; the extrapolated chunk buffer is then at most ``1 / MAX_SAMPLE_CHUNKS`` of the tensor)
MAX_SAMPLE_CHUNKS = 16


class SampleGraph:
    """A random graph of ``nodes`` nodes and ``edges`` edges shaped like ``spec``'s, with features, labels
    and training rows, on which models take recorded steps (:meth:`record`). ``scale``: its fraction of the
    full graph (chunked backward loops are scaled by it); ``gpu``: chunk as on a GPU."""

    def __init__(self, spec: PlanSpec, nodes: int, edges: int, scale: float = 1.0, gpu: bool = False, seed: int = 0):
        self.spec, self.scale, self.gpu, self.seed = spec, scale, gpu, seed
        self.graph, self.feat, self.label, self.idx = sample_graph(spec, nodes, edges, seed)
        self.nodes, self.edges = nodes, edges
        self.structure_bytes: Dict[str, int] = {}  # per implementation warmed up: its structure caches
        self.edge_index_bytes: Dict[str, int] = {}  # and a PyG model's edge_index of the graph
        self._graphs = {"exact": self.graph}  # one graph object per implementation (caches live on it)

    def _context(self, setting: Setting):
        stack = contextlib.ExitStack()
        if setting.compression:
            stack.enter_context(compression_scope(setting.compression))
        if self.gpu:
            stack.enter_context(gpu_chunk_policy())
        stack.enter_context(sample_chunking(self.scale, MAX_SAMPLE_CHUNKS if self.scale < 1.0 else 0))
        return stack

    def model_and_optimizer(self, setting: Setting):
        """A fresh model and Adam with its state created (as after a first step), no step taken."""
        model = build_for(self.spec, setting.impl, self.seed, setting.recompute)
        model.train()
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()  # zero gradients: Adam's state is created and the parameters do not move
        opt.zero_grad(set_to_none=True)
        return model, opt

    def graph_for(self, impl: str):
        """The sample graph ``impl``'s steps run on: the same graph, but its own object for each
        implementation, so that one implementation's structure caches are not counted for, or taken
        from, another (caches live on the graph object)."""
        if impl not in self._graphs:
            self._graphs[impl] = sample_graph(self.spec, self.nodes, self.edges, self.seed, impl)[0]
        return self._graphs[impl]

    def forward_fn(self, model, impl: str):
        loss_of = loss_fn(impl)
        g, feat, y, idx = self.graph_for(impl), self.feat, self.label, self.idx

        def forward():
            logits = model(g, feat)
            return loss_of(logits, y, idx), logits

        return forward

    def warm_up(self, setting: Setting) -> None:
        """One unrecorded training step of ``setting``'s implementation: the graph's sparse formats and its
        structure caches, whose bytes are counted for that implementation (the first implementation warmed
        up must not take another's caches with it: DGL's fp32 recorded first left dgl_exact's 8.8 MiB
        structure cache out of every later setting's static memory on a 20,000-node graph); each
        implementation runs on its own graph object (:meth:`graph_for`)."""
        model, opt = self.model_and_optimizer(setting)
        with self._context(setting):
            self.forward_fn(model, setting.impl)()[0].backward()
            opt.step()
        # the cache entry of this graph object only: a global difference also counted other graphs' entries
        # dropped or created meanwhile (a previous sample pair dying after this one was made: 0 bytes); a PyG
        # model's: the edge_index it made of this graph (kept while the graph lives, for every model, as the
        # trainer's one model keeps it across epochs) and the structures dgl_exact.pyg's convs cached for it
        graph = self.graph_for(setting.impl)
        tensors = cached_static_tensors(graph)
        if isinstance(model, PyGModel):
            tensors += PyGModel.structure_tensors(graph)
            self.edge_index_bytes[setting.impl] = memory.tensor_bytes(PyGModel.graph_tensors(graph))
        self.structure_bytes[setting.impl] = memory.tensor_bytes(tensors)

    def record(self, setting: Setting, hook=None) -> "SampleRun":
        """A fresh model's recorded training step under ``setting``. ``hook(recorder)``: returns the keep hook
        to use instead of the recorder (given the recorder, to call it)."""
        t0 = time.perf_counter()
        if setting.impl not in self.structure_bytes:
            self.warm_up(setting)
        model, opt = self.model_and_optimizer(setting)
        forward = self.forward_fn(model, setting.impl)
        keeps: List[KeptRecord] = []
        timeline = Timeline(touched=not self.gpu)
        recorder = _keep_recorder(keeps, timeline)
        with self._context(setting):
            with timeline:
                with memory.saved_storages() as saved, keeping.keep_hook(hook(recorder) if hook else recorder,
                                                                        records_only=hook is None):
                    result = forward()
                act, _ = memory.activation_bytes(saved, [model], [self.feat, self.label, self.idx], result)
                result[0].backward()
                opt.step()
                del result
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        state = [t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        graph = self.graph_for(setting.impl)
        return SampleRun(graph.num_nodes(), graph.num_edges(), timeline.totals, timeline.names, act,
                         keeps, params, memory.tensor_bytes(state), self.structure_bytes[setting.impl],
                         held_formats(graph), time.perf_counter() - t0, self.edge_index_bytes.get(setting.impl, 0))


# --- extrapolation -----------------------------------------------------------------------------------------
def extrapolate(a: float, b: float, s1: float, s2: float, s: float = 1.0) -> float:
    if s2 == s1:
        return b
    return b + (b - a) * (s - s2) / (s2 - s1)


def extrapolated_points(r1: SampleRun, r2: SampleRun, s1: float, s2: float) -> List[tuple]:
    """The step's memory timeline extrapolated to ``s = 1``, as ``(bytes, j)`` with ``j`` the point's operator
    index in ``r2``. Points are matched by position where both runs called the same operators; otherwise by
    aligning the operator sequences (chunked loops may repeat a different number of times at the two
    scales)."""
    t1, t2 = r1.timeline, r2.timeline
    if r1.names == r2.names:
        pairs = [(i, i) for i in range(len(t2))]
    else:  # align only what lies between the common prefix and suffix (quadratic matching: seconds otherwise)
        a, b = r1.names, r2.names
        pre = 0
        while pre < min(len(a), len(b)) and a[pre] == b[pre]:
            pre += 1
        suf = 0
        while suf < min(len(a), len(b)) - pre and a[-1 - suf] == b[-1 - suf]:
            suf += 1
        pairs = [(i, i) for i in range(pre)]
        matcher = difflib.SequenceMatcher(None, a[pre:len(a) - suf], b[pre:len(b) - suf], autojunk=False)
        pairs += [(pre + i + k, pre + j + k) for i, j, size in matcher.get_matching_blocks() for k in range(size)]
        pairs += [(len(t1) - suf + k, len(t2) - suf + k) for k in range(suf)]
    return [(extrapolate(t1[i], t2[j], s1, s2), j) for i, j in pairs]


def extrapolated_peak(r1: SampleRun, r2: SampleRun, s1: float, s2: float) -> int:
    """The largest point of the step's memory timeline extrapolated to ``s = 1`` (:func:`extrapolated_points`)."""
    return int(max([0.0] + [v for v, _ in extrapolated_points(r1, r2, s1, s2)]))


def _format_bytes(formats: Sequence[str], nodes: int, edges: int) -> int:
    """Bytes of a graph's sparse ``formats`` (names as :func:`~dgl_exact.data.compact.held_formats` gives them)
    at full size, in the id type the trainer gives it."""
    item = torch.iinfo(index_dtype(nodes, edges)).bits // 8
    total = 0
    for f in formats:
        if f == "coo":
            total += 2 * edges * item
        else:  # offsets, indices and (unless positions serve) edge ids
            total += (nodes + 1 + (1 if f.endswith("without edge ids") else 2) * edges) * item
    return total


def sample_sizes(spec: PlanSpec, sample_nodes: int = SAMPLE_NODES) -> tuple:
    """``((n1, e1), (n2, e2))``: the two sample graphs (the second is the full graph when it is small)."""
    n2 = min(spec.nodes, 2 * sample_nodes)
    n1 = max(2, n2 // 2)
    sizes = tuple((n, int(round(Fraction(spec.edges * n, spec.nodes)))) for n in (n1, n2))
    if sizes[1][1] > MAX_SAMPLE_EDGES:
        raise ValueError(f"an average degree of {spec.edges / spec.nodes:.4g} gives the {n2}-node sample graph "
                         f"{sizes[1][1]:,} edges, more than the {MAX_SAMPLE_EDGES:,} a sample may hold; plan a "
                         "graph of at most "
                         f"{MAX_SAMPLE_EDGES // n2:,} edges per node")
    return sizes


def samples_for(spec: PlanSpec, gpu: bool = False, sample_nodes: int = SAMPLE_NODES) -> tuple:
    """The two :class:`SampleGraph` of a prediction."""
    return tuple(SampleGraph(spec, n, e, n / spec.nodes, gpu) for n, e in sample_sizes(spec, sample_nodes))


def predict(spec: PlanSpec, setting: Setting, device_total: Optional[int] = None, gpu: bool = False,
            sample_nodes: int = SAMPLE_NODES, samples: Optional[tuple] = None, hook=None) -> PlanRecord:
    """One setting's :class:`PlanRecord` for ``spec`` (``samples``: from :func:`samples_for`, reused across
    settings; ``hook``: a keep hook factory, see :meth:`SampleGraph.record`)."""
    g1, g2 = samples or samples_for(spec, gpu, sample_nodes)
    r1, r2 = g1.record(setting, hook), g2.record(setting, hook)
    return combine(spec, setting.name, r1, r2, g1.scale, g2.scale, device_total, describe_setting(spec, setting))


def combine(spec: PlanSpec, name: str, r1: "SampleRun", r2: "SampleRun", s1: float, s2: float,
            device_total: Optional[int], compression: str = "") -> PlanRecord:
    """A :class:`PlanRecord` extrapolated from the recorded steps on two samples."""
    peak = extrapolated_peak(r1, r2, s1, s2)
    act = int(round(extrapolate(r1.activation_bytes, r2.activation_bytes, s1, s2)))
    structure = int(round(extrapolate(r1.structure_bytes, r2.structure_bytes, s1, s2)))
    breakdown = {"graph_bytes": _format_bytes(r2.formats, spec.nodes, spec.model_edges)}
    if spec.model in PYG_MODELS:  # the edge_index its PyG model reads (and the edge ids), int64 as PyG's
        breakdown["edge_index_bytes"] = max(0, int(round(extrapolate(r1.edge_index_bytes, r2.edge_index_bytes,
                                                                     s1, s2))))
    breakdown.update({
        "structure_cache_bytes": max(0, structure),
        "feature_bytes": spec.nodes * spec.features * 4,
        "label_bytes": spec.nodes * 8 + spec.train_count * 8,
        "parameter_bytes": r2.parameter_bytes,
        "optimizer_bytes": r2.optimizer_bytes,
    })
    static = sum(breakdown.values())
    total = static + peak
    fits = None if device_total is None else total <= device_total
    return PlanRecord(name, static, act, peak, total, fits, device_total, compression, breakdown)


def plan(spec: PlanSpec, device: str = "cpu", settings: Optional[Sequence[str]] = None,
         sample_nodes: int = SAMPLE_NODES, on_record=None) -> List[PlanRecord]:
    """Predicted memory of ``spec`` on ``device`` (``cpu``, ``cuda`` or a size such as ``"80GiB"``) for each
    setting (names as ``dgl-exact bench``; default :data:`DEFAULT_SETTINGS`); ``on_record(record)`` is called
    as each setting's record is made (``dgl-exact plan`` prints a line)."""
    from .settings import select

    total, _ = device_bytes(device)
    gpu = str(device).startswith("cuda")
    chosen = select(",".join(settings if settings is not None else DEFAULT_SETTINGS))
    check_depth(spec.layers, len(chosen))
    for s in chosen:   # before any sample is recorded
        if s.recompute and spec.model != "gcn2":
            raise ValueError(f"{s.name!r} is a GCNII (gcn2) setting; {spec.model} has no recompute mode")
    with single_thread():
        samples = samples_for(spec, gpu, sample_nodes)
        records = []
        for s in chosen:
            records.append(predict(spec, s, total, gpu, samples=samples))
            if on_record is not None:
                on_record(records[-1])
        return records


@contextlib.contextmanager
def single_thread():
    """Sample graphs are small: one torch thread is faster than two (and far faster on a loaded machine,
    where waiting for a descheduled worker thread dominates every small operator)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def format_table(records: Sequence[PlanRecord], header: str = "") -> str:
    fb = format_bytes
    lines = [header] if header else []
    lines.append("| setting | static | activations | step peak | total | fits |")
    lines.append("|---|---|---|---|---|---|")
    for r in records:
        fits = "n/a" if r.fits is None else ("yes" if r.fits else "NO")
        lines.append(f"| {r.setting} | {fb(r.static_bytes)} | {fb(r.activation_bytes)} | {fb(r.step_peak_bytes)} "
                     f"| {fb(r.total_bytes)} | {fits} |")
    return "\n".join(lines)

