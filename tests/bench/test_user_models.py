"""The pre-LayerNorm residual block models of ``bench/user_models.py`` (``user-block-gcn``, ``-sage``,
``-gat``): built for DGL and for dgl_exact, they compute the same outputs and gradients with compression
off, ``compress_model`` converts their LayerNorm, GELU, Linear and convolution layers, and the benchmark
workload gives them their own hidden size and block count unless told otherwise."""
import copy

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact.bench.user_models import ARXIV_MODELS, BLOCK_MODELS, USER_MODELS, build_user_model

import dgl  # noqa: E402  (after dgl_exact)

N, FEATS, HIDDEN, BLOCKS, CLASSES = 40, 8, 16, 2, 3


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    g = dgl.add_self_loop(dgl.remove_self_loop(dgl.rand_graph(N, 4 * N)))
    return g, torch.randn(N, FEATS), torch.randint(0, CLASSES, (N,))


def _step(model, g, x, y):
    out = model(g, x)
    F.cross_entropy(out, y).backward()
    return out.detach(), {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("name", BLOCK_MODELS)
def test_block_model_matches_dgl_with_compression_off(graph, name):
    g, x, y = graph
    assert name in USER_MODELS
    torch.manual_seed(0)
    ref = build_user_model(name, FEATS, HIDDEN, CLASSES, BLOCKS, 0.5, True, impl="dgl")
    assert len(ref.blocks) == BLOCKS and ref.inp.out_features == HIDDEN
    exact, report = dgl_exact.compress_model(copy.deepcopy(ref), dgl_exact.CompressionConfig(enabled=False),
                                             report=True)
    converted = " ".join(report.converted.values())
    for layer in ("LayerNorm", "GELU", "Linear", "Dropout"):
        assert f"torch.{layer} -> dgl_exact." in converted, (layer, converted)
    conv = {"user-block-sage": "dgl.SAGEConv", "user-block-gat": "dgl.GATConv"}.get(name)
    if conv:
        assert sum(v.startswith(conv + " ->") for v in report.converted.values()) == BLOCKS, converted
    assert isinstance(exact.blocks[0].norm, dgl_exact.nn.LayerNorm)
    ref.eval()
    exact.eval()  # dropout off: the same function
    out_ref, grads_ref = _step(ref, g, x, y)
    out_exact, grads_exact = _step(exact, g, x, y)
    torch.testing.assert_close(out_exact, out_ref, rtol=1e-5, atol=1e-5)
    assert grads_exact.keys() == grads_ref.keys()
    for k in grads_ref:
        torch.testing.assert_close(grads_exact[k], grads_ref[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.parametrize("name", BLOCK_MODELS)
def test_block_model_trains_at_int2(graph, name):
    g, x, y = graph
    model = build_user_model(name, FEATS, HIDDEN, CLASSES, BLOCKS, 0.5, True, impl="exact")
    assert isinstance(model.blocks[0].norm, dgl_exact.nn.LayerNorm)
    model.train()
    with dgl_exact.config(bits=2):
        out, grads = _step(model, g, x, y)
    assert out.shape == (N, CLASSES) and torch.isfinite(out).all()
    assert all(torch.isfinite(v).all() for v in grads.values())


def test_workload_defaults_for_block_models():
    from dgl_exact.bench.runner import Workload
    from dgl_exact.data import load_dataset

    ds = load_dataset("synthetic-small:num_nodes=50,num_features=8,num_classes=3", quiet=True)
    work = Workload(ds, "cpu")
    assert (work.hidden_for("user-block-gat"), work.layers_for("user-block-gat")) == (512, 5)
    assert (work.hidden_for("sage"), work.layers_for("sage")) == (128, 3)
    work = Workload(ds, "cpu", hidden=16, layers=2)
    assert (work.hidden_for("user-block-gcn"), work.layers_for("user-block-gcn")) == (16, 2)
    model = work.build("user-block-gcn", "exact")
    assert len(model.blocks) == 2 and model.inp.out_features == 16


def test_bench_command_accepts_block_models(tmp_path):
    from dgl_exact.cli._common import UserError
    from dgl_exact.cli.bench import _bench_setup

    work, models, _ = _bench_setup("synthetic-small:num_nodes=50,num_features=8,num_classes=3", ",".join(BLOCK_MODELS),
                                   "DGL fp32,INT2", None, None, "cpu", str(tmp_path), quiet=True)
    assert models == list(BLOCK_MODELS) and work.layers_for(models[0]) == 5 and work.layers_for("gcn") == 3
    with pytest.raises(UserError, match="user-block-gcn"):
        _bench_setup("synthetic-small:num_nodes=50", "user-block-mlp", "INT2", None, None, "cpu", str(tmp_path))


@pytest.mark.parametrize("name", ARXIV_MODELS)
def test_arxiv_style_model_matches_dgl_with_compression_off(graph, name):
    """The models written as DGL's ogbn-arxiv example writes them (and the user GCNII loop): converted with
    compression off and in eval mode, the same outputs and gradients as DGL's; the layers are converted."""
    g, x, y = graph
    assert name in USER_MODELS
    torch.manual_seed(0)
    ref = build_user_model(name, FEATS, HIDDEN, CLASSES, BLOCKS, 0.5, True, impl="dgl")
    exact, report = dgl_exact.compress_model(copy.deepcopy(ref), dgl_exact.CompressionConfig(enabled=False),
                                             report=True)
    converted = " ".join(report.converted.values())
    expect = {"arxiv-gcn-user": ("dgl.GraphConv", "torch.Linear", "torch.BatchNorm1d", "torch.Dropout"),
              "arxiv-gat-user": ("torch.Linear", "torch.BatchNorm1d", "torch.Dropout", "torch.LeakyReLU"),
              "user-gcn2": ("dgl.GCN2Conv", "torch.Linear"),
              "user-gcn2-donate": ("dgl.GCN2Conv", "torch.Linear")}[name]
    for layer in expect:
        assert f"{layer} ->" in converted, (layer, converted)
    ref.eval()
    exact.eval()
    out_ref, grads_ref = _step(ref, g, x, y)
    out_exact, grads_exact = _step(exact, g, x, y)
    torch.testing.assert_close(out_exact, out_ref, rtol=1e-5, atol=1e-5)
    assert grads_exact.keys() == grads_ref.keys()
    for k in grads_ref:
        torch.testing.assert_close(grads_exact[k], grads_ref[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.parametrize("name", ARXIV_MODELS)
def test_arxiv_style_model_trains_at_int2(graph, name):
    g, x, y = graph
    torch.manual_seed(0)
    model = dgl_exact.compress_model(build_user_model(name, FEATS, HIDDEN, CLASSES, BLOCKS, 0.5, True, impl="dgl"),
                                     dgl_exact.CompressionConfig(bits=2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = F.cross_entropy(model(g, x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert losses[-1] < losses[0]


def test_ops_gat_block_model_is_dgls_after_the_import_swap(graph):
    """``user-block-gat-ops`` (attention written with ``dgl.ops``, heads last) converted as such code is (``from
    dgl_exact import ops``, then ``compress_model``): with compression off and in eval mode, DGL's outputs and
    gradients; at INT2 it trains (finite gradients)."""
    g, x, y = graph
    torch.manual_seed(0)
    ref = build_user_model("user-block-gat-ops", FEATS, HIDDEN, CLASSES, BLOCKS, 0.5, True, impl="dgl")
    torch.manual_seed(0)
    exact = build_user_model("user-block-gat-ops", FEATS, HIDDEN, CLASSES, BLOCKS, 0.5, True, impl="exact")
    assert isinstance(exact.blocks[0].norm, dgl_exact.nn.LayerNorm) and exact.blocks[0].agg.exact_ops
    ref.eval()
    exact.eval()
    out_ref, grads_ref = _step(ref, g, x, y)
    with dgl_exact.config(enabled=False):
        out_exact, grads_exact = _step(exact, g, x, y)
    torch.testing.assert_close(out_exact, out_ref, rtol=1e-5, atol=1e-5)
    for k in grads_ref:
        torch.testing.assert_close(grads_exact[k], grads_ref[k], rtol=1e-4, atol=1e-5, msg=k)
    exact.train()
    with dgl_exact.config(bits=2):
        out, grads = _step(exact, g, x, y)
    assert torch.isfinite(out).all() and all(torch.isfinite(v).all() for v in grads.values())
