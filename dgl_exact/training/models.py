"""The GNN architectures of the EXACT benchmarks, buildable from DGL's layers (``impl='dgl'``, the baseline
users have today) or from dgl_exact's (``impl='exact'``) with identical parameters and ``state_dict``.

Every hidden layer is ``conv -> BatchNorm (optional) -> ReLU -> Dropout``; dgl_exact fuses the last two
into one op keeping a single bit per element. A first GraphSAGE layer on input features (the largest hidden
rows of a neighbour-sampled step) runs with its BatchNorm, ReLU and Dropout as one op where that computes
what the modules compute (:meth:`dgl_exact.SAGEConv.forward_bn_relu_dropout`: one layer-sized buffer at the
forward's and the backward's peak instead of two). A model asks its convs through the methods every dgl_exact
module has (:class:`dgl_exact.nn._base.CompressedModuleMixin`: ``forward_bn_relu_dropout``,
``input_compression``); when a fast path runs is decided in :mod:`dgl_exact.nn.fastpaths`.

``dropout2`` (EXACT's ``--dropout2``, its ``QDropout2``) turns every dropout of a model into the original,
non-inverted dropout: kept values are not scaled by ``1 / (1 - p)`` while training, and evaluation
multiplies by ``1 - p`` instead.

:func:`layerwise_inference` evaluates any of these models one layer at a time for all nodes, in batches
of destination nodes with their full in-neighbourhood (EXACT's products scripts): the same result as a
full-graph evaluation forward, up to float rounding, with one layer's activations alive at a time.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import nn as exact_nn
from .. import ops
from .._compat import import_dgl
from ..compression import draw_seed
from ..data.compact import keep_edges
from ..nn import fastpaths
from ..nn._base import CompressedModuleMixin
from ..ops.donation import donate, reclaim
from ..ops.recompute import recompute_segment
from ..nn.conv.gcn2conv import gcnii_stack

dgl = import_dgl()

MODELS = ("gcn", "sage", "gat", "gcn2")
IMPLS = ("exact", "dgl")


class _Layers:
    """Layer constructors for one implementation."""

    def __init__(self, impl: str, dropout2: bool = False):
        if impl not in IMPLS:
            raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
        self.impl, self.dropout2 = impl, dropout2
        exact = impl == "exact"
        self.GraphConv = exact_nn.GraphConv if exact else dgl.nn.GraphConv
        self.SAGEConv = exact_nn.SAGEConv if exact else dgl.nn.SAGEConv
        self.GATConv = exact_nn.GATConv if exact else dgl.nn.GATConv
        self.GCN2Conv = exact_nn.GCN2Conv if exact else dgl.nn.GCN2Conv
        self.Linear = exact_nn.Linear if exact else nn.Linear
        self.BatchNorm1d = exact_nn.BatchNorm1d if exact else nn.BatchNorm1d

    def _undo_scale(self, x, p):
        """dropout2: inverted dropout times ``1 - p`` (a scalar product keeps nothing for backward)."""
        return x * (1.0 - p) if self.dropout2 and p > 0 else x

    def relu_dropout(self, x, p, training, compress_for=None):
        """``compress_for``: how the next module keeps this output (``input_compression``); not with
        dropout2, whose rescaled copy is what that module sees."""
        if self.impl == "exact":
            keep = None if self.dropout2 and p > 0 else compress_for
            return self._undo_scale(ops.relu_dropout(x, p, training, compress_for=keep), p)
        return self._undo_scale(F.dropout(F.relu(x), p, training), p)

    def dropout(self, x, p, training):
        out = ops.dropout(x, p, training) if self.impl == "exact" else F.dropout(x, p, training)
        return self._undo_scale(out, p)

    def relu(self, x):
        return ops.relu(x) if self.impl == "exact" else F.relu(x)


class _Rows:
    """One layer's output for all nodes, filled batch by batch (no list of pieces and concatenated copy)."""

    def __init__(self, num_nodes: int):
        self.num_nodes, self.out = num_nodes, None

    def put(self, block, rows: torch.Tensor) -> None:
        if self.out is None:
            self.out = rows.new_empty((self.num_nodes,) + tuple(rows.shape[1:]))
        self.out[block.dstdata[dgl.NID].to(rows.device).long()] = rows


