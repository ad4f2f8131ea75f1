"""``ops.gcn2_recompute``: GCNII's fused stack in recomputed segments (``GCNII(recompute=L)`` under
compression). The forward equals the fused stack's bit for bit; with every boundary kept exactly the
recomputed activations equal the forward's bit for bit and the gradients equal the fused stack's; the
recompute's compression noise is independent of the forward's; hooks, eval mode and no_grad run the plain
paths and double backward raises; only the boundaries are kept."""
import dataclasses
import itertools

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact.ops import gcn2, gcn2_recompute
from dgl_exact.nn import fastpaths
from dgl_exact.ops import keep as keeping
from dgl_exact.training.models import GCNII
from tests.ops._helpers import small_chunks_of

dgl = pytest.importorskip("dgl")

pytestmark = pytest.mark.usefixtures("one_thread")

_DATA = {}


def _data(n=40, feats=6):
    if n not in _DATA:
        torch.manual_seed(0)
        g = dgl.add_self_loop(dgl.remove_self_loop(dgl.rand_graph(n, 3 * n)))
        _DATA[n] = (g, torch.randn(n, feats), torch.randint(0, 3, (n,)))
    return _DATA[n]


@pytest.fixture
def small_chunks(monkeypatch):
    small_chunks_of(monkeypatch, gcn2)


@pytest.fixture
def counted_seeds(monkeypatch):
    """The dropout seeds of the fused layers from a counter: the plain and the recomputed stack draw the
    same masks although their compression draws different numbers of seeds in between."""
    class Counter:
        def reset(self):
            self.it = itertools.count(1000)

        def __call__(self):
            return next(self.it)

    counter = Counter()
    counter.reset()
    monkeypatch.setattr(gcn2, "draw_seed", counter)


def _exact_kept():
    """Every kept tensor exact (a copy where the op overwrites it), as a planner's fp32 slot keeps it."""
    return keeping.keep_hook(lambda x, cfg, force: x.clone() if force else x)


def _step(recompute, layers=5, dropout=0.0, batch_norm=True, hidden=7, seed=1, exact=False, model=None):
    g, x, y = _data()
    if model is None:
        torch.manual_seed(0)
        model = GCNII(x.shape[1], hidden, 3, layers=layers, dropout=dropout, batch_norm=batch_norm)
    model.recompute = recompute
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    getattr(gcn2.draw_seed, "reset", lambda: None)()   # counted_seeds: every step draws the same seeds
    scope = _exact_kept() if exact else keeping.keep_hook(None)
    with dgl_exact.config(enabled=True, bits=2), scope:
        out = model(g, x)
        F.cross_entropy(out, y).backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()], model


def _spy_apply(monkeypatch):
    calls = []
    real = gcn2_recompute._GCNIIRecomputed.apply
    monkeypatch.setattr(gcn2_recompute._GCNIIRecomputed, "apply", lambda *a: calls.append(a[7]) or real(*a))
    return calls


@pytest.mark.parametrize("length", [1, 2, 5, 7])
@pytest.mark.parametrize("dropout,batch_norm", [(0.0, False), (0.4, True)])
def test_forward_bit_identical_and_exactly_kept_gradients_equal(length, dropout, batch_norm, small_chunks,
                                                                 counted_seeds, monkeypatch):
    calls = _spy_apply(monkeypatch)
    o1, g1, m1 = _step(0, dropout=dropout, batch_norm=batch_norm, exact=True)
    o2, g2, m2 = _step(length, dropout=dropout, batch_norm=batch_norm, exact=True)
    assert len(calls) == 1 and calls[0].segments == tuple(gcn2_recompute.segments_of(5, length))
    assert calls[0].stem_dropout == dropout   # the input layer folded in
    assert torch.equal(o1, o2)
    for (name, _), a, b in zip(m1.named_parameters(), g1, g2):
        if name.startswith("lin_in."):   # h0's gradient summed into it per contribution: another order
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a, b), name
    for a, b in zip(m1.buffers(), m2.buffers()):   # running statistics updated once, not twice
        assert torch.equal(a, b)
    # compressed: the forward is still the fused stack's bit for bit
    o3, g3, _ = _step(0, dropout=dropout, batch_norm=batch_norm)
    o4, g4, _ = _step(length, dropout=dropout, batch_norm=batch_norm)
    assert torch.equal(o3, o4) and torch.equal(o1, o3)
    assert all(torch.isfinite(g).all() for g in g4)


def test_recomputed_activations_bit_identical(small_chunks, monkeypatch):
    """Every layer's output in the recompute equals the forward's, bit for bit, where the boundaries are
    kept exactly (dropout and batch norm included)."""
    seen = []
    real = gcn2_recompute.layer_forward

    def spy(*a, **k):
        x, items, rec = real(*a, **k)
        seen.append((a[8].index, k.get("keep", True), x.clone()))
        return x, items, rec

    monkeypatch.setattr(gcn2_recompute, "layer_forward", spy)
    _step(2, dropout=0.4, batch_norm=True, exact=True)
    forward = {i: x for i, keep, x in seen if not keep}
    again = {i: x for i, keep, x in seen if keep}
    assert sorted(forward) == sorted(again) == list(range(5))
    for i in range(5):
        assert torch.equal(forward[i], again[i]), i


