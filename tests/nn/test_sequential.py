"""``compress_model`` on ``nn.Sequential(BatchNorm1d, ReLU, Dropout)``: a :class:`dgl_exact.nn.Sequential` that
runs the run as one op where that computes what the modules compute, and the modules' own calls elsewhere.

Compared with the same converted modules called one by one (an ``nn.Sequential`` of them): outputs, gradients,
running statistics bit for bit for the same random state; eval mode against torch's unconverted modules;
``state_dict``; hooks; double backward; odd batch sizes; the conversion report."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import dgl_exact
from dgl_exact import CompressionConfig, kernels
from dgl_exact.nn.sequential import FUSED


def _post(c=8, p=0.5, dropout=True, relu_first=False):
    torch.manual_seed(0)
    layers = [nn.BatchNorm1d(c), nn.ReLU()] + ([nn.Dropout(p)] if dropout else [])
    seq = nn.Sequential(*layers)
    with torch.no_grad():
        seq[0].weight.uniform_(0.5, 1.5)
        seq[0].bias.normal_(0, 0.2)
    return seq


def _pair(seq, cfg=CompressionConfig(bits=2)):
    """The converted model and the same converted modules called one by one (torch's Sequential.forward)."""
    fused = dgl_exact.compress_model(copy.deepcopy(seq), cfg)
    composed = copy.deepcopy(fused)
    composed.__class__ = nn.Sequential
    return fused, composed


def _step(model, x, seed=11):
    h = x * 1.0  # a tensor with history, as a conv's output
    torch.manual_seed(seed)
    y = model(h)
    grad = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
    gx, gw, gb = torch.autograd.grad(y, (x, model[0].weight, model[0].bias), grad)
    return [y.detach(), gx, gw, gb, model[0].running_mean.clone(), model[0].running_var.clone(),
            model[0].num_batches_tracked.clone()]


@pytest.mark.parametrize("backend", ["torch", "numba"])
@pytest.mark.parametrize("n,dropout,bits", [(40, True, 2), (7, True, 4), (3, False, 2), (2, True, None),
                                             (20001, True, 2)])  # the last: a row-chunked backward
def test_training_equals_the_modules_called_one_by_one(backend, n, dropout, bits):
    cfg = CompressionConfig(bits=bits) if bits else CompressionConfig(enabled=False)
    fused, composed = _pair(_post(64 if n > 20000 else 8, dropout=dropout), cfg)
    assert type(fused) is dgl_exact.nn.Sequential
    x = torch.randn(n, fused[0].num_features, requires_grad=True)
    with kernels.use_backend(backend):
        for _ in range(2):  # running statistics carried over
            got, want = _step(fused, x), _step(composed, x)
            for a, e in zip(got, want):
                torch.testing.assert_close(a, e, rtol=0, atol=0)
    explained = dgl_exact.explain(fused, x * 1.0)
    if dropout and bits is None:  # compression off (the model's config): dropout draws torch's masks, unfused
        assert explained.reason("0") == "compression off: dropout draws torch's masks (the modules' own calls)"
    else:
        assert explained.path("0") == FUSED


def test_eval_mode_equals_torchs_modules():
    seq = _post()
    seq.train()
    with torch.no_grad():
        for _ in range(3):
            seq(torch.randn(30, 8) * 3 + 1)  # running statistics away from their initial values
    fused = dgl_exact.compress_model(copy.deepcopy(seq), CompressionConfig(bits=2))
    seq.eval(), fused.eval()
    x = torch.randn(9, 8, requires_grad=True)
    torch.testing.assert_close(fused(x), seq(x), rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), seq(x), rtol=0, atol=0)
    assert dgl_exact.explain(fused, x).reason("0") == "eval mode"


def test_state_dict_and_module_identity_unchanged():
    seq = _post()
    original = copy.deepcopy(seq)
    children = list(seq.children())
    model = dgl_exact.compress_model(seq)
    assert list(model.state_dict()) == list(original.state_dict())
    assert model[0] is children[0]  # the same batch norm module (its hooks, its parameters)
    fresh = dgl_exact.compress_model(_post())
    with torch.no_grad():
        original[0].running_mean.fill_(0.25)
    fresh.load_state_dict(original.state_dict())
    assert torch.equal(fresh[0].running_mean, original[0].running_mean)


@pytest.mark.parametrize("where", [0, 1])
@pytest.mark.parametrize("kind", ["forward", "forward_pre", "full_backward"])
def test_hooks_still_fire_and_refuse_the_fused_path(where, kind):
    fused, composed = _pair(_post())
    calls = []
    for model in (fused, composed):
        module = model[where]
        if kind == "forward":
            module.register_forward_hook(lambda m, i, o: calls.append(o.sum().item()))
        elif kind == "forward_pre":
            module.register_forward_pre_hook(lambda m, i: calls.append(i[0].sum().item()))
        else:
            module.register_full_backward_hook(lambda m, gi, go: calls.append(go[0].sum().item()))
    x = torch.randn(12, 8, requires_grad=True)
    got, want = _step(fused, x), _step(composed, x)
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=0, atol=0)
    assert len(calls) == 2 and calls[0] == calls[1]
    assert "hooks" in dgl_exact.explain(fused, x * 1.0).reason("0")


