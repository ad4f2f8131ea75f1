"""Layer-wise mini-batch evaluation (EXACT's products ``mini_inference``): every model type computed one
layer at a time for all nodes, in batches of destination nodes with their full in-neighbourhood, equals
the full-graph evaluation forward; the trainer uses it with ``eval_batch_size``."""
import dgl
import pytest
import torch

import dgl_exact  # noqa: F401  (DGL compatibility shim)
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.models import (
    build_model,
    destination_blocks,
    layerwise_inference,
)
from dgl_exact.training.trainer import Trainer


def _graph(n=57, e=300, seed=0, self_loops=True):
    gen = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    g = dgl.graph((src, dst), num_nodes=n)       # directed, with isolated and zero-in-degree nodes
    return dgl.add_self_loop(dgl.remove_self_loop(g)) if self_loops else g


def _trained_like(model):
    """Non-trivial BatchNorm statistics and affine parameters (evaluation uses the running stats)."""
    gen = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen))
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.randn(m.num_features, generator=gen))
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen))
    return model


CASES = [("gcn", {}), ("sage", {}), ("gat", {"heads": 2}), ("gcn2", {"layers": 4}),
         ("gat", {"heads": 2, "residual": True, "use_attn_dst": False, "edge_drop": 0.5}),
         ("gcn2", {"layers": 3, "shared_weights": False, "residual": True, "identity_mapping": False}),
         ("sage", {"dropout2": True, "input_dropout": 0.3})]


@pytest.mark.parametrize("impl", ["exact", "dgl"])
@pytest.mark.parametrize("model,kw", CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_layerwise_equals_full_graph(model, kw, impl):
    g = _graph(self_loops=model != "sage")
    torch.manual_seed(0)
    x = torch.randn(g.num_nodes(), 7)
    kw = {"layers": 3, **kw}
    net = _trained_like(build_model(model, 7, 5, hidden=8, batch_norm=True, impl=impl, **kw)).eval()
    full = net(g, x)
    for batch_size in (10, 57):
        got = layerwise_inference(net, g, x, batch_size)
        torch.testing.assert_close(got, full, rtol=1e-5, atol=1e-5)
    assert not net.training


def test_blocks_hold_every_in_edge():
    g = _graph(self_loops=False)
    blocks = destination_blocks(g, 8)
    assert len(blocks) == 8 and sum(b.num_dst_nodes() for b in blocks) == g.num_nodes()
    assert sum(b.num_edges() for b in blocks) == g.num_edges()
    for b in blocks:
        assert torch.equal(b.in_degrees(), g.in_degrees(b.dstdata[dgl.NID]))


def test_trainer_eval_batch_size_matches_full_graph_evaluation():
    conf = {"dataset": "synthetic-small:num_nodes=300,num_features=8,num_classes=3", "model": "gcn", "hidden": 8,
                "layers": 2, "batch_norm": True, "epochs": 2, "device": "cpu"}
    full = Trainer(TrainConfig(**conf), progress=False, log=None)
    model, _, _ = full.build(0)
    batched = Trainer(TrainConfig(**conf, eval_batch_size=64), dataset=full.dataset, progress=False, log=None)
    a, b = full.evaluate(model), batched.evaluate(model)
    assert a == pytest.approx(b) and model.training


def test_eval_batch_size_is_checked():
    with pytest.raises(ValueError, match="eval-batch-size"):
        TrainConfig(eval_batch_size=0)