def test_recompute_noise_independent_of_the_boundaries(monkeypatch):
    """The recompute's compression draws its seeds from a stream of its own: none of them is a seed the
    forward drew (the boundaries', ``h0``'s), none repeats across segments, and the backward leaves torch's
    generator as it was."""
    from dgl_exact.compression import core
    drawn = []
    real = core.draw_seed
    monkeypatch.setattr(core, "draw_seed", lambda: drawn.append(real()) or drawn[-1])
    g, x, y = _data()
    torch.manual_seed(0)
    m = GCNII(x.shape[1], 7, 3, layers=5, dropout=0.0, batch_norm=True, recompute=1)
    with dgl_exact.config(enabled=True, bits=2):
        loss = F.cross_entropy(m(g, x), y)
        forward = list(drawn)
        state = torch.get_rng_state()
        loss.backward()
    backward = drawn[len(forward):]
    assert len(forward) >= 5 and len(backward) >= 5 * 2   # boundaries + h0; every layer's s and o
    assert not set(forward) & set(backward)
    assert len(set(backward)) == len(backward)
    assert torch.equal(state, torch.get_rng_state())


def test_gradients_average_to_the_exact_ones():
    """Under INT2 the gradients are finite and their average is close to the exact gradient (loose: the
    recompute from a compressed boundary is biased; see the module docstring)."""
    _, exact, _ = _step(0, exact=True, batch_norm=False)
    runs = [_step(2, seed=s, batch_norm=False)[1] for s in range(8)]
    big = max(e.norm() for e in exact)
    for i, want in enumerate(exact):
        if want.norm() < 1e-4 * big:
            continue
        mean = torch.stack([r[i] for r in runs]).mean(0)
        assert (mean - want).norm() <= 0.5 * want.norm()


def test_keeps_only_the_boundaries():
    """Kept activation memory barely grows with depth (h0, the boundaries and the head's input), while the
    fused stack's grows with every layer."""
    g, x, y = _data(400)

    def kept(layers, recompute):
        torch.manual_seed(0)
        m = GCNII(x.shape[1], 32, 3, layers=layers, dropout=0.0, batch_norm=True, recompute=recompute)
        with dgl_exact.config(enabled=True, bits=2):
            return dgl_exact.memory.measure(lambda: F.cross_entropy(m(g, x), y), modules=[m],
                                            exclude=[x]).activation_bytes

    plain4, plain16 = kept(4, 0), kept(16, 0)
    rec4, rec16 = kept(4, 16), kept(16, 16)   # one segment: h0, the head's input
    assert plain16 > 3 * plain4
    assert rec16 == rec4 and rec16 < plain4


def test_double_backward_raises():
    g, x, y = _data()
    torch.manual_seed(0)
    m = GCNII(x.shape[1], 7, 3, layers=4, dropout=0.0, batch_norm=True, recompute=2)
    with dgl_exact.config(enabled=True, bits=2):
        loss = F.cross_entropy(m(g, x), y)
        with pytest.raises(RuntimeError, match="double backward"):
            torch.autograd.grad(loss, list(m.parameters()), create_graph=True)


def test_hooks_eval_no_grad_take_the_plain_paths(monkeypatch):
    calls = _spy_apply(monkeypatch)
    g, x, y = _data()
    torch.manual_seed(0)
    m = GCNII(x.shape[1], 7, 3, layers=4, dropout=0.3, batch_norm=True, recompute=2)
    seen = []
    handle = m.convs[1].register_forward_hook(lambda mod, a, out: seen.append(out.shape))
    with dgl_exact.config(enabled=True, bits=2):
        F.cross_entropy(m(g, x), y).backward()
        assert seen == [(x.shape[0], 7)] and not calls   # the hook saw the module's own call
        handle.remove()
        m.eval()
        m(g, x)
        m.train()
        with torch.no_grad():
            m(g, x)
        assert not calls
        m(g, x)
        assert len(calls) == 1
        assert "recomputed in segments of 2" in str(dgl_exact.explain(m, g, x))


def _refuse_stem(monkeypatch):
    """The input layer is never folded in (one more condition on the stack, false where it is given)."""
    stack = fastpaths.GCNII_STACK
    refused = dataclasses.replace(stack, conditions=stack.conditions + ((lambda c: c.stem is None,
                                                                          "refused for the test"),))
    monkeypatch.setattr(fastpaths, "GCNII_STACK", refused)


