"""EXACT's GCNII options (shared_weights, residual, beta = 1) against a dense, hand-written reference of
EXACT's GCN2 forward (PyG's GCN2Conv on a normalised adjacency), and their way from a config to the model."""
import math

import pytest
import torch

from dgl_exact._compat import import_dgl
from dgl_exact.training.models import build_model

dgl = import_dgl()


def _graph(n=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(n, n, generator=g) < 0.3).float()
    a = ((a + a.t()) > 0).float()
    a.fill_diagonal_(1.0)                                   # symmetric, with self loops (EXACT: loop: true)
    src, dst = a.nonzero(as_tuple=True)
    return dgl.graph((src, dst), num_nodes=n), a


def _reference(model, a, x, alpha, shared, residual, beta_one, lambda_=0.5):
    """EXACT's GCN2.forward in eval mode, written out densely: P = D^-1/2 A D^-1/2; per layer
    s = (1 - alpha) P h, s0 = alpha h0; shared: t = s + s0, out = (1 - b) t + b t W1; separate weights:
    out = (1 - b) s + b s W1 + (1 - b) s0 + b s0 W2; then BatchNorm, + h (residual), ReLU."""
    d = a.sum(1).pow(-0.5)
    p = d[:, None] * a * d[None, :]
    h = h0 = torch.relu(model.lin_in(x))
    for i, conv in enumerate(model.convs):
        b = 1.0 if beta_one else math.log(lambda_ / (i + 1) + 1)
        s, s0 = (1 - alpha) * (p @ h), alpha * h0
        if shared:
            t = s + s0
            out = (1 - b) * t + b * t @ conv.weight1
        else:
            out = (1 - b) * s + b * s @ conv.weight1 + (1 - b) * s0 + b * s0 @ conv.weight2
        if conv.bias is not None:
            out = out + conv.bias
        out = model.norms[i](out)
        if residual:
            out = out + h
        h = torch.relu(out)
    return model.lin_out(h)


@pytest.mark.parametrize("impl", ["exact", "dgl"])
@pytest.mark.parametrize("shared,residual,beta_one", [(True, False, False), (False, False, False),
                                                      (False, True, True), (True, True, False)])
def test_gcnii_options_match_exact_math(impl, shared, residual, beta_one):
    g, a = _graph()
    x = torch.randn(12, 6, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = build_model("gcn2", 6, 3, hidden=8, layers=3, dropout=0.5, batch_norm=True, alpha=0.2, lambda_=0.5,
                        impl=impl, shared_weights=shared, residual=residual, identity_mapping=not beta_one)
    for bn in model.norms:      # non-trivial BatchNorm statistics
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    model.eval()
    with torch.no_grad():
        got = model(g, x)
        ref = _reference(model, a, x, 0.2, shared, residual, beta_one)
    assert torch.allclose(got, ref, atol=1e-5), (got - ref).abs().max()
    n_w2 = sum(1 for name, _ in model.named_parameters() if name.endswith("weight2"))
    assert n_w2 == (0 if shared else 3)


def test_gcnii_options_are_refused_by_other_models():
    with pytest.raises(ValueError, match="GCNII"):
        build_model("sage", 4, 2, residual=True)


def test_config_reaches_the_model():
    from dgl_exact.training.config import TrainConfig, load_conf
    from dgl_exact.training.trainer import Trainer

    conf = {**load_conf("arxiv_gcn2"), "dataset": "synthetic-small", "layers": 2, "hidden": 8, "epochs": 1,
            "device": "cpu", "grad_norm": 0.5}
    trainer = Trainer(TrainConfig(**conf), progress=False, log=lambda *a, **k: None)
    model = trainer.build(0)[0]
    assert model.residual and all(c.beta == 1.0 for c in model.convs)
    assert all(c.weight2 is not None for c in model.convs)


def test_exact_log_loss_formula_and_trainer():
    from dgl_exact.training.config import TrainConfig
    from dgl_exact.training.models import exact_log_loss
    from dgl_exact.training.trainer import Trainer

    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0], [-3.0, 4.0, 1.0]], requires_grad=True)
    target = torch.tensor([0, 2, 0])
    eps = 1 - math.log(2)
    ce = [-(2 - math.log(math.exp(2) + 1 + math.exp(-1))), math.log(3), -(-3 - math.log(math.exp(-3) + math.exp(4)
                                                                                        + math.exp(1)))]
    expected = sum(math.log(eps + c) - math.log(eps) for c in ce) / 3          # hand-computed CE per row
    assert exact_log_loss(logits, target).item() == pytest.approx(expected, rel=1e-6)
    idx = torch.tensor([2, 0])
    w = torch.tensor([0.25, 2.0])
    assert exact_log_loss(logits, target[[2, 0]], idx, w).item() == pytest.approx(
        0.25 * (math.log(eps + ce[2]) - math.log(eps)) + 2.0 * (math.log(eps + ce[0]) - math.log(eps)), rel=1e-6)
    exact_log_loss(logits, target).backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()

    cfg = TrainConfig(dataset="synthetic-small", model="sage", layers=1, hidden=8, epochs=1, device="cpu",
                      loss="exact_log")
    trainer = Trainer(cfg, progress=False, log=lambda *a, **k: None)
    z = torch.randn(trainer.dataset.num_nodes, trainer.dataset.num_classes)
    i = trainer.split["train"]
    got = trainer._loss(z, trainer.label[i], i)
    assert got.item() == pytest.approx(exact_log_loss(z, trainer.label[i], i).item())
    plain = Trainer(cfg.replace(loss="ce"), progress=False, log=lambda *a, **k: None)._loss(z, trainer.label[i], i)
    assert abs(plain.item() - got.item()) > 1e-3
