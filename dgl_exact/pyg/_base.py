"""What the PyG drop-ins share: their compression setting, the graph given as PyG gives it (``edge_index``
or a ``torch.sparse`` adjacency) read into a cached :class:`~.structure.EdgeStructure`, and the aggregation
ops they run on it (dgl_exact's autograd graph ops, which keep only what backward needs)."""
from __future__ import annotations

from copy import copy as shallow_copy
from typing import Optional, Tuple

import torch
from torch import Tensor

from .._compat import compiling
from .._docs import doc_filler
from ..compression_config import CompressionConfig, ConfiguredModule
from ..ops.graph import CopyUMinMax, CopyUReduce, UMulESum
from ..ops.keep import fresh_outputs
from ..ops.saved import needs_saving
from ..saved_tensors import compress_saved
from .structure import EdgeStructure, edge_structure

#: the docstring text the drop-ins share, written once: a line of a docstring that is only ``%(name)s`` becomes
#: the entry ``name`` when the class is decorated with :func:`shared_doc` (``{name}``: the class's name)
DOC_FRAGMENTS = {
    "compression": """compression, **kwargs
    As every drop-in takes them (:mod:`dgl_exact.pyg`).""",
    "example_imports": """>>> import torch
>>> from dgl_exact.pyg import {name}""",
    "attention": """out_channels : int
    Output feature size per head.
heads : int, default 1
    Attention heads.
concat : bool, default True
    Concatenate the heads (else average them).
negative_slope : float, default 0.2
    LeakyReLU's slope.
dropout : float, default 0.0
    Attention dropout.
add_self_loops : bool, default True
    Replace the graph's self loops by one per node.""",
    "attention_example": """Example
-------
>>> import torch
>>> from dgl_exact.pyg import {name}
>>> from dgl_exact import CompressionConfig
>>> edge_index = torch.randint(0, 100, (2, 500))
>>> conv = {name}(16, 8, heads=3, compression=CompressionConfig(bits=2))
>>> conv(torch.randn(100, 16), edge_index).shape
torch.Size([100, 24])""",
}

#: fills a drop-in's docstring from :data:`DOC_FRAGMENTS` (:func:`dgl_exact._docs.doc_filler`)
shared_doc = doc_filler(DOC_FRAGMENTS)


