"""GCN2Conv (GCNII) with compressed activations."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..._compat import import_dgl
from ... import ops
from ...compression_config import CompressionConfig
from ...ops.donation import Donated, release
from ...ops.gcn2 import BatchNormArgs, GCN2Layer, GCN2Step, gcn2_mix, gcnii_layers
from ...ops.gcn2_recompute import StemArgs, gcnii_layers_recomputed
from .. import fastpaths
from .._base import (CompressedModuleMixin, check_feature_rows, check_zero_in_degree, compressed_activation, into,
                     shared_doc)

dgl = import_dgl()


@shared_doc
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
    %(example_imports)s
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
        r"""Compute one GCNII layer.

        Parameters
        ----------
        graph : DGLGraph
            The graph.
        feat : torch.Tensor
            :math:`(N, D)` features of the previous layer, :math:`N` the number of nodes, :math:`D` =
            ``in_feats``. A tensor given with :func:`dgl_exact.donate` is released (its memory freed) once
            propagated, where that cannot change what is computed (training with grad, no edge weights, no
            hooks, not ``feat_0``'s memory).
        feat_0 : torch.Tensor
            :math:`(N, D)` initial features :math:`h^{(0)}` (on a block, its first :math:`N_{dst}` rows).
        edge_weight : torch.Tensor, optional
            :math:`(E,)` or :math:`(E, 1)` per-edge weights; the propagation then uses them symmetrically
            normalised (as :class:`dgl.nn.EdgeWeightNorm` with ``norm='both'``).

        Returns
        -------
        torch.Tensor
            :math:`(N_{dst}, D)` output features.

        Raises
        ------
        DGLError
            If the graph has 0-in-degree nodes and ``allow_zero_in_degree`` is False.

        Kept for backward: the mixed features :math:`(1-\alpha)\tilde{P} h + \alpha h^{(0)}` (and, without
        ``project_initial_features``, the two inputs of the products), compressed under this module's
        configuration; one bit per element for a ReLU-like ``activation``. The propagation keeps the edge
        values it multiplies by (and ``feat`` compressed only when ``edge_weight`` needs a gradient).
        """
        st = ops.structure_of(graph, feat.device)
        check_feature_rows(st, feat)
        check_zero_in_degree(self, st)
        cfg = self._config()
        h = self._propagate(graph, st, feat, feat_0, edge_weight, cfg)
        if fastpaths.GCN2_MIX.runs(self, h, feat_0, cfg):
            return self._activate(gcn2_mix(h, feat_0, self.weight1, self.bias if self._bias else None,
                                           self.alpha, self.beta, cfg), cfg)
        # slice only when needed: the backward of a slice allocates a full-size zero-padded gradient
        feat_0 = feat_0 if feat_0.size(0) == h.size(0) else feat_0[: h.size(0)]
        feat_0 = feat_0 * self.alpha
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
        if fastpaths.GCN2_SCALE_IN_PLACE.runs(self, feat_sum, cfg):
            rst = into(feat_sum, "mul", 1 - self.beta)
        else:
            rst = (1 - self.beta) * feat_sum
        del feat_sum
        rst = into(rst, "add", proj)
        del proj
        if self._bias:
            rst = into(rst, "add", self.bias)
        return self._activate(rst, cfg)

    def _propagate(self, graph, st, feat, feat_0, edge_weight, cfg):
        """``(1 - alpha)`` times the normalised propagation of ``feat``, in a buffer this module owns."""
        # Layer-sized fp32 temporaries are updated in place where this module owns them (see ``into``): the
        # chain below holds at most two of them (plus the caller's input and h0) instead of seven.
        if edge_weight is None:
            norm = st.in_degrees().to(feat).clamp(min=1).pow(-0.5).unsqueeze(1)
            if isinstance(st, ops.GraphStructure):  # the source normalisation as a cached edge value: no
                # normalised copy of the input
                h = ops.src_norm_sum(graph, feat, "sqrt", "in")
            else:  # captured for torch.compile: the structure is a handle
                h = ops.copy_u_sum(graph, feat * norm)
            # the propagation keeps nothing of feat: a donated input goes now (rule 5), not when the call returns
            if type(feat) is Donated and fastpaths.GCN2_DONATED_INPUT.runs(self, feat, feat_0, edge_weight):
                release(feat)
            h = into(h, "mul", norm)
            h = into(h, "mul", 1 - self.alpha)
        else:
            edge_weight = ops.normalize_edge_weight(graph, edge_weight, "both")
            h = into(ops.u_mul_e_sum(graph, feat, edge_weight, config=cfg), "mul", 1 - self.alpha)
        return h

    def _activate(self, rst, cfg):
        if self._activation is not None:
            rst = compressed_activation(self._activation, cfg)(rst)
        return rst


def gcnii_stack(graph, convs, norms, h0: torch.Tensor, dropout: float, input_dropout: float, head: nn.Module,
                recompute: int = 0, stem: Optional[nn.Module] = None, stem_dropout: float = 0.0):
    """GCNII's hidden layers ``h_l = dropout(relu(BN_l(conv_l(h_{l-1}, h0))))``, ``h_0' = dropout(h0,
    input_dropout)``, and the output layer ``head(h_L)`` as one op (:func:`dgl_exact.ops.gcn2.gcnii_layers`:
    two layer-sized buffers at the step's peak instead of three); returns the logits, or None where that
    op is not provably equivalent to calling the modules (the caller then calls them). ``norms``: batch
    norms or None; ``head``: a dgl_exact ``Linear``.

    Taken only where it computes what the modules compute, with the same parameters, buffers and hooks
    seen: training mode and grad enabled; compression on in every module (exactly kept tensors would allow
    double backward, which the fused op refuses); outside torch.compile, capture and autocast; dgl_exact's
    own ``GCN2Conv.forward`` (no subclass overriding it) with ``project_initial_features`` and no
    activation, dgl_exact ``BatchNorm1d`` norms and ``Linear`` head; no forward, forward-pre, backward or
    backward-pre hook on any of them, nor a global one; more than one row under batch norm; a homogeneous
    whole graph; fp32/fp64 and one dtype throughout (:data:`dgl_exact.nn.fastpaths.GCNII_STACK`, which also
    holds the input layer's conditions below). :func:`dgl_exact.explain` says which condition failed.

    ``recompute``: segments of that many layers (0: off) keep only their input and are re-run in the
    backward (:func:`dgl_exact.ops.gcn2_recompute.gcnii_layers_recomputed`), under the same conditions.
    With ``recompute``, ``stem`` (a dgl_exact ``Linear``) folds the input layer in: ``h0`` is then the
    features ``x`` (needing no gradient) and the stack computes ``h0 = relu(stem(dropout(x, stem_dropout)))``
    itself, summing ``h0``'s gradient straight into the stem's (one layer-sized block less in the backward;
    :mod:`dgl_exact.ops.gcn2_recompute`). Under the same conditions for the stem (dgl_exact's own
    ``Linear``, no hooks, training, compression on) and where its input is no wider than the layers
    (``in_feats <= hidden``: folded, every layer's backward pays an ``[in_feats, N] x [N, hidden]`` product).

    ``h0`` may be donated (``gcnii_stack(..., dgl_exact.donate(h0), ...)``, :mod:`dgl_exact.ops.keep` rule 5):
    where the stack runs without recompute, its memory is released once the last hidden layer has read it,
    so the output layer runs beside one layer-sized buffer, not two. Where the stack returns None it did not
    take ``h0``: the caller takes it back with :func:`dgl_exact.ops.donation.reclaim` before using it."""
    # one decision for the stack and the input layer folded into it: what it notes for explain is what ran
    call = fastpaths.GCNII_STACK.decide(graph, convs, norms, h0, dropout, input_dropout, head, stem, recompute,
                                        stem_dropout)
    if call is None:
        return None
    release_h0 = call.release_h0   # a donated h0 goes once the last layer has read it (rule 5)
    del call                        # (its facts refer to h0 and the modules: nothing held past the decision)
    st = ops.structure_of(graph, h0.device)
    check_feature_rows(st, h0)
    for conv in convs:
        check_zero_in_degree(conv, st)
    layers = []
    for i, conv in enumerate(convs):
        bn = None
        if norms is not None:
            m = norms[i]
            mean, var, batch_stats, momentum = m.batch_norm_args()
            bn = BatchNormArgs(m.weight, m.bias, mean, var, batch_stats, momentum, m.eps)
        step = GCN2Step(float(conv.alpha), float(conv.beta), float(dropout), float(input_dropout), i)
        layers.append(GCN2Layer(step, conv.weight1, conv.bias if conv._bias else None, bn, conv._config()))
    if recompute:  # the recomputed segments read h0 again in the backward: a donated h0 is kept
        stem_args = None if stem is None else StemArgs(stem.weight, stem.bias, float(stem_dropout), stem._config())
        return gcnii_layers_recomputed(st, h0, layers, head.weight, head.bias, head._config(), recompute,
                                       stem=stem_args)
    return gcnii_layers(st, h0, layers, head.weight, head.bias, head._config(), release_h0=release_h0)
