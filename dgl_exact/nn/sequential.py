"""``nn.Sequential`` whose ``BatchNorm1d -> ReLU (+ Dropout)`` runs execute as one op, in place.

A user's ``h = post(h)`` with ``post = nn.Sequential(nn.BatchNorm1d(d), nn.ReLU(), nn.Dropout(p))`` holds
three layer-sized tensors at once: the caller's ``h`` (the layer input, alive until the call returns), batch
norm's output and ReLU+dropout's output. :class:`Sequential` runs such a run as
:func:`dgl_exact.ops.batch_norm_relu_dropout`, which writes ReLU and dropout into batch norm's fresh output:
two tensors. :func:`dgl_exact.compress_model` makes an ``nn.Sequential`` holding such a run one of these
(the class changes, as for every converted module: same children, parameters, buffers and ``state_dict``).

A run is decided from the container's own children at every call (never from a user's ``forward``: only the
order an ``nn.Sequential`` calls its children in is known): a dgl_exact :class:`BatchNorm1d` directly followed
by a dgl_exact :class:`ReLUDropout` (what ``compress_model`` makes of ``ReLU, Dropout``) or a dgl_exact
:class:`ReLU`. It is fused only where that computes what the modules compute (:mod:`dgl_exact.ops.keep`, rule
7), as :data:`dgl_exact.nn.fastpaths.BN_RELU_DROPOUT` declares: batch norm in training mode, something
requiring grad, an fp32 ``[N, C]`` input of more than one row, a dropout probability below 1, no hook on
either module nor a global one, not while compiling or under autocast. Everywhere else, and for every other
child, the children are called one by one. :func:`dgl_exact.explain` says which path ran and why.
"""
from __future__ import annotations


import torch
import torch.nn as nn

from .. import ops
from .fastpaths import BN_RELU_DROPOUT
from .layers import BatchNorm1d, ReLU, ReLUDropout

__all__ = ["Sequential", "fusable_runs"]

FUSED = BN_RELU_DROPOUT.name


def _run_at(mods, i) -> bool:
    """Whether children ``i, i + 1`` are a batch norm and a ReLU (+ dropout) of dgl_exact's exact types."""
    return (i + 1 < len(mods) and type(mods[i]) is BatchNorm1d
            and type(mods[i + 1]) in (ReLUDropout, ReLU))


def fusable_runs(seq: nn.Sequential) -> list:
    """The child names ``(batch norm, activation)`` of each run :class:`Sequential` would fuse when allowed."""
    names = list(seq._modules.keys())
    mods = list(seq._modules.values())
    return [(names[i], names[i + 1]) for i in range(len(mods)) if _run_at(mods, i)]


class Sequential(nn.Sequential):
    """:class:`torch.nn.Sequential` running each ``BatchNorm1d -> ReLU (+ Dropout)`` run of dgl_exact modules as
    one op where that computes what the modules compute (see the module doc); the same children, parameters
    and ``state_dict``."""

    def forward(self, input):
        """Call the children in order; a fusable run as one op."""
        mods = list(self._modules.values())
        i = 0
        while i < len(mods):
            if _run_at(mods, i):
                bn, act = mods[i], mods[i + 1]
                if BN_RELU_DROPOUT.runs(bn, act, input):
                    input = _fused(bn, act, input)
                    i += 2
                    continue
            input = mods[i](input)
            i += 1
        return input


def _fused(bn: BatchNorm1d, act: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``act(bn(x))`` as :func:`dgl_exact.ops.batch_norm_relu_dropout`, with what the modules would read."""
    bn._check_input_dim(x)
    track, track_var, use_batch_stats, momentum = bn.batch_norm_args()
    p = float(act.p) if type(act) is ReLUDropout and act.training else 0.0
    return ops.batch_norm_relu_dropout(x, track, track_var, bn.weight, bn.bias, use_batch_stats, momentum, bn.eps,
                                       p, config=bn._config())