class CompressedMixin(ConfiguredModule):
    """``compression`` (a :class:`~dgl_exact.CompressionConfig` or None: the configuration in force), the
    configuration a forward runs under (compression off outside training), and when PyG's own code runs: for
    a call with a PyG hook or ``explain`` (:meth:`_hooked`), and for a setting no compressed path here computes
    (:meth:`pyg_setting`), which every drop-in accepts as PyG's class does and runs as PyG's code
    (:meth:`_pyg_forward`)."""

    #: the aggregations (``aggr``) the drop-in's compressed path computes; None: not a ``MessagePassing``
    compressed_aggregations: Optional[Tuple[str, ...]] = None

    @classmethod
    def pyg_setting(cls, conv: torch.nn.Module) -> Optional[str]:
        """The setting of ``conv`` (this drop-in, or the PyG conv it replaces: read from its attributes, which
        may change after construction, as ``decomposed_layers`` does) that this drop-in has no compressed path
        for, so that its forward runs PyG's code; None where its own path computes it. Here: edge features in
        the attention (GAT's and GATv2's ``edge_dim``: a ``lin_edge``), PyG's ``decomposed_layers > 1`` and an
        aggregation other than :attr:`compressed_aggregations`; a drop-in adds its own."""
        if cls.compressed_aggregations is None:
            return None
        if getattr(conv, "lin_edge", None) is not None:
            return "edge_dim (edge features in the attention)"
        if conv.decomposed_layers != 1:
            return f"decomposed_layers={conv.decomposed_layers}"
        aggr = conv.aggr  # (PyG stores an Aggregation object's as its str, a list's as a list of those)
        if not isinstance(aggr, str) or aggr not in cls.compressed_aggregations:
            return f"aggr {aggr!r}"
        return None

    def _hooked(self) -> bool:
        """Whether a hook on ``propagate``, ``message``, ``aggregate``, ``message_and_aggregate`` or
        ``edge_update`` is registered, or ``explain`` is set: those see PyG's per-edge tensors, which
        dgl_exact's fused ops never form (never, on a module that is not a ``MessagePassing``)."""
        if self.compressed_aggregations is None:
            return False
        return bool(self._explain) or any(getattr(self, name) for name in _PYG_HOOKS)

    def _runs_as_pyg(self) -> bool:
        """Whether this call runs PyG's own forward (:meth:`_pyg_forward`): :meth:`_hooked`, or a
        :meth:`pyg_setting`."""
        return self._hooked() or self.pyg_setting(self) is not None

    def _pyg_forward(self, forward, *args, setting: Optional[str] = None):
        """``forward(*args)``: PyG's own forward (its bound method) for this call. With a hook or ``explain``
        (:meth:`_hooked`) it runs as PyG runs it, uncompressed (the hooks see PyG's tensors). For a setting
        without a compressed path (:meth:`pyg_setting`, or ``setting``, one of this call's inputs), in a
        training forward with compression on, what PyG's code saves for backward is compressed at this
        module's configuration by the generic saved-tensor path, :func:`dgl_exact.compress_saved` (as
        ``compress_model(..., saved_tensors=True)`` covers a ``MessagePassing`` without a drop-in): signs and
        zeros exact, magnitudes at the configuration's bits. Not while torch.compile traces (saved-tensor hooks
        are eager-mode machinery: the compiled forward keeps what PyG's keeps)."""
        if compiling() or self._hooked() or not torch.is_grad_enabled():
            return forward(*args)
        if setting is None and self.pyg_setting(self) is None:
            return forward(*args)
        with compress_saved(self._config(), model=self):
            return forward(*args)

    def _set_jittable_templates(self, raise_on_error: bool = False) -> None:
        """PyG's compilation of ``propagate`` for this class (once per class: :func:`compile_propagate`)."""
        compile_propagate(self, super()._set_jittable_templates, raise_on_error)

    def __prepare_scriptable__(self):
        """What ``torch.jit.script`` compiles in place of this module: a copy of class PyG's own (the class this
        drop-in replaces) sharing its parameters, buffers and submodules (which are prepared in turn, in the
        copy); TorchScript cannot run dgl_exact's autograd ops nor saved-tensor hooks, so the scripted module
        runs PyG's forward, uncompressed, with this module's weights. A subclass defined elsewhere is left as it
        is (its forward may differ)."""
        if not type(self).__module__.startswith("dgl_exact."):
            return self
        base = next(k for k in type(self).__mro__ if k.__module__.startswith("torch_geometric."))
        copy = base.__new__(base)
        state = {k: v for k, v in self.__dict__.items() if k != "compression" and not k.startswith("_dgl_exact")}
        # PyG binds ``propagate`` to the instance for some settings; the copy reads its class's (as scripting does)
        state.pop("propagate", None)
        inspector = state.get("inspector")
        if inspector is not None:
            # PyG compiles propagate with the globals of the inspected class's modules: PyG's class's, not the
            # drop-in's (whose helpers, is_sparse, shadow PyG's names)
            inspector = shallow_copy(inspector)
            inspector._cls, inspector._source_dict = base, {}
            state["inspector"] = inspector
        copy.__dict__.update(state)
        for attr in ("_modules", "_parameters", "_buffers"):  # the copy's own dicts: scripting replaces submodules
            copy.__dict__[attr] = dict(self.__dict__[attr])
        if hasattr(copy, "_set_jittable_templates"):  # PyG's compiled propagate for its class (made once per class)
            compile_propagate(copy, copy._set_jittable_templates)
        return copy

    def explain_path(self) -> Optional[Tuple[str, str]]:
        """For :func:`dgl_exact.explain`: ``(path, why)`` where this module's forward runs PyG's code (a hook, or
        a :meth:`pyg_setting`), else None (its compressed path)."""
        if self._hooked():
            return ("PyG's own forward (uncompressed)",
                    "a PyG hook or explain is set (they see PyG's per-edge tensors)")
        setting = self.pyg_setting(self)
        if setting is not None:
            return ("PyG's own code, its saved tensors compressed by compress_saved",
                    f"{setting}: no compressed path in dgl_exact.pyg")
        return None


def compile_propagate(conv: torch.nn.Module, compile_templates, *args) -> None:
    """Run PyG's ``_set_jittable_templates`` (``compile_templates(*args)``) for ``conv`` so that the
    ``propagate`` it compiles keeps the fused sparse path wherever the class implements
    ``message_and_aggregate``. PyG compiles ``propagate`` once per class from the first instance's ``fuse``, so
    a first instance without it (SAGE's ``aggr="lstm"``) left every later one of the class without a fused path:
    a sparse adjacency then raised "'message_and_aggregate' not implemented". The compiled code still tests
    each instance's own ``fuse`` at run time, so compiling the path in is right for every instance."""
    own = conv.fuse
    conv.fuse = conv.inspector.implements("message_and_aggregate")
    try:
        compile_templates(*args)
    finally:
        conv.fuse = own