class _OwnLayers:
    """What :mod:`dgl_exact.nn.fastpaths` asks a model before offering its layers a fused path."""

    _lib: _Layers

    def uses_own_layers(self) -> bool:
        """Whether the layers are dgl_exact's own, with inverted dropout (``impl='exact'``, no ``dropout2``)."""
        return self._lib.impl == "exact" and not self._lib.dropout2


class StackedGNN(_OwnLayers, nn.Module):
    """``layers`` convolutions with BN/ReLU/Dropout between them (GCN, GraphSAGE, GAT).

    Works on a whole graph or on a list of DGL blocks (one per layer) from a neighbour sampler.

    EXACT's arxiv GAT options: ``edge_drop`` (while training, each forward keeps a random
    ``1 - edge_drop`` of the graph's edges, the same for every layer, unscaled; whole graphs only),
    ``residual`` (every GAT layer adds ``res_fc(x)``, a bias-free linear map of its input, before its bias,
    also when the widths match) and ``use_attn_dst=False`` (one attention vector scores both ends of an
    edge: ``attn_r`` is ``attn_l``; EXACT's ``CustomGATConv``, unlike DGL's example where it drops the
    destination term).
    """

    def __init__(self, model: str, in_feats: int, hidden: int, num_classes: int, layers: int = 3,
                 dropout: float = 0.5, batch_norm: bool = True, heads: int = 3, input_dropout: float = 0.0,
                 impl: str = "exact", dropout2: bool = False, edge_drop: float = 0.0, residual: bool = False,
                 use_attn_dst: bool = True):
        super().__init__()
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        if not 0.0 <= edge_drop < 1.0:
            raise ValueError(f"edge_drop must be in [0, 1), got {edge_drop}")
        self._lib = _Layers(impl, dropout2)
        self.model, self.dropout, self.input_dropout = model, dropout, input_dropout
        self.edge_drop = edge_drop
        # GAT concatenates its hidden heads (``hidden`` is the size per head, as in DGL's ogbn-arxiv example)
        width = hidden * heads if model == "gat" else hidden
        dims = [in_feats] + [width] * (layers - 1) + [num_classes]
        self.convs = nn.ModuleList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            last = i == layers - 1
            if model == "gcn":
                conv = self._lib.GraphConv(a, b, allow_zero_in_degree=True)
            elif model == "sage":
                conv = self._lib.SAGEConv(a, b, "mean")
            elif model == "gat":
                out, n_heads = (b, 1) if last else (hidden, heads)
                conv = self._lib.GATConv(a, out, num_heads=n_heads, allow_zero_in_degree=True)
                if residual:  # EXACT: always a bias-free linear map (DGL would use identity for equal widths)
                    conv.res_fc = self._lib.Linear(a, n_heads * out, bias=False)
                    nn.init.xavier_normal_(conv.res_fc.weight, gain=nn.init.calculate_gain("relu"))
                if not use_attn_dst:
                    conv.attn_r = conv.attn_l
            else:
                raise ValueError(f"unknown model {model!r}; expected one of {MODELS}")
            self.convs.append(conv)
        self.norms = nn.ModuleList([self._lib.BatchNorm1d(width) for _ in range(layers - 1)]) if batch_norm else None

    def reset_parameters(self):
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def forward(self, graph, x, edge_weight=None):
        """``graph``: a graph or one block per layer; ``edge_weight``: per-edge message weights (e.g.
        GraphSAINT's aggregation normalisation), one tensor or one per block."""
        if self.training and self.edge_drop > 0:
            graph, edge_weight = self._drop_edges(graph, edge_weight)
        blocks = graph if isinstance(graph, (list, tuple)) else [graph] * len(self.convs)
        weights = edge_weight if isinstance(edge_weight, (list, tuple)) else [edge_weight] * len(self.convs)
        h = self._input(x)
        for i, (conv, g, w) in enumerate(zip(self.convs, blocks, weights)):
            if i == 0 and fastpaths.FIRST_LAYER_BN_RELU_DROPOUT.runs(self, w):
                # the first layer with its batch norm, ReLU and dropout as one op where that computes what
                # the modules compute (one layer-sized buffer at its peaks instead of two); else None
                nxt = blocks[1]
                out = conv.forward_bn_relu_dropout(g, h, self.norms[0], self.dropout,
                                                   compress_for=self._next_keeps(0, nxt, h))
                if out is not None:
                    h, out = out, None  # no second name on the output: the next conv's call is its last use
                    continue
            # a hidden representation nothing else reads: donated to the conv, which may free it once kept
            h = [conv(g, donate(h) if i > 0 and self._lib.impl == "exact" else h, edge_weight=w)]
            h = self._after_conv(i, h, blocks[i + 1] if i + 1 < len(blocks) else None)
        return h

    def _input(self, x):
        return self._lib.dropout(x, self.input_dropout, self.training) if self.input_dropout > 0 else x

    def _drop_edges(self, graph, edge_weight):
        """The graph with a random ``1 - edge_drop`` of its edges (in their order) and their edge weights."""
        if isinstance(graph, (list, tuple)):
            raise ValueError("edge_drop needs whole (sub)graphs, not blocks from a neighbour sampler")
        n = graph.num_edges()
        keep = torch.randperm(n)[int(n * self.edge_drop):].sort().values
        sub = keep_edges(graph, keep)  # no format the graph does not hold (a training graph: CSC and CSR only)
        if isinstance(edge_weight, torch.Tensor):
            edge_weight = edge_weight[keep.to(edge_weight.device)]
        return sub, edge_weight

    def _next_keeps(self, i, next_graph, h):
        """How conv ``i + 1`` keeps its input (``input_compression``), so that ReLU+dropout can compress its
        output in the same pass; None where unknown."""
        nxt = self.convs[i + 1]
        return (nxt.input_compression(next_graph, h)
                if next_graph is not None and isinstance(nxt, CompressedModuleMixin) else None)

    def _after_conv(self, i, owned: list, next_graph=None):
        """What follows convolution ``i``: heads merged, BatchNorm, ReLU and dropout (hidden layers).
        ``owned``: a one-item list holding the conv's output, which this call takes out of it (the caller
        keeps no name on the output: it dies as soon as the step after it has run, not when this returns)."""
        h = owned.pop()
        if h.dim() == 3:  # GAT: concatenate hidden heads, average output heads
            h = h.flatten(1) if i < len(self.convs) - 1 else h.mean(1)
        if i < len(self.convs) - 1:
            if self.norms is not None:
                h = self.norms[i](h)
            h = self._lib.relu_dropout(h, self.dropout, self.training, compress_for=self._next_keeps(i, next_graph, h))
        return h

    @torch.no_grad()
    def layerwise(self, graph, x, batches, step: Callable[[], None] = lambda: None):
        """Evaluation forward one layer at a time (see :func:`layerwise_inference`)."""
        h = self._input(x)
        out_deg = graph.out_degrees().float().clamp(min=1) if self.model == "gcn" else None
        for i, conv in enumerate(self.convs):
            rows = _Rows(graph.num_nodes())
            for block in batches:
                src = block.srcdata[dgl.NID]
                w = None
                if out_deg is not None:  # GraphConv's source norm on a block uses the block's out-degrees:
                    # weight each edge by sqrt(block out-degree / graph out-degree) of its source
                    per_src = (block.out_degrees().float().clamp(min=1) / out_deg[src]).sqrt()
                    w = per_src[block.edges(order="eid")[0].long()].to(h.device, h.dtype)
                rows.put(block, self._after_conv(i, [conv(block, h[src.to(h.device)], edge_weight=w)]))
                step()
            h = rows.out
        return h


