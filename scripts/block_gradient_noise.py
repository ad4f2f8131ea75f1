"""Which compressed layer of the pre-LayerNorm residual block models costs the gradient most: bias and variance
of the INT2 gradient against the exact one, with every converted layer compressed and with one layer type at
a time kept exact (its modules' ``compression`` set to off), at weights trained a few epochs in fp32.

Dropout is set to 0 so the exact gradient is deterministic and the only noise is the compression's. For each
variant, ``--draws`` gradients are taken at the same weights; per parameter group (and overall) it prints

* ``rel_err``: mean over draws of ``||g - g_exact|| / ||g_exact||`` (one step's error),
* ``rel_bias``: ``||mean(g) - g_exact|| / ||g_exact||``; its noise floor is about ``rel_err / sqrt(draws)``
  (what an unbiased estimator leaves after averaging ``draws`` draws), so a bias well above that floor is real.

    python scripts/block_gradient_noise.py --model user-block-gcn --draws 16 --pretrain 10
"""
from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F

import dgl_exact
from dgl_exact.bench.user_models import BLOCK_HIDDEN, BLOCK_LAYERS, build_user_model
from dgl_exact.data import load_dataset
from dgl_exact.nn import layers as L

dgl = dgl_exact._compat.import_dgl()

#: variant -> which converted modules (name, module) are kept exact
VARIANTS = {
    "all INT2": lambda n, m: False,
    "LayerNorm exact": lambda n, m: isinstance(m, L.LayerNorm),
    "GELU exact": lambda n, m: isinstance(m, L.GELU),
    "FFN Linear exact": lambda n, m: isinstance(m, L.Linear) and ".ffn." in n,
    "output Linear exact": lambda n, m: n == "out",
    "all Linear exact": lambda n, m: isinstance(m, L.Linear),
}


def groups(model):
    """Parameter groups: the input linear, per-block LayerNorm / FFN linears, the output linear."""
    out = {}
    for name, p in model.named_parameters():
        if name.startswith("blocks."):
            kind = "norm" if ".norm." in name else ("ffn" if ".ffn." in name else "agg")
            key = f"blocks.{kind}"
        else:
            key = name.split(".")[0]
        out.setdefault(key, []).append(p)
    return out


def gradient(model, g, feat, label, mask, cfg):
    model.zero_grad(set_to_none=True)
    with dgl_exact.config(cfg):
        loss = F.cross_entropy(model(g, feat)[mask], label[mask])
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def set_exact(model, which):
    off = dgl_exact.CompressionConfig(enabled=False)
    for n, m in model.named_modules():
        if hasattr(m, "compression"):
            m.compression = off if which(n, m) else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="synthetic:num_nodes=10000,avg_degree=8,num_features=128,num_classes=10,"
                                         "homophily=0.5,feature_noise=8")
    ap.add_argument("--model", default="user-block-gcn")
    ap.add_argument("--draws", type=int, default=16)
    ap.add_argument("--pretrain", type=int, default=10, help="fp32 epochs before measuring")
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--levels", default="uniform", help="uniform or optimal (variance-optimal levels)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args(argv)
    data = load_dataset(a.dataset, quiet=True)
    g = data.graph
    if a.model in ("user-block-gcn", "user-block-gat"):
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    feat, label, mask = g.ndata["feat"], g.ndata["label"], g.ndata["train_mask"]
    torch.manual_seed(0)
    model = build_user_model(a.model, feat.shape[1], BLOCK_HIDDEN, data.num_classes, BLOCK_LAYERS, 0.0, False,
                             "exact")
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    off = dgl_exact.CompressionConfig(enabled=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    for _ in range(a.pretrain):
        gradient(model, g, feat, label, mask, off)
        opt.step()
    exact = gradient(model, g, feat, label, mask, off)
    names = groups(model)
    pname = {id(p): n for n, p in model.named_parameters()}
    cfg = dgl_exact.CompressionConfig(bits=a.bits, levels=a.levels)
    print(f"{a.model}, {a.dataset}, after {a.pretrain} fp32 epochs; INT{a.bits} ({a.levels} levels), "
          f"{a.draws} draws per variant; noise floor of rel_bias ~ rel_err / {math.sqrt(a.draws):.1f}")
    keys = list(names) + ["all"]
    print("| variant | " + " | ".join(f"{k} err / bias" for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for variant in a.variants.split(","):
        set_exact(model, VARIANTS[variant])
        draws = [gradient(model, g, feat, label, mask, cfg) for _ in range(a.draws)]
        cells = []
        for k in keys:
            ns = [pname[id(p)] for p in names[k]] if k != "all" else list(exact)
            ex = torch.cat([exact[n].flatten() for n in ns])
            ds = [torch.cat([d[n].flatten() for n in ns]) for d in draws]
            err = sum(((d - ex).norm() / ex.norm()).item() for d in ds) / len(ds)
            bias = ((torch.stack(ds).mean(0) - ex).norm() / ex.norm()).item()
            cells.append(f"{err:.3f} / {bias:.3f}")
        print(f"| {variant} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
