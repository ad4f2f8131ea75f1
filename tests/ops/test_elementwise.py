"""The elementwise ops (dgl_exact.ops.elementwise): activations against torch and the bits they keep, dropout
masks regenerated in backward, ``relu_dropout`` equal to dropout of relu.

``ops.relu_dropout(..., compress_for=cfg)``: the output's compressed copy made in the activation's own pass
(kernel ``relu_dropout_compress``) and taken by the next op's keep instead of compressing the output again.

The fused path must give the same forward, the same kept compressed tensor and the same gradients as the
unfused one when the random seeds are drawn in the same order; a copy is taken once, only under an equal
config and only while the output is unchanged; and training a model with it keeps the fused copy used."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact import CompressionConfig, ops
from dgl_exact.compression import CompressedTensor, decompress
from dgl_exact.ops import keep as keeping
from tests.ops._helpers import INT8, OFF, close, compress_calls, hidden, saved_tensors

pytestmark = pytest.mark.usefixtures("one_thread")

INT2 = CompressionConfig(bits=2)


def _linear_after_relu(x, w, fused: bool, cfg=INT2, p=0.5):
    torch.manual_seed(7)
    with dgl_exact.config(cfg):
        h = ops.relu_dropout(x, p, True, compress_for=cfg if fused else None)
        return h, ops.linear(h, w, None, cfg)


@pytest.mark.parametrize("shape", [(1, 3), (37, 5), (300, 64)])
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_fused_equals_unfused_bit_for_bit(shape, p):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, shape[1], generator=g, requires_grad=True)
    out = {}
    for fused in (False, True):
        x = torch.randn(shape, generator=g.manual_seed(2), requires_grad=True)
        h, y = _linear_after_relu(x, w, fused, p=p)
        y.square().sum().backward()
        out[fused] = (h.detach(), y.detach(), x.grad.clone(), w.grad.clone())
        w.grad = None
    for a, b in zip(out[False], out[True]):
        assert torch.equal(a, b)


def test_the_next_keep_takes_the_offered_copy_and_later_ones_share_it():
    x = torch.randn(20, 8, requires_grad=True)
    with dgl_exact.config(INT2):
        h = ops.relu_dropout(x, 0.5, True, compress_for=INT2)
    offered = keeping.offered(h)
    assert isinstance(offered, CompressedTensor) and offered.bits == 2
    assert torch.allclose(decompress(offered), h.detach(), atol=float(h.detach().abs().max()) / 2)  # INT2 of h
    with keeping.op_inputs(h):  # an op reading h alone
        assert keeping.default_keep(h, INT2) is offered
        second = keeping.default_keep(h, INT2)  # a second keeper shares it (rule 6): the same codes
    assert isinstance(second, CompressedTensor) and second.packed is offered.packed
    assert keeping.offered(h) is None


def test_no_copy_taken_under_another_config_or_after_an_inplace_change():
    x = torch.randn(20, 8, requires_grad=True)
    h = ops.relu_dropout(x, 0.0, True, compress_for=INT2)
    assert keeping.take_offered(h, CompressionConfig(bits=4)) is None
    assert keeping.take_offered(h, INT2.replace(block_rows=4)) is None
    h2 = h * 1.0
    assert keeping.take_offered(h2, INT2) is None  # another tensor
    with torch.no_grad():
        h.mul_(2.0)
    assert keeping.take_offered(h, INT2) is None  # changed in place since the copy was made


@pytest.mark.parametrize("cfg", [CompressionConfig(enabled=False), CompressionConfig(bits=2, kept_frac=0.5),
                                 CompressionConfig(bits=2, nonfinite="raise")])
def test_not_fused_where_it_does_not_apply(cfg):
    x = torch.randn(20, 8, requires_grad=True)
    h = ops.relu_dropout(x, 0.5, True, compress_for=cfg)
    assert keeping.offered(h) is None
    x.grad = None
    h.sum().backward()
    assert x.grad is not None


def test_eval_and_no_grad_ignore_the_hint():
    x = torch.randn(5, 4)
    y = ops.relu_dropout(x, 0.5, False, compress_for=INT2)
    assert torch.equal(y, torch.relu(x)) and keeping.offered(y) is None


def _sage_model():
    from dgl_exact.training.models import build_model

    torch.manual_seed(0)
    return build_model("sage", 8, 3, hidden=16, layers=3, dropout=0.5, batch_norm=True)


def test_sage_model_takes_every_fused_copy(monkeypatch):
    """In the trainer's SAGE model each hidden ReLU+dropout makes the next layer's fc_self copy: the step
    compresses that input once (in the fused op) and never again in fc_self."""
    import dgl

    from dgl_exact.compression import core

    gen = torch.Generator().manual_seed(1)
    src, dst = torch.randint(0, 50, (300,), generator=gen), torch.randint(0, 50, (300,), generator=gen)
    g = dgl.add_self_loop(dgl.graph((src, dst), num_nodes=50))
    feat = torch.randn(50, 8)
    model = _sage_model().train()
    calls = {"fused": 0, "taken": 0}
    fused, take = core.relu_dropout_compress, keeping.take_offered

    def count_fused(*a, **k):
        calls["fused"] += 1
        return fused(*a, **k)

    def count_take(x, cfg):
        got = take(x, cfg)
        calls["taken"] += got is not None
        return got

    monkeypatch.setattr("dgl_exact.ops.elementwise.relu_dropout_compress", count_fused)
    monkeypatch.setattr(keeping, "take_offered", count_take)
    with dgl_exact.config(INT2):
        model(g, feat).sum().backward()
    # layers 2 and 3 take their input from the op before them: layer 3's from ReLU+dropout's fused pass, layer
    # 2's from the first layer's op (SAGE + batch norm + ReLU + dropout, ops.sage_mean_bn_relu_dropout)
    assert calls == {"fused": 1, "taken": 2}


# ---------------------------------------------------------------------------------------------------
# activations and dropout
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["relu", "leaky_relu", "elu"])
def test_activations_match_torch(name):
    x = torch.randn(40, 5, dtype=torch.float64)
    ours = {"relu": lambda x: ops.relu(x), "leaky_relu": lambda x: ops.leaky_relu(x, 0.1),
            "elu": lambda x: ops.elu(x, 0.7, OFF)}[name]
    ref = {"relu": F.relu, "leaky_relu": lambda x: F.leaky_relu(x, 0.1), "elu": lambda x: F.elu(x, 0.7)}[name]
    close(ours(x), ref(x), name)
    assert torch.autograd.gradcheck(lambda x: ours(hidden(x)), (x.clone().requires_grad_(),))


def test_activation_bits(monkeypatch):
    x = hidden(torch.randn(64, 8, requires_grad=True))
    for fn in (ops.relu, lambda x: ops.leaky_relu(x, 0.2), lambda x: ops.relu_dropout(x, 0.5)):
        with saved_tensors() as kept:
            fn(x)
        assert len(kept) == 1 and kept[0].dtype == torch.uint8 and kept[0].numel() == 64 * 8 // 8
    with compress_calls(monkeypatch) as made, saved_tensors() as kept:
        ops.elu(x, 1.0, INT8)
    assert len(made) == 1 and made[0].proj_seed is None
    assert sum(t.nbytes for t in kept) == 64 + made[0].nbytes
    with saved_tensors() as kept:
        ops.dropout(x, 0.5)
    assert kept == []
    # the INT8 ELU gradient: exact where x > 0, close elsewhere
    r = torch.randn(64, 8)
    base = x.detach().requires_grad_()
    exact = torch.autograd.grad((F.elu(hidden(base)) * r).sum(), base)[0]
    approx = torch.autograd.grad((ops.elu(hidden(base), 1.0, INT8) * r).sum(), base)[0]
    pos = base.detach() > 0
    close(approx[pos], exact[pos], "elu positive part", rtol=0, atol=0)
    assert (approx - exact).norm() <= 0.02 * exact.norm()


def test_dropout_mask_regenerated_in_backward():
    torch.manual_seed(0)
    x = torch.randn(200, 10, requires_grad=True)
    p = 0.3
    torch.manual_seed(5)
    y = ops.dropout(hidden(x), p)
    kept = y != 0
    close(y[kept], x.detach()[kept] / (1 - p), "kept values scaled", rtol=1e-6, atol=1e-6)
    (gx,) = torch.autograd.grad(y.sum(), x)
    # the gradient's mask is the forward's: g / (1 - p) where kept, 0 elsewhere
    close(gx, kept.float() / (1 - p), "dropout gradient", rtol=1e-6, atol=0)
    frac = 1 - kept.float().mean().item()
    assert abs(frac - p) < 4 * math.sqrt(p * (1 - p) / kept.numel())
    # same seed, same mask; another seed, another mask
    torch.manual_seed(5)
    torch.testing.assert_close(ops.dropout(hidden(x), p), y, rtol=0, atol=0)
    torch.manual_seed(6)
    assert not torch.equal(ops.dropout(hidden(x), p) != 0, kept)
    # p = 0 and eval: identity (the very tensor); p = 1: zeros with zero gradient
    assert ops.dropout(x, 0.0) is x and ops.dropout(x, 0.5, training=False) is x
    y1 = ops.dropout(hidden(x), 1.0)
    assert bool((y1 == 0).all())
    assert bool((torch.autograd.grad(y1.sum(), x)[0] == 0).all())
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError):
            ops.dropout(x, bad)
        with pytest.raises(ValueError):
            ops.relu_dropout(x, bad)
    # without autograd: same mask as with it
    torch.manual_seed(5)
    with torch.no_grad():
        torch.testing.assert_close(ops.dropout(x, p), y.detach(), rtol=0, atol=0)


_DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


@pytest.mark.parametrize("device", _DEVICES)
@pytest.mark.parametrize("op", ["dropout", "relu_dropout"])
def test_dropout_like_torch_draws_torchs_mask_with_compression_off(device, op):
    """``like_torch=True`` (the modules' dropout) with compression off: torch's own dropout, bit for bit (the
    output, the gradient and the generator state after it, for a strided input too), keeping nothing; with
    compression on, or without ``like_torch``, the kernels' masks."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    torch.manual_seed(0)
    x = torch.randn(64, 300, device=device).t().requires_grad_(True)  # non-contiguous: the mask follows strides
    p = 0.3
    ref_fn = F.dropout if op == "dropout" else (lambda h, p: F.dropout(F.relu(h), p))
    ours = getattr(ops, op)

    def run(fn):
        torch.manual_seed(5)
        y = fn(hidden(x), p)
        (gx,) = torch.autograd.grad(y, x, torch.arange(y.numel(), device=device, dtype=y.dtype).view(y.shape))
        return y.detach(), gx, torch.rand(4, device=device)  # the generator's state afterwards

    with dgl_exact.config(enabled=False):
        want = run(ref_fn)
        with saved_tensors() as kept:
            got = run(lambda h, p: ours(h, p, like_torch=True))
        for a, b in zip(want, got):
            torch.testing.assert_close(b, a, rtol=0, atol=0)
        assert all(t.dtype == torch.bool or t.numel() * 8 <= x.numel() for t in kept)  # at most relu's bit
        unlike = run(lambda h, p: ours(h, p))
    assert not torch.equal(unlike[0], want[0])
    with dgl_exact.config(bits=8):
        assert not torch.equal(run(lambda h, p: ours(h, p, like_torch=True))[0], want[0])


def test_relu_dropout_is_dropout_of_relu():
    torch.manual_seed(0)
    x = torch.randn(100, 7, requires_grad=True)
    for p in (0.0, 0.4):
        torch.manual_seed(9)
        y = ops.relu_dropout(hidden(x), p)
        torch.manual_seed(9)
        ref = ops.dropout(F.relu(hidden(x)), p) if p > 0 else F.relu(x)
        torch.testing.assert_close(y, ref, rtol=0, atol=0)
        (gx,) = torch.autograd.grad(y.sum(), x)
        mask = (x.detach() > 0) & (y.detach() != 0) if p > 0 else x.detach() > 0
        close(gx, mask.float() / (1 - p), f"relu_dropout gradient p={p}", rtol=1e-6, atol=0)
    y1 = ops.relu_dropout(hidden(x), 1.0)
    assert bool((y1 == 0).all())
    y_eval = ops.relu_dropout(x, 0.5, training=False)
    torch.testing.assert_close(y_eval, F.relu(x), rtol=0, atol=0)
