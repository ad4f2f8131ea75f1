"""Per-parameter gradient error of compressing one kept activation at a time (the numbers behind the budget
planner's relative objective, BENCHMARKS.md, planner).

Trains the model in fp32 for ``--epochs`` epochs, then for each ``SLOT:OPTION`` compresses only that stash
slot and prints, over ``--draws`` compression draws with the dropout masks fixed: the plain squared error
``||g - g_fp32||^2`` summed over parameters, the error relative to each tensor's own squared gradient norm
(largest first), and the exact gradient norms.

    python scripts/gradient_error_by_parameter.py --epochs 30 0:INT2 0:INT4 1:INT1 3:INT1 1:INT2 2:INT2 5:INT2
"""
import argparse

import torch

import dgl_exact  # noqa: F401  (before dgl)
from dgl_exact import ops
from dgl_exact.compression_config import CompressionConfig
from dgl_exact.compression_config import config as scope
from dgl_exact.ops import keep as keeping
from dgl_exact.planning import budget as B
from dgl_exact.training.config import TrainConfig
from dgl_exact.training.trainer import Trainer


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probes", nargs="+", help="SLOT:OPTION, e.g. 1:INT1 (options: dgl_exact.planning.budget.OPTIONS)")
    ap.add_argument("--dataset", default="synthetic-arxiv:num_nodes=20000,homophily=0.3")
    ap.add_argument("--model", default="gcn")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--no-batch-norm", action="store_true")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--draws", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = TrainConfig(dataset=args.dataset, model=args.model, hidden=args.hidden, layers=args.layers,
                      batch_norm=not args.no_batch_norm, compression=CompressionConfig(enabled=False), runs=1)
    tr = Trainer(cfg, progress=False, log=None)
    model, opt, scaler = tr.build(cfg.seed)
    idx = tr.split["train"]
    for epoch in range(args.epochs):
        tr.train_epoch(model, opt, scaler, epoch)
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]
    model.train()

    def grad(target, option, draw):
        count = [0]

        def hook(x, c, force):
            i = count[0]
            count[0] += 1
            if i != target:
                return B.keep(x, c, B.FP, force)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1000 + draw)
                return keeping.default_stash(x, B.OPTIONS[option], force)

        for p in params:
            p.grad = None
        torch.manual_seed(0)  # the same dropout masks every time
        with scope(CompressionConfig(bits=2)), keeping.stash_hook(hook):
            ops.cross_entropy(model(tr.graph, tr.feat), tr.label[idx], idx).backward()
        return [p.grad.clone() for p in params]

    exact = grad(None, None, 0)
    print("exact squared gradient norms:", ", ".join(f"{n} {float((g ** 2).sum()):.2e}" for n, g in zip(names, exact)))
    for probe in args.probes:
        slot, option = probe.split(":", 1)
        err = [0.0] * len(params)
        for d in range(args.draws):
            for k, g in enumerate(grad(int(slot), option, d)):
                err[k] += float(((g - exact[k]) ** 2).sum()) / args.draws
        rel = sorted(((e / max(float((g ** 2).sum()), 1e-30), n) for e, g, n in zip(err, exact, names)), reverse=True)
        print(f"slot {slot} {option}: plain {sum(err):.3g}; relative, largest first: "
              + ", ".join(f"{n} {r:.2g}" for r, n in rel[:5]))


if __name__ == "__main__":
    main()
