"""Models as users write them, measured beside the project's own (``dgl-exact bench memory --models
user-sage,user-sage-donate``): the memory figures the README quotes must be reachable from a user's model.

``user-sage``: three ``dgl.nn.SAGEConv(..., 'mean')`` with ``nn.BatchNorm1d``, ``nn.ReLU`` and
``nn.Dropout(0.5)`` between them, written as a plain loop (``h = conv(g, h); h = post(h)``), converted
with :func:`dgl_exact.compress_model` for dgl_exact's settings and left as written for DGL's.
``user-sage-donate``: the same model with the one word per layer the README documents,
``h = conv(g, dgl_exact.donate(h))``. (``compress_model`` makes each ``Sequential(BatchNorm1d, ReLU, Dropout)``
a :class:`dgl_exact.nn.Sequential` running it as one op; with it the plain loop already reaches the project
model's step peak, and ``SAGEConv`` does not release a donated input: both peak alike.)

``user-block-gcn``, ``user-block-sage``, ``user-block-gat``: a pre-LayerNorm residual GNN
(:class:`PreNormNet`): an input ``nn.Linear(in, hidden)``, ``layers`` blocks
``x = x + FFN(aggregate(LayerNorm(x)))`` with FFN ``Linear -> GELU -> Dropout -> Linear -> Dropout``, then
``nn.Linear(hidden, classes)``. Its own defaults: hidden 512, 5 blocks, FFN dropout 0.1 (the benchmark's
``--hidden``/``--layers`` override the first two). Aggregations: ``gcn``, ``dgl.ops.u_mul_e_sum`` with the
symmetric degree norm ``1 / sqrt(d_u d_v)`` (no weight of its own); ``sage``, ``dgl.nn.SAGEConv(hidden,
hidden, 'mean')``; ``gat``, ``dgl.nn.GATConv`` with :data:`BLOCK_GAT_HEADS` heads of ``hidden / heads``
concatenated back to ``hidden``.

``user-block-gat-ops``: the same blocks with attention written with ``dgl.ops`` in the heads-last layout, as
published research code writes it (:class:`OpsGATAggregate`: ``Linear``, per-head scores ``ops.u_add_v`` of two
linear maps, leaky ReLU, ``ops.edge_softmax``, then ``ops.u_mul_e_sum(g, x [N, D, H], p [E, 1, H])``),
:data:`BLOCK_GAT_OPS_HEADS` heads. Converted as such code is: ``from dgl_exact import ops`` in place of
``from dgl import ops`` (``impl='exact'``), then :func:`dgl_exact.compress_model`.

``arxiv-gcn-user``, ``arxiv-gat-user``: models written in the architecture and API style of DGL's ogbn-arxiv
example (``examples/pytorch/ogb/ogbn-arxiv/models.py``; written here, not copied): :class:`ArxivGCN`, GraphConv
layers with bias-free linear residuals, BatchNorm, ``F.relu`` and Dropout as statements of a plain loop;
:class:`ArxivGAT`, a custom attention layer (:class:`ArxivGATConv`) on DGL's message-passing API
(``apply_edges(fn.u_add_v)``, ``edge_softmax``, ``update_all(fn.u_mul_e, fn.sum)``) with a linear residual,
3 heads. ``user-gcn2``: a user's GCNII loop (:class:`UserGCNII`), 16 ``dgl.nn.GCN2Conv`` each followed by an
``nn.Sequential(BatchNorm1d, ReLU, Dropout)``. These are converted by the README's one line,
``dgl_exact.compress_model(model)``, and nothing else; ``dgl-exact bench census`` names the lines that hold
their peaks. ``user-gcn2-donate``: the GCNII loop with the one word per layer the conversion guide documents,
``conv(graph, dgl_exact.donate(h), h0)`` from the second layer on.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._compat import import_dgl
from ..nn.convert import compress_model
from .. import ops as exact_ops
from ..ops.donation import donate
from ..training.workloads import ModelTraits

dgl = import_dgl()
fn = dgl.function
edge_softmax = dgl.nn.functional.edge_softmax

BLOCK_MODELS = ("user-block-gcn", "user-block-sage", "user-block-gat")
#: the block model with attention written with ``dgl.ops`` (converted by swapping the import for dgl_exact's)
OPS_MODELS = ("user-block-gat-ops",)
#: written the way DGL's ogbn-arxiv example writes its models, and a user's GCNII loop
ARXIV_MODELS = ("arxiv-gcn-user", "arxiv-gat-user", "user-gcn2", "user-gcn2-donate")
USER_MODELS = ("user-sage", "user-sage-donate") + BLOCK_MODELS + OPS_MODELS + ARXIV_MODELS
ARXIV_GAT_HEADS, GCN2_USER_LAYERS = 3, 16
BLOCK_HIDDEN, BLOCK_LAYERS, BLOCK_DROPOUT, BLOCK_GAT_HEADS = 512, 5, 0.1, 4
#: heads of :class:`OpsGATAggregate` (hidden 512: 64 features per head, ``x [N, 64, 8]``)
BLOCK_GAT_OPS_HEADS = 8
#: the user models' workload facts (:class:`~dgl_exact.training.workloads.ModelTraits`: self loops for the
#: GCN and GAT blocks, as DGL's GraphConv and GATConv want; default width and depth)
USER_MODEL_TRAITS = {t.name: t for t in (
    ModelTraits("user-sage", self_loops=False, csc_only=False, hidden=128),
    ModelTraits("user-sage-donate", self_loops=False, csc_only=False, hidden=128),
    ModelTraits("user-block-gcn", self_loops=True, csc_only=False, hidden=BLOCK_HIDDEN, layers=BLOCK_LAYERS),
    ModelTraits("user-block-sage", self_loops=False, csc_only=False, hidden=BLOCK_HIDDEN, layers=BLOCK_LAYERS),
    ModelTraits("user-block-gat", self_loops=True, csc_only=False, hidden=BLOCK_HIDDEN, layers=BLOCK_LAYERS,
                heads=BLOCK_GAT_HEADS),
    ModelTraits("user-block-gat-ops", self_loops=True, csc_only=False, hidden=BLOCK_HIDDEN, layers=BLOCK_LAYERS,
                heads=BLOCK_GAT_OPS_HEADS),
    ModelTraits("arxiv-gcn-user", self_loops=True, csc_only=False, hidden=256),
    ModelTraits("arxiv-gat-user", self_loops=True, csc_only=False, hidden=128, heads=ARXIV_GAT_HEADS),
    ModelTraits("user-gcn2", self_loops=True, csc_only=False, hidden=256, layers=GCN2_USER_LAYERS),
    ModelTraits("user-gcn2-donate", self_loops=True, csc_only=False, hidden=256, layers=GCN2_USER_LAYERS),
)}


class UserSAGE(nn.Module):
    """``layers`` DGL ``SAGEConv(..., 'mean')`` with BatchNorm, ReLU and Dropout between them."""

    def __init__(self, in_feats: int, hidden: int, classes: int, layers: int = 3, dropout: float = 0.5,
                 batch_norm: bool = True, donate_inputs: bool = False):
        super().__init__()
        dims = [in_feats] + [hidden] * (layers - 1) + [classes]
        self.convs = nn.ModuleList(dgl.nn.SAGEConv(a, b, "mean") for a, b in zip(dims[:-1], dims[1:]))
        self.posts = nn.ModuleList(
            nn.Sequential(*([nn.BatchNorm1d(hidden)] if batch_norm else []), nn.ReLU(), nn.Dropout(dropout))
            for _ in range(layers - 1))
        self.donate_inputs = donate_inputs

    def forward(self, g, x):
        """Logits of every node of ``g`` from features ``x``."""
        h = x
        for i, conv in enumerate(self.convs):
            h = conv(g, donate(h) if self.donate_inputs and i > 0 else h)
            if i < len(self.posts):
                h = self.posts[i](h)
        return h


class PreNormBlock(nn.Module):
    """``x + FFN(agg(g, LayerNorm(x), *agg_args))``, FFN ``Linear -> GELU -> Dropout -> Linear -> Dropout``."""

    def __init__(self, hidden: int, agg, p: float = BLOCK_DROPOUT):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.ffn = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(p), nn.Linear(hidden, hidden),
                                 nn.Dropout(p))
        self.agg = agg

    def forward(self, g, x, *agg_args):
        """The block's output: ``x`` plus the FFN of the aggregated, normalised ``x``."""
        return x + self.ffn(self.agg(g, self.norm(x), *agg_args))


