"""``ops.sage_mean_bn_relu_dropout`` (a first SAGE-mean layer with its batch norm, ReLU and dropout as one op)
and the project model's use of it: with every kept tensor exact it computes what DGL's SAGEConv, torch's
BatchNorm1d and ReLU compute (output, every gradient, running statistics); with dropout and INT2 it equals
dgl_exact's composed ops drawn from the same seeds; it holds one ``[N_dst, D]`` buffer at the forward's and
the backward's peak where the composed ops hold two; and everywhere it does not compute the same the
modules run."""
import copy

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact.ops import keep as keeping
from dgl_exact.ops import chunks as chunking
from dgl_exact.training.models import StackedGNN

dgl = pytest.importorskip("dgl")


def _blocks(n=400, seeds=37, fanouts=(6, 4), seed=0):
    torch.manual_seed(seed)
    dgl.seed(seed)  # before rand_graph: it draws from DGL's own generator, not torch's
    g = dgl.rand_graph(n, 8 * n)
    _, _, blocks = dgl.dataloading.NeighborSampler(list(fanouts)).sample_blocks(g, torch.arange(seeds))
    return g, blocks


@pytest.fixture(params=[False, True], ids=["whole", "chunked"])
def chunks(request, monkeypatch):
    if request.param:  # row chunks of a few rows: chunks cross the mask's bytes and the codes' blocks
        monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", 8 * 9)


def _exact_kept():
    return keeping.keep_hook(lambda x, cfg, force: x.clone() if force else x)


@pytest.mark.parametrize("d_in,d_out", [(7, 7), (5, 9), (3, 20)])
@pytest.mark.parametrize("on_block", [True, False], ids=["block", "graph"])
@pytest.mark.parametrize("affine,bias", [(True, True), (False, False)])
def test_exact_kept_equals_dgl_and_torch(d_in, d_out, on_block, affine, bias, chunks):
    g, blocks = _blocks()
    graph = blocks[0] if on_block else g
    torch.manual_seed(2)
    ref = dgl.nn.SAGEConv(d_in, d_out, "mean", bias=bias)
    bn_ref = torch.nn.BatchNorm1d(d_out, affine=affine)
    if affine:
        torch.nn.init.uniform_(bn_ref.weight, 0.5, 1.5)
        torch.nn.init.uniform_(bn_ref.bias, -0.5, 0.5)
    cfg = dgl_exact.CompressionConfig(bits=2)
    conv = dgl_exact.SAGEConv(d_in, d_out, "mean", bias=bias, compression=cfg)
    conv.load_state_dict(ref.state_dict())
    bn = dgl_exact.nn.BatchNorm1d(d_out, affine=affine, compression=cfg)
    bn.load_state_dict(bn_ref.state_dict())
    x = torch.randn(graph.num_src_nodes(), d_in)
    gout = torch.randn(graph.num_dst_nodes(), d_out)

    want = F.relu(bn_ref(ref(graph, x)))
    want.backward(gout)
    with _exact_kept():
        got = conv.forward_bn_relu_dropout(graph, x, bn, 0.0)
    assert got is not None
    got.backward(gout)
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(list(conv.named_parameters()) + list(bn.named_parameters()),
                            list(ref.parameters()) + list(bn_ref.parameters())):
        # the conv's bias gradient is zero under batch norm up to rounding: an absolute tolerance
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4 if name == "fc_self.bias" else 1e-5,
                                   msg=name)
    for name, b in bn.named_buffers():
        torch.testing.assert_close(b, dict(bn_ref.named_buffers())[name], rtol=1e-5, atol=1e-6, msg=name)


def _model_pair(in_feats=12, hidden=24, p=0.4):
    torch.manual_seed(3)
    fused = StackedGNN("sage", in_feats, hidden, 5, layers=3, dropout=p)
    composed = copy.deepcopy(fused)
    composed.norms[0].register_forward_hook(lambda *a: None)  # a hook sees the module's call: composed path
    return fused, composed


def _step(model, graph, x, y, **cfg):
    torch.manual_seed(11)  # the same compression and dropout draws for both models
    with dgl_exact.config(**cfg):
        out = model(graph, x)
        F.cross_entropy(out, y).backward()
    return out.detach()


