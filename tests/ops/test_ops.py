"""Properties every op shares: nothing kept and nothing compressed in ``torch.no_grad()`` or for modules in
``eval()``. Each op's own tests are in ``tests/ops/test_<module>.py`` (graph, gat, dense, elementwise, loss, ...)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact import ops
from tests.ops._helpers import INT2, compress_calls, hidden, saved_tensors

pytestmark = pytest.mark.usefixtures("one_thread")


# ---------------------------------------------------------------------------------------------------
# no_grad / eval: nothing kept, nothing compressed
# ---------------------------------------------------------------------------------------------------
def _all_ops(g, x, e_vals, cfg):
    n = g.num_nodes()
    w = torch.randn(4, x.shape[1])
    fs = x[:, :4].reshape(n, 2, 2)
    return [
        ops.copy_u_sum(g, x), ops.copy_u_mean(g, x), ops.copy_u_max(g, x), ops.copy_u_min(g, x),
        ops.u_mul_e_sum(g, x, e_vals, config=cfg), ops.u_add_v(g, x, x), ops.edge_softmax(g, e_vals, config=cfg),
        ops.gat_attention(g, fs, fs, torch.randn(1, 2, 2), torch.randn(1, 2, 2), 0.2, 0.5, e_vals, True, cfg)[0],
        ops.linear(x, w, None, cfg), ops.batch_norm(x, torch.zeros(x.shape[1]), torch.ones(x.shape[1]),
                                                     training=True, config=cfg),
        ops.relu(x), ops.leaky_relu(x), ops.elu(x, 1.0, cfg), ops.dropout(x, 0.3), ops.relu_dropout(x, 0.3),
        ops.cross_entropy(x, torch.zeros(n, dtype=torch.long)),
        ops.binary_cross_entropy_with_logits(x, torch.zeros_like(x)),
    ]


def test_no_grad_keeps_and_compresses_nothing(graphs, kernel_path, monkeypatch):
    g = graphs["graph"]
    x = hidden(torch.randn(g.num_nodes(), 6, requires_grad=True))
    e_vals = hidden(torch.rand(g.num_edges(), requires_grad=True))
    with compress_calls(monkeypatch) as made, saved_tensors() as kept, torch.no_grad():
        outs = _all_ops(g, x, e_vals, INT2)
    assert kept == [] and made == []
    assert all(o.grad_fn is None for o in outs)


def test_eval_modules_compress_nothing(graphs, kernel_path, monkeypatch):
    g = graphs["graph"]
    mods = [dgl_exact.GraphConv(6, 9, activation=F.elu), dgl_exact.SAGEConv(6, 9, "pool"),
            dgl_exact.GATConv(6, 3, 2), dgl_exact.GCN2Conv(6, 1), dgl_exact.nn.Linear(6, 4),
            dgl_exact.nn.BatchNorm1d(6), dgl_exact.nn.ELU()]

    def run():
        h = hidden(torch.randn(g.num_nodes(), 6, requires_grad=True))
        return [mods[0](g, h), mods[1](g, h), mods[2](g, h), mods[3](g, h, h)] + [m(h) for m in mods[4:]]

    with dgl_exact.config(bits=2, kept_frac=0.5):
        for m in mods:
            m.eval()
        with compress_calls(monkeypatch) as made:
            outs = run()
        assert made == []
        assert all(o.grad_fn is not None for o in outs)  # still differentiable, just not compressed
        with compress_calls(monkeypatch) as made, saved_tensors() as kept, torch.no_grad():
            run()
        assert made == [] and kept == []
        for m in mods:
            m.train()
        with compress_calls(monkeypatch) as made:
            run()
        assert made and all(c.bits == 2 for c in made)