_PYG_HOOKS = tuple(f"_{step}_forward{kind}_hooks" for step in ("propagate", "message", "aggregate",
                                                                "message_and_aggregate", "edge_update")
                   for kind in ("_pre", ""))


def materialize(lin: torch.nn.Module, x: Tensor) -> None:
    """Initialise a lazy PyG ``Linear`` (``in_channels=-1``) from ``x`` as its own first call would: its
    forward pre-hook reads the input width (an empty batch of rows computes nothing)."""
    if torch.nn.parameter.is_lazy(lin.weight):
        with torch.no_grad():
            lin(x[:0])


def check_adjacency(edge_index) -> None:
    if isinstance(edge_index, Tensor):
        if edge_index.is_sparse or edge_index.layout in (torch.sparse_csr, torch.sparse_csc):
            return
        if edge_index.dim() != 2 or edge_index.shape[0] != 2 or edge_index.is_floating_point():
            raise ValueError(f"edge_index must be an integer tensor of shape [2, num_edges], got "
                             f"{edge_index.dtype} {tuple(edge_index.shape)}")
        return
    raise NotImplementedError(
        f"dgl_exact.pyg takes the graph as an edge_index tensor [2, E] or a torch.sparse adjacency, not "
        f"{type(edge_index).__name__}; convert a torch_sparse SparseTensor with adj_t.to_torch_sparse_csr_tensor()")


def is_sparse(adj) -> bool:
    return isinstance(adj, Tensor) and (adj.is_sparse or adj.layout in (torch.sparse_csr, torch.sparse_csc))


def sparse_edges(adj_t: Tensor) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """``(src, dst, values)`` of a ``torch.sparse`` adjacency ``adj_t`` indexed ``[target, source]`` (PyG's
    convention for sparse adjacencies), in the order ``torch_geometric.utils.to_edge_index`` lists them."""
    from torch_geometric.utils import to_edge_index

    if adj_t.layout == torch.sparse_coo and adj_t.is_coalesced():
        # as to_edge_index lists them, without its ``_coalesced_(True)``, which bumps the indices' version: a
        # PyG conv that saved them for backward (the same adjacency) would then refuse to run its backward
        ei = adj_t.indices().detach()
        return ei[1], ei[0], adj_t.values()
    if adj_t.layout == torch.sparse_csc:
        adj_t = adj_t.to_sparse_csr()
    ei, values = to_edge_index(adj_t)
    return ei[1], ei[0], values


def structure(edge_index, variant: str, num_src: int, num_dst: int, device, flow: str = "source_to_target",
              key: Optional[Tensor] = None, transform=None) -> EdgeStructure:
    """The cached structure of ``edge_index`` (a ``[2, E]`` tensor read with PyG's ``flow``, or a ``torch.sparse``
    adjacency indexed ``[target, source]``), keyed on ``key`` (default: ``edge_index`` itself) and ``variant``:
    ``edge_index`` must be the same function (named by ``variant``) of ``key`` on every call. ``transform``: the
    structure is that of ``transform(edge_index)`` (a ``[2, E']`` tensor; called only when none is cached)."""
    check_adjacency(edge_index)
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError(f"flow must be 'source_to_target' or 'target_to_source', got {flow!r}")
    if flow == "target_to_source" and is_sparse(edge_index):
        raise ValueError("flow 'target_to_source' does not apply to a sparse adjacency (as in PyG): pass the "
                         "transposed adjacency, adj_t.t(), with the default flow")

    def endpoints():
        if transform is not None:
            graph = transform(edge_index)
            return (graph[0], graph[1]) if flow == "source_to_target" else (graph[1], graph[0])
        if is_sparse(edge_index):
            src, dst, _ = sparse_edges(edge_index)
            return src, dst
        return (edge_index[0], edge_index[1]) if flow == "source_to_target" else (edge_index[1], edge_index[0])

    if flow == "target_to_source":
        variant += "|target_to_source"
    return edge_structure(edge_index if key is None else key, variant, num_src, num_dst, device, endpoints)


def attention_result(graph, alpha: Tensor, n_src: int, n_dst: int):
    """What an attention conv returns with ``return_attention_weights`` for ``alpha [E', H]`` over ``graph``
    (the adjacency after its self-loop edits): ``(edge_index, alpha)``, or for a ``torch.sparse`` adjacency, as
    PyG, ``(adjacency holding the attention in graph's layout, alpha)``; ``alpha`` lists the edges in the order
    :func:`sparse_edges` reads them (row-major), which the coalesced COO tensor shares."""
    if not is_sparse(graph):
        return graph, alpha
    src, dst, _ = sparse_edges(graph)
    adj = torch.sparse_coo_tensor(torch.stack([dst, src]), alpha, (n_dst, n_src, alpha.shape[1])).coalesce()
    if graph.layout == torch.sparse_csr:
        adj = adj.to_sparse_csr()
    elif graph.layout == torch.sparse_csc:
        adj = adj.to_sparse_csc()
    return adj, alpha