@pytest.mark.parametrize("cfg", [dict(bits=2), dict(bits=4, block_rows=5, levels="optimal"),
                                 dict(bits=2, kept_frac=0.5, block_rows=16), dict(bits=1, block_rows=3)],
                         ids=["int2", "int4-blocks-optimal", "int2-rp-blocks", "int1"])
@pytest.mark.parametrize("on_blocks", [True, False], ids=["blocks", "graph"])
def test_model_equals_its_composed_modules(cfg, on_blocks, chunks):
    """The same forward, running statistics and gradients as the modules' own calls under the same seeds
    (the same kept items: the op draws its random numbers in the composed ops' order)."""
    g, blocks = _blocks(fanouts=(6, 4, 3))
    x = torch.randn(g.num_nodes(), 12)
    y = torch.randint(0, 5, (g.num_nodes(),))
    if on_blocks:
        graph, x, y = blocks, x[blocks[0].srcdata[dgl.NID]], y[blocks[-1].dstdata[dgl.NID]]
    else:
        graph = g
    fused, composed = _model_pair()
    paths = dgl_exact.explain(copy.deepcopy(fused), graph, x)
    assert "one op" in paths.path("convs.0"), paths
    assert "one op" not in dgl_exact.explain(copy.deepcopy(composed), graph, x).path("convs.0")
    out_f, out_c = _step(fused, graph, x, y, **cfg), _step(composed, graph, x, y, **cfg)
    torch.testing.assert_close(out_f, out_c, rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(fused.named_parameters(), composed.parameters()):
        scale = q.grad.norm().item() + 1e-3
        assert (p.grad - q.grad).norm().item() <= 1e-3 * scale, name
    for (name, b), c in zip(fused.named_buffers(), composed.buffers()):
        torch.testing.assert_close(b, c, rtol=1e-5, atol=1e-5, msg=name)


def _reason(model, graph, x):
    return dgl_exact.explain(model, graph, x)


@pytest.mark.parametrize("change", ["hook", "eval", "dropout2", "input grad", "narrowing", "feat_drop", "subclass",
                                    "compression off"])
def test_the_modules_run_where_the_op_would_not_compute_the_same(change, monkeypatch):
    g, blocks = _blocks()
    x = torch.randn(blocks[0].num_src_nodes(), 12)
    torch.manual_seed(3)
    kwargs = dict(dropout2=True) if change == "dropout2" else {}
    model = StackedGNN("sage", 12, 24 if change != "narrowing" else 8, 5, layers=2, **kwargs)
    calls = []
    real = dgl_exact.ops.sage_norm._SAGEMeanBNReLUDropout.apply
    monkeypatch.setattr(dgl_exact.ops.sage_norm._SAGEMeanBNReLUDropout, "apply",
                        lambda *a: calls.append(1) or real(*a))
    if change == "hook":
        model.convs[0].fc_self.register_forward_pre_hook(lambda *a: None)
    elif change == "eval":
        model.eval()
    elif change == "input grad":
        x.requires_grad_(True)
    elif change == "feat_drop":
        model.convs[0].feat_drop = torch.nn.Dropout(0.3)
    elif change == "subclass":
        class Mine(dgl_exact.nn.BatchNorm1d):
            def forward(self, x):
                return super().forward(x) * 2.0
        mine = Mine(24)
        mine.load_state_dict(model.norms[0].state_dict())
        model.norms[0] = mine
    cfg = dict(enabled=False) if change == "compression off" else dict(bits=2)
    with dgl_exact.config(**cfg):
        out = model(blocks, x)
    assert calls == [], change
    out.sum().backward() if out.requires_grad else None


def test_peaks_hold_one_layer_sized_buffer(monkeypatch):
    """At the first layer the forward holds one ``[N_dst, D]`` fp32 buffer (the output) and the backward none
    beyond the output and its incoming gradient (row chunks of a sixteenth); the composed modules hold two
    in the forward and two more in the backward."""
    from tests._op_census import Census

    g, blocks = _blocks(n=6000, seeds=2000, fanouts=(3,))
    block, d = blocks[0], 128
    big = block.num_dst_nodes() * d * 4
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", big // 4 // 16)
    x = torch.randn(block.num_src_nodes(), 8)
    cfg = dgl_exact.CompressionConfig(bits=2)
    torch.manual_seed(0)
    conv = dgl_exact.SAGEConv(8, d, "mean", compression=cfg)
    bn = dgl_exact.nn.BatchNorm1d(d, compression=cfg)

    def peaks(fused):
        census = Census(min_bytes=big // 4)
        with census:
            census.phase = "forward"
            out = (conv.forward_bn_relu_dropout(block, x, bn, 0.3) if fused
                   else dgl_exact.ops.relu_dropout(bn(conv(block, x)), 0.3))
            census.phase = "between"
            gout = torch.randn_like(out)
            census.phase = "backward"
            torch.autograd.grad(out, list(conv.parameters()) + list(bn.parameters()), gout)
        return census.best["forward"] / big, census.best["backward"] / big

    fwd, bwd = peaks(True)
    assert fwd <= 1.2 and bwd <= 2.2, (fwd, bwd)
    fwd, bwd = peaks(False)
    assert fwd >= 2 and bwd >= 3.9, (fwd, bwd)


def test_double_backward_raises():
    _, blocks = _blocks()
    torch.manual_seed(0)
    conv = dgl_exact.SAGEConv(6, 8, "mean", compression=dgl_exact.CompressionConfig(bits=8))
    bn = dgl_exact.nn.BatchNorm1d(8, compression=dgl_exact.CompressionConfig(bits=8))
    out = conv.forward_bn_relu_dropout(blocks[0], torch.randn(blocks[0].num_src_nodes(), 6), bn, 0.0)
    with pytest.raises(RuntimeError, match="double backward"):  # as sage_mean: refused at create_graph
        torch.autograd.grad(out.square().sum(), [conv.fc_self.weight], create_graph=True)


def test_the_op_refuses_what_it_does_not_cover():
    _, blocks = _blocks()
    b = blocks[0]
    x = torch.randn(b.num_src_nodes(), 6)
    w6, w4 = torch.randn(6, 6), torch.randn(4, 6)
    with pytest.raises(ValueError, match="without gradient"):
        dgl_exact.ops.sage_mean_bn_relu_dropout(b, x.requires_grad_(), w6, None, w6, None, None, None, None)
    with pytest.raises(ValueError, match="D_out >= D_in"):
        dgl_exact.ops.sage_mean_bn_relu_dropout(b, x.detach(), w4, None, w4, None, None, None, None)
    with pytest.raises(ValueError, match="compression must be on"):
        dgl_exact.ops.sage_mean_bn_relu_dropout(b, x.detach(), w6, None, w6, None, None, None, None,
                                                config=dgl_exact.CompressionConfig(enabled=False))


@pytest.mark.parametrize("on_blocks", [True, False], ids=["blocks", "graph"])
def test_model_peaks_not_above_the_composed_modules(on_blocks, monkeypatch):
    """The project model with the op: neither the forward's nor the backward's peak above the modules' own
    calls (the first layer's output goes once the next conv has kept it, as the composed path's does)."""
    from tests._op_census import Census

    g, blocks = _blocks(n=3000, seeds=1500, fanouts=(4, 3, 2))
    x = torch.randn(g.num_nodes(), 16)
    y = torch.randint(0, 5, (g.num_nodes(),))
    graph = blocks if on_blocks else g
    if on_blocks:
        x, y = x[blocks[0].srcdata[dgl.NID]], y[blocks[-1].dstdata[dgl.NID]]
    rows = blocks[0].num_dst_nodes() if on_blocks else g.num_nodes()
    big = rows * 64 * 4
    monkeypatch.setattr(chunking, "CHUNK_ELEMENTS", big // 4 // 8)
    fused, composed = _model_pair(in_feats=16, hidden=64)

    def peaks(model):
        census = Census(min_bytes=big // 8)
        torch.manual_seed(11)
        with dgl_exact.config(bits=2), census:
            census.phase = "forward"
            loss = F.cross_entropy(model(graph, x), y)
            census.phase = "backward"
            loss.backward()
        return census.best["forward"] / big, census.best["backward"] / big

    (ff, fb), (cf, cb) = peaks(fused), peaks(composed)
    assert ff <= cf + 0.05 and fb <= cb + 0.05, ((ff, fb), (cf, cb))
