"""Every layer a GNN block uses: LayerNorm, GELU, SiLU, ELU, PReLU, LeakyReLU, Softmax/LogSoftmax kept
compressed, ``compress_model`` converting them, the saved-tensor-hooks fallback for ops dgl_exact does not
know, and converted modules keeping the model's train/eval mode."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import dgl_exact
from dgl_exact import CompressionConfig


def test_compress_model_in_eval_mode_keeps_eval():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 4))
    model.eval()
    original = copy.deepcopy(model)
    dgl_exact.compress_model(model)
    assert not any(m.training for m in model.modules())
    x = torch.randn(32, 8)
    with torch.no_grad():
        a, b, ref = model(x), model(x), original(x)
    assert torch.equal(a, b)
    assert torch.equal(a, ref)
    # and training mode is kept too
    model.train()
    assert all(m.training for m in model.modules())
