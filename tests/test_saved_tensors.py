"""``compress_saved`` (dgl_exact.saved_tensors): the saved-tensor-hooks fallback that compresses what ops dgl_exact does
not know save for backward (once, skipping parameters, small tensors and dgl_exact's own saves), its opt-outs, and
its composition with ``memory.measure``."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import dgl_exact
from dgl_exact import CompressionConfig
from tests.nn._helpers import _block_model, _row_step


# --- saved-tensor hooks ----------------------------------------------------------------------------------
def test_compress_saved_compresses_unknown_ops_once_and_skips_params_small_and_own():
    torch.manual_seed(8)
    lin = nn.Linear(256, 256)
    x = torch.randn(256, 256, requires_grad=True)
    small = torch.randn(8, 8, requires_grad=True)
    with dgl_exact.compress_saved(CompressionConfig(bits=8), model=lin) as stats:
        h = lin(x)  # saves x (a leaf: alive anyway) and the weight: kept as is
        t = torch.tanh(h)  # saves its output: compressed
        y = t * t  # saves t twice more: the same storage, compressed once (two saves answered from the cache)
        z = (small * 1.0).sin()  # small: kept
        e = dgl_exact.ops.gelu(h * 1.0, config=CompressionConfig(enabled=False))  # dgl_exact keeps it exactly
    assert stats.compressed == 1, stats
    assert stats.shared == 2, stats
    assert stats.bytes_after < stats.bytes_before / 3
    (y.sum() + z.sum() + e.sum()).backward()
    # the gradient with exact saves, for comparison
    x2 = x.detach().clone().requires_grad_(True)
    t2 = torch.tanh(lin(x2))
    (t2 * t2).sum().backward()
    assert torch.allclose(x.grad, x2.grad + torch.autograd.functional.vjp(
        lambda v: torch.nn.functional.gelu(lin(v)), x.detach(), torch.ones(256, 256))[1], rtol=0.05, atol=0.05)


def test_compress_saved_opt_outs():
    h = torch.randn(256, 256, requires_grad=True) * 1.0
    for scope in (lambda: dgl_exact.compress_saved(enabled=False),
                  lambda: dgl_exact.compress_saved(CompressionConfig(enabled=False))):
        with scope() as stats:
            torch.tanh(h)
        assert stats.compressed == 0
    with dgl_exact.compress_saved(CompressionConfig(bits=2)) as stats:
        with dgl_exact.keep_exact():
            torch.tanh(h)
        torch.sigmoid(h)
    assert stats.compressed == 1 and stats.kept == 1


@pytest.mark.skipif(not hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks"),
                    reason="torch < 2.2 cannot tell a scope the saved-tensor hooks around it")
def test_compress_saved_composes_with_memory_measure():
    torch.manual_seed(9)
    model = _block_model(128)
    x = torch.randn(512, 128)
    fp32 = dgl_exact.memory.measure(lambda: model(x).sum(), modules=[model]).activation_bytes
    dgl_exact.compress_model(model, CompressionConfig(bits=2), saved_tensors=True)
    rep = dgl_exact.memory.measure(lambda: model(x).sum(), modules=[model])
    rep.result.backward()
    assert all(p.grad is not None for p in model.parameters())
    plain = copy.deepcopy(model)
    plain._compress_saved_config = CompressionConfig(enabled=False)  # the hooks do nothing then
    no_fallback = dgl_exact.memory.measure(lambda: plain(x).sum(), modules=[plain]).activation_bytes
    assert rep.activation_bytes < no_fallback < fp32
    # eval: no scope, identical outputs with and without the hooks
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(x), model(x))


def test_compress_saved_never_compresses_dgl_exact_saves_twice():
    """dgl_exact's own ops register what they save (codes, bf16 metadata of 200 KB here, exact tensors):
    the pack hook passes it through."""
    lin = dgl_exact.nn.Linear(8, 8)
    h = torch.randn(100_000, 8, requires_grad=True) * 1.0
    with dgl_exact.config(bits=2), dgl_exact.compress_saved(model=lin) as stats:
        lin(h)
        dgl_exact.ops.gelu(h)
    assert stats.compressed == 0 and stats.kept > 0, stats


def test_compress_saved_keeps_parameter_views_without_model():
    weight = nn.Parameter(torch.randn(256, 256))
    h = torch.randn(256, 256, requires_grad=True) * 1.0
    with dgl_exact.compress_saved(CompressionConfig(bits=2)) as stats:
        y = h * weight.view(256, 256)  # saves h (compressed) and a view of the parameter (kept)
    assert stats.compressed == 1 and stats.kept == 1, stats
    y.sum().backward()  # the weight gradient reads the decoded h: within a quantization step of h
    h = h.detach()
    assert ((weight.grad - h).abs() <= _row_step(h, 2) * 1.01 + 1e-6).all()
    assert not torch.equal(weight.grad, h)


def test_compress_saved_cache_not_fooled_by_reused_addresses(monkeypatch):
    """A saved temporary freed during the forward leaves its address to the next tensor of the same shape
    (version 0 again): that tensor must be compressed anew, not answered with the old codes.

    Whether the allocator hands the address out again depends on the allocator (glibc reuses it under one
    torch and not under another), so the test makes every storage report the same address: the worst case,
    deterministically."""
    import dgl_exact.saved_tensors as saved_tensors

    monkeypatch.setattr(saved_tensors, "_ptr", lambda t: 0x1000)
    torch.manual_seed(12)
    h = torch.randn(256, 256, requires_grad=True)
    outs = []
    with dgl_exact.compress_saved(CompressionConfig(bits=8)) as stats:
        for i in range(4):
            # tanh keeps its output (a fresh tensor, freed once summed: only its codes stay), all of the
            # same shape, stride, dtype and version, at the "same address"
            outs.append(torch.tanh(h * float(i + 1)).sum())
    assert stats.compressed == 4 and stats.shared == 0, stats
    sum(outs).backward()
    expected = sum((1 - torch.tanh(h.detach() * (i + 1)) ** 2) * (i + 1) for i in range(4))
    # tanh keeps its output y (|y| <= 1, row range <= 2, INT8 step s <= 2 / 255): |y_hat^2 - y^2| <= (2 + s) s
    s = 2 / 255 * 1.01
    assert ((h.grad - expected).abs() <= sum(i + 1 for i in range(4)) * (2 + s) * s).all()
