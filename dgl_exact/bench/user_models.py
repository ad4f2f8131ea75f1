"""Models as users write them, measured beside the project's own (``dgl-exact bench memory --models
user-sage,user-sage-donate``): the memory figures the README quotes must be reachable from a user's model.

``user-sage``: three ``dgl.nn.SAGEConv(..., 'mean')`` with ``nn.BatchNorm1d``, ``nn.ReLU`` and
``nn.Dropout(0.5)`` between them, written as a plain loop (``h = conv(g, h); h = post(h)``), converted
with :func:`dgl_exact.compress_model` for dgl_exact's settings and left as written for DGL's.
``user-sage-donate``: the same model with the one word per layer the README documents,
``h = conv(g, dgl_exact.donate(h))``.
"""
from __future__ import annotations

import torch.nn as nn

from .._compat import import_dgl
from ..nn.convert import compress_model
from ..ops.keep import donate

dgl = import_dgl()

USER_MODELS = ("user-sage", "user-sage-donate")


class UserSAGE(nn.Module):
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
        h = x
        for i, conv in enumerate(self.convs):
            h = conv(g, donate(h) if self.donate_inputs and i > 0 else h)
            if i < len(self.posts):
                h = self.posts[i](h)
        return h


def build_user_model(name: str, in_feats: int, hidden: int, classes: int, layers: int, dropout: float,
                     batch_norm: bool, impl: str) -> nn.Module:
    """``name`` (one of :data:`USER_MODELS`) built from DGL's and torch's layers; for ``impl='exact'``
    converted in place by :func:`dgl_exact.compress_model` (its configuration: the one in force)."""
    if name not in USER_MODELS:
        raise ValueError(f"unknown user model {name!r}; expected one of {USER_MODELS}")
    model = UserSAGE(in_feats, hidden, classes, layers, dropout, batch_norm, donate_inputs=name.endswith("donate"))
    return compress_model(model) if impl == "exact" else model
