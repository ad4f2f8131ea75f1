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
7): batch norm in training mode, grad enabled with something requiring grad, an fp32 ``[N, C]`` input of more
than one row, a dropout probability below 1, no hook on either module nor a global one, not while compiling,
capturing or under autocast. Everywhere else, and for every other child, the children are called one by one.
:func:`dgl_exact.explain` says which path ran and why.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from .. import ops
from .._compat import autocast_dtype, compiling
from ..compression_config import get_config
from ..ops import captured
from ..ops.saved import needs_saving
from . import paths
from ._base import hooks_present
from .layers import BatchNorm1d, ReLU, ReLUDropout

__all__ = ["Sequential", "fusable_runs"]

FUSED = "fused BatchNorm1d+ReLU+Dropout (one op, in place)"


def _run_at(mods, i) -> bool:
    """Whether children ``i, i + 1`` are a batch norm and a ReLU (+ dropout) of dgl_exact's exact types."""
    return (i + 1 < len(mods) and type(mods[i]) is BatchNorm1d
            and type(mods[i + 1]) in (ReLUDropout, ReLU))


def fusable_runs(seq: nn.Sequential) -> list:
    """The child names ``(batch norm, activation)`` of each run :class:`Sequential` would fuse when allowed."""
    names = list(seq._modules.keys())
    mods = list(seq._modules.values())
    return [(names[i], names[i + 1]) for i in range(len(mods)) if _run_at(mods, i)]


def _refusal(bn: BatchNorm1d, act: nn.Module, x) -> Optional[str]:
    """Why the run ``bn, act`` on ``x`` must run as the modules' own calls (None: it may be fused)."""
    if not isinstance(x, torch.Tensor):
        return "the input is not a tensor"
    if not bn.training:
        return "batch norm in eval mode"
    if hooks_present(bn, act):
        return "a module has hooks (they see each module's own call)"
    if compiling() or captured.active():
        return "torch.compile: the modules' ops are captured one by one"
    if x.dim() != 2 or x.dtype != torch.float32 or (bn.weight is not None and bn.weight.dtype != torch.float32):
        return "not an fp32 [N, C] input"
    if x.shape[0] < 2:
        return "one row under batch norm"
    if autocast_dtype(x.device.type) is not None:
        return "autocast"
    if not needs_saving(x, bn.weight, bn.bias):
        return "no grad (nothing is kept)"
    if type(act) is ReLUDropout and act.training and act.p >= 1.0:
        return "dropout probability 1"
    if type(act) is ReLUDropout and act.training and act.p > 0 and not get_config().enabled:
        # the module draws torch's own mask then (ops.relu_dropout(like_torch=True)); the fused op cannot
        return "compression off: dropout draws torch's masks (the modules' own calls)"
    return None


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
                why = _refusal(bn, act, input)
                paths.record([bn, act], FUSED if why is None else None, why)
                if why is None:
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
