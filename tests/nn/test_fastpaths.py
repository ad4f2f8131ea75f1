"""``dgl_exact.nn.fastpaths``: every fast path declared once; the shared checks made in one fixed order before a
path's own conditions; what a forward acted on is what ``dgl_exact.explain`` reports."""
import contextlib
import dataclasses
import warnings

import pytest
import torch

import dgl_exact
from dgl_exact import CompressionConfig
from dgl_exact.nn import fastpaths
from dgl_exact.nn.fastpaths import FastPath
from dgl_exact.training.models import build_model

import dgl  # noqa: E402  (after dgl_exact)

pytestmark = pytest.mark.usefixtures("one_thread")

INT2 = CompressionConfig(bits=2)


@pytest.fixture
def decisions(monkeypatch):
    """Every decision a forward makes: ``(path name, modules, reason or None)``, in order."""
    seen = []
    real = FastPath._decide

    def spy(self, args, kwargs):
        call, why = real(self, args, kwargs)
        seen.append((self.name, call.modules if call is not None else (), why))
        return call, why

    monkeypatch.setattr(FastPath, "_decide", spy)
    return seen


def _graph(n=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = dgl.graph((torch.randint(0, n, (4 * n,), generator=gen), torch.randint(0, n, (4 * n,), generator=gen)),
                  num_nodes=n)
    return dgl.add_self_loop(dgl.remove_self_loop(g))


def _bn_relu():
    return dgl_exact.compress_model(torch.nn.Sequential(torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                                        torch.nn.Dropout(0.3)), INT2)


def _sequential_case(change):
    seq, x = _bn_relu(), torch.randn(12, 8, requires_grad=True)
    if change == "eval":
        seq.eval()
    elif change == "hook":
        seq[0].register_forward_hook(lambda *a: None)
    elif change == "fp64":
        seq.double()
        x = x.detach().double().requires_grad_()
    elif change == "no grad input":
        x = x.detach()
        for p in seq.parameters():
            p.requires_grad_(False)
    return seq, (x * 1.0,), "0", fastpaths.BN_RELU_DROPOUT


def _gcnii_case(change):
    g, x = _graph(), torch.randn(40, 6)
    torch.manual_seed(1)
    model = build_model("gcn2", 6, 4, hidden=7, layers=3, dropout=0.0, batch_norm=True, impl="exact")
    if change == "eval":
        model.eval()
    elif change == "hook":
        model.norms[1].register_full_backward_hook(lambda *a: None)
    elif change == "compression off":
        model.convs[1].compression = CompressionConfig(enabled=False)
    elif change == "subclass":
        class Mine(dgl_exact.GCN2Conv):
            def forward(self, *args, **kwargs):
                return super().forward(*args, **kwargs)

        mine = Mine(7, layer=2, alpha=0.1, lambda_=0.5, allow_zero_in_degree=True)
        mine.load_state_dict(model.convs[1].state_dict())
        model.convs[1] = mine
    return model, (g, x), "convs.0", fastpaths.GCNII_STACK


def _sage_case(change):
    g = _graph()
    _, _, blocks = dgl.dataloading.NeighborSampler([4, 3]).sample_blocks(g, torch.arange(10))
    x = torch.randn(blocks[0].num_src_nodes(), 6)
    torch.manual_seed(1)
    model = build_model("sage", 6, 3, hidden=8, layers=2, dropout=0.2, impl="exact")
    if change == "hook":
        model.convs[0].fc_self.register_forward_pre_hook(lambda *a: None)
    elif change == "input grad":
        x.requires_grad_(True)
    elif change == "narrowing":
        model = build_model("sage", 6, 3, hidden=4, layers=2, dropout=0.2, impl="exact")
    elif change == "bn compression":
        model.norms[0].compression = CompressionConfig(bits=8)
    return model, (blocks, x), "convs.0", fastpaths.SAGE_MEAN_BN_RELU_DROPOUT


CASES = [(_sequential_case, c) for c in ("eval", "hook", "fp64", "no grad input")] + \
        [(_gcnii_case, c) for c in ("eval", "hook", "compression off", "subclass")] + \
        [(_sage_case, c) for c in ("hook", "input grad", "narrowing", "bn compression")]


@pytest.mark.parametrize("case,change", CASES, ids=[f"{f.__name__[1:-5]}-{c}" for f, c in CASES])
def test_explain_reports_the_refusal_the_forward_acted_on(case, change, decisions):
    model, inputs, name, path = case(change)
    with dgl_exact.config(bits=2):
        explained = dgl_exact.explain(model, *inputs)
    module = dict(model.named_modules())[name]
    acted = [why for p, mods, why in decisions if p == path.name and any(m is module for m in mods)]
    assert acted and acted[0] is not None, (change, decisions)      # refused, and ...
    assert explained.reason(name) == acted[0]                       # ... explain says exactly why
    assert explained.path(name) == "modules' own calls"
    # the reason is the declared one: a shared check's or one of the path's own conditions
    declared = {r for n, _, r in fastpaths.SHARED if n in path.shared} | {r for _, r in path.conditions}
    assert acted[0] in declared


@pytest.mark.parametrize("case", [_sequential_case, _gcnii_case, _sage_case])
def test_explain_names_the_path_the_forward_took(case, decisions):
    model, inputs, name, path = case(None)
    with dgl_exact.config(bits=2):
        explained = dgl_exact.explain(model, *inputs)
    module = dict(model.named_modules())[name]
    assert any(p == path.name and why is None and any(m is module for m in mods) for p, mods, why in decisions)
    assert explained.path(name).startswith(path.name) and explained.reason(name) == ""


def test_shared_checks_come_first_in_their_fixed_order():
    """Eval mode and a hook and an fp64 input: the hook is reported (hooks come before training in SHARED,
    and every shared check before the path's own fp32 condition), whatever order the path lists them in."""
    seq, x = _bn_relu(), torch.randn(12, 8, dtype=torch.float64)
    seq.double().eval()
    seq[1].register_forward_pre_hook(lambda *a: None)
    path = fastpaths.BN_RELU_DROPOUT
    assert path.refusal(seq[0], seq[1], x) == "a module has hooks (they must see the modules' own calls)"
    reordered = dataclasses.replace(path, shared=tuple(reversed(path.shared)))
    assert reordered.refusal(seq[0], seq[1], x) == path.refusal(seq[0], seq[1], x)
    seq.train()   # still hooked: the hook, not the fp64 input (the path's own condition)
    assert path.refusal(seq[0], seq[1], x) == "a module has hooks (they must see the modules' own calls)"
    order = [name for name, _, _ in fastpaths.SHARED]
    assert order.index("hooks") < order.index("training") < order.index("autocast")


def test_a_path_names_only_known_shared_checks():
    with pytest.raises(ValueError, match="unknown shared checks.*'hook'"):
        dataclasses.replace(fastpaths.GCN2_MIX, shared=("compile", "hook"))


def test_every_path_is_listed_and_found_by_module_type():
    text = fastpaths.describe()
    for path in fastpaths.PATHS:
        assert path.name in text
        assert all(reason in text for _, reason in path.conditions)
    sage = dgl_exact.SAGEConv(4, 4, "mean")
    assert set(fastpaths.paths_for(sage)) == {fastpaths.SAGE_MEAN, fastpaths.SAGE_MEAN_BN_RELU_DROPOUT,
                                              fastpaths.SAGE_INPUT_COMPRESSED_AHEAD, fastpaths.SAGE_ADD_IN_PLACE}
    assert fastpaths.paths_for(dgl_exact.GraphConv(4, 4)) == (fastpaths.GCN_PLUS_LINEAR,)
    assert fastpaths.GCNII_STACK in fastpaths.paths_for(dgl_exact.nn.BatchNorm1d(4))


def test_a_conv_without_a_fused_form_says_so_through_the_protocol():
    """The models ask a conv through the methods every dgl_exact module has: a GraphConv has no fused
    batch-norm form (None: the caller runs the modules) and keeps no input by reference it could name."""
    g, x = _graph(), torch.randn(40, 6)
    conv, bn = dgl_exact.GraphConv(6, 8), dgl_exact.nn.BatchNorm1d(8)
    assert conv.forward_bn_relu_dropout(g, x, bn, 0.1) is None
    assert conv.input_compression(g, x) is None


class _StackWithStem(torch.nn.Module):
    """A caller of ``gcnii_stack`` that, where the stack with its input layer folded in is refused, runs the
    modules itself (no second try without the input layer)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, g, x):
        from dgl_exact.nn.conv.gcn2conv import gcnii_stack

        m = self.model
        out = gcnii_stack(g, m.convs, m.norms, x, 0.0, 0.0, m.lin_out, recompute=2, stem=m.lin_in, stem_dropout=0.0)
        if out is not None:
            return out
        h = h0 = m.lin_in(x).relu()
        for conv, bn in zip(m.convs, m.norms):
            h = bn(conv(g, h, h0)).relu()
        return m.lin_out(h)


@pytest.mark.parametrize("in_feats,folded", [(6, True), (9, False)])
def test_the_stacks_note_says_whether_it_ran_with_its_input_layer(in_feats, folded):
    """The stack and the input layer folded into it are one decision: where the input layer is refused (more
    input features than hidden units), no row says the stack ran, and the input layer's row says why."""
    g = _graph()
    torch.manual_seed(1)
    model = build_model("gcn2", in_feats, 4, hidden=7 if in_feats == 6 else 8, layers=3, dropout=0.0,
                        batch_norm=True, impl="exact")
    wrapper = _StackWithStem(model)
    with dgl_exact.config(bits=2):
        explained = dgl_exact.explain(wrapper, g, torch.randn(40, in_feats))
    for name in ("model.convs.0", "model.norms.2", "model.lin_out", "model.lin_in"):
        if folded:
            assert explained.path(name) == ("fused GCNII stack recomputed in segments of 2 (ops.gcn2_recompute), "
                                             "the input layer folded in"), name
        else:
            assert explained.path(name) == "modules' own calls", name
            assert explained.reason(name).startswith("in_feats > hidden"), name


def test_gcnii_recompute_is_decided_by_the_registry_and_explained(decisions):
    g, x = _graph(), torch.randn(40, 6)
    torch.manual_seed(1)
    model = build_model("gcn2", 6, 4, hidden=7, layers=4, dropout=0.0, batch_norm=True, impl="exact", recompute=2)
    with dgl_exact.config(bits=2):
        explained = dgl_exact.explain(model, g, x)
        assert explained.path("<root>") == ("hidden layers recomputed in segments of 2 (the fused stack's form "
                                            "where its layers' rows say so)")
        assert explained.path("convs.0").startswith("fused GCNII stack recomputed in segments of 2")
        model.convs[1].register_forward_hook(lambda *a: None)
        explained = dgl_exact.explain(model, g, x)
    assert explained.path("<root>") == "modules' own calls"
    assert explained.reason("<root>") == "a module has hooks (they must see the modules' own calls)"
    assert [why for p, _, why in decisions if p == fastpaths.GCNII_RECOMPUTE.name] == [None, explained.reason("<root>")]


@pytest.mark.parametrize("change", [None, "dropout2", "no batch norm"])
def test_the_first_layer_is_offered_its_fused_form_by_the_registry(change, decisions):
    """StackedGNN asks the registry whether to offer its first conv the fused batch-norm form; a refusal is
    noted for explain until the conv's own decision replaces it (what the conv then ran)."""
    g = _graph()
    _, _, blocks = dgl.dataloading.NeighborSampler([4, 3]).sample_blocks(g, torch.arange(10))
    x = torch.randn(blocks[0].num_src_nodes(), 6)
    torch.manual_seed(1)
    model = build_model("sage", 6, 3, hidden=8, layers=2, dropout=0.2, impl="exact", dropout2=change == "dropout2",
                        batch_norm=change != "no batch norm")
    with dgl_exact.config(bits=2):
        explained = dgl_exact.explain(model, blocks, x)
    gate = [why for p, _, why in decisions if p == fastpaths.FIRST_LAYER_BN_RELU_DROPOUT.name]
    fused = [why for p, _, why in decisions if p == fastpaths.SAGE_MEAN_BN_RELU_DROPOUT.name]
    if change is None:
        assert gate == [None] and fused == [None]
        assert explained.path("convs.0") == fastpaths.SAGE_MEAN_BN_RELU_DROPOUT.name
    elif change == "dropout2":
        assert gate == ["not dgl_exact's own layers (impl, or dropout2)"] and fused == []
        assert explained.reason("norms.0") == gate[0]        # nothing else decided about the batch norm
        assert explained.path("convs.0").startswith(fastpaths.SAGE_MEAN.name)   # the conv's own fused mean ran
    else:
        assert gate == ["no batch norm after the first layer"] and fused == []
        assert explained.path("convs.0").startswith(fastpaths.SAGE_MEAN.name)


def _gat_case():
    g, x = _graph(), torch.randn(40, 6)
    conv = dgl_exact.GATConv(6, 4, num_heads=2)
    conv.attn_drop = torch.nn.Sequential()   # not a dropout: the attention op cannot apply it
    return conv, (g, x), "<root>", fastpaths.GAT_ATTENTION


def _sage_lstm_case():
    g, x = _graph(), torch.randn(40, 6)
    torch.manual_seed(1)
    model = build_model("sage", 6, 3, hidden=8, layers=2, dropout=0.2, impl="exact")
    model.convs[1] = dgl_exact.SAGEConv(8, 3, "lstm")   # runs DGL's forward: nothing decides after the ask
    return model, (g, x), "convs.1", fastpaths.SAGE_INPUT_COMPRESSED_AHEAD


@pytest.mark.parametrize("case", [_gat_case, _sage_lstm_case])
def test_a_step_declared_in_the_registry_is_explained_as_refused(case, decisions):
    """Decisions inside a module's forward (the attention op, an input compressed ahead) are declared paths:
    the refusal the forward acted on is the registry's, and explain reports it."""
    model, inputs, name, path = case()
    module = model if name == "<root>" else dict(model.named_modules())[name]
    with dgl_exact.config(bits=2), _quiet():   # the fallbacks warn once per process
        explained = dgl_exact.explain(model, *inputs)
    acted = [why for p, mods, why in decisions if p == path.name and any(m is module for m in mods)]
    assert acted and acted[0] is not None and acted[0] in {r for _, r in path.conditions}
    assert explained.reason(name) == acted[0]
    assert explained.path(name) == "modules' own calls"


def test_a_gat_with_a_replaced_attention_dropout_computes_what_dgl_computes():
    conv, (g, x), _, path = _gat_case()
    ref = dgl.nn.GATConv(6, 4, num_heads=2)
    ref.load_state_dict(conv.state_dict())
    ref.attn_drop = torch.nn.Sequential()
    assert path.refusal(conv) is not None
    with _quiet():
        torch.testing.assert_close(conv(g, x), ref(g, x))


@pytest.mark.parametrize("enabled", [True, False])
def test_in_place_steps_follow_the_registry(enabled, decisions):
    """GCN2Conv scales the mixed features in place unless they are kept by reference (compression off);
    SAGEConv adds the neighbour term into fc_self's output unless fc_self is another module."""
    g, x = _graph(), torch.randn(40, 6, requires_grad=True)
    cfg = CompressionConfig(bits=2, enabled=enabled)
    gcn2 = dgl_exact.GCN2Conv(6, layer=1, compression=cfg)
    gcn2(g, x * 1.0, x * 1.0)
    scale = [why for p, _, why in decisions if p == fastpaths.GCN2_SCALE_IN_PLACE.name]
    if enabled:   # the mix runs fused: no in-place step to decide
        assert scale == []
    else:
        assert scale == [fastpaths.GCN2_SCALE_IN_PLACE.conditions[0][1]]
    sage = dgl_exact.SAGEConv(6, 4, "pool", compression=cfg)
    if not enabled:
        sage.fc_self = torch.nn.Sequential(sage.fc_self)
    sage(g, x)
    add = [why for p, _, why in decisions if p == fastpaths.SAGE_ADD_IN_PLACE.name]
    assert add == [None if enabled else fastpaths.SAGE_ADD_IN_PLACE.conditions[0][1]]



@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
