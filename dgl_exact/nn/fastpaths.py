"""When a fused fast path runs: every fast path of dgl_exact's modules, declared once, decided here.

A fast path replaces several modules' calls (or the steps of one module's forward) by one op that keeps less
and holds fewer layer-sized buffers. It is taken only where it computes what the modules compute (see
:mod:`dgl_exact.ops.keep`); everywhere else the modules' own calls run. Each path is one :class:`FastPath`
below: its name, the module types whose calls it replaces, the shared checks it needs and its own conditions
as ``(predicate, reason)`` pairs. A module asks its path (``SAGE_MEAN.runs(conv, ...)``) and calls the op
when the answer is yes; :func:`dgl_exact.explain` prints the notes these decisions leave, so what runs and
what ``explain`` says are one decision.

The shared checks are made by :meth:`FastPath.refusal` before a path's own conditions, in this fixed order
(:data:`SHARED`), each only for the paths that declare it:

1. ``compile``: not while torch.compile traces (the modules' ops are captured one by one);
2. ``input``: the input is a tensor;
3. ``types``: each module is dgl_exact's own type (exactly, or an instance whose ``forward`` is the
   type's own, as the path declares);
4. ``hooks``: no hook on the modules whose calls are replaced, nor a global one (a hook sees a module's own
   call: :func:`~dgl_exact.nn._base.hooks_present`);
5. ``training``: those modules are in training mode;
6. ``grad``: grad mode is on;
7. ``compression``: compression is on in each configuration involved (exactly kept tensors allow double
   backward, which the fused ops refuse);
8. ``autocast``: no autocast on the input's device;
9. ``saving``: something needs a gradient (else nothing is kept and the modules' calls are as cheap).

``python -c "import dgl_exact.nn.fastpaths as f; print(f.describe())"`` lists every path with its checks.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from .. import ops
from .._compat import autocast_dtype, compiling, storage_ptr
from ..compression_config import get_config
from ..ops.donation import Donated
from ..ops.keep import keep_hook_active
from ..ops.saved import needs_saving
from . import paths
from ._base import CompressedModuleMixin, hooks_present, kept_by_reference, plain_dropout_p, plain_linear

__all__ = ["Call", "FastPath", "SHARED", "PATHS", "BN_RELU_DROPOUT", "SAGE_MEAN", "SAGE_MEAN_BN_RELU_DROPOUT",
           "SAGE_INPUT_COMPRESSED_AHEAD", "SAGE_ADD_IN_PLACE", "GCN_PLUS_LINEAR", "GCN2_MIX", "GCN2_SCALE_IN_PLACE",
           "GCNII_STACK",
           "GCNII_RECOMPUTE", "FIRST_LAYER_BN_RELU_DROPOUT", "GAT_ATTENTION", "GAT_DONATED_INPUT", "GCN2_DONATED_INPUT",
           "describe", "paths_for"]


class Call:
    """The facts of one call a path is asked about. ``modules``: whose calls the path replaces (what
    :func:`dgl_exact.explain` reports on); ``hooked`` / ``trained``: the modules the ``hooks`` / ``training``
    checks read (default: ``modules``); ``x``: the input (``input``, ``autocast``); ``saved``: the tensors of
    which one must need a gradient (``saving``); ``configs``: the configurations that must be on
    (``compression``), each a sequence or a callable returning one, read only when its check is made (after
    the ``types`` check, say); ``exact`` / ``own``: ``(module, type)`` pairs the ``types`` check reads
    (``type(m) is type``; ``isinstance`` with the type's own ``forward``). Any other keyword is a fact for the
    path's own conditions."""

    def __init__(self, modules: Sequence, *, x=None, hooked=None, trained=None, saved=(), configs=(), exact=(),
                 own=(), **facts):
        self.modules = tuple(modules)
        self.hooked = self.modules if hooked is None else tuple(hooked)
        self.trained = self.modules if trained is None else tuple(trained)
        self.x, self.exact, self.own = x, exact, own
        self._saved, self._configs = saved, configs   # sequences, or callables returning one (read when checked)
        self.__dict__.update(facts)

    @property
    def saved(self) -> tuple:
        return tuple(self._saved() if callable(self._saved) else self._saved)

    @property
    def configs(self) -> tuple:
        return tuple(self._configs() if callable(self._configs) else self._configs)


def _types_ok(c: Call) -> bool:
    return (all(type(m) is t for m, t in c.exact)
            and all(isinstance(m, t) and type(m).forward is t.forward for m, t in c.own))


#: the shared checks, in the order they are made: (name, predicate (True: may fuse), reason refused)
SHARED: Tuple[Tuple[str, Callable[[Call], bool], str], ...] = (
    ("compile", lambda c: not compiling(), "torch.compile: the modules' ops are captured one by one"),
    ("input", lambda c: isinstance(c.x, torch.Tensor), "the input is not a tensor"),
    ("types", _types_ok, "not dgl_exact's own module type (another type, or a subclass overriding forward)"),
    ("hooks", lambda c: not hooks_present(*c.hooked), "a module has hooks (they must see the modules' own calls)"),
    ("training", lambda c: all(m.training for m in c.trained), "eval mode"),
    ("grad", lambda c: torch.is_grad_enabled(), "grad disabled"),
    ("compression", lambda c: all(cfg.enabled for cfg in c.configs),
     "compression off (exactly kept tensors: the modules keep double backward exact)"),
    ("autocast", lambda c: autocast_dtype(c.x.device.type) is None, "autocast"),
    ("saving", lambda c: needs_saving(*c.saved), "nothing needs a gradient (nothing is kept)"),
)
_SHARED_NAMES = tuple(name for name, _, _ in SHARED)


@dataclasses.dataclass(frozen=True)
class FastPath:
    """One fused fast path. ``name``: what :func:`dgl_exact.explain` prints where it runs (``detail``, given
    the :class:`Call`, may add to it); ``applies_to``: qualified names of the module types whose calls it
    replaces (named, not imported: the modules import this file); ``shared``: the checks of :data:`SHARED` it
    needs (made in :data:`SHARED`'s order, whatever the order here); ``conditions``: its own ``(predicate,
    reason)`` pairs, in order, each predicate True where the path may run; ``facts``: builds the
    :class:`Call` from the caller's arguments; ``gate``: a condition for the modules' own paths (a model's for
    asking them at all, or a step inside a module's forward that its own paths follow): where it passes,
    nothing is noted (the paths after it decide and note); where it refuses, its reason is noted until a
    later decision about the module replaces it."""

    name: str
    applies_to: Tuple[str, ...]
    shared: Tuple[str, ...]
    conditions: Tuple[Tuple[Callable[[Call], bool], str], ...]
    facts: Callable[..., Call]
    detail: Optional[Callable[[Call], str]] = None
    gate: bool = False

    def __post_init__(self):
        unknown = set(self.shared) - set(_SHARED_NAMES)
        if unknown:
            raise ValueError(f"{self.name}: unknown shared checks {sorted(unknown)}; expected some of {_SHARED_NAMES}")

    def refusal(self, *args, **kwargs) -> Optional[str]:
        """Why this path cannot run for the caller's arguments (the first check that fails: the shared ones
        in :data:`SHARED`'s order, then the path's own); None where it runs. Records nothing."""
        return self._decide(args, kwargs)[1]

    def decide(self, *args, **kwargs) -> Optional[Call]:
        """The :class:`Call` (its facts, gathered once) where this path runs for the caller's arguments, None
        where it does not; notes the decision for :func:`dgl_exact.explain` on the call's modules (with the
        reason refused). Nothing is noted while torch.compile traces."""
        call, why = self._decide(args, kwargs)
        # not while compiling: a path without the ``compile`` check (a step inside a conv's forward) is decided
        # while dynamo traces, and the notes' context variable would break the graph
        if call is not None and not (self.gate and why is None) and not compiling():
            shown = self.name + (self.detail(call) if self.detail is not None and why is None else "")
            paths.record(call.modules, shown if why is None else None, why, key=self.name, weak=self.gate)
        return call if why is None else None

    def runs(self, *args, **kwargs) -> bool:
        """Whether this path runs for the caller's arguments (:meth:`decide`, noted for explain)."""
        return self.decide(*args, **kwargs) is not None

    def _decide(self, args, kwargs) -> Tuple[Optional[Call], Optional[str]]:
        if "compile" in self.shared and compiling():  # first, and before any fact is read: dynamo traces this
            return None, SHARED[0][2]
        call = self.facts(*args, **kwargs)
        for name, ok, reason in SHARED[1:]:
            if name in self.shared and not ok(call):
                return call, reason
        for ok, reason in self.conditions:
            if not ok(call):
                return call, reason
        return call, None


def _type(qualified: str) -> type:
    """The class ``module.Name`` (its module is imported: the caller asking about it lives there or above)."""
    module, name = qualified.rsplit(".", 1)
    return getattr(sys.modules[module], name)


def _step(name: str, applies_to: str, ok: Callable[[Call], bool], reason: str, facts: Callable[..., Call]) -> FastPath:
    """A step inside one module's forward taken its own way (in place, or as dgl_exact's op) only under one
    condition of its own, with no shared check: noted for :func:`dgl_exact.explain` only where refused
    (``gate``: a path decided after it replaces the note)."""
    return FastPath(name=name, applies_to=(applies_to,), shared=(), conditions=((ok, reason),), facts=facts, gate=True)


_LAYERS = "dgl_exact.nn.layers"
_SAGE = "dgl_exact.nn.conv.sageconv.SAGEConv"
_GCN2 = "dgl_exact.nn.conv.gcn2conv.GCN2Conv"
_GAT = "dgl_exact.nn.conv.gatconv.GATConv"
_GRAPHCONV = "dgl_exact.nn.conv.graphconv.GraphConv"


# --- nn.Sequential: BatchNorm1d -> ReLU (+ Dropout) as one op (dgl_exact.nn.sequential) -----------------------

def _bn_relu_facts(bn, act, x) -> Call:
    return Call((bn, act), x=x, trained=(bn,), saved=lambda: (x, bn.weight, bn.bias), bn=bn, act=act,
                dropping=type(act) is _type(f"{_LAYERS}.ReLUDropout") and act.training)


BN_RELU_DROPOUT = FastPath(
    name="fused BatchNorm1d+ReLU+Dropout (one op, in place)",
    applies_to=(f"{_LAYERS}.BatchNorm1d", f"{_LAYERS}.ReLUDropout", f"{_LAYERS}.ReLU"),
    shared=("compile", "input", "hooks", "training", "autocast", "saving"),
    conditions=(
        (lambda c: c.x.dim() == 2 and c.x.dtype == torch.float32
         and (c.bn.weight is None or c.bn.weight.dtype == torch.float32), "not an fp32 [N, C] input"),
        (lambda c: c.x.shape[0] >= 2, "one row under batch norm"),
        (lambda c: not (c.dropping and c.act.p >= 1.0), "dropout probability 1"),
        # the module draws torch's own mask then (ops.relu_dropout(like_torch=True)); the fused op cannot
        (lambda c: not (c.dropping and c.act.p > 0 and not get_config().enabled),
         "compression off: dropout draws torch's masks (the modules' own calls)"),
    ),
    facts=_bn_relu_facts,
)


# --- SAGEConv: the 'mean' layer as one op (ops.sage_mean) -----------------------------------------------------

def _sage_mean_facts(conv, feat, x, edge_weight, cfg) -> Call:
    linears = tuple(m for m in (getattr(conv, "fc_self", None), conv.fc_neigh) if m is not None)  # 'gcn': no fc_self
    return Call((conv, *linears), x=x, hooked=linears, configs=(cfg,),
                saved=lambda: (x, *(w for m in linears for w in _weights(m))), conv=conv, feat=feat,
                edge_weight=edge_weight, cfg=cfg)


def _weights(layer) -> tuple:
    return getattr(layer, "weight", None), getattr(layer, "bias", None)


SAGE_MEAN = FastPath(
    name="fused SAGE mean (ops.sage_mean)",
    applies_to=(_SAGE,),
    shared=("compile", "hooks", "compression", "saving"),
    conditions=(
        (lambda c: c.conv._aggre_type == "mean", "not the 'mean' aggregator"),
        (lambda c: not isinstance(c.feat, tuple) and c.edge_weight is None and c.x.dim() == 2,
         "a pair of feature tensors, edge weights, or not [N, D] features"),
        (lambda c: plain_linear(c.conv.fc_self, c.cfg) and plain_linear(c.conv.fc_neigh, c.cfg)
         and c.conv.fc_neigh.bias is None, "fc_self / fc_neigh replaced by other modules (or fc_neigh with a bias)"),
        (lambda c: (c.x.dtype == c.conv.fc_self.weight.dtype == c.conv.fc_neigh.weight.dtype
                    or (autocast_dtype(c.x.device.type) is not None and c.x.is_floating_point())),
         "mixed dtypes (outside autocast)"),
    ),
    facts=_sage_mean_facts,
)


# --- SAGEConv + BatchNorm1d + ReLU + dropout as one op (ops.sage_mean_bn_relu_dropout) -------------------------

def _sage_bn_facts(conv, graph, feat, bn, p) -> Call:
    return Call((conv, bn), x=feat, hooked=(conv, bn, conv.fc_self, conv.fc_neigh),
                exact=((bn, _type(f"{_LAYERS}.BatchNorm1d")),), own=((conv, _type(_SAGE)),), conv=conv, bn=bn,
                p=p, graph=graph, cfg=conv._config())


SAGE_MEAN_BN_RELU_DROPOUT = FastPath(
    name="SAGE mean + batch norm + ReLU + dropout as one op",
    applies_to=(_SAGE, f"{_LAYERS}.BatchNorm1d"),
    shared=("compile", "input", "types", "hooks", "training", "grad", "autocast"),
    conditions=(
        (lambda c: c.x.dim() == 2 and c.x.dtype == torch.float32, "not one fp32 [N, D] feature tensor"),
        (lambda c: not c.x.requires_grad, "the input needs a gradient"),
        (lambda c: (c.conv.activation is None and c.conv.norm is None and plain_dropout_p(c.conv.feat_drop) == 0
                    and c.conv.fc_neigh.weight.shape[0] >= c.x.shape[1]),
         "an activation, norm or feature dropout of the conv's own, or D_out < D_in"),
        (lambda c: 0.0 <= float(c.p) < 1.0, "dropout probability 1"),
        (lambda c: c.bn._config() == c.cfg, "batch norm's compression differs from the conv's"),
        (lambda c: c.bn.num_features == c.conv.fc_self.weight.shape[0]
         and (c.bn.weight is None or c.bn.weight.dtype == torch.float32), "batch norm over another width or dtype"),
        (lambda c: ops.structure_of(c.graph, c.x.device).num_dst >= 2, "one row under batch norm"),
        (lambda c: SAGE_MEAN.refusal(c.conv, c.x, c.x, None, c.cfg) is None,
         "the conv's own fused path does not apply"),
    ),
    facts=_sage_bn_facts,
)


# --- SAGEConv: its input compressed ahead by the op that made it (SAGEConv.input_compression) ------------------

def _sage_input_facts(conv, graph, feat) -> Call:
    cfg = conv._config()
    return Call((conv,), configs=(cfg,), conv=conv, graph=graph, feat=feat, cfg=cfg)


SAGE_INPUT_COMPRESSED_AHEAD = FastPath(
    name="input compressed by the op that made it (compress_for)",
    applies_to=(_SAGE,),
    shared=("compression",),
    conditions=(
        (lambda c: not isinstance(c.feat, tuple) and not getattr(c.graph, "is_block", False),
         "a pair of feature tensors, or a block (fc_self keeps a slice of the input)"),
        (lambda c: c.conv._aggre_type in ("mean", "pool"), "not the 'mean' or 'pool' aggregator"),
        (lambda c: plain_dropout_p(c.conv.feat_drop) == 0, "feature dropout, or a module in its place"),
        (lambda c: plain_linear(c.conv.fc_self, c.cfg), "fc_self replaced by another module"),
    ),
    facts=_sage_input_facts,
    gate=True,
)


# --- SAGEConv (composed): fc_neigh's term added into fc_self's output (SAGEConv._composed) --------------------

SAGE_ADD_IN_PLACE = _step("neighbour term added into fc_self's output in place", _SAGE,
                          lambda c: plain_linear(c.conv.fc_self, c.cfg),
                          "fc_self replaced by another module (its output is not this module's to overwrite)",
                          facts=lambda conv, cfg: Call((conv,), conv=conv, cfg=cfg))


# --- GraphConv plus a residual linear as one op (ops.graph_conv_plus_linear; nn.conv_plus_linear) ------------

def _conv_plus_linear_facts(conv, linear, graph, feat) -> Call:
    # (read by the ``saving`` check, before the conditions: the residual may be any module)
    weights = lambda: (feat, conv.weight, conv.bias, getattr(linear, "weight", None), getattr(linear, "bias", None))  # noqa: E731
    return Call((conv, linear), x=feat, own=((conv, _type(_GRAPHCONV)),), configs=lambda: (conv._config(),),
                saved=weights, conv=conv, linear=linear, graph=graph)


def _homogeneous(graph) -> bool:
    return not graph.is_block and graph.num_src_nodes() == graph.num_dst_nodes()


GCN_PLUS_LINEAR = FastPath(
    name="GraphConv + residual Linear as one op (ops.graph_conv_plus_linear)",
    applies_to=(_GRAPHCONV,),
    shared=("compile", "input", "types", "hooks", "training", "grad", "compression", "autocast", "saving"),
    conditions=(
        (lambda c: plain_linear(c.linear, c.conv._config()),
         "the residual is not a plain nn.Linear under the conv's configuration (another module, or a hook)"),
        (lambda c: c.conv.weight is not None and c.conv._activation is None,
         "the conv has an activation, or no weight of its own (an external weight)"),
        (lambda c: _homogeneous(c.graph), "a block or a bipartite graph"),
        (lambda c: c.x.dim() == 2 and c.x.is_floating_point(), "not [N, D] floating-point features"),
        (lambda c: tuple(c.linear.weight.shape) == tuple(c.conv.weight.shape[::-1]),
         "the linear's shape differs from the conv's (their outputs would not add)"),
        (lambda c: c.x.dtype == c.conv.weight.dtype == c.linear.weight.dtype, "mixed dtypes"),
    ),
    facts=_conv_plus_linear_facts,
)


# --- GCN2Conv: the mix after the propagation as one op (ops.gcn2.gcn2_mix) ------------------------------------

def _gcn2_mix_facts(conv, h, feat_0, cfg) -> Call:
    bias = conv.bias if conv._bias else None
    return Call((conv,), x=h, configs=(cfg,), saved=(h, feat_0, conv.weight1, bias), conv=conv, feat_0=feat_0)


GCN2_MIX = FastPath(
    name="fused GCNII mix (ops.gcn2.gcn2_mix)",
    applies_to=(_GCN2,),
    shared=("compile", "compression", "autocast", "saving"),
    conditions=(
        (lambda c: c.conv._project_initial_features, "separate initial-feature weights"),
        (lambda c: c.x._base is None, "the propagation's output is a view"),
        (lambda c: (c.feat_0.shape == c.x.shape and c.feat_0.dtype == c.x.dtype == c.conv.weight1.dtype
                    and (not c.conv._bias or c.conv.bias.dtype == c.x.dtype)), "h0's rows or the dtypes differ"),
    ),
    facts=_gcn2_mix_facts,
)


# --- GCN2Conv (composed): the mixed features scaled by 1 - beta in place (GCN2Conv.forward) --------------------

# the projection keeps them compressed (or not at all) unless they would be kept as they are
GCN2_SCALE_IN_PLACE = _step("mixed features scaled in place", _GCN2,
                            lambda c: not (c.conv._project_initial_features and c.conv.weight1.requires_grad
                                           and kept_by_reference(c.x, c.cfg)),
                            "the mixed features are kept by reference for weight1's gradient (compression off, "
                            "or alive anyway)",
                            facts=lambda conv, feat_sum, cfg: Call((conv,), x=feat_sum, conv=conv, cfg=cfg))


# --- GCN2Conv: a donated input released once propagated (ops.donation, keep.py rule 5) -------------------------

def _gcn2_donated_facts(conv, feat, feat_0, edge_weight) -> Call:
    return Call((conv,), conv=conv, feat=feat, feat_0=feat_0, edge_weight=edge_weight)


def _apart_from(x: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether ``x`` is a whole tensor sharing no memory with ``other`` (releasing it frees its memory and
    nothing ``other`` reads)."""
    return x._base is None and storage_ptr(x) != storage_ptr(other)


GCN2_DONATED_INPUT = FastPath(
    name="donated input released once propagated",
    applies_to=(_GCN2,),
    shared=("compile", "hooks", "training", "grad"),
    conditions=(
        (lambda c: c.edge_weight is None, "donated input kept: edge weights (their gradient may read the input)"),
        (lambda c: _apart_from(c.feat, c.feat_0), "donated input kept: a view, or it shares memory with h0"),
    ),
    facts=_gcn2_donated_facts,
)


# --- GCNII's hidden layers and output layer as one op (ops.gcn2.gcnii_layers, ops.gcn2_recompute) --------------

def _gcnii_facts(graph, convs, norms, h0, dropout, input_dropout, head, stem=None, recompute=0,
                 stem_dropout=0.0) -> Call:
    norms = list(norms) if norms is not None else None
    mods = list(convs) + (norms or []) + [head] + ([stem] if stem is not None else [])
    bn, linear = _type(f"{_LAYERS}.BatchNorm1d"), _type(f"{_LAYERS}.Linear")
    exact = [(m, bn) for m in norms or []] + [(m, linear) for m in (head, stem) if m is not None]
    # a donated h0 (rule 5) goes once the last layer has read it, where the stack runs without recompute (the
    # recomputed segments read h0 again): its gradient needs no value, nothing the stack keeps refers to it,
    # and a view would free nothing
    release_h0 = not recompute and type(h0) is Donated and h0._base is None
    configured = list(convs) + [m for m in (head, stem) if m is not None]
    return Call(mods, x=h0, configs=lambda: [m._config() for m in configured],
                own=[(c, _type(_GCN2)) for c in convs], exact=exact, saved=lambda: (h0, *_params(mods)), graph=graph,
                convs=convs, norms=norms, dropout=dropout, input_dropout=input_dropout, stem=stem,
                stem_dropout=stem_dropout, recompute=recompute, release_h0=release_h0)


def _params(mods) -> list:
    return [p for m in mods for p in m.parameters()]


def _whole_graph(c: Call) -> bool:
    st = ops.structure_of(c.graph, c.x.device)
    return isinstance(st, ops.GraphStructure) and not st.is_block and st.num_src == st.num_dst


def _gcnii_detail(c: Call) -> str:
    if c.recompute:
        stem = ", the input layer folded in" if c.stem is not None else ""
        return f" recomputed in segments of {c.recompute} (ops.gcn2_recompute){stem}"
    return " (ops.gcn2.gcnii_layers)" + (", donated h0 released after the last layer" if c.release_h0 else "")


def _stem_fits(c: Call) -> bool:
    s = c.stem
    return c.x.dim() == 2 and c.x.shape[1] == s.in_features and s.out_features == c.convs[0].weight1.shape[0]


GCNII_STACK = FastPath(
    name="fused GCNII stack",
    applies_to=(_GCN2, f"{_LAYERS}.BatchNorm1d", f"{_LAYERS}.Linear"),
    shared=("compile", "input", "types", "hooks", "training", "grad", "compression", "autocast", "saving"),
    conditions=(
        (lambda c: len(c.convs) > 0, "no layers"),
        (lambda c: all(m._project_initial_features and m._activation is None for m in c.convs),
         "a layer has separate initial-feature weights or an activation"),
        (lambda c: c.norms is None or len(c.norms) == len(c.convs), "not one batch norm per layer"),
        (lambda c: 0.0 <= c.dropout < 1.0 and 0.0 <= c.input_dropout < 1.0, "dropout outside [0, 1)"),
        (lambda c: c.x.dim() == 2 and c.x.is_contiguous() and c.x.dtype in (torch.float32, torch.float64),
         "h0 is not a contiguous fp32/fp64 [N, D] tensor"),
        (lambda c: c.norms is None or c.x.shape[0] >= 2, "batch norm over one row (the modules raise)"),
        (lambda c: all(p.dtype == c.x.dtype for p in _params(c.modules)), "mixed dtypes"),
        (_whole_graph, "not a homogeneous whole graph"),
        # with ``stem``, the input layer (a dgl_exact Linear, h0 = relu(stem(dropout(x)))) is folded in: the
        # shared checks above cover it (types, hooks, training, compression), and these are its own
        (lambda c: c.stem is None or bool(c.recompute), "an input layer is folded in only with recompute"),
        (lambda c: c.stem is None or not c.x.requires_grad, "the input layer's input needs a gradient"),
        (lambda c: c.stem is None or 0.0 <= c.stem_dropout < 1.0, "the input layer's dropout outside [0, 1)"),
        (lambda c: c.stem is None or _stem_fits(c), "the input layer's shapes do not match"),
        # folded, every layer's backward pays an [in, N] x [N, hidden] product: h0's gradient is kept instead
        (lambda c: c.stem is None or c.stem.in_features <= c.stem.out_features,
         "in_feats > hidden: folding the input layer in would cost every layer's backward more than the layer"),
    ),
    facts=_gcnii_facts,
    detail=_gcnii_detail,
)


# --- GCNII: the hidden layers recomputed in segments (training.models.GCNII, ops.recompute) ---------------------

def _gcnii_recompute_facts(model, edge_weight) -> Call:
    return Call((model,), hooked=(*model.convs, *(model.norms or [])), model=model, edge_weight=edge_weight)


GCNII_RECOMPUTE = FastPath(
    name="hidden layers recomputed in segments",
    applies_to=("dgl_exact.training.models.GCNII",),
    shared=("hooks", "training", "grad"),
    conditions=(
        (lambda c: bool(c.model.recompute), "recompute off"),
        (lambda c: c.edge_weight is None and not c.model.residual, "edge weights or a residual"),
        (lambda c: c.model.uses_own_layers(), "not dgl_exact's own layers (impl, or dropout2)"),
    ),
    facts=_gcnii_recompute_facts,
    detail=lambda c: f" of {c.model.recompute} (the fused stack's form where its layers' rows say so)",
)


# --- StackedGNN: the first layer asked for its fused batch-norm form (training.models.StackedGNN) --------------

def _first_layer_facts(model, edge_weight) -> Call:
    mods = (model.convs[0],) + ((model.norms[0],) if model.norms else ())
    return Call(mods, trained=(model,), model=model, edge_weight=edge_weight)


FIRST_LAYER_BN_RELU_DROPOUT = FastPath(
    name="first layer asked for its fused batch norm + ReLU + dropout form",
    applies_to=("dgl_exact.training.models.StackedGNN",),
    shared=("training",),
    conditions=(
        (lambda c: c.model.uses_own_layers(), "not dgl_exact's own layers (impl, or dropout2)"),
        (lambda c: c.model.norms is not None and len(c.model.convs) > 1, "no batch norm after the first layer"),
        (lambda c: c.edge_weight is None, "edge weights"),
        (lambda c: isinstance(c.model.convs[0], CompressedModuleMixin), "the first layer is not a dgl_exact module"),
    ),
    facts=_first_layer_facts,
    gate=True,
)

# --- GATConv: the attention as dgl_exact's op (ops.gat_attention), else DGL's own forward ------------------------

GAT_ATTENTION = _step("attention as one op (ops.gat_attention)", _GAT,
                      lambda c: c.attn_p is not None and isinstance(c.conv.leaky_relu, nn.LeakyReLU),
                      "attn_drop or leaky_relu replaced by another module: DGL's implementation runs (uncompressed)",
                      facts=lambda conv: Call((conv,), conv=conv, attn_p=plain_dropout_p(conv.attn_drop)))


# --- GATConv: a donated input released once projected (ops.donation, keep.py rule 5) ----------------------------

def _gat_facts(conv, feat, cfg) -> Call:
    return Call((conv,), conv=conv, feat=feat, cfg=cfg)


GAT_DONATED_INPUT = FastPath(
    name="donated input released once projected",
    applies_to=(_GAT,),
    shared=("compile", "hooks", "training", "grad"),
    conditions=(
        (lambda c: (c.conv.res_fc is None and plain_linear(c.conv.fc, c.cfg)
                    and plain_dropout_p(c.conv.feat_drop) is not None),
         "donated input kept: a residual, or fc / feat_drop replaced by other modules"),
        (lambda c: c.cfg.enabled and not keep_hook_active() and c.feat._base is None,
         "donated input kept: it may be kept by reference (compression off, a planner hook, or a view)"),
    ),
    facts=_gat_facts,
)

#: every fast path, outermost first (a stack's decision precedes its modules' own)
PATHS: Tuple[FastPath, ...] = (GCNII_RECOMPUTE, GCNII_STACK, FIRST_LAYER_BN_RELU_DROPOUT, SAGE_MEAN_BN_RELU_DROPOUT,
                               BN_RELU_DROPOUT, SAGE_INPUT_COMPRESSED_AHEAD, SAGE_MEAN, SAGE_ADD_IN_PLACE,
                               GCN_PLUS_LINEAR, GCN2_MIX,
                               GCN2_SCALE_IN_PLACE, GCN2_DONATED_INPUT, GAT_ATTENTION, GAT_DONATED_INPUT)


def paths_for(module) -> Tuple[FastPath, ...]:
    """The paths that may replace ``module``'s call (by its type and base types)."""
    names = {f"{k.__module__}.{k.__qualname__}" for k in type(module).__mro__}
    return tuple(p for p in PATHS if names & set(p.applies_to))


def describe() -> str:
    """Every path with its shared checks (in the order made) and its own conditions, as text."""
    lines = []
    for p in PATHS:
        lines.append(f"{p.name}  [{', '.join(n.rsplit('.', 1)[1] for n in p.applies_to)}]")
        lines += [f"  - {reason}" for name, _, reason in SHARED if name in p.shared]
        lines += [f"  - {reason}" for _, reason in p.conditions]
    return "\n".join(lines)
