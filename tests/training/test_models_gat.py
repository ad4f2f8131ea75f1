"""EXACT's arxiv GAT extras: ``residual`` (a bias-free linear map of each layer's input, also at equal
widths), ``use_attn_dst: false`` (one attention vector for both ends of an edge), ``edge_drop``, label
inputs (``use_labels`` / ``mask_rate``) and the learning-rate warm-up (``lr_warmup``, EXACT's adjust_lr)."""
import math

import pytest
import torch
import torch.nn.functional as F

import dgl_exact  # (before dgl: DGL compatibility shim)
import dgl
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.models import build_model
from dgl_exact.training.trainer import Trainer

SMALL = "synthetic-small:num_nodes=200,num_features=6,num_classes=3"


def _graph(n=20, e=80, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = dgl.graph((torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)), num_nodes=n)
    return dgl.add_self_loop(dgl.remove_self_loop(g))


def _exact_gat_layer(conv, g, x, heads, out, residual, use_attn_dst):
    """EXACT's CustomGATConv (eval, no attention dropout), written out: z = x W, score of edge u -> v is
    leaky_relu(a_l . z_u + a_r . z_v) (a_r = a_l without use_attn_dst), softmax over v's in-edges, sum of
    alpha z_u, + x W_res (residual), + bias."""
    z = (x @ conv.fc.weight.t()).view(-1, heads, out)
    a_l = conv.attn_l.view(1, heads, out)
    a_r = conv.attn_r.view(1, heads, out) if use_attn_dst else a_l
    el, er = (z * a_l).sum(-1), (z * a_r).sum(-1)
    src, dst = g.edges()
    score = F.leaky_relu(el[src] + er[dst], 0.2)
    rst = torch.zeros(x.shape[0], heads, out)
    for v in range(x.shape[0]):
        into = dst == v
        if into.any():
            alpha = torch.softmax(score[into], dim=0)
            rst[v] = (alpha.unsqueeze(-1) * z[src[into]]).sum(0)
    if residual:
        rst = rst + (x @ conv.res_fc.weight.t()).view(-1, heads, out)
    return rst + conv.bias.view(1, heads, out)


@pytest.mark.parametrize("impl", ["exact", "dgl"])
@pytest.mark.parametrize("residual,use_attn_dst", [(True, False), (True, True), (False, False)])
def test_gat_layers_match_exact(impl, residual, use_attn_dst):
    g = _graph()
    torch.manual_seed(0)
    net = build_model("gat", 6, 4, hidden=3, heads=2, layers=2, batch_norm=False, impl=impl, residual=residual,
                      use_attn_dst=use_attn_dst).eval()
    for conv in net.convs:
        assert (conv.res_fc is not None) == residual
        assert (conv.attn_r is conv.attn_l) == (not use_attn_dst)
        if residual:
            assert isinstance(conv.res_fc, torch.nn.Linear) and conv.res_fc.bias is None
    x = torch.randn(20, 6)
    with torch.no_grad():
        h = _exact_gat_layer(net.convs[0], g, x, 2, 3, residual, use_attn_dst).flatten(1)   # 6 -> 2 x 3 = 6 wide
        expected = _exact_gat_layer(net.convs[1], g, torch.relu(h), 1, 4, residual, use_attn_dst).mean(1)
        torch.testing.assert_close(net(g, x), expected, rtol=1e-5, atol=1e-5)
    # the shared attention vector trains as one parameter
    net.train()
    net(g, x).sum().backward()
    names = [n for n, _ in net.named_parameters()]
    assert any("attn_r" in n for n in names) == use_attn_dst


def test_edge_drop_keeps_a_random_fraction_while_training():
    g = _graph(n=30, e=300)
    torch.manual_seed(0)
    net = build_model("gat", 5, 2, hidden=4, heads=1, layers=2, batch_norm=False, dropout=0.0, edge_drop=0.7)
    seen = []
    for conv in net.convs:
        conv.register_forward_pre_hook(lambda m, args: seen.append(args[0]) and None)
    x = torch.randn(30, 5)
    net.train()(g, x)
    a, b = seen
    assert a is b and a.num_nodes() == 30 and a.num_edges() == g.num_edges() - int(g.num_edges() * 0.7)
    kept = set(zip(*[t.tolist() for t in a.edges()]))
    assert kept <= set(zip(*[t.tolist() for t in g.edges()]))
    seen.clear()
    net.eval()(g, x)
    assert seen[0] is g                                       # evaluation: the whole graph
    with pytest.raises(ValueError, match="edge_drop"):
        build_model("gcn2", 5, 2, edge_drop=0.5)