class GCNII(_OwnLayers, nn.Module):
    """GCNII (Chen et al., 2020): ``Linear -> L x GCN2Conv (residual to the initial representation) -> Linear``.

    Layer ``l`` computes ``h_l = conv_l(h_{l-1}, h_0)``, then BatchNorm (optional), then ``h_l += h_{l-1}``
    when ``residual`` (EXACT's ``residual: true``: added after BatchNorm, before ReLU), then ReLU and
    Dropout. ``shared_weights=False`` gives the initial representation its own weight (DGL's
    ``project_initial_features=False``, EXACT's/PyG's ``shared_weights: false``).
    ``identity_mapping=False`` sets every ``beta_l`` to 1: ``(1 - beta) I + beta W`` becomes ``W``, which
    is what EXACT's arxiv GCNII runs (PyG's ``GCN2Conv`` with ``theta=None``); ``lambda_`` is then unused.

    Training with compression on, shared weights and no residual, the hidden layers run as fused in-place
    ops (:func:`dgl_exact.nn.conv.gcn2conv.gcnii_stack`: two layer-sized buffers at the step's peak instead
    of three); the modules' parameters, buffers and ``state_dict`` are the same either way.

    ``recompute``: segment length ``L`` of the "recompute" mode (None or 0: off; ``'auto'``:
    ``round(sqrt(layers))``). Training with grad, the hidden layers then run in segments of ``L`` layers
    (the fused stack's recomputed form, :func:`dgl_exact.ops.gcn2_recompute.gcnii_layers_recomputed`, where
    the fused stack applies; else the modules through :func:`dgl_exact.ops.recompute.recompute_segment`):
    only each segment's input and ``h0`` (once) are
    kept, compressed under the layers' configuration, and the backward re-runs each segment from the
    decoded copy; memory no longer grows with the depth's kept activations. The fused form also folds the
    input layer in (``h0 = relu(lin_in(dropout(x)))`` computed inside it, ``h0``'s gradient summed straight
    into ``lin_in``'s: one layer-sized block less in the backward) where ``lin_in`` has no hooks, ``x``
    needs no gradient and ``in_feats <= hidden`` (each layer's backward then pays an ``[in_feats, N] x [N,
    hidden]`` product for it). The forward is exact; the
    gradients are exact with compression off and otherwise read activations recomputed from the decoded
    boundary (see :mod:`dgl_exact.ops.recompute`). Taken with dgl_exact layers, no ``residual``, no
    ``dropout2``, no edge weights and no hooks on the hidden layers
    (:data:`dgl_exact.nn.fastpaths.GCNII_RECOMPUTE`); elsewhere the layers run as above.
    """

    def __init__(self, in_feats: int, hidden: int, num_classes: int, layers: int = 8, dropout: float = 0.5,
                 alpha: float = 0.1, lambda_: float = 0.5, batch_norm: bool = False, impl: str = "exact",
                 shared_weights: bool = True, residual: bool = False, identity_mapping: bool = True,
                 dropout2: bool = False, recompute: Optional[Union[int, str]] = None):
        super().__init__()
        self._lib = _Layers(impl, dropout2)
        self.recompute = recompute_length(recompute, layers)
        self.dropout, self.residual = dropout, residual
        self.lin_in = self._lib.Linear(in_feats, hidden)
        self.convs = nn.ModuleList([self._lib.GCN2Conv(hidden, layer=i + 1, alpha=alpha, lambda_=lambda_,
                                                       project_initial_features=shared_weights,
                                                       allow_zero_in_degree=True) for i in range(layers)])
        if not identity_mapping:
            for conv in self.convs:
                conv.beta = 1.0   # DGL's and dgl_exact's GCN2Conv read self.beta in forward
        self.norms = nn.ModuleList([self._lib.BatchNorm1d(hidden) for _ in range(layers)]) if batch_norm else None
        self.lin_out = self._lib.Linear(hidden, num_classes)

    def reset_parameters(self):
        for m in self.modules():
            if m is not self and hasattr(m, "reset_parameters"):
                m.reset_parameters()

    def forward(self, graph, x, edge_weight=None):
        if isinstance(graph, (list, tuple)):
            raise ValueError("GCNII runs on whole (sub)graphs, not on blocks from a neighbour sampler")
        if fastpaths.GCNII_RECOMPUTE.runs(self, edge_weight):
            # the fused stack in recomputed segments with the input layer folded in where it applies (h0's
            # gradient is summed straight into lin_in's), else without it, else the modules in segments
            out = gcnii_stack(graph, self.convs, self.norms, x, self.dropout, self.dropout, self.lin_out,
                              recompute=self.recompute, stem=self.lin_in, stem_dropout=self.dropout)
            if out is not None:
                return out
            h0 = self._initial(x)
            out = gcnii_stack(graph, self.convs, self.norms, h0, self.dropout, self.dropout, self.lin_out,
                              recompute=self.recompute)
            return out if out is not None else self._recomputed(graph, h0)
        if edge_weight is None and not self.residual and self._lib.impl == "exact" and not self._lib.dropout2:
            # the hidden layers as fused in-place ops where they apply (two layer-sized buffers at the
            # step's peak instead of three); else the modules below
            h0 = self._initial(x)
            # h0 is read by the stack only: donated, it goes once the last layer has read it (rule 5)
            out = gcnii_stack(graph, self.convs, self.norms, donate(h0), self.dropout,
                              self.dropout if self.training else 0.0, self.lin_out)
            if out is not None:
                return out
            h0 = reclaim(h0)  # the stack declined it: ours again
            h = self._lib.dropout(h0, self.dropout, self.training)
        else:
            h, h0 = self._input(x)
        for i, conv in enumerate(self.convs):
            if self.residual:
                h = self._after_conv(i, conv(graph, h, h0, edge_weight=edge_weight), h)
                continue
            h = conv(graph, h, h0, edge_weight=edge_weight)
            if self.norms is not None:
                h = self.norms[i](h)
            h = self._lib.relu_dropout(h, self.dropout, self.training)
        return self.lin_out(h)

    def _recomputed(self, graph, h0):
        """The training forward of the modules in recomputed segments (``recompute``; see the class
        docstring), from the initial representation ``h0``."""
        h = self._lib.dropout(h0, self.dropout, self.training)
        n = len(self.convs)
        seeds = [draw_seed() if self.dropout > 0 else 0 for _ in range(n)]   # replayed by the recompute
        cfg, memo = self.convs[0]._config(), {}
        for s in range(0, n, self.recompute):
            idx = range(s, min(n, s + self.recompute))
            mods = [self.convs[i] for i in idx] + ([self.norms[i] for i in idx] if self.norms is not None else [])
            params = [p for m in mods for p in m.parameters() if p.requires_grad]
            buffers = [b for m in mods for b in m.buffers()]
            h = recompute_segment(lambda h, h0, idx=idx: self._segment(graph, idx, seeds, h, h0), h, h0,
                                  config=cfg, params=params, memo=memo, buffers=buffers)
        return self.lin_out(h)

    def _segment(self, graph, idx, seeds, h, h0):
        """Hidden layers ``idx`` from ``h`` with the given dropout seeds (the same masks with and without
        grad)."""
        for i in idx:
            h = self.convs[i](graph, h, h0)
            if self.norms is not None:
                h = self.norms[i](h)
            h = ops.relu_dropout(h, self.dropout, True, seed=seeds[i])
        return h

    def _input(self, x):
        """(input of the first layer, initial representation ``h0``). ``h0`` is reused undropped by every
        layer, as in the GCNII paper's code and EXACT's GCN2; only the first layer's input is dropped."""
        h0 = self._initial(x)
        return self._lib.dropout(h0, self.dropout, self.training), h0

    def _initial(self, x):
        return self._lib.relu(self.lin_in(self._lib.dropout(x, self.dropout, self.training)))

    def _after_conv(self, i, out, h):
        """``out``: the conv output; ``h``: the layer input (used only with ``residual``)."""
        if self.norms is not None:
            out = self.norms[i](out)
        if self.residual:
            out = out + h
        return self._lib.relu_dropout(out, self.dropout, self.training)

    @torch.no_grad()
    def layerwise(self, graph, x, batches, step: Callable[[], None] = lambda: None):
        """Evaluation forward one layer at a time (see :func:`layerwise_inference`). GCN2Conv has no block
        form, so its propagation (symmetric in-degree norm, as DGL's and ours without edge weights) is done
        here and the rest of the layer follows the conv's own parameters."""
        h, h0 = self._input(x)
        norm = graph.in_degrees().float().clamp(min=1).pow(-0.5).to(h.device, h.dtype).unsqueeze(1)
        for i, conv in enumerate(self.convs):
            rows = _Rows(graph.num_nodes())
            for block in batches:
                src, dst = block.srcdata[dgl.NID].to(h.device), block.dstdata[dgl.NID].to(h.device)
                agg = ops.copy_u_sum(block, h[src] * norm[src]) * norm[dst] * (1 - conv.alpha)
                init = h0[dst] * conv.alpha
                if conv._project_initial_features:
                    proj = (agg + init) @ conv.weight1
                else:
                    proj = agg @ conv.weight1 + init @ conv.weight2
                out = (1 - conv.beta) * (agg + init) + conv.beta * proj
                if conv._bias:
                    out = out + conv.bias
                rows.put(block, self._after_conv(i, out, h[dst]))
                step()
            h = rows.out
        return self.lin_out(h)