class PreNormNet(nn.Module):
    """Input ``Linear(in_dim, hidden)``, ``layers`` :class:`PreNormBlock` (``make_agg()`` gives each block its
    aggregation, called ``agg(g, x, *agg_args)``), output ``Linear(hidden, classes)``. ``edge_weight(g)``,
    if given, supplies the aggregation's extra argument when ``forward`` gets none."""

    def __init__(self, in_dim: int, hidden: int, classes: int, layers: int, make_agg: Callable,
                 edge_weight: Optional[Callable] = None, p: float = BLOCK_DROPOUT):
        super().__init__()
        self.inp = nn.Linear(in_dim, hidden)
        self.blocks = nn.ModuleList(PreNormBlock(hidden, make_agg(), p) for _ in range(layers))
        self.out = nn.Linear(hidden, classes)
        self.edge_weight = edge_weight

    def forward(self, g, x, *agg_args):
        """Logits of every node of ``g`` from features ``x`` (``agg_args``: passed to every aggregation)."""
        if not agg_args and self.edge_weight is not None:
            agg_args = (self.edge_weight(g),)
        h = self.inp(x)
        for block in self.blocks:
            h = block(g, h, *agg_args)
        return self.out(h)


def gcn_aggregate(g, x, w):
    """``sum_{u -> v} w_uv x_u`` with DGL's ``u_mul_e_sum``."""
    return dgl.ops.u_mul_e_sum(g, x, w)


