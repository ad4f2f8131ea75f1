"""``ops.gcn2``'s fused GCNII stack holds each layer's compressed copies and masks on its ``ctx`` and drops
them as soon as that layer's backward step has run (``ops.keep``, rule 8), unless ``retain_graph`` keeps the
graph or saved-tensor hooks must see them. Gradients are the same bit for bit on every path."""
import gc
import weakref

import pytest
import torch

import dgl_exact
from dgl_exact.compression import CompressedTensor
from dgl_exact.ops import gcn2, keep as keeping
from dgl_exact.ops import donation
from dgl_exact.ops import saved

dgl = pytest.importorskip("dgl")

pytestmark = pytest.mark.usefixtures("one_thread")

N, D, LAYERS = 40, 8, 4


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, N, (2, 3 * N), generator=gen)
    g = dgl.add_self_loop(dgl.remove_self_loop(dgl.graph((src, dst), num_nodes=N)))
    st = dgl_exact.ops.structure_of(g, torch.device("cpu"))
    h0 = torch.randn(N, D, generator=gen, requires_grad=True)
    head = torch.randn(3, D, generator=gen, requires_grad=True)
    cfg = dgl_exact.CompressionConfig(bits=2)
    layers = []
    for i in range(LAYERS):
        w = (torch.randn(D, D, generator=gen) / D ** 0.5).requires_grad_()
        bn = gcn2.BatchNormArgs(torch.ones(D, requires_grad=True), torch.zeros(D, requires_grad=True),
                                torch.zeros(D), torch.ones(D), True, 0.1, 1e-5)
        layers.append(gcn2.GCN2Layer(gcn2.GCN2Step(0.1, 0.5, 0.3, 0.2 if i == 0 else 0.0, i), w, None, bn, cfg))
    params = [h0, head] + [t for layer in layers for t in (layer.weight1, layer.bn.weight, layer.bn.bias)]
    return st, h0, head, layers, cfg, params


def _recording_keep(kept):
    def hook(t, cfg, force):
        item = keeping.default_keep(t, cfg, force)
        kept.append(item)
        return item
    return hook


def _packed_refs(items):
    """Weak references to the packed codes of the compressed copies the stack made (in forward order: per
    layer s and o, then the output layer's input)."""
    assert items and all(isinstance(i, CompressedTensor) for i in items)
    return [weakref.ref(i.packed) for i in items]


def _grads(run_backward, hooks=None, seed=5):
    st, h0, head, layers, cfg, params = _inputs()
    torch.manual_seed(seed)
    if hooks is not None:
        with torch.autograd.graph.saved_tensors_hooks(*hooks):
            out = gcn2.gcnii_layers(st, h0, layers, head, None, cfg)
    else:
        out = gcn2.gcnii_layers(st, h0, layers, head, None, cfg)
    loss = out.square().sum()
    return [g.clone() for g in run_backward(loss, params)]


def _alive_per_layer(monkeypatch, retain_graph=False):
    """For each layer's backward step (in the order they run): how many layers' kept codes are still alive."""
    st, h0, head, layers, cfg, params = _inputs()
    kept = []
    torch.manual_seed(5)
    with keeping.keep_hook(_recording_keep(kept)):
        out = gcn2.gcnii_layers(st, h0, layers, head, None, cfg)
    refs = _packed_refs(kept)
    del kept
    seen = []
    real = gcn2._layer_backward

    def spy(g, items, rec, *a):
        gc.collect()
        seen.append((rec.step.index, sum(r() is not None for r in refs[:2 * LAYERS]) // 2,
                     refs[-1]() is not None))
        return real(g, items, rec, *a)

    monkeypatch.setattr(gcn2, "_layer_backward", spy)
    out.square().sum().backward(retain_graph=retain_graph)
    gc.collect()
    return seen, refs, out


#: whether this torch says if saved-tensor hooks are in force and if the graph is kept (torch >= 2.3 or so;
#: not 2.1): where it cannot, rule 8 never drops anything
TORCH_SAYS = all(hasattr(torch._C._autograd, name)
                 for name in ("_top_saved_tensors_default_hooks", "_get_current_graph_task_keep_graph"))