def destination_blocks(graph, batch_size: int):
    """``graph``'s nodes in consecutive batches of ``batch_size`` destination nodes, each as a DGL block
    holding all its in-edges (sources: the batch first, then its in-neighbours; ``dgl.NID`` in
    ``srcdata``/``dstdata``). Built once and reused by every layer of :func:`layerwise_inference`."""
    if batch_size < 1:
        raise ValueError(f"eval batch size must be >= 1, got {batch_size}")
    n, blocks = graph.num_nodes(), []
    bare = dgl.graph(graph.edges(order="eid"), num_nodes=n)  # structure only: blocks copy no node data
    for start in range(0, n, batch_size):
        dst = torch.arange(start, min(start + batch_size, n), dtype=bare.idtype, device=bare.device)
        blocks.append(dgl.to_block(dgl.in_subgraph(bare, dst), dst_nodes=dst, include_dst_in_src=True))
    return blocks


@torch.no_grad()
def layerwise_inference(model: nn.Module, graph, feat: torch.Tensor, batch_size: int, progress: bool = False):
    """``model``'s evaluation-mode output for every node of ``graph``, computed one layer at a time for all
    nodes, in batches of ``batch_size`` destination nodes with their whole in-neighbourhood (EXACT's
    ``mini_inference`` for products). Equal to ``model.eval()(graph, feat)`` up to float rounding, while
    only one layer's outputs (plus one batch's inputs) are alive at a time. ``progress``: a tqdm bar over
    layers x batches."""
    from tqdm.auto import tqdm

    target = model.module if hasattr(model, "module") else model
    if not hasattr(target, "layerwise"):
        raise TypeError(f"{type(target).__name__} has no layer-wise evaluation")
    was_training = target.training
    target.eval()
    blocks = destination_blocks(graph, batch_size)
    bar = tqdm(total=len(blocks) * len(target.convs), disable=not progress, desc="evaluating", unit="batch",
               leave=False, dynamic_ncols=True)
    try:
        return target.layerwise(graph, feat, blocks, step=lambda: bar.update(1))
    finally:
        bar.close()
        target.train(was_training)