def symmetric_norm(g) -> torch.Tensor:
    """GCN's edge weights ``1 / sqrt(d_out(u) d_in(v))`` (degrees clamped to at least 1), no gradient."""
    with torch.no_grad():
        src, dst = g.edges()
        d_out, d_in = g.out_degrees().clamp(min=1).float(), g.in_degrees().clamp(min=1).float()
        return (d_out[src] * d_in[dst]).rsqrt()


class HeadsConcat(nn.Module):
    """A ``dgl.nn.GATConv`` whose ``(N, heads, out)`` output is flattened to ``(N, heads * out)``."""

    def __init__(self, hidden: int, heads: int = BLOCK_GAT_HEADS):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"GAT block: hidden {hidden} is not a multiple of {heads} heads")
        self.conv = dgl.nn.GATConv(hidden, hidden // heads, heads)

    def forward(self, g, x):
        """The heads' outputs concatenated."""
        return self.conv(g, x).flatten(1)


class OpsGATAggregate(nn.Module):
    """Graph attention written with ``ops`` (``dgl.ops``, or ``dgl_exact.ops`` once converted), heads last:
    ``x = Linear(x)``; scores ``ops.u_add_v(g, Linear_u(x), Linear_v(x))`` (``[E, H]``), leaky ReLU,
    ``ops.edge_softmax``; ``ops.u_mul_e_sum`` of ``x`` viewed ``[N, hidden / H, H]`` and the probabilities
    ``[E, 1, H]``, flattened back to ``[N, hidden]``. ``exact_ops``: the import swapped for dgl_exact's."""

    def __init__(self, hidden: int, heads: int = BLOCK_GAT_OPS_HEADS, exact_ops: bool = False):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"GAT block: hidden {hidden} is not a multiple of {heads} heads")
        self.heads, self.exact_ops = heads, exact_ops
        self.lin = nn.Linear(hidden, hidden)
        self.score_u = nn.Linear(hidden, heads)
        self.score_v = nn.Linear(hidden, heads, bias=False)
        self.act = nn.LeakyReLU(0.2)

    def forward(self, g, x):
        """Each node's attention-weighted sum of its in-neighbours, ``[N, hidden]``."""
        ops = exact_ops if self.exact_ops else dgl.ops
        x = self.lin(x)
        probs = ops.edge_softmax(g, self.act(ops.u_add_v(g, self.score_u(x), self.score_v(x))))
        out = ops.u_mul_e_sum(g, x.view(x.shape[0], -1, self.heads), probs.unsqueeze(1))
        return out.reshape(x.shape[0], -1)


def build_block_model(kind: str, in_feats: int, hidden: int, classes: int, layers: int,
                      impl: str = "dgl") -> PreNormNet:
    """The pre-LayerNorm residual model with aggregation ``kind`` (``gcn``, ``sage``, ``gat`` or ``gat-ops``,
    the last on ``dgl_exact.ops`` for ``impl='exact'``, else on ``dgl.ops``)."""
    if kind == "gat-ops":
        return PreNormNet(in_feats, hidden, classes, layers,
                          lambda: OpsGATAggregate(hidden, exact_ops=impl == "exact"))
    if kind == "gcn":
        return PreNormNet(in_feats, hidden, classes, layers, lambda: gcn_aggregate, edge_weight=symmetric_norm)
    if kind == "sage":
        return PreNormNet(in_feats, hidden, classes, layers, lambda: dgl.nn.SAGEConv(hidden, hidden, "mean"))
    if kind == "gat":
        return PreNormNet(in_feats, hidden, classes, layers, lambda: HeadsConcat(hidden))
    raise ValueError(f"unknown block aggregation {kind!r}; expected gcn, sage, gat or gat-ops")