def test_each_layers_codes_are_freed_once_its_backward_step_ran(monkeypatch):
    seen, refs, _ = _alive_per_layer(monkeypatch)
    if not TORCH_SAYS:  # nothing is dropped: everything is held to the end, as with retain_graph
        assert seen == [(i, LAYERS, True) for i in range(LAYERS - 1, -1, -1)]
        return
    # layer i's step runs while layers 0..i still hold their codes; the output layer's input is gone
    assert seen == [(i, i + 1, False) for i in range(LAYERS - 1, -1, -1)]
    assert all(r() is None for r in refs)


def test_retain_graph_keeps_everything_and_a_second_backward_matches(monkeypatch):
    seen, refs, out = _alive_per_layer(monkeypatch, retain_graph=True)
    assert seen == [(i, LAYERS, True) for i in range(LAYERS - 1, -1, -1)]
    assert all(r() is not None for r in refs)


def test_second_backward_after_the_codes_were_dropped_raises_torchs_error():
    st, h0, head, layers, cfg, params = _inputs()
    loss = gcn2.gcnii_layers(st, h0, layers, head, None, cfg).square().sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def _plain(loss, params):
    return torch.autograd.grad(loss, params)


def _retained_twice(loss, params):
    first = torch.autograd.grad(loss, params, retain_graph=True)
    second = torch.autograd.grad(loss, params)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    return second


def test_gradients_identical_when_dropped_early_kept_or_seen_by_hooks():
    plain = _grads(_plain)
    retained = _grads(_retained_twice)
    packed = []

    def pack(t):
        packed.append(t.dtype)
        return t

    hooked = _grads(_plain, hooks=(pack, lambda t: t))
    # under a saved-tensor hook everything kept goes through save_for_backward: the hook sees the codes
    assert torch.uint8 in packed
    for a, b, c in zip(plain, retained, hooked):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_hooks_see_the_codes_and_nothing_is_dropped_under_them(monkeypatch):
    st, h0, head, layers, cfg, params = _inputs()
    kept, stored = [], []
    torch.manual_seed(5)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: stored.append(t) or t, lambda t: t):
        with keeping.keep_hook(_recording_keep(kept)):
            out = gcn2.gcnii_layers(st, h0, layers, head, None, cfg)
    stored_ptrs = {t.untyped_storage().data_ptr() for t in stored}
    assert all(item.packed.untyped_storage().data_ptr() in stored_ptrs for item in kept)
    out.square().sum().backward()
    # the hook's references still read the codes (nothing was resized or freed under it)
    assert all(t.untyped_storage().nbytes() > 0 for t in stored if t.dtype == torch.uint8 and t.numel())


def test_double_backward_still_refused():
    st, h0, head, layers, cfg, params = _inputs()
    loss = gcn2.gcnii_layers(st, h0, layers, head, None, cfg).square().sum()
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(loss, params, create_graph=True)


