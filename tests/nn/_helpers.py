"""Helpers shared by the layer tests (tests/nn/test_layers.py, tests/test_saved_tensors.py): a pre-LayerNorm
transformer-style block model, and one quantisation step of a row."""
from __future__ import annotations

import torch
import torch.nn as nn


def _row_step(x, bits):
    """The quantization step of each row (uniform levels, one group per row): range / (2**bits - 1)."""
    return (x.amax(1, keepdim=True) - x.amin(1, keepdim=True)) / (2 ** bits - 1)


# --- compress_model on a pre-LayerNorm residual block ----------------------------------------------------
class _PreLNBlock(nn.Module):
    """``x + FFN(LayerNorm(x))``: the residual add keeps nothing; ``tanh`` is a functional call (fallback)."""

    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(2 * d, d),
                                 nn.Dropout(0.1))

    def forward(self, x):
        return x + torch.tanh(self.ffn(self.norm(x)))


def _block_model(d=64):
    torch.manual_seed(7)
    return nn.Sequential(_PreLNBlock(d), _PreLNBlock(d), nn.SiLU(), nn.PReLU(), nn.Linear(d, 8), nn.LogSoftmax(1))
