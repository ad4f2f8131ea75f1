"""EXACT's script options beyond its confs: ``--dropout2`` (non-inverted dropout in every dropout of a model),
``--inductive`` (train on the subgraph induced by the training nodes, evaluate on the full graph), and
GCNII's initial representation ``h0`` reused undropped by every layer (the GCNII paper's code and EXACT)."""
import dgl
import pytest
import torch
from click.testing import CliRunner

import dgl_exact  # noqa: F401  (DGL compatibility shim)
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.models import build_model
from dgl_exact.training.trainer import Trainer

SMALL = "synthetic-small:num_nodes=240,num_features=6,num_classes=3"


def _graph(n=40, e=160, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = dgl.graph((torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)), num_nodes=n)
    return dgl.add_self_loop(dgl.remove_self_loop(g))


# ------------------------------------------------------------------------------------------------
# dropout2
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["exact", "dgl"])
def test_dropout2_gcnii_eval_scales_every_dropout(impl):
    g, p = _graph(), 0.4
    x = torch.randn(g.num_nodes(), 5)
    torch.manual_seed(0)
    net = build_model("gcn2", 5, 3, hidden=6, layers=2, dropout=p, batch_norm=False, impl=impl,
                      dropout2=True).eval()
    h, h0 = net._input(x)
    torch.testing.assert_close(h0, torch.relu(net.lin_in(x * (1 - p))))   # input dropout: x (1 - p)
    torch.testing.assert_close(h, h0 * (1 - p))                          # first layer's input dropout
    out = net.convs[0](g, h, h0)
    torch.testing.assert_close(net._after_conv(0, out, h), torch.relu(out) * (1 - p))


def test_dropout2_eval_scales_by_keep_probability():
    g, p = _graph(), 0.25
    x = torch.randn(g.num_nodes(), 5)
    torch.manual_seed(0)
    net = build_model("gcn", 5, 3, hidden=6, layers=2, dropout=p, batch_norm=False, input_dropout=0.5,
                      dropout2=True).eval()
    h = net.convs[0](g, x * 0.5)                     # input dropout in eval: x (1 - 0.5)
    expected = net.convs[1](g, torch.relu(h) * (1 - p))
    torch.testing.assert_close(net(g, x), expected)


def test_dropout2_training_keeps_values_unscaled():
    torch.manual_seed(0)
    net = build_model("gcn", 4, 2, hidden=512, layers=2, dropout=0.5, batch_norm=False, dropout2=True)
    g = _graph(n=30)
    x = torch.randn(30, 4)
    seen = {}
    net.convs[1].register_forward_pre_hook(lambda m, args: seen.update(h=args[1]) if "h" not in seen else None)
    net.train()(g, x)
    relu = torch.relu(net.convs[0](g, x))
    h = seen["h"]
    kept = h != 0
    assert 0.4 < kept[relu > 0].float().mean() < 0.6            # half of the positive values dropped
    torch.testing.assert_close(h[kept], relu[kept])              # not scaled by 1 / (1 - p)


# ------------------------------------------------------------------------------------------------
# GCNII: h0 undropped
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", ["exact", "dgl"])
def test_gcnii_reuses_undropped_h0(impl):
    g = _graph()
    x = torch.randn(g.num_nodes(), 5)
    torch.manual_seed(0)
    net = build_model("gcn2", 5, 3, hidden=16, layers=3, dropout=0.5, batch_norm=False, impl=impl).train()
    seen = {}
    net.lin_in.register_forward_hook(lambda m, args, out: seen.update(lin=out.detach()))
    for i, conv in enumerate(net.convs):
        conv.register_forward_pre_hook(lambda m, args, i=i: seen.update({i: (args[1].detach(), args[2].detach())}))
    net(g, x)
    h0 = torch.relu(seen["lin"])
    for i in range(3):
        torch.testing.assert_close(seen[i][1], h0)               # every layer's initial term: relu(lin_in), undropped
    first = seen[0][0]                                           # the first layer's input is dropped
    kept = first != 0
    assert (h0[~kept] != 0).any()
    torch.testing.assert_close(first[kept], h0[kept] * 2)


# ------------------------------------------------------------------------------------------------
# inductive
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", ["full", "saint", "cluster"])
def test_inductive_trains_on_the_training_subgraph(sampler, tmp_path):
    kw = {"dataset": SMALL, "model": "sage", "sampler": sampler, "hidden": 8, "epochs": 2, "device": "cpu",
              "data_root": str(tmp_path), "saint_budget": 40, "num_parts": 8, "parts_per_batch": 2,
              "sample_coverage": 0}
    trainer = Trainer(TrainConfig(**kw, inductive=True), progress=False, log=None)
    g, train = trainer.graph, trainer.split["train"]
    sub = trainer.train_graph
    assert sub.num_nodes() == train.numel() < g.num_nodes()
    ref = dgl.node_subgraph(g, train.to(g.idtype))  # the trainer's graph has int32 ids
    assert torch.equal(torch.stack(sub.edges()), torch.stack(ref.edges()))
    assert torch.equal(sub.ndata["feat"], g.ndata["feat"][train])
    assert torch.equal(sub.ndata["label"], trainer.train_label) and bool(sub.ndata["train_mask"].all())
    assert torch.equal(sub.ndata["_deg_in"], sub.in_degrees().float())
    seen = set()
    if trainer.sampler is None:
        graph, feat, index, _labels, *_ = trainer._batch_inputs(None)
        assert graph is sub and torch.equal(index, torch.arange(train.numel())) and feat.shape[0] == train.numel()
    else:
        assert trainer.sampler.g.num_nodes() == train.numel() if hasattr(trainer.sampler, "g") else True
        for batch in trainer.sampler.iter_epoch(0):
            seen.update(batch.graph.ndata[dgl.NID].tolist() if dgl.NID in batch.graph.ndata else [])
            assert batch.graph.num_nodes() <= train.numel()
        assert seen <= set(range(train.numel()))
    result = trainer.fit()
    assert 0.0 <= result.runs[0].test <= 1.0
    # evaluation runs on the full graph: every split scored
    model, _, _ = trainer.build(0)
    assert set(trainer.evaluate(model)) == {"train", "val", "test"}


def test_transductive_default_and_inductive_differ(tmp_path):
    kw = {"dataset": SMALL, "model": "gcn", "hidden": 8, "epochs": 3, "device": "cpu", "data_root": str(tmp_path)}
    a = Trainer(TrainConfig(**kw), progress=False, log=None)
    b = Trainer(TrainConfig(**kw, inductive=True), dataset=a.dataset, progress=False, log=None)
    assert a.train_graph is a.graph and b.train_graph.num_nodes() < b.graph.num_nodes()
    la = a.fit().runs[0].final_loss
    lb = b.fit().runs[0].final_loss
    assert la != lb


def test_cli_flags_reach_the_config(tmp_path):
    import json

    from dgl_exact.cli import cli

    out = tmp_path / "r.json"
    r = CliRunner().invoke(cli, ["train", "--dataset", SMALL, "--dropout2", "--inductive", "--eval-batch-size", "128",
                                 "--data-root", str(tmp_path), "-q", "--epochs", "1", "--hidden", "4", "--json",
                                 str(out)])
    assert r.exit_code == 0, r.output
    cfg = json.loads(out.read_text())["config"]
    assert cfg["dropout2"] is True and cfg["inductive"] is True and cfg["eval_batch_size"] == 128
    assert not TrainConfig().dropout2 and not TrainConfig().inductive and TrainConfig().eval_batch_size is None