def build_user_model(name: str, in_feats: int, hidden: int, classes: int, layers: int, dropout: float,
                     batch_norm: bool, impl: str) -> nn.Module:
    """``name`` (one of :data:`USER_MODELS`) built from DGL's and torch's layers; for ``impl='exact'``
    converted in place by :func:`dgl_exact.compress_model` (its configuration: the one in force)."""
    if name not in USER_MODELS:
        raise ValueError(f"unknown user model {name!r}; expected one of {USER_MODELS}")
    if name in BLOCK_MODELS + OPS_MODELS:  # its own dropout; no batch norm
        model = build_block_model(name.removeprefix("user-block-"), in_feats, hidden, classes, layers, impl)
    elif name == "arxiv-gcn-user":
        model = ArxivGCN(in_feats, hidden, classes, layers, F.relu, dropout)
    elif name == "arxiv-gat-user":
        model = ArxivGAT(in_feats, hidden, classes, layers, ARXIV_GAT_HEADS, F.relu, dropout)
    elif name in ("user-gcn2", "user-gcn2-donate"):
        model = UserGCNII(in_feats, hidden, classes, layers, dropout, batch_norm=batch_norm,
                          donate_inputs=name.endswith("donate"))
    else:
        model = UserSAGE(in_feats, hidden, classes, layers, dropout, batch_norm,
                         donate_inputs=name.endswith("donate"))
    return compress_model(model) if impl == "exact" else model


class ArxivModel(nn.Module):
    """What DGL's ogbn-arxiv examples set up alike for every model: ``layers``, the activation (a function),
    a ``BatchNorm1d`` of ``norm_width`` after each hidden layer, input dropout ``min(0.1, dropout)`` and
    dropout; the subclass adds its layers as ``convs``."""

    def __init__(self, layers: int, activation: Callable, dropout: float, norm_width: int):
        super().__init__()
        self.layers, self.activation = layers, activation
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList(nn.BatchNorm1d(norm_width) for _ in range(layers - 1))
        self.input_drop = nn.Dropout(min(0.1, dropout))
        self.dropout = nn.Dropout(dropout)


class ArxivGCN(ArxivModel):
    """A GCN in the style of DGL's ogbn-arxiv example: ``layers`` ``dgl.nn.GraphConv`` ('both' norm), each
    with a bias-free linear residual ``Linear(h)`` added to its output, then ``BatchNorm1d``, the activation
    (a function: ``F.relu``) and ``Dropout`` as separate statements of a plain loop; input dropout
    ``min(0.1, dropout)``; only the last conv has a bias."""

    def __init__(self, in_feats: int, hidden: int, classes: int, layers: int, activation: Callable,
                 dropout: float):
        super().__init__(layers, activation, dropout, norm_width=hidden)
        dims = [in_feats] + [hidden] * (layers - 1) + [classes]
        self.linears = nn.ModuleList()
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            self.convs.append(dgl.nn.GraphConv(a, b, "both", bias=i == layers - 1))
            self.linears.append(nn.Linear(a, b, bias=False))

    def forward(self, graph, feat):
        """Logits of every node of ``graph`` from features ``feat``."""
        h = self.input_drop(feat)
        for i in range(self.layers):
            conv = self.convs[i](graph, h)
            linear = self.linears[i](h)
            h = conv + linear
            if i < self.layers - 1:
                h = self.norms[i](h)
                h = self.activation(h)
                h = self.dropout(h)
        return h


