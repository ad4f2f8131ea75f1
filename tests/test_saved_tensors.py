"""``compress_saved`` (dgl_exact.saved_tensors): the saved-tensor-hooks fallback that compresses what ops dgl_exact does
not know save for backward (once, skipping parameters, small tensors and dgl_exact's own saves), its opt-outs, and
its composition with ``memory.measure``."""
from __future__ import annotations

import copy
import math

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


@pytest.mark.skipif(not hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks"),
                    reason="torch < 2.2 cannot tell a scope the saved-tensor hooks around it")
def test_compress_saved_passes_a_shared_copy_through_once_per_keeper():
    """Two dgl_exact products keep one copy of ``h`` (ownership rule 6) inside the scope: the pack hook passes its
    storages through for both (nothing compressed again), and they are the same storages."""
    from dgl_exact.ops.products import compressed_products

    h = torch.randn(256, 64, requires_grad=True) * 1.0
    p1, p2 = nn.Parameter(torch.randn(1, 64)), nn.Parameter(torch.randn(1, 64))
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
        with compressed_products(), dgl_exact.config(CompressionConfig(bits=2)), \
                dgl_exact.compress_saved(CompressionConfig(bits=2)) as stats:
            y = h * p1 + h * p2
    assert stats.compressed == 0
    codes = [t for t in seen if t.dtype == torch.uint8]
    assert len(codes) == 2 and codes[0] is codes[1]
    y.sum().backward()
    assert p1.grad is not None and p2.grad is not None


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
    pytest.importorskip("dgl", reason="compress_model is the DGL front end (the no-DGL CI job runs without DGL)")
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
    pytest.importorskip("dgl", reason="dgl_exact.nn is the DGL front end (the no-DGL CI job runs without DGL)")
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


# --- mask- and sign-reading ops: exact masks in every draw, unbiased values --------------------------------
F = torch.nn.functional
_MASK_READING = {
    "relu": lambda h, h2: torch.relu(h),
    "relu_inplace": lambda h, h2: F.relu(h * 1.0, inplace=True),
    "threshold": lambda h, h2: F.threshold(h, 0.3, -1.0),
    "leaky_relu": lambda h, h2: F.leaky_relu(h, 0.1),
    "abs": lambda h, h2: torch.abs(h),
    "hardtanh": lambda h, h2: F.hardtanh(h),
    "relu6": lambda h, h2: F.relu6(h * 4.0),
    "clamp": lambda h, h2: torch.clamp(h, -0.5, 0.8),
    "clamp_min_method": lambda h, h2: h.clamp(min=0.2),
    "maximum": lambda h, h2: torch.maximum(h, h2),
    "minimum": lambda h, h2: torch.minimum(h, h2),
    "max_all": lambda h, h2: torch.max(h).reshape(1, 1),
    "amax": lambda h, h2: h.amax(dim=1, keepdim=True),
    "min_dim": lambda h, h2: torch.min(h, dim=1, keepdim=True).values,
    "where": lambda h, h2: torch.where(h > 0.1, h, h2 * 0.5),
    "max_pool1d": lambda h, h2: F.max_pool1d(h.view(64, 4, 8), 2).reshape(64, -1),
}


@pytest.mark.parametrize("op", sorted(_MASK_READING))
def test_compress_saved_mask_reading_ops_exact_masks_unbiased_values(op):
    """``loss = sum(op(h) * v)``: the backward of ``op`` reads a mask (a sign, ``> threshold``, ``==`` the
    maximum, indices) from what it saved, so the input gradient ``mask * v`` must be exact in every draw; the
    gradient of ``v`` is the decoded ``op(h)``: its mean over the draws must be ``op(h)`` (unbiased)."""
    f = _MASK_READING[op]
    g = torch.Generator().manual_seed(21)
    a = torch.randn(64, 32, generator=g)
    pick = torch.rand(64, 32, generator=g)
    a = torch.where(pick < 0.15, a.sign() * 1e-3, a)  # far below an INT2 step: decoded to 0 without a sign bit
    a[pick > 0.9] = 0.0
    a.requires_grad_(True)
    b = torch.randn(64, 32, generator=g, requires_grad=True)
    y_exact = f(a.detach(), b.detach())
    v = torch.randn(y_exact.shape, generator=g, requires_grad=True)

    def grads(scope):
        a.grad = b.grad = v.grad = None
        with scope:
            y = f(a * 1.0, b * 1.0)  # non-leaf inputs: what the op saves is compressed unless kept exact
            loss = (y * v).sum()
        loss.backward()
        return tuple(None if t.grad is None else t.grad.clone() for t in (a, b, v))

    exact = grads(dgl_exact.compress_saved(enabled=False))
    cfg = CompressionConfig(bits=2)
    n_draws = 100
    total = torch.zeros_like(y_exact, dtype=torch.float64)
    for _ in range(n_draws):
        ga, gb, gv = grads(dgl_exact.compress_saved(cfg, min_bytes=0))
        assert torch.equal(ga, exact[0]), op  # the mask is exact in every draw
        assert (gb is None and exact[1] is None) or torch.equal(gb, exact[1]), op
        total += gv
    # v.grad is the decoded op(h): two adjacent levels of its row, a step s apart (see
    # tests/compression/test_signed.py; a constant row is quantised on a range under one bf16 ulp of its
    # value, <= value * 2^-7); Hoeffding at 1e-9 over all elements together
    m = y_exact.abs().reshape(y_exact.shape[0], -1)
    s = ((m.amax(1) - m.amin(1)) / 3 + m.amax(1) * 2 ** -7) * (1 + 2 ** -7)
    s = s.reshape(-1, *[1] * (y_exact.dim() - 1))
    t = s * math.sqrt(math.log(2 / (1e-9 / y_exact.numel())) / (2 * n_draws)) + 1e-30
    assert ((total / n_draws - y_exact.double()).abs() <= t).all(), op


def test_compress_saved_keeps_mask_ops_saves_exact_once():
    """``hardtanh`` keeps its input exactly (its mask compares with +-1); a later save of the same tensor is
    not compressed a second time."""
    h = torch.randn(256, 256, requires_grad=True) * 1.0
    with dgl_exact.compress_saved(CompressionConfig(bits=2)) as stats:
        y = F.hardtanh(h) * h  # hardtanh saves h (kept), the product saves h again and y
    assert stats.compressed == 1 and stats.kept >= 2, stats
    y.sum().backward()