def test_retain_graph_gives_the_same_gradient_twice():
    g, x, y = _data()
    torch.manual_seed(0)
    m = GCNII(x.shape[1], 7, 3, layers=5, dropout=0.3, batch_norm=True, recompute=2)
    with dgl_exact.config(enabled=True, bits=2):
        loss = F.cross_entropy(m(g, x), y)
        first = torch.autograd.grad(loss, list(m.parameters()), retain_graph=True)
        second = torch.autograd.grad(loss, list(m.parameters()))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def test_input_layer_folded_in_forms_no_h0_gradient(monkeypatch):
    """With the input layer folded in, every ``h0`` gradient contribution goes into the input layer's
    gradients (the accumulator ``layers_backward`` gets is the stem's, never an ``[N, D]`` tensor), and the
    model's gradients are those of the unfolded recompute up to float summation order."""
    seen = []
    real = gcn2_recompute.layers_backward

    def spy(st, norm, g, gh0, *a):
        seen.append(type(gh0))
        out = real(st, norm, g, gh0, *a)
        seen.append(type(out[1]))
        return out

    monkeypatch.setattr(gcn2_recompute, "layers_backward", spy)
    _, folded, _ = _step(2, dropout=0.3, batch_norm=True, exact=True)
    assert seen and set(seen) == {gcn2_recompute._StemGradient}
    _refuse_stem(monkeypatch)
    seen.clear()
    _, unfolded, m = _step(2, dropout=0.3, batch_norm=True, exact=True)
    assert torch.Tensor in seen
    for (name, _), a, b in zip(m.named_parameters(), folded, unfolded):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_folded_input_layer_with_zero_features_reads_the_forwards_dropout(monkeypatch):
    """The folded input layer's backward reads ``dropout(x)`` through the mask packed in the forward (bit:
    ``dropout(x) != 0``): with bag-of-words-like features (mostly exact zeros) and heavy dropout, its
    gradients are the unfolded recompute's (which reads the modules' own ``dropout(x)``)."""
    g, x, y = _data()
    torch.manual_seed(3)
    xz = x * (torch.rand_like(x) < 0.3)

    def step():
        torch.manual_seed(0)
        m = GCNII(x.shape[1], 7, 3, layers=4, dropout=0.6, batch_norm=False, recompute=2)
        torch.manual_seed(5)
        with dgl_exact.config(enabled=True, bits=2), _exact_kept():
            F.cross_entropy(m(g, xz), y).backward()
        return [p.grad.clone() for p in m.parameters()], m

    calls = _spy_apply(monkeypatch)
    folded, _ = step()
    _refuse_stem(monkeypatch)
    unfolded, m = step()
    assert [c.stem_dropout for c in calls] == [0.6, None]
    for (name, _), a, b in zip(m.named_parameters(), folded, unfolded):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


def test_input_layer_wider_than_hidden_not_folded(monkeypatch):
    """Folded, every layer's backward would pay an ``[in_feats, N] x [N, hidden]`` product: with more input
    features than hidden units (Cora: 1433 against 64) ``h0``'s gradient is kept instead."""
    calls = _spy_apply(monkeypatch)
    g, x, y = _data()
    m = GCNII(x.shape[1], x.shape[1] - 1, 3, layers=4, dropout=0.3, batch_norm=False, recompute=2)
    with dgl_exact.config(enabled=True, bits=2):
        F.cross_entropy(m(g, x), y).backward()
    assert len(calls) == 1 and calls[0].stem_dropout is None
    assert "in_feats > hidden" in fastpaths.GCNII_STACK.refusal(g, m.convs, m.norms, x, 0.3, 0.3, m.lin_out,
                                                                 stem=m.lin_in, recompute=2, stem_dropout=0.3)


@pytest.mark.parametrize("why", ["x needs a gradient", "a hook on the input layer", "input layer in eval mode"])
def test_input_layer_not_folded_where_it_would_change_what_is_seen(why, monkeypatch):
    """Where folding the input layer in would hide its own call (a hook), leave a needed gradient out (``x``
    needs one) or differ from the module (eval mode), the stack takes ``h0`` from the modules instead."""
    calls = _spy_apply(monkeypatch)
    g, x, y = _data()
    x = x.clone()
    torch.manual_seed(0)
    m = GCNII(x.shape[1], 7, 3, layers=4, dropout=0.3, batch_norm=True, recompute=2)
    seen = []
    if why == "x needs a gradient":
        x.requires_grad_()
    elif why == "a hook on the input layer":
        m.lin_in.register_forward_hook(lambda mod, a, out: seen.append(out.shape))
    else:
        m.lin_in.eval()
    with dgl_exact.config(enabled=True, bits=2):
        F.cross_entropy(m(g, x), y).backward()
    assert len(calls) == 1 and calls[0].stem_dropout is None
    if why == "x needs a gradient":
        assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    if why == "a hook on the input layer":
        assert seen == [(x.shape[0], 7)]
    assert m.lin_in.weight.grad is not None