def _sorted_by_source(g):
    """``g``'s edges renumbered in (source, destination) order: each node's out-edges in edge-id order are
    then also in destination order, the order a CSR built from a CSC has."""
    src, dst = g.edges()
    order = torch.sort(src.long() * g.num_nodes() + dst.long(), stable=True).indices
    return dgl.graph((src[order], dst[order]), num_nodes=g.num_nodes())


def _run_dropped(graph, model, x, **options):
    """Output and gradients (input, parameters) of one training forward with ``edge_drop`` on ``graph``."""
    torch.manual_seed(0)
    net = build_model(model, x.shape[1], 3, hidden=4, layers=2, dropout=0.0, edge_drop=0.6, **options)
    x = x.clone().requires_grad_()
    torch.manual_seed(1)                        # the same edges dropped on both graphs
    out = net.train()(graph, x)
    out.square().sum().backward()
    return out.detach(), [x.grad] + [p.grad for p in net.parameters()]


@pytest.mark.parametrize("model,options", [("gat", {"heads": 2}), ("gcn", {}), ("sage", {})])
@pytest.mark.parametrize("bits", [None, 2])
def test_edge_drop_on_the_training_graph_without_a_coo(model, options, bits):
    """The trainer's full graph holds CSC and CSR only: the dropped graph is built from its CSC (no COO), and
    the model computes what it computed on the COO graph through ``dgl.edge_subgraph``: the forward exactly
    (each node's in-edges in the same order). The CSR the backward reads is created from the dropped CSC, each
    node's out-edges in destination order; on a graph whose edge ids run in that order the gradients are
    equal too (elsewhere they may differ by the rounding of a sum taken in another order)."""
    from dgl_exact.data.compact import TRAINING_FORMATS, compact_graph

    setting = {"bits": bits} if bits else {"enabled": False}
    for g, grads_equal in ((_graph(n=40, e=300), False), (_sorted_by_source(_graph(n=40, e=300)), True)):
        g = g.int()
        trained = compact_graph(g, TRAINING_FORMATS)
        assert "coo" not in trained.formats()["created"] + trained.formats()["not created"]
        x = torch.randn(40, 5, generator=torch.Generator().manual_seed(2))
        with dgl_exact.config(**setting):
            out, grads = _run_dropped(trained, model, x, **options)
            ref_out, ref_grads = _run_dropped(g, model, x, **options)
        assert torch.equal(out, ref_out)
        if grads_equal:  # elsewhere: fp32 sums of the same terms in another order, not compared here
            for a, b in zip(grads, ref_grads):
                assert torch.equal(a, b)


@pytest.mark.parametrize("model", ["gat", "gcn"])
@pytest.mark.parametrize("act_fp", [False, True])
def test_full_graph_training_with_edge_drop(tmp_path, model, act_fp):
    """The trainer's graph (CSC and CSR, no COO) trains with edge_drop, compressed or not."""
    cfg = TrainConfig(dataset=SMALL, model=model, hidden=4, heads=2, epochs=1, device="cpu", edge_drop=0.7,
                      act_fp=act_fp, data_root=str(tmp_path))
    tr = Trainer(cfg, progress=False, log=None)
    assert "coo" not in tr.graph.formats()["created"] + tr.graph.formats()["not created"]
    result = tr.fit()
    assert len(result.runs) == 1 and math.isfinite(result.runs[0].final_loss)


def test_use_labels_inputs_and_loss_rows(tmp_path):
    cfg = TrainConfig(dataset=SMALL, model="gat", hidden=4, heads=2, epochs=1, device="cpu", use_labels=True,
                      mask_rate=0.5, data_root=str(tmp_path))
    tr = Trainer(cfg, progress=False, log=None)
    model, _, _ = tr.build(0)
    assert model.convs[0].fc.in_features == 6 + 3
    torch.manual_seed(3)
    graph, feat, index, labels, *_ = tr._batch_inputs(None)
    train = tr.split["train"]
    shown_rows = (feat[:, 6:].sum(1) > 0).nonzero().flatten()
    assert torch.equal(feat[:, :6], tr.feat)
    assert set(shown_rows.tolist()) | set(index.tolist()) == set(train.tolist())
    assert not set(shown_rows.tolist()) & set(index.tolist())         # loss only on nodes not showing labels
    assert 0.3 < len(shown_rows) / len(train) < 0.7
    assert torch.equal(feat[shown_rows, 6:].argmax(1), tr.label[shown_rows]) and torch.equal(labels, tr.label[index])
    # evaluation shows every training label
    seen = {}
    model.convs[0].register_forward_pre_hook(lambda m, args: seen.update(x=args[1]))
    tr.evaluate(model)
    assert torch.equal(seen["x"][train, 6:].argmax(1), tr.train_label)
    assert seen["x"][:, 6:].sum() == len(train)
    result = tr.fit()
    assert result.runs[0].test >= 0
    with pytest.raises(ValueError, match="use_labels"):
        Trainer(cfg.replace(sampler="cluster"), dataset=tr.dataset, progress=False, log=None)