def test_private_keeping_and_graph_freed_follow_what_torch_says():
    if not TORCH_SAYS:
        assert not saved.private_keeping_allowed()
        return
    assert saved.private_keeping_allowed()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert not saved.private_keeping_allowed()
    with torch.autograd.graph.save_on_cpu():
        assert not saved.private_keeping_allowed()
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            seen.append(saved.graph_freed_after_backward())
            return g * 2

    x = torch.ones(3, requires_grad=True)
    y = Probe.apply(x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert seen == [False, True]


def test_a_layers_own_codes_are_freed_before_its_h0_gradient_is_formed(monkeypatch):
    """Inside a layer's backward step, its compressed ``s`` and ``o`` go once read (batch norm's backward,
    the weight gradient), before the mix's backward allocates the ``h0`` gradient: at the top layer, where
    every layer's codes are alive, that is the backward's peak."""
    if not TORCH_SAYS:
        pytest.skip("this torch cannot say whether the graph is retained: nothing is dropped early")
    st, h0, head, layers, cfg, params = _inputs()
    kept = []
    torch.manual_seed(5)
    with keeping.keep_hook(_recording_keep(kept)):
        out = gcn2.gcnii_layers(st, h0, layers, head, None, cfg)
    refs = _packed_refs(kept)
    del kept
    seen = []
    real = gcn2._mix_backward

    def spy(g, weight1, step, *a):
        gc.collect()
        seen.append((step.index, [r() is not None for r in refs[:2 * LAYERS]]))
        return real(g, weight1, step, *a)

    monkeypatch.setattr(gcn2, "_mix_backward", spy)
    out.square().sum().backward()
    assert [i for i, _ in seen] == list(range(LAYERS - 1, -1, -1))
    for i, alive in seen:  # only the layers below i still hold their s and o
        assert alive == [True] * (2 * i) + [False] * (2 * (LAYERS - i)), i


def _donated_run(donate, monkeypatch=None):
    st, h0, head, layers, cfg, params = _inputs()
    h = h0 * 1.0  # a tensor of this forward (a leaf that requires grad cannot be donated)
    types_at_keep = []
    if monkeypatch is not None:
        real = gcn2.as_kept

        def spy(t, *a, **k):
            types_at_keep.append(type(h))
            return real(t, *a, **k)
        monkeypatch.setattr(gcn2, "as_kept", spy)
    torch.manual_seed(5)
    arg = donation.donate(h) if donate else h
    out = gcn2.gcnii_layers(st, arg, layers, head, None, cfg, release_h0=donate)
    grads = torch.autograd.grad(out.square().sum(), params)
    return out.detach(), grads, h, types_at_keep


def test_a_donated_h0_is_released_before_the_output_layer_same_results(monkeypatch):
    out, grads, h, _ = _donated_run(False)
    d_out, d_grads, d_h, types = _donated_run(True, monkeypatch)
    assert torch.equal(out, d_out)
    for a, b in zip(grads, d_grads):
        assert torch.equal(a, b)
    # every layer's keep saw h0 alive; the output layer's (the last keep) saw it released
    assert types[:-1] == [donation.Donated] * (len(types) - 1) and types[-1] is donation.Released
    assert type(h) is torch.Tensor and type(d_h) is donation.Released
    with pytest.raises(RuntimeError, match="donated"):
        d_h.sum()


def test_a_memory_meter_sees_what_is_held_privately_and_the_step_runs_as_in_training(monkeypatch):
    """``memory.measure_step`` observes saved tensors (``keep.observe_saved``): rule 8 stays in force under
    it (each layer's codes are dropped early, as in training) and the activation bytes it reports count
    what the stack holds privately, the same as where everything goes through ``save_for_backward``."""
    from dgl_exact import memory
    if not TORCH_SAYS:
        pytest.skip("this torch cannot say whether saved-tensor hooks are in force")

    def measured(private_allowed):
        real = gcn2.private_keeping_allowed
        asked = []
        monkeypatch.setattr(gcn2, "private_keeping_allowed",
                            lambda: asked.append(real() and private_allowed) or asked[-1])
        st, h0, head, layers, cfg, params = _inputs()
        torch.manual_seed(5)
        report = memory.measure_step(lambda: gcn2.gcnii_layers(st, h0, layers, head, None, cfg).square().sum(),
                                     cpu_method="none")
        monkeypatch.undo()
        return report.activation_bytes, asked

    held, asked = measured(True)
    assert asked == [True]  # the meter's observer leaves rule 8 in force
    saved, _ = measured(False)
    assert held == saved > 0


def test_observe_saved_allows_private_keeping_other_hooks_do_not():
    if not TORCH_SAYS:
        pytest.skip("this torch cannot say whether saved-tensor hooks are in force")
    assert saved.private_keeping_allowed()
    with saved.observe_saved(lambda t: None):
        assert saved.private_keeping_allowed()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            assert not saved.private_keeping_allowed()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        assert not saved.private_keeping_allowed()
        with saved.observe_saved(lambda t: None):  # innermost hooks rule: the observer's
            assert saved.private_keeping_allowed()
