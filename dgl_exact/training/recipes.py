"""EXACT's training recipes: how a training step's inputs, loss and numeric precision are made from the data,
each chosen once per run from the config (:func:`step_recipe`) and used by the
:class:`~dgl_exact.training.trainer.Trainer` for every step and evaluation.

* :class:`StepInputs` -- what one step feeds the model and the loss.
* :class:`LabelInputs` -- ``use_labels`` (EXACT's arxiv GAT): a random part of the training nodes show
  their one-hot labels as extra input columns, the loss is on the others; evaluation shows every training
  label.
* :func:`saint_edge_weight` -- GraphSAINT's edge normalisation folded into each conv's own, so that the
  sampled subgraph's aggregation estimates the full graph's.
* :func:`sampled_inputs` -- a mini-batch's inputs: its training rows, GraphSAINT's node and edge weights.
* :func:`loss_function` -- the loss of the dataset (multi-label) and the config (``exact_log``).
* :func:`autocast` -- ``amp``'s precision on the device.
"""
from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple, Optional

import torch

from .. import ops
from .models import exact_log_loss

__all__ = ["StepInputs", "LabelInputs", "saint_edge_weight", "sampled_inputs", "loss_function", "autocast"]


class StepInputs(NamedTuple):
    """One training step's inputs: the graph (or a batch's blocks), the input features, the rows the loss
    reads and their labels, the loss's per-row weights and the convs' edge weights (None: unweighted)."""

    graph: object
    feat: torch.Tensor
    index: torch.Tensor
    labels: torch.Tensor
    weight: Optional[torch.Tensor] = None
    edge_weight: Optional[torch.Tensor] = None


class LabelInputs:
    """EXACT's label inputs (``use_labels``): ``num_classes`` one-hot columns appended to the features.

    For a training step, each training node shows its label with probability ``mask_rate`` (a draw from
    torch's global generator, so a resumed run draws the same) and the loss is on the training nodes that
    do not; for evaluation every training node shows its label (EXACT's ``test()``)."""

    def __init__(self, num_classes: int, mask_rate: float):
        self.num_classes, self.mask_rate = num_classes, mask_rate

    def with_labels(self, feat: torch.Tensor, index: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """``feat`` with the one-hot ``labels`` at rows ``index``, zeros elsewhere."""
        onehot = torch.zeros(feat.shape[0], self.num_classes, dtype=feat.dtype, device=feat.device)
        onehot[index, labels] = 1.0
        return torch.cat([feat, onehot], dim=1)

    def step_inputs(self, graph, feat: torch.Tensor, index: torch.Tensor, labels: torch.Tensor) -> StepInputs:
        """A full-graph step's inputs: ``index`` (the training rows, labelled ``labels``) split into the
        shown and the scored."""
        shown = torch.rand(index.numel()) < self.mask_rate
        shown = shown.to(feat.device)
        feat = self.with_labels(feat, index[shown], labels[shown])
        return StepInputs(graph, feat, index[~shown], labels[~shown])

    def eval_features(self, feat: torch.Tensor, index: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The evaluation's features: every training row ``index`` shows its label."""
        return self.with_labels(feat, index, labels)


def saint_edge_weight(batch, model: str, device) -> torch.Tensor:
    """GraphSAINT's per-edge weight of ``batch`` (its ``edge_norm``), folded so each conv's own normalisation
    becomes the full-graph one: SAGE's mean divides by the subgraph's in-degree, GCN's symmetric norm by the
    subgraph's degrees; the full graph's degrees are the ``_deg_in`` / ``_deg_out`` node columns."""
    g, norm = batch.graph, batch.edge_norm.float()
    src, dst = g.edges(order="eid")
    if model == "sage":  # mean: sum_u w h_u / deg_S(v) should be sum_u a h_u / deg_G(v)
        w = norm * g.in_degrees()[dst].float() / g.ndata["_deg_in"][dst]
    elif model == "gcn":  # both: 1/sqrt(deg_S(u) deg_S(v)) -> 1/sqrt(deg_G(u) deg_G(v))
        sub = g.out_degrees()[src].float().clamp(min=1) * g.in_degrees()[dst].float().clamp(min=1)
        full = g.ndata["_deg_out"][src].clamp(min=1) * g.ndata["_deg_in"][dst].clamp(min=1)
        w = norm * (sub / full).sqrt()
    else:
        w = norm
    return w.to(device)


def sampled_inputs(batch, model: str, device) -> StepInputs:
    """A mini-batch's step inputs on ``device``: the loss on its training rows, weighted by GraphSAINT's
    node norm where the sampler gives one, and GraphSAINT's edge weights (:func:`saint_edge_weight`)."""
    moved = batch.to(device)
    index = torch.nonzero(moved.train_mask, as_tuple=True)[0]
    weight = moved.node_norm[index] if moved.node_norm is not None else None
    edge_weight = saint_edge_weight(batch, model, device) if batch.edge_norm is not None else None
    return StepInputs(batch.graph, moved.feat, index, moved.label[index], weight, edge_weight)


def loss_function(multilabel: bool, loss: str) -> Callable:
    """``loss(logits, label_rows, index, weight)``: binary cross-entropy for a multi-label dataset, else
    EXACT's ``exact_log`` loss or cross-entropy (``loss``), all on the rows ``index`` of ``logits``."""
    if multilabel:
        return ops.binary_cross_entropy_with_logits
    if loss == "exact_log":
        return exact_log_loss
    return ops.cross_entropy


def autocast(amp: bool, device: torch.device):
    """``amp``'s autocast on ``device`` (float16 on CUDA, bfloat16 on the CPU); a null context without."""
    if not amp:
        return contextlib.nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype)