def test_lr_warmup_follows_exact(tmp_path):
    cfg = TrainConfig(dataset=SMALL, model="gcn", hidden=4, epochs=6, lr=0.01, lr_warmup=4, device="cpu",
                      data_root=str(tmp_path))
    tr = Trainer(cfg, progress=False, log=None)
    seen = []
    orig = tr.train_epoch

    def spy(model, optimizer, scaler, epoch, measure=False):
        seen.append(optimizer.param_groups[0]["lr"])
        return orig(model, optimizer, scaler, epoch, measure=measure)

    tr.train_epoch = spy
    tr.fit()
    assert seen == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01])


@pytest.mark.parametrize("residual", [False, True])
def test_donated_hidden_inputs_are_released_inside_gatconv_and_the_step_is_unchanged(monkeypatch, residual):
    """The trainer's GAT donates each hidden representation to its conv (``dgl_exact.donate``): without a
    residual map it is released once projected and kept compressed, before the attention op allocates its
    output; with a residual map the conv still needs it and keeps it. Outputs and gradients are those of the
    same step where a hook keeps the conv from releasing anything."""
    import weakref

    from dgl_exact import config as compression_scope
    from dgl_exact import ops
    from dgl_exact.compression_config import CompressionConfig
    from dgl_exact.ops import donation
    from dgl_exact.training import models

    g = _graph(60, 400)
    x = torch.randn(60, 5)
    model = build_model("gat", 5, 3, hidden=4, layers=3, dropout=0.5, batch_norm=True, heads=2, residual=residual)
    model.train()
    refs, released_at_op = [], []
    orig_donate, orig_op = models.donate, ops.gat_attention

    def donate(value):
        refs.append(weakref.ref(value))
        return orig_donate(value)

    def op(*args, **kwargs):
        if refs:
            released_at_op.append(type(refs[-1]()) is donation.Released)
        return orig_op(*args, **kwargs)

    monkeypatch.setattr(models, "donate", donate)
    monkeypatch.setattr(ops, "gat_attention", op)

    def step():
        for p in model.parameters():
            p.grad = None
        torch.manual_seed(3)
        with compression_scope(CompressionConfig(bits=2)):
            out = model(g, x)
        out.square().sum().backward()
        return out.detach(), [p.grad.clone() for p in model.parameters()]

    out, grads = step()
    assert len(refs) == 2 and released_at_op == [not residual] * 2  # layer 0 takes the features
    handles = [c.register_forward_pre_hook(lambda m, args: None) for c in model.convs]  # hooks: nothing released
    refs.clear(), released_at_op.clear()
    out_plain, grads_plain = step()
    for h in handles:
        h.remove()
    assert len(refs) == 2 and released_at_op == [False, False]
    assert torch.equal(out, out_plain)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_plain))


def test_full_backward_hook_on_a_gat_layer_sees_and_replaces_gradients_as_in_dgl():
    """A full backward hook on a GATConv of the trainer's GAT model that rescales ``grad_input``: it receives
    the input gradient and its replacement reaches the earlier layers, as with DGL's modules (compression
    off, so the gradients are comparable exactly)."""
    from dgl_exact import config as compression_scope

    g = _graph(40, 200)
    x = torch.randn(40, 5)
    seen = {}

    def run(impl):
        torch.manual_seed(0)
        model = build_model("gat", 5, 3, hidden=4, layers=3, dropout=0.0, batch_norm=False, heads=2, impl=impl)
        model.train()

        def hook(module, grad_input, grad_output):
            seen.setdefault(impl, []).append(grad_input[1] is not None)  # (graph: None, feat)
            return (grad_input[0], grad_input[1] * 3.0)

        model.convs[1].register_full_backward_hook(hook)
        with compression_scope(enabled=False):
            model(g, x).square().sum().backward()
        return {n: p.grad for n, p in model.named_parameters()}

    want, got = run("dgl"), run("exact")
    assert seen["exact"] == seen["dgl"] == [True]
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)