LOSSES = ("ce", "exact_log")
EXACT_LOG_EPS = 1.0 - math.log(2.0)


def exact_log_loss(logits: torch.Tensor, target: torch.Tensor, index: Optional[torch.Tensor] = None,
                   weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """EXACT's ogbn-arxiv objective (``loss: exact_log``): per training row the cross-entropy ``ce_i`` is
    replaced by ``log(eps + ce_i) - log(eps)`` with ``eps = 1 - log 2``, then averaged (or, with per-row
    ``weight``, the weighted sum, as :func:`dgl_exact.ops.cross_entropy`). It equals ``ce_i`` to first
    order near 0 and grows only logarithmically for badly classified rows.

    ``logits[index]`` are the training rows (all rows when ``index`` is None); ``target`` is already
    indexed. Plain autograd: it keeps the softmax of the training rows (``[rows, classes]`` floats).
    """
    if target.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"exact_log_loss expects integer class targets (single-label), got {target.dtype}")
    rows = logits if index is None else logits[index]
    ce = F.cross_entropy(rows.float(), target.long(), reduction="none")
    per_row = torch.log(EXACT_LOG_EPS + ce) - math.log(EXACT_LOG_EPS)
    return per_row.mean() if weight is None else (per_row * weight.to(per_row.dtype)).sum()