class ArxivGATConv(nn.Module):
    """A graph attention layer written with DGL's message-passing API, as DGL's ogbn-arxiv example writes
    its own: ``fc`` to ``heads x out``, per-head scores ``el``/``er`` summed on the edges
    (``apply_edges(fn.u_add_v)``), leaky ReLU, ``edge_softmax``, attention dropout, the weighted sum
    (``update_all(fn.u_mul_e, fn.sum)``), plus a linear residual of the input."""

    def __init__(self, in_feats: int, out_feats: int, heads: int, attn_drop: float = 0.05,
                 negative_slope: float = 0.2):
        super().__init__()
        self.heads, self.out_feats = heads, out_feats
        self.fc = nn.Linear(in_feats, heads * out_feats, bias=False)
        self.attn_l = nn.Parameter(torch.empty(1, heads, out_feats))
        self.attn_r = nn.Parameter(torch.empty(1, heads, out_feats))
        self.attn_drop = nn.Dropout(attn_drop)
        self.leaky_relu = nn.LeakyReLU(negative_slope)
        self.res_fc = nn.Linear(in_feats, heads * out_feats, bias=False)
        self.bias = nn.Parameter(torch.zeros(1, heads, out_feats))
        gain = nn.init.calculate_gain("relu")
        for w in (self.fc.weight, self.res_fc.weight, self.attn_l, self.attn_r):
            nn.init.xavier_normal_(w, gain=gain)

    def forward(self, graph, feat):
        """``(N, heads, out)``: each head's attention-weighted sum of its neighbours, plus the residual."""
        with graph.local_scope():
            ft = self.fc(feat).view(-1, self.heads, self.out_feats)
            el = (ft * self.attn_l).sum(dim=-1).unsqueeze(-1)
            er = (ft * self.attn_r).sum(dim=-1).unsqueeze(-1)
            graph.srcdata.update({"ft": ft, "el": el})
            graph.dstdata.update({"er": er})
            graph.apply_edges(fn.u_add_v("el", "er", "e"))
            e = self.leaky_relu(graph.edata.pop("e"))
            graph.edata["a"] = self.attn_drop(edge_softmax(graph, e))
            graph.update_all(fn.u_mul_e("ft", "a", "m"), fn.sum("m", "ft"))
            rst = graph.dstdata["ft"]
            rst = rst + self.res_fc(feat).view(-1, self.heads, self.out_feats)
            return rst + self.bias


class ArxivGAT(ArxivModel):
    """``layers`` :class:`ArxivGATConv` with ``heads`` heads of ``hidden`` (concatenated), ``BatchNorm1d``,
    the activation (a function) and ``Dropout`` between them as a plain loop, input dropout
    ``min(0.1, dropout)``; the last layer has ``classes`` per head, averaged over the heads."""

    def __init__(self, in_feats: int, hidden: int, classes: int, layers: int, heads: int, activation: Callable,
                 dropout: float):
        super().__init__(layers, activation, dropout, norm_width=hidden * heads)
        for i in range(layers):
            a = in_feats if i == 0 else hidden * heads
            b = classes if i == layers - 1 else hidden
            self.convs.append(ArxivGATConv(a, b, heads))

    def forward(self, graph, feat):
        """Logits of every node of ``graph`` from features ``feat``."""
        h = self.input_drop(feat)
        for i in range(self.layers):
            h = self.convs[i](graph, h)
            if i < self.layers - 1:
                h = h.flatten(1)
                h = self.norms[i](h)
                h = self.activation(h)
                h = self.dropout(h)
        return h.mean(1)


class UserGCNII(nn.Module):
    """A user's GCNII loop: ``Linear(in, hidden)`` and ReLU give ``h0``; ``layers`` ``dgl.nn.GCN2Conv``
    (``alpha`` 0.1, ``lambda_`` 0.5, layer ``i + 1``), each followed by an ``nn.Sequential(BatchNorm1d,
    ReLU, Dropout)`` (without the ``BatchNorm1d`` where ``batch_norm`` is False: the recipe that learns Cora's
    140 labels at 16 layers); ``Linear(hidden, classes)`` out. ``donate_inputs``: every conv from the second on
    is given its input with :func:`dgl_exact.donate` (the first one's input is ``h0``, which every layer reads)."""

    def __init__(self, in_feats: int, hidden: int, classes: int, layers: int, dropout: float,
                 alpha: float = 0.1, lambda_: float = 0.5, donate_inputs: bool = False, batch_norm: bool = True):
        super().__init__()
        self.donate_inputs = donate_inputs
        self.inp = nn.Linear(in_feats, hidden)
        self.convs = nn.ModuleList(dgl.nn.GCN2Conv(hidden, layer=i + 1, alpha=alpha, lambda_=lambda_)
                                   for i in range(layers))
        self.posts = nn.ModuleList(nn.Sequential(*([nn.BatchNorm1d(hidden)] if batch_norm else []), nn.ReLU(),
                                                 nn.Dropout(dropout))
                                   for _ in range(layers))
        self.out = nn.Linear(hidden, classes)

    def forward(self, graph, feat):
        """Logits of every node of ``graph`` from features ``feat``."""
        h0 = torch.relu(self.inp(feat))
        h = h0
        for i, (conv, post) in enumerate(zip(self.convs, self.posts)):
            h = post(conv(graph, donate(h) if self.donate_inputs and i > 0 else h, h0))
        return self.out(h)
