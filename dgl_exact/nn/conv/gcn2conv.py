"""GCN2Conv (GCNII) with compressed activations."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..._compat import compiling, import_dgl
from ...ops._saving import (DOUBLE_BACKWARD_MESSAGE, autocast_dtype, chunk_rows, create_graph_requested,
                            load, needs_saving, row_chunks, save, stash)
from ... import ops
from ...config import CompressionConfig
from ...ops import captured
from ...ops.gcn2 import BatchNormArgs, GCN2Step, InitialGradient, degree_norm, gcn2_layer_
from ..layers import BatchNorm1d
from .._base import (CompressedModuleMixin, check_feature_rows, check_zero_in_degree, compressed_activation,
                     forward_hooks_present, into, kept_by_reference)

dgl = import_dgl()


class GCN2Conv(CompressedModuleMixin, dgl.nn.GCN2Conv):
    r"""GCNII layer (Chen et al., ICML 2020), a drop-in for :class:`dgl.nn.GCN2Conv`.

    .. math::
        h^{(l+1)} = \sigma\Big(\big((1-\alpha)\tilde{P} h^{(l)} + \alpha h^{(0)}\big)
        \big((1-\beta_l) I + \beta_l W^{(l)}\big)\Big),\qquad \beta_l = \log(\lambda / l + 1)

    Same constructor, forward signature ``(graph, feat, feat_0, edge_weight=None)``, parameters
    (``weight1``, ``weight2``, ``bias``), initialisation, ``state_dict`` and output as DGL's. The
    propagation keeps nothing; the products keep their inputs compressed.

    Parameters
    ----------
    in_feats : int
    layer : int
        Index of this layer (from 1), sets :math:`\beta_l`.
    alpha : float, default 0.1
    lambda_ : float, default 1
    project_initial_features : bool, default True
    allow_zero_in_degree : bool, default False
    bias : bool, default True
    activation : callable, optional
    compression : CompressionConfig, optional

    Example
    -------
    >>> import torch, dgl_exact, dgl  # dgl_exact first: it makes DGL importable on new torch
    >>> g = dgl.add_self_loop(dgl.rand_graph(100, 500))
    >>> h0 = torch.randn(100, 16)
    >>> dgl_exact.GCN2Conv(16, layer=1)(g, h0, h0).shape
    torch.Size([100, 16])
    """

    def __init__(self, in_feats, layer, alpha=0.1, lambda_=1, project_initial_features=True,
                 allow_zero_in_degree=False, bias=True, activation=None,
                 *, compression: Optional[CompressionConfig] = None):
        super().__init__(in_feats, layer, alpha=alpha, lambda_=lambda_,
                         project_initial_features=project_initial_features,
                         allow_zero_in_degree=allow_zero_in_degree, bias=bias, activation=activation)
        self._init_compression(compression)

    def forward(self, graph, feat, feat_0, edge_weight=None):
        st = ops.structure_of(graph, feat.device)
        check_feature_rows(st, feat)
        check_zero_in_degree(self, st)
        cfg = self._config()
        # Layer-sized fp32 temporaries are updated in place where this module owns them (see ``into``): the
        # chain below holds at most two of them (plus the caller's input and h0) instead of seven.
        if edge_weight is None:
            norm = st.in_degrees().to(feat).clamp(min=1).pow(-0.5).unsqueeze(1)
            if isinstance(st, ops.GraphStructure):  # the source normalisation as a cached edge value: no
                # normalised copy of the input
                h = ops.u_mul_e_sum(graph, feat, st.src_edge_norm("in", "sqrt", feat.dtype), config=cfg)
            else:  # captured for torch.compile: the structure is a handle
                h = ops.copy_u_sum(graph, feat * norm)
            h = into(h, "mul", norm)
            h = into(h, "mul", 1 - self.alpha)
        else:
            edge_weight = ops.normalize_edge_weight(graph, edge_weight, "both")
            h = into(ops.u_mul_e_sum(graph, feat, edge_weight, config=cfg), "mul", 1 - self.alpha)
        owed = getattr(feat_0, _ALPHA_OWED, None)  # see initial_features_for
        if owed is not None and owed != float(self.alpha):
            raise ValueError(f"feat_0 was prepared by initial_features_for for alpha={owed}, but this layer's "
                             f"alpha is {self.alpha}")
        if _MixGCN2.applies(self, h, feat_0, cfg):
            return self._activate(_MixGCN2.apply(h, feat_0, self.weight1, self.bias if self._bias else None,
                                                 float(self.alpha), float(self.beta), cfg, owed is not None), cfg)
        # slice only when needed: the backward of a slice allocates a full-size zero-padded gradient
        feat_0 = feat_0 if feat_0.size(0) == h.size(0) else feat_0[: h.size(0)]
        feat_0 = _ScaleOwed.apply(feat_0, float(self.alpha)) if owed is not None else feat_0 * self.alpha
        if self._project_initial_features:
            feat_sum = into(h, "add", feat_0)
            del h, feat_0
            proj = ops.linear(feat_sum, self.weight1.t(), None, cfg)
        else:
            proj = into(ops.linear(h, self.weight1.t(), None, cfg), "add",
                        ops.linear(feat_0, self.weight2.t(), None, cfg))
            feat_sum = h + feat_0
            del h, feat_0
        proj = into(proj, "mul", self.beta)
        # the linear keeps feat_sum compressed (or not at all): it may then be overwritten
        if self._project_initial_features and self.weight1.requires_grad and kept_by_reference(feat_sum, cfg):
            rst = (1 - self.beta) * feat_sum
        else:
            rst = into(feat_sum, "mul", 1 - self.beta)
        del feat_sum
        rst = into(rst, "add", proj)
        del proj
        if self._bias:
            rst = into(rst, "add", self.bias)
        return self._activate(rst, cfg)

    def _activate(self, rst, cfg):
        if self._activation is not None:
            rst = compressed_activation(self._activation, cfg)(rst)
        return rst


class _MixGCN2(torch.autograd.Function):
    """GCNII's mix after the propagation, in one op over the propagation's own buffer ``h`` (already times
    ``1 - alpha``): ``s = h + alpha h0``, ``out = (1 - beta) s + beta s W (+ b)``, the same operations in
    the same order as the unfused chain (bit-identical forward), keeping only ``s`` compressed. Backward
    holds two layer-sized buffers besides its input gradient (``gs = (1 - beta) g + beta g W^T``, then
    ``alpha gs``) instead of autograd's five, and the weight gradient comes from ``s`` in row chunks.
    Used only with compression on (compressed copies cannot do double backward anyway); otherwise the
    module runs the unfused chain, exact to any order."""

    @staticmethod
    def applies(conv, h, feat_0, cfg) -> bool:
        return (conv._project_initial_features and cfg.enabled and h._base is None and not compiling()
                and feat_0.shape == h.shape and feat_0.dtype == h.dtype == conv.weight1.dtype
                and (not conv._bias or conv.bias.dtype == h.dtype)
                and autocast_dtype(h.device.type) is None
                and needs_saving(h, feat_0, conv.weight1, conv.bias if conv._bias else None))

    @staticmethod
    def forward(ctx, h, feat_0, weight1, bias, alpha, beta, cfg, alpha_owed=False):
        # row chunks: every step is row-local, so only chunk-sized temporaries exist besides h itself
        rows = chunk_rows(h.shape[0], h[0].numel(), h.device)
        for r0 in range(0, h.shape[0], rows):
            h[r0:r0 + rows].add_(feat_0[r0:r0 + rows] * alpha)  # s
        kept = stash(h, cfg, force=True) if ctx.needs_input_grad[2] else None  # force: h is overwritten below
        for r0 in range(0, h.shape[0], rows):
            part = h[r0:r0 + rows]
            proj = F.linear(part, weight1.t()).mul_(beta)
            part.mul_(1 - beta).add_(proj)
            if bias is not None:
                part.add_(bias)
        del proj
        ctx.mark_dirty(h)
        ctx.alpha, ctx.beta, ctx.has_bias, ctx.alpha_owed = alpha, beta, bias is not None, alpha_owed
        save(ctx, kept, weight1)
        return h

    @staticmethod
    def backward(ctx, grad):
        kept, weight1 = load(ctx)
        if create_graph_requested():  # only built with compression on
            raise RuntimeError(DOUBLE_BACKWARD_MESSAGE.format(op="GCN2Conv"))
        needs = ctx.needs_input_grad
        gh = gf0 = gw = gb = None
        if needs[0] or needs[1]:
            gs = grad.matmul(weight1.t()).mul_(ctx.beta).add_(grad, alpha=1 - ctx.beta)
            # alpha owed (initial_features_for): the same tensor for both, alpha applied once upstream
            gf0 = (gs if ctx.alpha_owed else gs * ctx.alpha) if needs[1] else None
            gh = gs if needs[0] else None
            del gs
        if needs[2]:
            for r0, r1, s in row_chunks(kept):
                part = s.to(grad.dtype).reshape(r1 - r0, -1).t().matmul(grad[r0:r1])
                gw = part if gw is None else gw.add_(part)
            gw = gw.mul_(ctx.beta)
        if ctx.has_bias and needs[3]:
            gb = grad.sum(0)
        return gh, gf0, gw, gb, None, None, None, None


_ALPHA_OWED = "_dgl_exact_alpha_owed"


class _OweAlpha(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient summed over all consumers by ``alpha`` once."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.alpha, None


class _ScaleOwed(torch.autograd.Function):
    """``x * alpha`` whose backward passes the gradient unscaled (the factor is owed to :class:`_OweAlpha`)."""

    @staticmethod
    def forward(ctx, x, alpha):
        return x * alpha

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def initial_features_for(convs, feat_0: torch.Tensor) -> torch.Tensor:
    """``feat_0`` (GCNII's ``h0``) prepared for a stack of dgl_exact ``GCN2Conv`` layers sharing one
    ``alpha``: the same values, marked so that each layer returns its ``feat_0`` gradient without the factor
    ``alpha``, which is applied once to their sum. In each layer's backward the ``h0`` gradient is then the
    layer's own input gradient (one tensor for both) instead of a second layer-sized product: one
    layer-sized buffer fewer at the backward's peak (the ``h0`` accumulator, the incoming gradient and one
    product remain). Gradients equal up to rounding (``alpha * sum`` vs ``sum of alpha *``). Anything else
    (other layers, several alphas, no gradient, double backward, torch.compile): ``feat_0`` unchanged."""
    alphas = {float(c.alpha) for c in convs if isinstance(c, GCN2Conv)}
    if (len(alphas) != 1 or not all(isinstance(c, GCN2Conv) for c in convs) or not torch.is_grad_enabled()
            or not feat_0.requires_grad or compiling()):
        return feat_0
    (alpha,) = alphas
    out = _OweAlpha.apply(feat_0, alpha)
    setattr(out, _ALPHA_OWED, alpha)
    return out


def gcnii_stack(graph, convs, norms, h0: torch.Tensor, dropout: float, input_dropout: float):
    """GCNII's hidden layers ``h_l = dropout(relu(BN_l(conv_l(h_{l-1}, h0))))``, ``h_0' = dropout(h0,
    input_dropout)``, as fused in-place layers (:func:`dgl_exact.ops.gcn2.gcn2_layer_`: two layer-sized
    buffers at the step's peak instead of three); returns the last layer's output, or None where the fused
    layers do not apply (the caller then runs the modules). ``norms``: batch norms or None.

    Applies when training with compression on, with grad enabled, outside torch.compile, capture and
    autocast, on a homogeneous whole graph without edge weights, for dgl_exact ``GCN2Conv`` layers with
    ``project_initial_features`` and no activation and dgl_exact ``BatchNorm1d`` norms, none with hooks."""
    mods = list(convs) + (list(norms) if norms is not None else [])
    if not convs or not all(isinstance(c, GCN2Conv) and c._project_initial_features and c._activation is None
                            for c in convs):
        return None
    if norms is not None and (len(norms) != len(convs) or not all(type(m) is BatchNorm1d for m in norms)):
        return None
    if (not torch.is_grad_enabled() or compiling() or captured.active() or not all(m.training for m in mods)
            or forward_hooks_present(*mods)
            or autocast_dtype(h0.device.type) is not None):
        return None
    if not 0.0 <= dropout < 1.0 or not 0.0 <= input_dropout < 1.0:
        return None
    cfgs = [c._config() for c in convs]
    if (not all(cfg.enabled for cfg in cfgs) or h0.dim() != 2 or not h0.is_contiguous()
            or h0.dtype not in (torch.float32, torch.float64)):  # half precision: the modules (fp32 statistics)
        return None
    params = [p for m in mods for p in m.parameters()]
    if not all(p.dtype == h0.dtype for p in params) or not needs_saving(h0, *params):
        return None
    st = ops.structure_of(graph, h0.device)
    if not isinstance(st, ops.GraphStructure) or st.is_block or st.num_src != st.num_dst:
        return None
    check_feature_rows(st, h0)
    for conv in convs:
        check_zero_in_degree(conv, st)
    grads, norm = InitialGradient(len(convs)), degree_norm(st, h0.dtype)  # one norm kept for all layers
    h = None
    for i, (conv, cfg) in enumerate(zip(convs, cfgs)):
        bn = None
        if norms is not None:
            m = norms[i]
            mean, var, batch_stats, momentum = m.batch_norm_args()
            bn = BatchNormArgs(m.weight, m.bias, mean, var, batch_stats, momentum, m.eps)
        step = GCN2Step(float(conv.alpha), float(conv.beta), float(dropout), float(input_dropout), i)
        h = gcn2_layer_(st, h, h0, conv.weight1, conv.bias if conv._bias else None, step, bn, grads, cfg, norm)
    return h