def recompute_length(recompute: Optional[Union[int, str]], layers: int) -> int:
    """GCNII's recompute segment length: 0 (off) for None/0, ``round(sqrt(layers))`` for ``'auto'``, else the
    given positive int."""
    if recompute in (None, 0, "0", "off", "none"):
        return 0
    if isinstance(recompute, str):
        if recompute.lower() == "auto":
            return max(1, round(math.sqrt(layers)))
        recompute = int(recompute)
    if int(recompute) < 0:
        raise ValueError(f"recompute must be a positive segment length, 0/None (off) or 'auto'; got {recompute!r}")
    return int(recompute)


def build_model(model: str, in_feats: int, num_classes: int, hidden: int = 128, layers: int = 3,
                dropout: float = 0.5, batch_norm: bool = True, heads: int = 3, alpha: float = 0.1,
                lambda_: float = 0.5, input_dropout: float = 0.0, impl: str = "exact", shared_weights: bool = True,
                residual: bool = False, identity_mapping: bool = True, dropout2: bool = False,
                edge_drop: float = 0.0, use_attn_dst: bool = True,
                recompute: Optional[Union[int, str]] = None, framework: str = "dgl") -> nn.Module:
    """Build one of :data:`MODELS` with DGL's (``impl='dgl'``) or dgl_exact's (``impl='exact'``) layers.

    ``shared_weights`` and ``identity_mapping`` are GCNII's (see :class:`GCNII`); ``residual`` is GCNII's
    and GAT's, ``use_attn_dst`` GAT's, ``edge_drop`` GCN's, SAGE's and GAT's (see :class:`StackedGNN`); other
    models refuse non-default values. ``dropout2``: EXACT's non-inverted dropout (module docstring).
    ``recompute``: GCNII's recompute segment length (see :class:`GCNII`); other models refuse it.
    ``framework='pyg'``: the same architecture (or ``gatv2``, PyG's alone) on PyTorch Geometric's layers, converted by
    :func:`dgl_exact.compress_model` (``impl='exact'``) or as PyG runs it, called as the trainer calls its models
    (:class:`~dgl_exact.training.pyg_models.PyGModel`); the DGL-only options must keep their defaults."""
    if framework == "pyg":
        from .pyg_models import PYG_NETWORKS, PyGModel, build_pyg_network

        if model not in PYG_NETWORKS:
            raise ValueError(f"unknown model {model!r}; expected one of {', '.join(PYG_NETWORKS)}")
        return PyGModel(build_pyg_network(model, in_feats, hidden, num_classes, layers, dropout, batch_norm, heads,
                                          alpha=alpha, theta=lambda_, convert=impl == "exact"))
    if framework != "dgl":
        raise ValueError(f"unknown framework {framework!r}; expected dgl or pyg")
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")
    if not use_attn_dst and model != "gat":
        raise ValueError(f"use_attn_dst is a GAT option; {model} has none (leave it at true)")
    if edge_drop and model == "gcn2":
        raise ValueError("edge_drop is not supported for gcn2 (EXACT uses it for GAT only); leave it at 0")
    if model == "gcn2":
        return GCNII(in_feats, hidden, num_classes, layers=layers, dropout=dropout, alpha=alpha, lambda_=lambda_,
                     batch_norm=batch_norm, impl=impl, shared_weights=shared_weights, residual=residual,
                     identity_mapping=identity_mapping, dropout2=dropout2, recompute=recompute)
    if recompute_length(recompute, layers):
        raise ValueError(f"recompute is a GCNII option; {model} has none (leave it off)")
    if not shared_weights or (residual and model != "gat") or not identity_mapping:
        raise ValueError(f"shared_weights, residual and identity_mapping are GCNII options (residual also GAT's); "
                         f"{model} has none (leave them at true, false, true)")
    return StackedGNN(model, in_feats, hidden, num_classes, layers=layers, dropout=dropout, batch_norm=batch_norm,
                      heads=heads, input_dropout=input_dropout, impl=impl, dropout2=dropout2, edge_drop=edge_drop,
                      residual=residual, use_attn_dst=use_attn_dst)