def test_double_backward():
    fused, composed = _pair(_post(), CompressionConfig(enabled=False))
    x = torch.randn(10, 8, requires_grad=True)
    results = []
    for model in (fused, composed):
        torch.manual_seed(2)
        y = model(x * 1.0)
        (gx,) = torch.autograd.grad((y * torch.arange(8.0)).sum(), x, create_graph=True)
        results.append(torch.autograd.grad(gx.square().sum(), (x, model[0].weight)))
    for a, e in zip(*results):
        torch.testing.assert_close(a, e)
    on = dgl_exact.compress_model(_post(), CompressionConfig(bits=2))
    y = on(x * 1.0)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(y.sum(), x, create_graph=True)


def test_one_row_and_other_inputs_run_the_modules():
    fused, composed = _pair(_post())
    with pytest.raises(ValueError, match="more than 1 value"):
        fused(torch.randn(1, 8, requires_grad=True) * 1.0)
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    fused.double(), composed.double()
    assert dgl_exact.explain(fused, x * 1.0).reason("0") == "not an fp32 [N, C] input"
    torch.manual_seed(0)
    a = fused(x * 1.0)
    torch.manual_seed(0)
    torch.testing.assert_close(a, composed(x * 1.0), rtol=0, atol=0)
    fused.float(), composed.float()
    x = torch.randn(6, 8)
    with torch.no_grad():  # nothing kept: the modules' own calls (torch's dropout), as composed
        torch.manual_seed(0)
        a = fused(x)
        torch.manual_seed(0)
        torch.testing.assert_close(a, composed(x), rtol=0, atol=0)


def test_conversion_report_and_what_is_not_fused():
    model = nn.Module()
    model.post = _post()
    model.other = nn.Sequential(nn.BatchNorm1d(8), nn.Tanh(), nn.ReLU(), nn.Dropout(0.1))  # not adjacent
    model.lin = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    model, report = dgl_exact.compress_model(model, report=True)
    assert report.fused_norm == ["post.0+1"]
    assert "fused BatchNorm1d+ReLU(+Dropout), in place where allowed: post.0+1" in str(report)
    assert type(model.post) is dgl_exact.nn.Sequential
    assert type(model.other) is nn.Sequential and type(model.lin) is nn.Sequential
    assert "post" not in report.fp32 and "post" not in report.converted
    _, again = dgl_exact.compress_model(model, report=True)
    assert again.fused_norm == [] and len(again) == 0
    unfused = dgl_exact.compress_model(_post(), fuse=False)
    assert type(unfused) is nn.Sequential


def test_user_sage_model_runs_its_posts_fused():
    from dgl_exact.bench.user_models import build_user_model

    model = build_user_model("user-sage-donate", 12, 16, 3, 3, 0.5, True, "exact")
    assert all(type(post) is dgl_exact.nn.Sequential for post in model.posts)


@pytest.mark.parametrize("variant", ["bias None", "affine=False", "track_running_stats=False"])
@pytest.mark.parametrize("tail", ["relu", "tanh"], ids=["fused", "alone"])
def test_batch_norm_without_bias_or_statistics_converted(variant, tail):
    """A torch BatchNorm1d whose bias is None (set so, or ``affine=False``) or without running statistics,
    converted by compress_model, fused with its ReLU + Dropout or alone: a training step's backward runs (a
    gradient for a None bias used to be returned and refused by autograd), and with compression off the
    gradients and statistics are torch's."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(8, affine=variant != "affine=False", track_running_stats=variant != "track_running_stats=False")
    if variant == "bias None":
        bn.bias = None
    ref = nn.Sequential(nn.Linear(4, 8), bn, nn.ReLU() if tail == "relu" else nn.Tanh(), nn.Dropout(0.0))
    x = torch.randn(32, 4)
    for cfg in (CompressionConfig(enabled=False), CompressionConfig(bits=2)):
        ours = dgl_exact.compress_model(copy.deepcopy(ref), cfg)
        assert type(ours[1]) is dgl_exact.nn.BatchNorm1d
        for model in (ours, ref):
            model.zero_grad()
            model(x).square().sum().backward()
        for (name, got), want in zip(ours.named_parameters(), ref.parameters()):
            assert got.grad is not None, name
            if not cfg.enabled:
                torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=name)
        if not cfg.enabled:
            for (name, got), want in zip(ours.named_buffers(), ref.buffers()):
                torch.testing.assert_close(got, want, msg=name)