def finish_heads(out: Tensor, heads: int, out_channels: int, concat: bool, res: Optional[Tensor],
                 bias: Optional[Tensor]) -> Tensor:
    """An attention conv's output from ``out [N_dst, H, C]``: heads concatenated (``concat``) or averaged,
    plus the residual ``res`` and the ``bias`` where given (PyG's order)."""
    out = out.reshape(-1, heads * out_channels) if concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    if bias is not None:
        out = out + bias
    return out


@fresh_outputs
def weighted_sum(st: EdgeStructure, x: Tensor, edge_weight: Optional[Tensor], cfg: CompressionConfig) -> Tensor:
    """``out[v] = sum_{e = (u, v)} w[e] x[u]`` (``w`` 1 without ``edge_weight [E]``); ``x [N_src, *F]``. Keeps
    nothing without edge weights; with them, the weights exactly and, where they need a gradient, ``x``
    compressed under ``cfg`` (PyG keeps the ``[E, *F]`` messages)."""
    if x.shape[0] != st.num_src:
        raise ValueError(f"features have {x.shape[0]} rows but the graph has {st.num_src} source nodes")
    if edge_weight is None:
        return CopyUReduce.apply(x, st, False)
    if edge_weight.numel() != st.num_edges:
        raise ValueError(f"edge_weight has {edge_weight.numel()} values but the graph has {st.num_edges} edges")
    out_shape = tuple(x.shape[1:])
    dim = x[0].numel() if x.shape[0] else int(torch.Size(out_shape).numel())
    w = edge_weight.reshape(st.num_edges, 1)
    if not needs_saving(x, w):
        out = st.aggregate(x.reshape(x.shape[0], 1, dim), w.to(x.dtype))
        return out.view((st.num_dst,) + out_shape)
    return UMulESum.apply(x, w, st, out_shape, 1, dim, cfg)


@fresh_outputs
def symmetric_norm_sum(st: EdgeStructure, x: Tensor, owned: bool = False) -> Tensor:
    """``out[v] = sum_{(u, v)} d(u) d(v) x[u]`` with ``d = deg_in^-1/2`` (0 for a node without in-edges), the
    in-degrees counting duplicate edges: PyG's ``gcn_norm`` on unit edge weights, its factors applied to the
    nodes (before and after a sum that keeps nothing), so that no per-edge weight exists or is kept.
    ``owned``: ``x`` is the caller's own temporary, scaled in place."""
    if x.shape[0] != st.num_src or st.num_src != st.num_dst:
        raise ValueError(f"features have {x.shape[0]} rows; a graph of {st.num_src} nodes needs one per node")
    d = st.in_degrees().to(x.dtype).pow(-0.5)
    d.masked_fill_(d == float("inf"), 0.0)
    d = d.view(-1, *([1] * (x.dim() - 1)))
    x = x.mul_(d) if owned else x * d
    return CopyUReduce.apply(x, st, False).mul_(d)


@fresh_outputs
def mean(st: EdgeStructure, x: Tensor) -> Tensor:
    """``out[v] = mean_{(u, v)} x[u]`` (0 without in-edges; a duplicate edge counts twice, as PyG's mean
    aggregation counts it); keeps nothing."""
    if x.shape[0] != st.num_src:
        raise ValueError(f"features have {x.shape[0]} rows but the graph has {st.num_src} source nodes")
    return CopyUReduce.apply(x, st, True)


@fresh_outputs
def plain_sum(st: EdgeStructure, x: Tensor) -> Tensor:
    """``out[v] = sum_{(u, v)} x[u]``; keeps nothing."""
    if x.shape[0] != st.num_src:
        raise ValueError(f"features have {x.shape[0]} rows but the graph has {st.num_src} source nodes")
    return CopyUReduce.apply(x, st, False)


@fresh_outputs
def maximum(st: EdgeStructure, x: Tensor) -> Tensor:
    """``out[v] = max_{(u, v)} x[u]`` (0 without in-edges, as PyG's max aggregation); keeps the winning source
    per element (the narrowest integer type that holds it), PyG the ``[E, *F]`` messages."""
    if x.shape[0] != st.num_src:
        raise ValueError(f"features have {x.shape[0]} rows but the graph has {st.num_src} source nodes")
    return CopyUMinMax.apply(x, st, "max")
